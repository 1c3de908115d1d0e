"""``evotuner.flash_attention``: the tuned attention kernels as a function on torch tensors.

Which kernel runs (:func:`choose`): with a ``config``, the family its parameter names
belong to (or ``family``); else the tuned table's row for the problem on this GPU model
(:func:`use_tuned`, ``$EVOTUNER_TUNED``, then the tables the package ships: see
:mod:`evotuner.tuned`); else, of the registered families that support the problem and
recommend a config for it, the one whose recommended config is fastest by its own
measured figure (:meth:`KernelFamily.expected_speed`). The returned :class:`Choice` says
which and why (``flash_attention(..., return_choice=True)``).

The first call for a plan key (shapes, strides, dtypes, devices, causal, scale, config,
layout, lse, family) validates, chooses, builds the cubin through
:class:`evotuner.compiler.Builder` (cached on disk by content), loads it through the
driver and derives a :class:`_Plan`: the launch geometry and the kernel's argument bytes
with the places of the pointers in them. A later call with the same key allocates the
output, checks the pointers' alignment, writes them into the bytes and launches on torch's
current stream: a few µs of host time. Under ``torch.compile`` the call is the custom op
``evotuner::flash_attention`` (registered at the end of this module).
"""

from __future__ import annotations

import ctypes
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from evotuner.compiler import Builder
from evotuner.config import KernelConfig
from evotuner.defaults import (config_family, default_config, fastest_recommended, family_parameters,  # noqa: F401
                               parse_defaults, supported_head_dims)  # (public names)
from evotuner.errors import BuildError, EvotunerError, ShapeError, SpaceError
from evotuner.family import DEFAULT_FAMILY, KernelFamily, families, get_family
from evotuner.problem import HEAD_DIMS, Problem, Shape
from evotuner.runtime import cuda
from evotuner.runtime.binder import POINTER_LIMIT, ArgBinder
from evotuner.runtime.loader import KernelModule, tensor_view as _view
from evotuner.tuned import ENV_VAR as TUNED_ENV_VAR
from evotuner.tuned import TunedTable, shipped_tables
from evotuner.tuned import from_environment as tuned_from_environment
from evotuner.tuned import load as load_tuned

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
           family: str | None = None, exclude: Mapping[str, str] | None = None, *,
           device: str | None = None, tables: Sequence[TunedTable] | None = None) -> Choice:
    """The family and config :func:`flash_attention` runs for ``problem`` (see the module docstring);
    ``exclude``: {family: why} families the automatic choice must pass over; ``device``: the GPU
    model whose tuned rows apply; ``tables``: the tuned tables to serve from (default: the
    ones :func:`use_tuned` and ``$EVOTUNER_TUNED`` set, then the shipped ones)."""
    if config is not None:
        fam = get_family(family) if family is not None else config_family(config)
        why_not = fam.unsupported(problem)
        if why_not:
            raise ShapeError(f"q: {why_not}", f"use one of {', '.join(map(str, fam.head_dims))}")
        cfg = resolve_config(config, problem.shape.head_dim, problem.dtype, problem.causal, family=fam.name)
        return Choice(fam.name, cfg, "asked for" if family is not None else
                      f"config given (its parameters are the {fam.name} family's)")
    if family is not None:
        fam = get_family(family)
        why_not = fam.unsupported(problem)
        if why_not:
            raise ShapeError(f"q: {why_not}", f"use one of {', '.join(map(str, fam.head_dims))}")
    usable = [f for f in families() if (family is None or f.name == family)
              and not (exclude or {}).get(f.name) and not f.unsupported(problem)]
    active = served_tables() if tables is None else tuple(tables)
    if device is not None:
        for table in active:
            for fam in usable:
                pick = table.pick(problem, device, fam.name)
                if pick is not None:
                    return Choice(fam.name, pick.row.config, pick.why)
    base = _recommended(problem, family, exclude)
    user = [t for t in active if not t.shipped]
    if device is not None and user:
        return Choice(base.family, base.config, f"{base.why}; {user[0].nearest_note(problem, device, family)}")
    return base


