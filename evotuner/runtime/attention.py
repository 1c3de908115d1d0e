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
current stream: in C++ (:mod:`evotuner.runtime.fastpath`, which the Python path registers
its plans with), else here, in Python. Under ``torch.compile`` the call is the custom op
``evotuner::flash_attention`` (registered at the end of this module).
"""

from __future__ import annotations

import ctypes
import math
import threading
from pathlib import Path
from typing import Any, Mapping

import torch

from evotuner.compiler import Builder
from evotuner.config import KernelConfig
from evotuner.defaults import (config_family, default_config, fastest_recommended, family_parameters,  # noqa: F401
                               parse_defaults, supported_head_dims)  # (public names)
from evotuner.errors import BuildError, EvotunerError, ShapeError
from evotuner.family import DEFAULT_FAMILY, get_family
from evotuner.problem import Problem, Shape
from evotuner.runtime import choice, cuda, fastpath
from evotuner.runtime.binder import POINTER_LIMIT, ArgBinder
from evotuner.runtime.choice import PARTIAL_NOTE, Choice, choose, resolve_config, served_tables  # noqa: F401 (public names)
from evotuner.runtime.inputs import ALIGN_BYTES, LAYOUTS, validate  # noqa: F401 (public names)
from evotuner.runtime.loader import KernelModule, tensor_view as _view
from evotuner.tuned import TunedTable


class KernelBuildError(BuildError):
    """The requested config did not compile (the message carries the compiler's reason)."""


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


def chosen_module(choice: Choice, problem: Problem, device: int) -> KernelModule:
    """:func:`kernel_module` for ``choice``; when a partial config fails to build, the error
    says that the keys it left out came from the problem's recommended config."""
    try:
        return kernel_module(choice.config, problem, device, choice.family)
    except KernelBuildError as exc:
        if not choice.partial:
            raise
        raise KernelBuildError(exc.message, f"{PARTIAL_NOTE}: name the ones that conflict too, or give "
                                            "every parameter") from exc


def use_tuned(source: str | Path | None = None, *, shipped: bool = True) -> TunedTable | None:
    """Serve tuned configs from ``source`` (:func:`evotuner.runtime.choice.use_tuned`, which
    says how) and forget the plans resolved with the tables before."""
    table = choice.use_tuned(source, shipped=shipped)
    forget_plans()
    return table


def forget_plans() -> None:
    """Forget every resolved plan, the Python path's and the C++ fast path's: the next call of
    each key resolves again (validation, choice, module)."""
    _plans.clear()
    fastpath.clear()


# --------------------------------------------------------------------------- the hot path

#: Plans kept in the process (each a few KB); past this the oldest go first.
MAX_PLANS = 1024
_plans: dict[tuple, "_Plan"] = {}
_device_names: dict[int, str] = {}


def device_name(index: int) -> str:
    """The GPU model name of device ``index`` (what tuned rows are keyed by), asked once."""
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
                 "binder", "args", "params", "geometry", "workspace", "workspaces", "lock", "launch",
                 "function", "config", "config_ref", "stream", "like_q", "sizes", "scratch", "scratches", "spec")

    def __init__(self, choice: Choice, module: KernelModule, q: torch.Tensor, layout: str, scale: float,
                 return_lse: bool, views: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
        self.choice = choice
        self.module = module
        self.spec: Any = None   # what the C++ hot path serves it from (fastpath.plan_spec), False: none
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
        self.workspace = module.family.workspace_bytes(module.meta)   # zeroed once: the kernel leaves it zero
        self.workspaces: dict[int, int] = {}                          # stream -> its workspace pointer
        self.sizes = (B, H, Sq, views[1].shape[2])
        self.scratch = module.family.scratch_bytes(module.meta, *self.sizes)   # zeroed once, reused
        self.scratches: dict[int, Any] = {}                           # stream -> its scratch buffer
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
    name = device_name(device)
    choice = choose(problem, config, family, device=name)
    ov = qv  # the output has q's shape; its strides are contiguous in q's layout
    views = {"q": _view(qv), "k": _view(kv), "v": _view(vv), "o": _view(ov)}
    why_not = get_family(choice.family).unsupported_views(views)
    if why_not:
        if family is not None or config is not None:
            raise ShapeError(why_not, "make the tensors contiguous, or leave family and config unset to fall back")
        choice = choose(problem, None, None, exclude={choice.family: why_not}, device=name)
    module = chosen_module(choice, problem, device)
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
    if key is not None:
        fastpath.publish(plan, _current_stream, q, k, v, causal, scale, config, layout, return_lse, family)
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
    "NAME=value,..."; its parameter names pick the family; a partial one changes only what
    it names of the config recommended for this problem); None serves the tuned
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
    native = fastpath.run
    if native is not None:   # the C++ hot path: the result, or None for the path below
        result = native(q, k, v, causal, scale, config, layout, return_lse, family, return_choice)
        if result is not None:
            return result
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
    native = fastpath.run
    result = native(q, k, v, causal, scale, config, layout, return_lse, family, False) if native is not None else None
    if result is not None:
        out, lse = result if return_lse else (result, None)
        return out, (lse if lse is not None else out.new_empty((0,), dtype=torch.float32))
    out, lse, _ = _forward(q, k, v, causal, scale, config, layout, return_lse, family)
    return out, (lse if lse is not None else out.new_empty((0,), dtype=torch.float32))


@_op.register_fake
def _op_fake(q, k, v, causal, scale, config, layout, return_lse, family):  # type: ignore[no-untyped-def]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if not return_lse:
        return out, q.new_empty((0,), dtype=torch.float32)
    B, H, Sq = (q.shape[0], q.shape[2], q.shape[1]) if layout == "bshd" else (q.shape[0], q.shape[1], q.shape[2])
    return out, q.new_empty((B, H, Sq), dtype=torch.float32)
