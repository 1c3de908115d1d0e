"""The GPU tests' one comparison of an attention output (and its LSE) with the fp32
reference, by FA2's rule (evotuner.runtime.check): NaN or an error past the bound fails."""

from __future__ import annotations

import math

import torch

from evotuner.runtime import check as C


def assert_like_reference(out, q, k, v, causal, scale=None, layout="bhsd", lse=None) -> None:
    """``out`` (and ``lse``, natural log) of attention over q, k, v in ``layout``, against
    the fp32 reference; ``scale`` defaults to 1/sqrt(D)."""
    t = (lambda x: x.transpose(1, 2)) if layout == "bshd" else (lambda x: x)
    qv, kv, vv, ov = t(q), t(k), t(v), t(out)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    ref, ref_lse = C.reference(qv, kv, vv, causal, scale)
    tol = C.tolerance(C.torch_low_precision(qv, kv, vv, causal, scale), ref)
    err = float((ov.float() - ref).abs().max())
    assert math.isfinite(err) and err <= tol, (err, tol)
    if lse is not None:
        assert torch.allclose(lse, ref_lse, atol=1e-3)


def assert_graph_replays_like_eager(call, q, k, v, causal, layout="bhsd", warmups=1) -> None:
    """``call()`` (attention over q, k, v returning (out, lse)) captured in a CUDA graph after
    ``warmups`` calls on the capture stream: three replays on fresh inputs, the output poisoned
    with NaN before each, each like the reference; then the last inputs through ``call()``
    eagerly give the same bits."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):       # warm up on the capture stream (its workspace, its plans)
        for _ in range(warmups):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = call()
    for _ in range(3):
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_like_reference(out, q, k, v, causal, layout=layout, lse=lse)
    eager, eager_lse = call()
    assert torch.equal(out, eager) and torch.equal(lse, eager_lse)


def launch_side_by_side(modules, q, k, v, scale, lse_shape):
    """Each KernelModule of ``modules`` launched on the same q, k, v into its own output and LSE,
    both poisoned with NaN first (a row a kernel leaves unwritten stays NaN); returns
    [(out, lse), ...] in the modules' order, synchronized. For tests that two builds of one
    arithmetic give the same bits."""
    outs = []
    for mod in modules:
        out = torch.full_like(q, float("nan"))
        lse = torch.full(lse_shape, float("nan"), device=q.device, dtype=torch.float32)
        mod.launch(q, k, v, out, lse, scale)
        outs.append((out, lse))
    torch.cuda.synchronize()
    return outs