def _recommended(problem: Problem, family: str | None, exclude: Mapping[str, str] | None) -> Choice:
    """The recommended config of ``family``, else of the fastest family by its own figure."""
    if family is not None:
        fam = get_family(family)
        picked = fam.recommended_configs(problem)
        cfg = picked[0] if picked else resolve_config(None, problem.shape.head_dim, problem.dtype, problem.causal,
                                                      family=fam.name)
        return Choice(fam.name, cfg, "asked for")
    fam, cfg, why = fastest_recommended(problem, exclude)
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
        if name not in known and name not in fam.optional_params:
            try:
                other = config_family(given).name      # the family these parameters are of, if one
            except SpaceError:
                other = None
            hint = f"; they are the {other} family's: pass family={other!r}" if other and other != fam.name else ""
            raise SpaceError(f"config: unknown kernel parameter {name} for the {fam.name} family",
                             f"{fam.title or fam.name} takes {', '.join(sorted({*known, *fam.optional_params}))}{hint}")
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
    """The loaded KernelModule for (device, family, config, D, dtype, causal, varlen), built on first use."""
    key = (device, family, config, problem.shape.head_dim, problem.dtype, problem.causal, problem.varlen)
    mod = _modules.get(key)
    if mod is not None:
        return mod
    builder = _get_builder(family)
    result = builder.build(config, problem)
    if not result.ok or result.artifact is None:
        lines = (result.error or "").strip().splitlines()
        tail = [line.strip() for line in lines if "error" in line.lower()][:1] or lines[-1:]
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


# --------------------------------------------------------------------------- tuned tables

_tables_lock = threading.Lock()
_tables: tuple[TunedTable, ...] | None = None   # None: not read yet


def use_tuned(source: str | Path | None = None, *, shipped: bool = True) -> TunedTable | None:
    """Serve tuned configs from ``source``: a study database (``"sqlite:///studies.db"``, a
    PostgreSQL URL, or a SQLite file's path) or a header written by ``evotuner export``.

    The table is read once, here; later calls of :func:`flash_attention` look problems up in
    it (:meth:`evotuner.tuned.TunedTable.pick`): the row of the same GPU model, family, head
    dim, dtype and causal flag in the problem's size bucket, else the nearest tuned size,
    else the shipped table's row (``shipped``), else the recommended config.
    ``return_choice=True`` says which and why. ``source=None`` goes back to the default:
    ``$EVOTUNER_TUNED`` when set, and the shipped tables. Returns the table read (None for
    the default)."""
    global _tables
    table = load_tuned(source) if source is not None else None
    defaults = _shipped() if shipped else ()
    with _tables_lock:
        _tables = ((table,) + defaults) if table is not None else None
        _plans.clear()
    return table


def served_tables() -> tuple[TunedTable, ...]:
    """The tuned tables :func:`flash_attention` serves from, in order (read on first use)."""
    global _tables
    tables = _tables
    if tables is None:
        with _tables_lock:
            if _tables is None:
                env = tuned_from_environment()
                try:
                    user = (load_tuned(env),) if env else ()
                except EvotunerError as exc:
                    raise type(exc)(f"${TUNED_ENV_VAR}: {exc.message}",
                                    exc.remedy or f"fix or unset {TUNED_ENV_VAR}") from None
                _tables = user + _shipped()
            tables = _tables
    return tables


def _shipped() -> tuple[TunedTable, ...]:
    """The families' shipped tables, read once per process (use_tuned resets only the user's)."""
    global _shipped_tables
    if _shipped_tables is None:
        _shipped_tables = tuple(load_tuned(path) for path in shipped_tables(families()))
    return _shipped_tables


_shipped_tables: tuple[TunedTable, ...] | None = None


# --------------------------------------------------------------------------- the hot path

#: Plans kept in the process (each a few KB); past this the oldest go first.
MAX_PLANS = 1024
_plans: dict[tuple, "_Plan"] = {}
_device_names: dict[int, str] = {}


def _device_name(index: int) -> str:
    name = _device_names.get(index)
    if name is None:
        name = _device_names[index] = torch.cuda.get_device_name(index)
    return name


