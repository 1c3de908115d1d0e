"""Packed variable-length batches: :func:`flash_attention_varlen` (FlashAttention's convention).

Sequences of different lengths packed one after another, no padding: q [total_q, Hq, D],
k and v [total_k, Hkv, D], sequence b's rows ``cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1`` of q
and ``cu_seqlens_k[b] ..`` of k/v (int32 offsets on the device, ``batch + 1`` each). Only the
hopper family has a packed kernel: a build of its own (``Problem.varlen``; ``HOPPER_VARLEN``),
so the dense kernels carry none of its code. Its config (:func:`packed_choice`): ``config``
when given, else the served tuned tables' row of a packed study (``evotuner search
--lengths``) on this GPU model, in the size bucket of ``batch, Hq, max_seqlen_q,
max_seqlen_k``, else the hopper family's recommended one for that packed problem.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Mapping, Sequence

import torch

from evotuner.config import KernelConfig
from evotuner.errors import ShapeError
from evotuner.family import get_family
from evotuner.problem import Problem, Shape
from evotuner.runtime.attention import Choice, choose, chosen_module, device_name, forward_only_error
from evotuner.runtime.inputs import no_gpu_remedy
from evotuner.tuned import TunedTable

FAMILY = "hopper"
_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}


def flash_attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    causal: bool = False,
    scale: float | None = None,
    config: Mapping[str, int] | KernelConfig | str | None = None,
    return_lse: bool = False,
    return_choice: bool = False,
) -> Any:
    """softmax(scale · Q Kᵀ [+ causal mask]) V of each packed sequence on its own.

    q: [total_q, Hq, D]; k, v: [total_k, Hkv, D] with Hkv dividing Hq (GQA/MQA); fp16 or
    bf16 CUDA tensors on one device, last dim contiguous. ``cu_seqlens_q``/``cu_seqlens_k``:
    int32 [batch + 1] offsets on that device, non-decreasing, from 0 to total_q / total_k.
    ``max_seqlen_q``/``max_seqlen_k`` must be at least every sequence's length (as in
    FlashAttention, they are not read back from the device: that would synchronise).
    ``causal`` masks top-left within each sequence (query i of a sequence sees its keys
    0..i, SDPA's ``is_causal``); an empty sequence is allowed, and a sequence with queries
    but no keys gives zeros (and LSE -inf). Returns the output [total_q, Hq, D], with
    ``return_lse`` also the fp32 logsumexp [Hq, total_q], with ``return_choice`` the
    :class:`Choice` last. Forward only.
    """
    if any(t.requires_grad for t in (q, k, v)) and torch.is_grad_enabled():
        raise forward_only_error()
    dtype, device = _validate(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    total_q, hq, d = q.shape
    batch = cu_seqlens_q.numel() - 1
    shape = Shape(batch, hq, max(1, int(max_seqlen_q)), max(1, int(max_seqlen_k)), d, k.shape[1])
    problem = Problem(shape, dtype, bool(causal), varlen=True)
    choice = packed_choice(problem, config, device_name(device))
    out = torch.empty_like(q)
    lse = torch.empty((hq, total_q), dtype=torch.float32, device=q.device) if return_lse else None
    module = chosen_module(choice, problem, device)
    with torch.cuda.device(device):
        module.launch_varlen(q, k, v, out, lse, 1.0 / math.sqrt(d) if scale is None else float(scale),
                             cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k))
    result: tuple[Any, ...] = (out, lse) if return_lse else (out,)
    if return_choice:
        result += (replace(choice, why=f"{choice.why} (packed variable-length kernel)"),)
    return result[0] if len(result) == 1 else result


def packed_choice(problem: Problem, config: Mapping[str, int] | KernelConfig | str | None = None,
                  device: str | None = None, tables: Sequence[TunedTable] | None = None) -> Choice:
    """The config a packed call of ``problem`` (``varlen``, sized by its longest lengths) runs:
    ``config`` when given, else the served tuned tables' row of a packed study on GPU model
    ``device`` (a dense study's rows serve dense calls only), else the hopper family's
    recommended config; never split-KV, which is not built packed."""
    choice = choose(problem, config, family=FAMILY, device=device, tables=tables)
    splits = choice.config.as_dict().get("SPLITS", 1)
    if splits > 1:
        raise ShapeError(f"config: SPLITS={splits} (split-KV) is not built for packed variable-length batches",
                         "pass SPLITS=1, or leave config unset")
    return choice


def _validate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
              max_q: Any, max_k: Any) -> tuple[str, int]:
    """(dtype name, device index), or ShapeError naming the argument and the fix."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ShapeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ShapeError(f"{name}: expected a packed [total, heads, D] tensor, got {t.dim()}-D "
                             f"{tuple(t.shape)}", "pack the batch: torch.cat of the [S_b, H, D] sequences")
        if t.dtype not in _DTYPES:
            raise ShapeError(f"{name}: dtype {t.dtype} is not supported", "use torch.float16 or torch.bfloat16")
        if t.device.type != "cuda":
            raise ShapeError(f"{name}: on {t.device}; the kernel runs on a CUDA device", no_gpu_remedy(name))
        if t.stride(2) != 1:
            raise ShapeError(f"{name}: last dim (D) stride is {t.stride(2)}, must be 1", f"pass {name}.contiguous()")
    if not (q.dtype == k.dtype == v.dtype) or not (q.device == k.device == v.device):
        raise ShapeError("q, k, v: dtypes or devices differ", "give all three one dtype and one device")
    if k.shape != v.shape:
        raise ShapeError(f"k, v: shapes differ ({tuple(k.shape)}, {tuple(v.shape)})", "pack k and v alike")
    if q.shape[2] != k.shape[2]:
        raise ShapeError(f"k: head dim {k.shape[2]} but q's is {q.shape[2]}", "give q, k and v one head dim")
    if k.shape[1] < 1 or q.shape[1] % k.shape[1]:
        raise ShapeError(f"k: {k.shape[1]} heads, which does not divide q's {q.shape[1]}",
                         "use as many k/v heads as q's, or a divisor of them (GQA/MQA)")
    for name, cu in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1:
            raise ShapeError(f"{name}: expected a 1-D int32 tensor of batch + 1 offsets",
                             "e.g. torch.tensor([0, 5, 12], dtype=torch.int32, device='cuda')")
        if cu.device != q.device:
            raise ShapeError(f"{name}: on {cu.device}, q on {q.device}", f"move it: {name}.to(q.device)")
    if cu_q.numel() != cu_k.numel() or cu_q.numel() < 2:
        raise ShapeError(f"cu_seqlens_q/k: {cu_q.numel()} and {cu_k.numel()} offsets; both must have batch + 1 >= 2",
                         "one offset more than there are sequences, starting at 0")
    for name, m in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if isinstance(m, bool) or not isinstance(m, int) or m < 0 or m >= 2**31:
            raise ShapeError(f"{name}: {m!r} is not a length", "the longest sequence's length, an int >= 0")
    why = get_family(FAMILY).unsupported(Problem(Shape(1, q.shape[1], 1, 1, q.shape[2], k.shape[1]),
                                                 _DTYPES[q.dtype]))
    if why:
        raise ShapeError(f"q: {why} (packed batches run on the hopper family only)",
                         f"use a head dim of {', '.join(map(str, get_family(FAMILY).head_dims))}, or pad the batch "
                         f"and call flash_attention")
    return _DTYPES[q.dtype], q.device.index if q.device.index is not None else torch.cuda.current_device()
