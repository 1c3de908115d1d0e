"""``evotuner.flash_attention``: the tuned attention kernels as a function on torch tensors.

Which kernel runs: :func:`choose` -- an explicit ``family``; else, with a
``config``, the default family (its parameter names); else, of the registered
families that support the problem and recommend a config for it, the one whose
recommended config is fastest by its own measured figure
(:meth:`KernelFamily.expected_speed`), FlashCore on ties; the returned
:class:`Choice` says which and why (``flash_attention(..., return_choice=True)``).

The first call for a (device, family, head dim, dtype, causal, config) builds the cubin
through :class:`evotuner.compiler.Builder` (cached on disk by content) and loads it
through the driver (cached in the process); later calls only validate,
allocate and launch on torch's current stream.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from evotuner.compiler import Builder
from evotuner.config import KernelConfig
from evotuner.defaults import default_config, parse_defaults, supported_head_dims  # noqa: F401 (public names)
from evotuner.errors import BuildError, ShapeError, SpaceError
from evotuner.family import DEFAULT_FAMILY, KernelFamily, families, get_family
from evotuner.problem import HEAD_DIMS, Problem, Shape
from evotuner.runtime.loader import KernelModule, tensor_view as _view

LAYOUTS = ("bhsd", "bshd")
_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
#: cp.async moves 16-byte chunks: base pointers and strides must keep every row 16-byte aligned.
ALIGN_BYTES = 16


class KernelBuildError(BuildError):
    """The requested config did not compile (the message carries the compiler's reason)."""


@dataclass(frozen=True)
class Choice:
    """Which family and config a call runs, and why (one line)."""

    family: str
    config: KernelConfig
    why: str


def choose(problem: Problem, config: Mapping[str, int] | KernelConfig | str | None = None,
           family: str | None = None, exclude: Mapping[str, str] | None = None) -> Choice:
    """The family and config :func:`flash_attention` runs for ``problem`` (see the module docstring);
    ``exclude``: {family: why} families the automatic choice must pass over."""
    if family is not None or config is not None:
        fam = get_family(family or DEFAULT_FAMILY)
        why_not = fam.unsupported(problem)
        if why_not:
            raise ShapeError(f"q: {why_not}", f"use one of {', '.join(map(str, fam.head_dims))}")
        cfg = resolve_config(config, problem.shape.head_dim, problem.dtype, problem.causal, family=fam.name)
        return Choice(fam.name, cfg, "asked for" if family is not None else "the default family (config given)")
    candidates: list[tuple[float, int, KernelFamily, KernelConfig]] = []
    skipped: list[str] = []
    for fam in families():
        why_not = (exclude or {}).get(fam.name) or fam.unsupported(problem)
        recommended = () if why_not else fam.recommended_configs(problem)
        if not recommended:
            skipped.append(f"{fam.name}: {why_not or 'no recommended config'}")
            continue
        candidates.append((fam.expected_speed(problem), fam.name == DEFAULT_FAMILY, fam, recommended[0]))
    if not candidates:
        fam = get_family(DEFAULT_FAMILY)
        dims = [d for d in HEAD_DIMS if d in supported_head_dims(family=fam.name)]
        raise ShapeError(f"q: head dim D={problem.shape.head_dim} is not supported ({'; '.join(skipped)})",
                         f"use one of {', '.join(map(str, dims))}")
    candidates.sort(key=lambda c: (c[0], c[1]), reverse=True)
    speed, _, fam, cfg = candidates[0]
    why = f"fastest recommended config ({speed:g} by its family's figure)" if len(candidates) > 1 else \
        "the only family supporting the problem"
    if skipped:
        why += f"; not: {'; '.join(skipped)}"
    return Choice(fam.name, cfg, why)


def resolve_config(config: Mapping[str, int] | KernelConfig | str | None, head_dim: int, dtype: str,
                   causal: bool, *, family: str | None = None) -> KernelConfig:
    """``config`` over the recommended default (a partial mapping overrides only its keys)."""
    fam = get_family(family or DEFAULT_FAMILY)
    base = default_config(head_dim, dtype, causal, family=fam.name)
    if config is None:
        return base
    if isinstance(config, str):
        given = KernelConfig.parse(config).as_dict()
    elif isinstance(config, KernelConfig):
        given = config.as_dict()
    elif isinstance(config, Mapping):
        given = KernelConfig.of({str(k).upper(): v for k, v in config.items()}).as_dict()
    else:
        raise SpaceError(f"config: expected a mapping of kernel parameters, got {type(config).__name__}",
                         f"e.g. config={dict(list(base.as_dict().items())[:2])}")
    known = base.as_dict()
    for name in given:
        if name not in known:
            raise SpaceError(f"config: unknown kernel parameter {name}",
                             f"{fam.title or fam.name} takes {', '.join(sorted(known))}")
    return KernelConfig.of({**known, **given})


# --------------------------------------------------------------------------- validation


def _check_tensor(name: str, t: Any) -> None:
    if not isinstance(t, torch.Tensor):
        raise ShapeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 4:
        raise ShapeError(f"{name}: expected a 4-D tensor, got {t.dim()}-D with shape {tuple(t.shape)}",
                         "pass [B, H, S, D] (layout='bhsd') or [B, S, H, D] (layout='bshd')")


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
        if t.dtype not in _DTYPES:
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
        for axis in (0, 1, 3):
            if t.shape[axis] != qv.shape[axis]:
                raise ShapeError(f"{name}: {labels[axis]} is {t.shape[axis]} but q's is {qv.shape[axis]} "
                                 f"(layout {layout} = {dims})")
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
            raise ShapeError(f"{name}: must be on a CUDA device, got {t.device}", f"move it with {name}.cuda()")
    if not (q.device == k.device == v.device):
        raise ShapeError(f"q, k, v: on different devices ({q.device}, {k.device}, {v.device})",
                         "put all three on the same GPU")
    return qv, kv, vv, _DTYPES[q.dtype]


# --------------------------------------------------------------------------- modules

_lock = threading.Lock()
_builders: dict[str, Builder] = {}
_modules: dict[tuple[int, str, KernelConfig, int, str, bool], KernelModule] = {}


def _get_builder(family: str) -> Builder:
    builder = _builders.get(family)
    if builder is None:
        with _lock:
            builder = _builders.get(family)
            if builder is None:
                builder = _builders[family] = Builder(family)
    return builder


def kernel_module(config: KernelConfig, problem: Problem, device: int, family: str = DEFAULT_FAMILY) -> KernelModule:
    """The loaded KernelModule for (device, family, config, D, dtype, causal), built on first use."""
    key = (device, family, config, problem.shape.head_dim, problem.dtype, problem.causal)
    mod = _modules.get(key)
    if mod is not None:
        return mod
    builder = _get_builder(family)
    result = builder.build(config, problem)
    if not result.ok or result.artifact is None:
        tail = (result.error or "").strip().splitlines()
        raise KernelBuildError(
            f"{builder.family.title or family} config {config} (D={problem.shape.head_dim}, {problem.dtype}, "
            f"causal={problem.causal}) "
            f"did not build: {tail[-1] if tail else 'no compiler output'}",
            "choose another config (see `evotuner compile` for the full log)",
        )
    with torch.cuda.device(device):
        mod = KernelModule.load(result.artifact, device=device)
    _modules[key] = mod
    return mod


# --------------------------------------------------------------------------- the function


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    config: Mapping[str, int] | KernelConfig | str | None = None,
    layout: str = "bhsd",
    return_lse: bool = False,
    family: str | None = None,
    return_choice: bool = False,
) -> Any:
    """softmax(scale · Q Kᵀ [+ causal mask]) V with a tuned kernel (:func:`choose`).

    q: [B, H, Sq, D], k and v: [B, H, Sk, D] (layout "bhsd", SDPA's) or
    [B, S, H, D] (layout "bshd", FlashAttention's); fp16 or bf16 CUDA tensors
    on one device, last dim contiguous. ``causal`` masks top-left like SDPA's
    ``is_causal`` (query i sees keys 0..i). ``scale`` defaults to 1/sqrt(D).
    ``config`` picks kernel parameters (a mapping, a KernelConfig or
    "NAME=value,..."); None or missing keys take the kernel's recommended
    values for the head dim. ``family`` picks the kernel family (default:
    :func:`choose`). Returns the output in q's layout, with ``return_lse`` also
    the fp32 logsumexp [B, H, Sq] (natural log), and with ``return_choice`` the
    :class:`Choice` last.
    """
    if not isinstance(causal, bool):
        raise ShapeError(f"causal: expected a bool, got {type(causal).__name__}")
    qv, kv, vv, dtype = validate(q, k, v, layout=layout, scale=scale)
    B, H, Sq, D = qv.shape
    Sk = kv.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    device = q.device.index if q.device.index is not None else torch.cuda.current_device()
    problem = Problem(Shape(B, H, Sq, Sk, D), dtype, causal)
    choice = choose(problem, config, family)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    ov = out.transpose(1, 2) if layout == "bshd" else out
    views = {"q": _view(qv), "k": _view(kv), "v": _view(vv), "o": _view(ov)}
    why_not = get_family(choice.family).unsupported_views(views)
    if why_not:
        if family is not None:
            raise ShapeError(why_not, "make the tensors contiguous, or leave family=None to fall back")
        choice = choose(problem, config, None, exclude={choice.family: why_not})
    module = kernel_module(choice.config, problem, device, choice.family)
    lse = torch.empty(B, H, Sq, dtype=torch.float32, device=q.device) if return_lse else None
    with torch.cuda.device(device):
        module.launch(qv, kv, vv, ov, lse, scale)
    result = (out, lse) if return_lse else (out,)
    if return_choice:
        result = (*result, choice)
    return result if len(result) > 1 else result[0]