class _Plan:
    """Everything one call needs that depends only on the plan key (shapes, strides, dtypes,
    devices, causal, scale, layout, lse, family, config): the resolved choice, the loaded
    kernel, the launch geometry and the argument bytes with their pointer fields
    (:class:`~evotuner.runtime.binder.ArgBinder`). A call through a plan allocates the
    output, checks the pointers' alignment, writes them into the bytes and launches."""

    __slots__ = ("choice", "module", "device", "torch_device", "dtype", "out_shape", "lse_shape", "layout", "scale",
                 "binder", "args", "params", "geometry", "workspace", "workspaces", "lock", "launch", "memset",
                 "function", "config", "config_ref", "stream", "like_q", "sizes", "scratch", "scratches")

    def __init__(self, choice: Choice, module: KernelModule, q: torch.Tensor, layout: str, scale: float,
                 return_lse: bool, views: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
        self.choice = choice
        self.module = module
        self.device = module.device
        self.torch_device = q.device
        self.dtype = q.dtype
        self.out_shape = tuple(q.shape)
        self.layout = layout
        self.scale = scale
        B, H, Sq, _ = views[0].shape
        self.lse_shape = (B, H, Sq) if return_lse else None
        self.lock = threading.Lock()
        cuda.ensure_context(self.device)
        self.workspace = module.family.workspace_bytes(module.meta)   # bytes zeroed before each launch
        self.workspaces: dict[int, int] = {}                          # stream -> its workspace pointer
        self.sizes = (B, H, Sq, views[1].shape[2])
        self.scratch = module.family.scratch_bytes(module.meta, *self.sizes)   # zeroed once, reused
        self.scratches: dict[int, Any] = {}                           # stream -> its scratch buffer
        self.memset = cuda.driver().cuMemsetD8Async
        self.function = ctypes.c_void_p(module.function)
        # q contiguous: empty_like(q) is the output (contiguous in q's layout), and the cheapest allocation
        self.like_q = q.is_contiguous()
        # Derive the pointer fields on scratch tensors of the call's own shapes and strides.
        out = torch.empty(self.out_shape, dtype=self.dtype, device=q.device)
        lse = torch.empty(self.lse_shape, dtype=torch.float32, device=q.device) if return_lse else None
        ov = out.transpose(1, 2) if layout == "bshd" else out
        qv, kv, vv = views

        def make(ptrs: Mapping[str, int]) -> bytes:
            spec = module.launch_spec(_at(qv, ptrs["q"]), _at(kv, ptrs["k"]), _at(vv, ptrs["v"]), _at(ov, ptrs["o"]),
                                      _at(lse, ptrs["lse"]) if lse is not None else None, scale,
                                      ptrs.get("workspace", 0), ptrs.get("scratch", 0))
            if len(spec.args) != 1:
                raise _NoBinder()
            return spec.args[0]

        ptrs = {"q": qv.data_ptr(), "k": kv.data_ptr(), "v": vv.data_ptr(), "o": ov.data_ptr()}
        if lse is not None:
            ptrs["lse"] = lse.data_ptr()
        if self.workspace:
            ptrs["workspace"] = 1 << 40
        if self.scratch:
            ptrs["scratch"] = 1 << 41
        spec = module.launch_spec(qv, kv, vv, ov, lse, scale, ptrs.get("workspace", 0), ptrs.get("scratch", 0))
        self.geometry = (*spec.grid, *spec.block, spec.smem_bytes)
        # cuLaunchKernelEx with a prebuilt CUlaunchConfig: 4 arguments for ctypes to pass, not 11
        self.config = cuda.LaunchConfig(*self.geometry, None, None, 0)
        self.config_ref = ctypes.byref(self.config)
        self.stream: int | None = None
        self.launch = cuda.driver().cuLaunchKernelEx
        try:
            self.binder = ArgBinder.derive(make, ptrs) if len(spec.args) == 1 else None
        except (_NoBinder, EvotunerError):
            self.binder = None
        if self.binder is not None:
            self.args = ctypes.create_string_buffer(self.binder.template, len(self.binder.template))
            self.params = (ctypes.c_void_p * 1)(ctypes.addressof(self.args))

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        out = torch.empty_like(q) if self.like_q else q.new_empty(self.out_shape)
        lse = q.new_empty(self.lse_shape, dtype=torch.float32) if self.lse_shape is not None else None
        if self.binder is None:
            return self._run_slow(q, k, v, out, lse)
        pq, pk, pv, po = q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()
        if (pq | pk | pv | po) & 15 or max(pq, pk, pv, po) >= POINTER_LIMIT or not (pq and pk and pv):
            return self._run_slow(q, k, v, out, lse)
        ptrs = (pq, pk, pv, po) if lse is None else (pq, pk, pv, po, lse.data_ptr())
        stream = _current_stream(self.device)
        with self.lock:
            if self.workspace:
                ws = self.workspaces.get(stream)
                if ws is None:
                    ws = self._workspace_for(stream)
                if self.memset(ws, 0, self.workspace, stream):
                    return self._run_slow(q, k, v, out, lse)
                ptrs = (*ptrs, ws)
            if self.scratch:
                sc = self.scratches.get(stream)
                if sc is None:   # the buffer itself is kept: the module may let its reference go
                    sc = self.scratches[stream] = self.module.scratch_buffer(stream, *self.sizes)
                ptrs = (*ptrs, sc.data_ptr())
            self.binder.bind_into(self.args, ptrs)
            if stream != self.stream:
                self.config.hStream = self.stream = stream
            code = self.launch(self.config_ref, self.function, self.params, None)
        if code:
            # Another context is current (a call from a thread or device scope torch has not
            # set to this device): the launch is refused, nothing ran; the slow path sets it.
            if code in _WRONG_CONTEXT:
                return self._run_slow(q, k, v, out, lse)
            cuda.check(code, f"cuLaunchKernel({self.module.entry} from {self.module.source})")
        return out, lse

    def _workspace_for(self, stream: int) -> int:
        """This plan's zero-initialised workspace for ``stream`` (the module keeps it)."""
        ptr = self.module.zeroed_workspace(stream)
        self.workspaces[stream] = ptr
        return ptr

    def _run_slow(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                  lse: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The same launch with the argument bytes built by the family (no binder, odd pointers,
        or another current context)."""
        t = (lambda x: x.transpose(1, 2)) if self.layout == "bshd" else (lambda x: x)
        for name, x in (("q", q), ("k", k), ("v", v)):
            if x.data_ptr() % ALIGN_BYTES:
                raise ShapeError(f"{name}: data pointer is not {ALIGN_BYTES}-byte aligned", f"pass {name}.clone()")
        with torch.cuda.device(self.device):
            self.module.launch(t(q), t(k), t(v), t(out), lse, self.scale)
        return out, lse


def forward_only_error() -> ShapeError:
    """The refusal of inputs that require grad (no backward kernel: the output would silently
    stop the gradient)."""
    return ShapeError("q/k/v: requires grad, but evotuner.flash_attention is forward-only (no backward kernel)",
                      "call it under torch.no_grad() / torch.inference_mode(), or detach() the inputs")

#: cuLaunchKernel's answers when the current context is not the plan's device's (nothing ran).
_WRONG_CONTEXT = frozenset({201, 400})   # CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_HANDLE


class _NoBinder(Exception):
    """The family's launch has more than one argument: no binder, bytes built per call."""


def _at(t: torch.Tensor, ptr: int) -> torch.Tensor:
    """A stand-in with ``t``'s shape and strides at device address ``ptr`` (for deriving the
    binder: only its pointer, shape and strides are read, never its memory)."""
    return _PointerView(ptr, tuple(t.shape), tuple(t.stride()))


class _PointerView:
    """Duck-types the few tensor methods KernelModule.launch_spec reads."""

    __slots__ = ("_ptr", "shape", "_strides")

    def __init__(self, ptr: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> None:
        self._ptr, self.shape, self._strides = ptr, shape, strides

    def data_ptr(self) -> int:
        return self._ptr

    def stride(self) -> tuple[int, ...]:
        return self._strides


def _current_stream(device: int) -> int:
    return torch.cuda.current_stream(device).cuda_stream


if hasattr(torch._C, "_cuda_getCurrentRawStream"):
    def _current_stream(device: int) -> int:  # noqa: F811 - the fast form where torch has it
        return torch._C._cuda_getCurrentRawStream(device)


def _plan_key(q: Any, k: Any, v: Any, causal: Any, scale: Any, config: Any, layout: Any, return_lse: Any,
              family: Any) -> tuple | None:
    """The plan key of a call, or None where the call must take the full path (not tensors,
    a causal flag that is not a bool, a config of unhashable values)."""
    if causal is not True and causal is not False:
        return None
    if isinstance(config, Mapping):
        try:
            config = ("mapping", tuple(sorted((str(k).upper(), v) for k, v in config.items())))
            hash(config)
        except TypeError:
            return None
    elif config is not None and not isinstance(config, (str, KernelConfig)):
        return None
    try:
        return (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype,
                q.device, k.device, v.device, causal, scale, config, layout, return_lse, family)
    except (AttributeError, TypeError):
        return None


def _resolve(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None,
             config: Any, layout: str, return_lse: bool, family: str | None) -> _Plan:
    """The full path: validate, choose, build and load, derive the plan."""
    if not isinstance(causal, bool):
        raise ShapeError(f"causal: expected a bool, got {type(causal).__name__}")
    qv, kv, vv, dtype = validate(q, k, v, layout=layout, scale=scale)
    B, H, Sq, D = qv.shape
    Sk = kv.shape[2]
    scale_value = 1.0 / math.sqrt(D) if scale is None else float(scale)
    device = q.device.index if q.device.index is not None else torch.cuda.current_device()
    problem = Problem(Shape(B, H, Sq, Sk, D, kv.shape[1]), dtype, causal)
    name = _device_name(device)
    choice = choose(problem, config, family, device=name)
    ov = qv  # the output has q's shape; its strides are contiguous in q's layout
    views = {"q": _view(qv), "k": _view(kv), "v": _view(vv), "o": _view(ov)}
    why_not = get_family(choice.family).unsupported_views(views)
    if why_not:
        if family is not None or config is not None:
            raise ShapeError(why_not, "make the tensors contiguous, or leave family and config unset to fall back")
        choice = choose(problem, None, None, exclude={choice.family: why_not}, device=name)
    module = kernel_module(choice.config, problem, device, choice.family)
    with torch.cuda.device(device):
        return _Plan(choice, module, q, layout, scale_value, return_lse, (qv, kv, vv))


def _remember(key: tuple | None, plan: _Plan) -> None:
    """Keep ``plan`` for ``key`` (the oldest plan goes past MAX_PLANS); misses are rare, so a
    lock here costs the hot path nothing."""
    if key is None:
        return
    with _lock:
        while len(_plans) >= MAX_PLANS:
            _plans.pop(next(iter(_plans)), None)
        _plans[key] = plan


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None, config: Any,
             layout: str, return_lse: bool, family: str | None) -> tuple[torch.Tensor, torch.Tensor | None, Choice]:
    key = _plan_key(q, k, v, causal, scale, config, layout, return_lse, family)
    plan = _plans.get(key) if key is not None else None
    if plan is None:
        plan = _resolve(q, k, v, causal, scale, config, layout, return_lse, family)
        _remember(key, plan)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise forward_only_error()
    out, lse = plan.run(q, k, v)
    return out, lse, plan.choice


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
    "NAME=value,..."; its parameter names pick the family); None serves the tuned
    table's config (:func:`use_tuned`), else the recommended one. ``family`` picks the
    kernel family. Returns the output in q's layout, with ``return_lse`` also the fp32
    logsumexp [B, H, Sq] (natural log), and with ``return_choice`` the :class:`Choice` last.

    Forward only: inputs that require grad (with grad mode on) are refused. The first call
    of a (shapes, strides, dtypes, devices, causal, scale, config, layout, family) resolves
    everything once; later calls only allocate the output and launch. Under
    ``torch.compile`` the call is the custom op ``evotuner::flash_attention``.
    """
    if torch.compiler.is_compiling():
        return _compiled(q, k, v, causal, scale, config, layout, return_lse, family, return_choice)
    out, lse, choice = _forward(q, k, v, causal, scale, config, layout, return_lse, family)
    if return_choice:
        return (out, lse, choice) if return_lse else (out, choice)
    return (out, lse) if return_lse else out


def _compiled(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None, config: Any,
              layout: str, return_lse: bool, family: str | None, return_choice: bool) -> Any:
    """What :func:`flash_attention` is under torch.compile: one node, the custom op."""
    if return_choice:
        raise ShapeError("return_choice: not available under torch.compile",
                         "call evotuner.flash_attention(..., return_choice=True) eagerly to see the choice")
    if config is not None and not isinstance(config, str):
        raise ShapeError("config: under torch.compile give it as a 'NAME=value,...' string",
                         "e.g. config=str(kernel_config)")
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise forward_only_error()
    out, lse = torch.ops.evotuner.flash_attention(q, k, v, causal, scale, config, layout, return_lse, family)
    return (out, lse) if return_lse else out


# --------------------------------------------------------------------------- torch.library
#
# torch.compile sees flash_attention as this one op (the public function calls it while it
# is being compiled), so a model that calls it compiles with no graph break; the fake
# implementation gives the outputs' shapes without running anything. Eager calls skip the
# dispatcher and run _forward directly, which keeps them at a few µs of host time. The op
# returns (out, lse); lse is an empty fp32 tensor when return_lse is false (an op's outputs
# are tensors, never None). The schema is given, not inferred from the annotations.

OP_SCHEMA = ("(Tensor q, Tensor k, Tensor v, bool causal, float? scale, str? config, str layout, bool return_lse, "
             "str? family) -> (Tensor, Tensor)")


@torch.library.custom_op("evotuner::flash_attention", mutates_args=(), device_types="cuda", schema=OP_SCHEMA)
def _op(q, k, v, causal, scale, config, layout, return_lse, family):  # type: ignore[no-untyped-def]
    out, lse, _ = _forward(q, k, v, causal, scale, config, layout, return_lse, family)
    return out, (lse if lse is not None else out.new_empty((0,), dtype=torch.float32))


@_op.register_fake
def _op_fake(q, k, v, causal, scale, config, layout, return_lse, family):  # type: ignore[no-untyped-def]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if not return_lse:
        return out, q.new_empty((0,), dtype=torch.float32)
    B, H, Sq = (q.shape[0], q.shape[2], q.shape[1]) if layout == "bshd" else (q.shape[0], q.shape[1], q.shape[2])
    return out, q.new_empty((B, H, Sq), dtype=torch.float32)
