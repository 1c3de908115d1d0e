"""Packed variable-length batches for the measure stage: inputs, the correctness check and the
SDPA baselines of a :class:`~evotuner.problem.Problem` that carries its sequence lengths.

* :func:`make_packed_inputs`: fresh q [total_q, H, D], k and v [total_k, HKV, D] ~ N(0, 1)
  from a seed, drawn on the device, and the int32 offsets ``cu_seqlens_q/k`` there
  (FlashAttention's convention, what ``flash_attention_varlen`` takes);
* :func:`check_packed`: one run on fresh inputs, output and LSE poisoned with NaN, each
  sequence judged on its own by FA2's rule (:mod:`evotuner.runtime.check`: the fp32
  reference of that sequence, the bound from PyTorch's low-precision attention of it); a
  sequence with queries but no keys must give zeros and LSE -inf; NaN never passes;
* :func:`packed_baselines`: the SDPA calls a packed batch is compared with -- SDPA's
  default backend on the batch padded to its longest lengths (``sdpa_padded``) and on
  jagged nested tensors (``sdpa_jagged``), as ``scripts/bench_varlen.py`` calls them.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from evotuner.errors import ShapeError
from evotuner.problem import Problem
from evotuner.runtime.check import (
    CheckResult, compare, default_scale, lse_low_precision, reference, tolerance, torch_dtype, torch_low_precision,
)

#: ``run(q, k, v, o, lse, scale, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)``:
#: writes o (and lse unless None); KernelModule.launch_varlen has this signature.
PackedRunner = Callable[..., None]


def offsets(lengths: tuple[int, ...], device: torch.device | str) -> torch.Tensor:
    """int32 [len + 1] cumulative offsets of ``lengths`` on ``device``."""
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def _lengths(problem: Problem) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if not problem.varlen or not problem.lengths_q:
        raise ShapeError(f"problem {problem}: no sequence lengths to measure a packed batch at",
                         "make the problem with Problem.packed(lengths, ...) or `--lengths`")
    return problem.lengths_q, problem.lengths_k


def make_packed_inputs(problem: Problem, *, device: str | torch.device = "cuda", seed: int = 0
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, k, v, cu_seqlens_q, cu_seqlens_k) of ``problem``'s lengths, fresh from ``seed``."""
    lq, lk = _lengths(problem)
    s = problem.shape
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    dt = torch_dtype(problem.dtype)

    def one(rows: int, heads: int) -> torch.Tensor:
        return torch.randn(rows, heads, s.head_dim, generator=gen, dtype=torch.float32, device=device).to(dt)

    hkv = int(s.heads_kv or s.heads)
    return (one(sum(lq), s.heads), one(sum(lk), hkv), one(sum(lk), hkv), offsets(lq, device), offsets(lk, device))


def check_packed(run: PackedRunner, problem: Problem, *, seed: int = 0, device: str | torch.device = "cuda",
                 scale: float | None = None) -> CheckResult:
    """Run ``run`` once on fresh packed inputs and judge each sequence by FA2's rule. The
    figures reported are those of the sequence closest to its bound (its max error and
    tolerance); a failure names the sequence. Errors raised by ``run`` propagate."""
    lq, lk = _lengths(problem)
    scale = default_scale(problem.shape.head_dim) if scale is None else float(scale)
    q, k, v, cu_q, cu_k = make_packed_inputs(problem, device=device, seed=seed)
    o = torch.full_like(q, float("nan"))
    lse = torch.full((q.shape[1], q.shape[0]), float("nan"), dtype=torch.float32, device=q.device)
    run(q, k, v, o, lse, scale, cu_q, cu_k, max(lq), max(lk))
    if q.device.type == "cuda":
        torch.cuda.synchronize(q.device)
    worst: tuple[float, float, float] = (-1.0, 0.0, 0.0)      # (error / tolerance, error, tolerance)
    q0 = k0 = 0
    for b, (sq, sk) in enumerate(zip(lq, lk)):
        rows, keys = slice(q0, q0 + sq), slice(k0, k0 + sk)
        q0, k0 = q0 + sq, k0 + sk
        if sq == 0:
            continue
        where = f"sequence {b} (Sq={sq}, Sk={sk})"
        out_b, lse_b = o[rows].transpose(0, 1).unsqueeze(0), lse[:, rows].unsqueeze(0)
        if sk == 0:          # softmax over no key: zeros, LSE -inf
            failed = _no_keys(out_b, lse_b, where)
            if failed is not None:
                return failed
            continue
        qb = q[rows].transpose(0, 1).unsqueeze(0)
        kb, vb = k[keys].transpose(0, 1).unsqueeze(0), v[keys].transpose(0, 1).unsqueeze(0)
        ref, ref_lse = reference(qb, kb, vb, problem.causal, scale)
        tol = tolerance(torch_low_precision(qb, kb, vb, problem.causal, scale), ref)
        ok, err, reason, kind = compare(out_b, ref, tol, what=f"output of {where}")
        if ok:
            lse_tol = tolerance(lse_low_precision(qb, kb, problem.causal, scale), ref_lse)
            ok, _, reason, kind = compare(lse_b, ref_lse, lse_tol, what=f"lse of {where}")
        if not ok:
            return CheckResult(ok=False, max_error=err, tolerance=tol, reason=reason, kind=kind)
        worst = max(worst, (err / tol, err, tol))
    return CheckResult(ok=True, max_error=worst[1], tolerance=worst[2], reason="")


