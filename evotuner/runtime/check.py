"""The correctness rule shared by the tests, the bench script and the GPU worker.

FlashAttention-2's rule: a kernel's output passes when

    max|out - ref| <= 2 * max|out_torch - ref| + 1e-5

where ``ref`` is attention computed in fp32 on the (upcast) low-precision
inputs and ``out_torch`` is PyTorch's attention computed *in* the low
precision (SDPA's math backend with fp16/bf16 reductions allowed, the way
FA2's tests use ``attention_ref(upcast=False)``): the kernel may be at most
twice as far from the truth as a plain low-precision implementation. NaN or Inf
never passes. The output (and the LSE) is poisoned with NaN before the run, so
an element the kernel did not write fails. Every check draws fresh random
inputs from its own seed.

The LSE (natural log, fp32 [B, H, Sq]) is held to the same rule against the
logsumexp of the fp32 scores, with the low-precision bound taken from scores
rounded to the input dtype.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

from evotuner.errors import ShapeError
from evotuner.problem import Problem, Shape

#: ``run(q, k, v, o, lse, scale)``: writes o (and lse unless it is None); q, k, v, o
#: are logical [B, H, S, D] views (KernelModule.launch has this signature).
Runner = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None", float], None]

LAYOUTS = ("bhsd", "bshd")
TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
#: The additive floor of FA2's rule.
ABS_FLOOR = 1e-5
#: Bytes of fp32 scores the reference materialises at once (it loops over batch·heads).
_REF_CHUNK_BYTES = 1 << 30


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    max_error: float              # max |out - ref| (inf when out has NaN/Inf)
    tolerance: float              # 2 * max |out_torch - ref| + 1e-5
    reason: str                   # "" when ok; else one line saying what failed
    kind: str | None = None       # None when ok; "nan" or "wrong_result" (MeasureFailure kinds)
    lse_error: float | None = None
    lse_tolerance: float | None = None


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in TORCH_DTYPES.values():
            raise ShapeError(f"dtype: {dtype} is not supported", "use torch.float16 or torch.bfloat16")
        return dtype
    try:
        return TORCH_DTYPES[dtype]
    except KeyError:
        raise ShapeError(f"dtype: {dtype!r} is not supported", "use fp16 or bf16") from None


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


def make_inputs(shape: Shape, dtype: str | torch.dtype, *, layout: str = "bhsd", device: str | torch.device = "cuda",
                seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fresh q, k, v ~ N(0, 1) (unit-variance activations, as FA2's tests use) from ``seed``.

    Returned as logical [B, H, S, D] views; with layout "bshd" their storage is
    [B, S, H, D] contiguous (FlashAttention's layout), so strides differ.
    """
    dt = torch_dtype(dtype)
    # Drawn on the target device: at a study's shape (100M+ elements) a CPU draw
    # took most of a trial's correctness time (bench_tuner on the H100).
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    B, Sq, Sk, D = shape.batch, shape.seqlen_q, shape.seqlen_k, shape.head_dim

    def one(S: int, H: int) -> torch.Tensor:
        if layout == "bhsd":
            t = torch.randn(B, H, S, D, generator=gen, dtype=torch.float32, device=device)
        elif layout == "bshd":
            t = torch.randn(B, S, H, D, generator=gen, dtype=torch.float32, device=device).transpose(1, 2)
        else:
            raise ShapeError(f"layout: {layout!r} is not supported", f"use one of {', '.join(LAYOUTS)}")
        return t.to(dtype=dt)  # keeps the strides (preserve_format)

    Hkv = int(shape.heads_kv or shape.heads)
    return one(Sq, shape.heads), one(Sk, Hkv), one(Sk, Hkv)


def expand_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v with one head per query head (GQA/MQA: each K/V head repeated for the query
    heads that read it); unchanged when they already have q's heads."""
    group = q.shape[1] // k.shape[1]
    if group == 1:
        return k, v
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)


def empty_like_layout(q: torch.Tensor, layout: str) -> torch.Tensor:
    """An output with q's logical shape [B, H, Sq, D] stored in ``layout``."""
    B, H, S, D = q.shape
    if layout == "bshd":
        return torch.empty(B, S, H, D, dtype=q.dtype, device=q.device).transpose(1, 2)
    return torch.empty(B, H, S, D, dtype=q.dtype, device=q.device)


