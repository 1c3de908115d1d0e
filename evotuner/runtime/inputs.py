"""The checks ``evotuner.flash_attention`` makes of its arguments before anything runs
(:func:`validate`): tensors, dtypes, shapes, layouts, strides, alignment, scale, and the
device last, so everything but the device is testable with CPU tensors."""

from __future__ import annotations

import math
from typing import Any

import torch

from evotuner.defaults import supported_head_dims
from evotuner.errors import ShapeError
from evotuner.family import families
from evotuner.problem import HEAD_DIMS

LAYOUTS = ("bhsd", "bshd")
DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
#: cp.async moves 16-byte chunks: base pointers and strides must keep every row 16-byte aligned.
ALIGN_BYTES = 16


def _check_tensor(name: str, t: Any) -> None:
    if not isinstance(t, torch.Tensor):
        raise ShapeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 4:
        raise ShapeError(f"{name}: expected a 4-D tensor, got {t.dim()}-D with shape {tuple(t.shape)}",
                         "pass [B, H, S, D] (layout='bhsd') or [B, S, H, D] (layout='bshd')")


def no_gpu_remedy(name: str) -> str:
    """What to do with a tensor that is not on a GPU: move it there, or, where this torch sees
    no GPU at all (a CPU build, no driver), that ``.cuda()`` would not help."""
    if torch.cuda.is_available():
        return f"move it with {name}.cuda()"
    return ("this torch sees no CUDA GPU (torch.cuda.is_available() is False): run on a machine with an "
            "NVIDIA Hopper GPU and a CUDA build of torch")


def validate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, layout: str = "bhsd",
             scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]:
    """Check the arguments (no CUDA call until the device check, which comes last).

    Returns q, k, v as [B, H, S, D] views and the dtype name.
    """
    if layout not in LAYOUTS:
        raise ShapeError(f"layout: {layout!r} is not supported", f"use one of {', '.join(LAYOUTS)}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in DTYPES:
            raise ShapeError(f"{name}: dtype {t.dtype} is not supported", "use torch.float16 or torch.bfloat16")
    if not (q.dtype == k.dtype == v.dtype):
        raise ShapeError(f"q, k, v: dtypes differ ({q.dtype}, {k.dtype}, {v.dtype})", "give all three the same dtype")
    if layout == "bshd":
        qv, kv, vv = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        dims = "[B, S, H, D]"
    else:
        qv, kv, vv = q, k, v
        dims = "[B, H, S, D]"
    B, H, Sq, D = qv.shape
    labels = ("B (batch)", "H (heads)", "S (seqlen)", "D (head dim)")
    for name, t in (("k", kv), ("v", vv)):
        for axis in (0, 3):
            if t.shape[axis] != qv.shape[axis]:
                raise ShapeError(f"{name}: {labels[axis]} is {t.shape[axis]} but q's is {qv.shape[axis]} "
                                 f"(layout {layout} = {dims})")
    if kv.shape[1] != vv.shape[1]:
        raise ShapeError(f"k, v: heads differ (k has {kv.shape[1]}, v has {vv.shape[1]})",
                         "k and v must have the same number of heads")
    if kv.shape[1] < 1 or H % kv.shape[1]:
        raise ShapeError(f"k: H (heads) is {kv.shape[1]}, which does not divide q's {H} "
                         f"(layout {layout} = {dims})",
                         "give k and v as many heads as q, or a divisor of it (grouped-query attention)")
    if kv.shape[2] != vv.shape[2]:
        raise ShapeError(f"k, v: seqlen differs (k has Sk={kv.shape[2]}, v has {vv.shape[2]})",
                         "k and v must have the same sequence length")
    for name, t in (("q", qv), ("k", kv)):
        for axis in range(4):
            if t.shape[axis] < 1:
                raise ShapeError(f"{name}: {labels[axis]} is {t.shape[axis]}; every dimension must be at least 1")
    supported = sorted({d for f in families() for d in supported_head_dims(family=f.name)})
    if D not in HEAD_DIMS or D not in supported:
        dims = HEAD_DIMS if D not in HEAD_DIMS else supported
        raise ShapeError(f"q: head dim D={D} is not supported", f"use one of {', '.join(map(str, dims))}")
    if max(kv.shape[2], Sq) >= 2**31:
        raise ShapeError(f"q/k: seqlen {max(kv.shape[2], Sq)} does not fit the kernel's int32 indices")
    elem = qv.element_size()
    for name, t in (("q", qv), ("k", kv), ("v", vv)):
        if t.stride(3) != 1:
            raise ShapeError(f"{name}: the last dimension (D) is not contiguous (stride {t.stride(3)})",
                             f"pass {name}.contiguous()")
        for axis, what in ((0, "batch"), (1, "head"), (2, "row")):
            if t.shape[axis] > 1 and (t.stride(axis) * elem) % ALIGN_BYTES:
                raise ShapeError(f"{name}: {what} stride {t.stride(axis)} elements is not a multiple of "
                                 f"{ALIGN_BYTES // elem} (rows must be {ALIGN_BYTES}-byte aligned)",
                                 f"pass {name}.contiguous()")
        if t.data_ptr() % ALIGN_BYTES:
            raise ShapeError(f"{name}: data pointer is not {ALIGN_BYTES}-byte aligned", f"pass {name}.clone()")
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        raise ShapeError(f"scale: {scale!r} must be a finite number")
    # Device last: everything above is testable with CPU tensors.
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.device.type != "cuda":
            raise ShapeError(f"{name}: must be on a CUDA device, got {t.device}", no_gpu_remedy(name))
    if not (q.device == k.device == v.device):
        raise ShapeError(f"q, k, v: on different devices ({q.device}, {k.device}, {v.device})",
                         "put all three on the same GPU")
    return qv, kv, vv, DTYPES[q.dtype]