def _no_keys(out: torch.Tensor, lse: torch.Tensor, where: str) -> CheckResult | None:
    """A sequence without keys must give zeros and LSE -inf (NaN: never written)."""
    if not bool((out == 0).all()):
        bad = int((out != 0).sum())
        kind = "nan" if bool(torch.isnan(out).any()) else "wrong_result"
        return CheckResult(ok=False, max_error=math.inf, tolerance=0.0, kind=kind,
                           reason=f"output of {where}: {bad} of {out.numel()} elements are not 0 (a sequence "
                                  "without keys gives zeros; NaN marks elements the kernel never wrote)")
    if not bool(torch.isneginf(lse).all()):
        return CheckResult(ok=False, max_error=math.inf, tolerance=0.0, kind="wrong_result",
                           reason=f"lse of {where}: not -inf everywhere (a sequence without keys has LSE -inf)")
    return None


def packed_baselines(problem: Problem, *, device: str | torch.device = "cuda", seed: int = 0
                     ) -> dict[str, Callable[[], Any]]:
    """{name: a call of SDPA for ``problem``'s batch} (evotuner.measure.gpu.PACKED_BASELINES),
    inputs made once here: the batch padded to its longest query and key lengths, [B, H, S, D]
    (``sdpa_padded``: SDPA's default backend; non-causal with a key-padding mask, causal with
    none, as ``scripts/bench_varlen.py`` calls it: sequences padded at their end, a row sees
    no key past its own under the top-left mask wherever Sq <= Sk); and jagged nested
    tensors of the sequences with queries and keys (``sdpa_jagged``; GQA's K/V heads
    repeated for the query heads first, as nested tensors take no ``enable_gqa``). A call
    SDPA refuses raises RuntimeError when called."""
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    lq, lk = _lengths(problem)
    s = problem.shape
    device = torch.device(device)
    dt = torch_dtype(problem.dtype)
    gen = torch.Generator(device=device).manual_seed(seed)
    hkv = int(s.heads_kv or s.heads)

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float32, device=device).to(dt)

    pq, pk, pv = draw(s.batch, s.heads, s.seqlen_q, s.head_dim), draw(s.batch, hkv, s.seqlen_k, s.head_dim), \
        draw(s.batch, hkv, s.seqlen_k, s.head_dim)
    gqa = {"enable_gqa": True} if s.kv_group > 1 else {}
    mask = None
    if not problem.causal:   # keys past a sequence's end masked, as a correct padded call needs
        keys = torch.arange(s.seqlen_k, device=device)
        mask = (keys[None, :] < torch.tensor(lk, device=device)[:, None])[:, None, None, :]

    def padded() -> Any:
        return sdpa(pq, pk, pv, attn_mask=mask, is_causal=problem.causal, **gqa)

    def jagged(lengths: tuple[int, ...], heads: int, repeat: int) -> torch.Tensor:
        parts = [draw(n, heads, s.head_dim).repeat_interleave(repeat, dim=1) for n in lengths]
        return torch.nested.nested_tensor(parts, layout=torch.jagged).transpose(1, 2)   # [B, H, j, D]

    made: tuple[torch.Tensor, ...] | str
    try:
        # only the sequences with queries and keys: the rest is no work (and SDPA's fused
        # kernels take no empty sequence)
        busy = [(a, b) for a, b in zip(lq, lk) if a and b]
        jq, jk = tuple(a for a, _ in busy), tuple(b for _, b in busy)
        made = (jagged(jq, s.heads, 1), jagged(jk, hkv, s.kv_group), jagged(jk, hkv, s.kv_group))
    except (RuntimeError, ValueError, TypeError) as exc:     # e.g. a torch without jagged nested tensors
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        made = f"cannot make jagged nested tensors of the batch: {first[:200]}"

    def nested() -> Any:
        if isinstance(made, str):
            raise RuntimeError(made)    # the worker records it as the baseline's reason
        return sdpa(*made, is_causal=problem.causal)

    return {"sdpa_padded": padded, "sdpa_jagged": nested}