@contextlib.contextmanager
def _fp32_exact() -> Iterator[None]:
    """No TF32 in the reference's fp32 matmuls."""
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def _causal_mask(Sq: int, Sk: int, device: torch.device) -> torch.Tensor:
    """True where masked: top-left alignment (SDPA is_causal), query i sees keys 0..i."""
    i = torch.arange(Sq, device=device).unsqueeze(1)
    j = torch.arange(Sk, device=device).unsqueeze(0)
    return j > i


def _chunks(q: torch.Tensor, k: torch.Tensor) -> int:
    """Heads per chunk so the fp32 scores stay under _REF_CHUNK_BYTES."""
    per_head = q.shape[2] * k.shape[2] * 4
    return max(1, _REF_CHUNK_BYTES // max(per_head, 1))


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 attention on the upcast inputs: (out fp32 [B,H,Sq,D], lse fp32 [B,H,Sq]); k and v
    may have fewer heads than q (GQA/MQA)."""
    k, v = expand_kv(q, k, v)
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    out = torch.empty(B, H, Sq, D, dtype=torch.float32, device=q.device)
    lse = torch.empty(B, H, Sq, dtype=torch.float32, device=q.device)
    mask = _causal_mask(Sq, Sk, q.device) if causal else None
    qf, kf, vf = q.reshape(B * H, Sq, D), k.reshape(B * H, Sk, D), v.reshape(B * H, Sk, D)
    of, lf = out.view(B * H, Sq, D), lse.view(B * H, Sq)
    step = _chunks(q, k)
    with _fp32_exact():
        for s in range(0, B * H, step):
            e = min(s + step, B * H)
            scores = torch.matmul(qf[s:e].float(), kf[s:e].float().transpose(1, 2)) * scale
            if mask is not None:
                scores.masked_fill_(mask, float("-inf"))
            lf[s:e] = torch.logsumexp(scores, dim=-1)
            # softmax from the lse just taken: exp(s - lse) in place (one pass fewer than softmax)
            probs = scores.sub_(lf[s:e].unsqueeze(-1)).exp_()
            of[s:e] = torch.matmul(probs, vf[s:e].float())
    return out, lse


@contextlib.contextmanager
def _low_precision_math() -> Iterator[None]:
    """SDPA's math backend computing in fp16/bf16 (not upcasting internally)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = torch.backends.cuda
    toggle = hasattr(backends, "allow_fp16_bf16_reduction_math_sdp")
    saved = backends.fp16_bf16_reduction_math_sdp_allowed() if toggle else None
    with sdpa_kernel(SDPBackend.MATH):
        if toggle:
            backends.allow_fp16_bf16_reduction_math_sdp(True)
        try:
            yield
        finally:
            if toggle:
                backends.allow_fp16_bf16_reduction_math_sdp(saved)


def torch_low_precision(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
                        ) -> torch.Tensor:
    """PyTorch's attention in the inputs' own precision (FA2's ``out_pt``), [B,H,Sq,D]."""
    k, v = expand_kv(q, k, v)
    B, H, Sq, D = q.shape
    out = torch.empty(B, H, Sq, D, dtype=q.dtype, device=q.device)
    step = _chunks(q, k)
    qf, kf, vf = q.reshape(B * H, 1, Sq, D), k.reshape(B * H, 1, k.shape[2], D), v.reshape(B * H, 1, k.shape[2], D)
    of = out.view(B * H, 1, Sq, D)
    with _low_precision_math():
        for s in range(0, B * H, step):
            e = min(s + step, B * H)
            of[s:e] = F.scaled_dot_product_attention(qf[s:e], kf[s:e], vf[s:e], is_causal=causal, scale=scale)
    return out


def lse_low_precision(q: torch.Tensor, k: torch.Tensor, causal: bool, scale: float) -> torch.Tensor:
    """logsumexp of the scores rounded to the inputs' dtype (the LSE analogue of out_torch)."""
    k, _ = expand_kv(q, k, k)
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    lse = torch.empty(B, H, Sq, dtype=torch.float32, device=q.device)
    mask = _causal_mask(Sq, Sk, q.device) if causal else None
    qf, kf, lf = q.reshape(B * H, Sq, D), k.reshape(B * H, Sk, D), lse.view(B * H, Sq)
    step = _chunks(q, k)
    for s in range(0, B * H, step):
        e = min(s + step, B * H)
        scores = (torch.matmul(qf[s:e], kf[s:e].transpose(1, 2)) * scale).float()
        if mask is not None:
            scores.masked_fill_(mask, float("-inf"))
        lf[s:e] = torch.logsumexp(scores, dim=-1)
    return lse


def tolerance(torch_out: torch.Tensor, ref: torch.Tensor) -> float:
    """FA2's bound: 2 * max|out_torch - ref| + 1e-5."""
    return 2.0 * float((torch_out.float() - ref.float()).abs().max()) + ABS_FLOOR


def compare(out: torch.Tensor, ref: torch.Tensor, tol: float, *, what: str = "output") -> tuple[bool, float, str, str | None]:
    """(ok, max_error, reason, kind) for one tensor against its reference and bound."""
    o = out.float()
    finite = torch.isfinite(o)
    if not bool(finite.all()):
        bad = int((~finite).sum())
        first = tuple(int(i) for i in (~finite).nonzero()[0].tolist())
        return False, math.inf, (f"{what}: {bad} of {o.numel()} elements are NaN/Inf (first at {first}; "
                                 "NaN also marks elements the kernel never wrote)"), "nan"
    err = (o - ref.float()).abs()
    max_err = float(err.max()) if err.numel() else 0.0
    if max_err > tol:
        where = tuple(int(i) for i in torch.nonzero(err == err.max())[0].tolist())
        return False, max_err, f"{what}: max error {max_err:.3g} at {where} exceeds the tolerance {tol:.3g}", \
            "wrong_result"
    return True, max_err, "", None


def check(run: Runner, problem: Problem | Shape, dtype: str | None = None, causal: bool | None = None, *,
          seed: int = 0, layout: str = "bhsd", device: str | torch.device = "cuda", scale: float | None = None,
          check_lse: bool = True, bounds: tuple[float, float | None] | None = None) -> CheckResult:
    """Run ``run`` once on fresh inputs and judge its output (and LSE) by FA2's rule.

    ``problem`` may be a Problem (dtype and causal come from it unless given) or
    a Shape (then dtype and causal are required). Errors raised by ``run`` (a
    CudaError, say) propagate: the caller decides what a launch failure means.

    ``bounds``: the (output, LSE) tolerances to judge by, from an earlier check of the same
    problem (its ``tolerance`` and ``lse_tolerance``), instead of computing FA2's bound on
    these inputs. The bound is the dtype's rounding at this problem for inputs of this
    distribution (a max over every output element), not a property of the kernel: the GPU
    worker computes it on its first check of a study's problem and reuses it, the fp32
    reference and the inputs staying fresh each check (at B=4,H=32,S=4096,D=128 causal the
    two bounds cost 68 of the check's 136 ms, scripts/check_cost.py).
    """
    if isinstance(problem, Problem):
        shape = problem.shape
        dtype = problem.dtype if dtype is None else dtype
        causal = problem.causal if causal is None else causal
    else:
        shape = problem
        if dtype is None or causal is None:
            raise TypeError("check(): give dtype and causal with a Shape (or pass a Problem)")
    scale = default_scale(shape.head_dim) if scale is None else float(scale)
    q, k, v = make_inputs(shape, dtype, layout=layout, device=device, seed=seed)
    o = empty_like_layout(q, layout).fill_(float("nan"))
    lse = None
    if check_lse:
        lse = torch.full((shape.batch, shape.heads, shape.seqlen_q), float("nan"), dtype=torch.float32,
                         device=q.device)
    run(q, k, v, o, lse, scale)
    if q.device.type == "cuda":
        torch.cuda.synchronize(q.device)

    ref, ref_lse = reference(q, k, v, bool(causal), scale)
    if bounds is not None:
        tol = float(bounds[0])
    else:
        tol = tolerance(torch_low_precision(q, k, v, bool(causal), scale), ref)
    ok, max_err, reason, kind = compare(o, ref, tol)
    lse_err = lse_tol = None
    if check_lse and lse is not None:
        if bounds is not None and bounds[1] is not None:
            lse_tol = float(bounds[1])
        else:
            lse_tol = tolerance(lse_low_precision(q, k, bool(causal), scale), ref_lse)
        lse_ok, lse_err, lse_reason, lse_kind = compare(lse, ref_lse, lse_tol, what="lse")
        if ok and not lse_ok:
            ok, reason, kind = False, lse_reason, lse_kind
    return CheckResult(ok=ok, max_error=max_err, tolerance=tol, reason=reason, kind=kind,
                       lse_error=lse_err, lse_tolerance=lse_tol)
