"""The C++ hot path of :func:`evotuner.flash_attention` (``fastpath.cpp`` beside this file).

A call whose plan is known (same shapes, strides, dtypes, device and flags as an earlier call)
runs entirely in C++: the key, the plan look-up, the output's allocation, the pointers written
into a copy of the plan's argument bytes (the family's workspace, a tile counter, is this
stream's buffer, zeroed once: the kernel leaves it zero) and ``cuLaunchKernelEx`` on torch's
current stream. Everything else (a new key, a new stream, grad, odd pointers, a
tensor subclass, a flag such as an OrderedDict config) returns None there and takes the Python
path of :mod:`evotuner.runtime.attention`, unchanged; that path then registers its plan here
(:func:`publish`) under the key the C++ side computes itself from the same call, so the two
can never disagree about what a key holds.

**Build.** ``torch.utils.cpp_extension.load`` compiles the one source file (a host compiler and
ninja; no CUDA toolkit, no CUDA torch) in a child process, with a timeout, killed as a group on
timeout, into ``<build cache>/fastpath/<key>/`` (:func:`evotuner.compiler.cache.default_cache_root`),
``<key>`` a hash of the source, the torch version and build, and the Python ABI: a stale build
is never loaded. The first eager call of a process starts it: a build already in the cache is
loaded there and then (milliseconds); otherwise it compiles in the background (about 20 s
on 2 cores, once per torch version) while calls take the Python path, and they switch to C++ once
it loaded. :func:`build` builds and loads synchronously (``evotuner.runtime.build_fastpath``).

``$EVOTUNER_FASTPATH``: ``0``/``off`` never uses it; ``sync`` builds on the first call, blocking
it; unset or ``1``: in the background. Without a compiler (or on a timeout or a failed build) the
Python path serves every call and :func:`status` says why in one line (a failed build is
remembered in the cache and not retried until :func:`build` is called);
``$EVOTUNER_FASTPATH_DEBUG=1`` logs that line as a warning (logger ``evotuner.runtime.fastpath``).
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import importlib.util
import json
import logging
import os
import platform
import shutil
import sys
import sysconfig
import threading
import uuid
from pathlib import Path
from typing import Any, Callable

import torch

from evotuner import childproc
from evotuner.compiler.cache import default_cache_root
from evotuner.compiler.nvcc import find_nvcc
from evotuner.config import KernelConfig
from evotuner.errors import BuildError, EvotunerError
from evotuner.runtime import cuda

SOURCE = Path(__file__).with_name("fastpath.cpp")
#: Every file the build reads (the source includes the header beside it): all are in the build key.
SOURCES = (SOURCE, SOURCE.with_name("fastpath_table.h"))
ENV_VAR = "EVOTUNER_FASTPATH"
DEBUG_ENV = "EVOTUNER_FASTPATH_DEBUG"
#: The build compiles torch's ATen headers once (about 20 s on 2 cores); this is a guard.
BUILD_TIMEOUT_S = 600.0
#: Bumped when the build's recipe (not the source, which is hashed) changes.
FORMAT = 1
_ROLES = ("q", "k", "v", "o", "lse", "workspace", "scratch")
_M64 = (1 << 64) - 1

log = logging.getLogger(__name__)

#: The C++ ``run`` once loaded (what flash_attention calls first), else None.
run: Callable[..., Any] | None = None

_lock = threading.Lock()
_native: Any = None
_state = "not started"          # one line: what the fast path is doing or why it is off
_started = False
_child: Any = None              # the build's child process while one runs
_checked_devices: set[int] = set()


def status() -> str:
    """One line: ``on (<module path>)``, ``building ...``, ``off: ...`` or ``unavailable: <why>``."""
    return _state


def mode() -> str:
    """``off``, ``sync`` or ``background`` from ``$EVOTUNER_FASTPATH``."""
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value in ("0", "off", "false", "no"):
        return "off"
    if value not in ("", "1", "on", "true", "yes", "background", "sync"):
        log.warning("$%s=%r is not one of 0/off, sync, 1/on: the fast path starts as if unset (in the "
                       "background)", ENV_VAR, os.environ.get(ENV_VAR))
    return "sync" if value == "sync" else "background"


def build_key() -> str:
    """sha256 of the source, the torch build and the Python ABI (what makes a build loadable)."""
    h = hashlib.sha256()
    for part in (*(p.read_bytes() for p in SOURCES), torch.__version__, str(torch.version.cuda),
                 str(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", "")), sys.implementation.cache_tag,
                 str(sysconfig.get_config_var("EXT_SUFFIX")), platform.machine(), str(FORMAT)):
        h.update(part if isinstance(part, bytes) else part.encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


def build_dir(root: Path | None = None) -> Path:
    """``<build cache>/fastpath/<build key>``: where the module is (or will be) built."""
    return (root if root is not None else default_cache_root()) / "fastpath" / build_key()


def _module_name(key: str) -> str:
    return f"evotuner_fastpath_{key}"


def _set(state: str, *, level: int = logging.INFO) -> None:
    global _state
    _state = state
    log.log(logging.WARNING if os.environ.get(DEBUG_ENV) else level, "evotuner fast path: %s", state)


def start() -> None:
    """Start the fast path as ``$EVOTUNER_FASTPATH`` says (once per process; the first eager
    call does it): load a cached build, else build it in the background (or, with ``sync``,
    here). Never raises."""
    global _started
    if _started:
        return
    with _lock:
        if _started:
            return
        _started = True
    how = mode()
    if how == "off":
        _set(f"off: ${ENV_VAR}={os.environ.get(ENV_VAR)}")
        return
    try:
        where = build_dir()
    except EvotunerError as exc:
        _set(f"unavailable: {exc}")
        return
    if _load(where) or _known_failure(where):
        return
    if how == "sync":
        build()
        return
    _set(f"building in the background into {where} (once per torch version, about 20 s on 2 cores); "
         "calls take the Python path until it is ready")
    threading.Thread(target=build, name="evotuner-fastpath-build", daemon=True).start()


def build(timeout_s: float = BUILD_TIMEOUT_S, root: Path | None = None) -> str:
    """Build (unless cached) and load the fast path now, retrying a remembered failure; returns
    :func:`status`. ``$EVOTUNER_FASTPATH=0`` still keeps it off."""
    global _started
    _started = True
    if mode() == "off":
        _set(f"off: ${ENV_VAR}={os.environ.get(ENV_VAR)}")
        return _state
    try:
        where = build_dir(root)
        if _load(where):
            return _state
        why = _compile(where, timeout_s)
    except (EvotunerError, OSError) as exc:
        why = f"{exc}"
    if why is None and _load(where):
        return _state
    _set(f"unavailable: {why or 'the built module did not load'}")
    return _state


def _known_failure(where: Path) -> bool:
    failed = where.with_name(where.name + ".failed")
    try:
        why = failed.read_text().strip()
    except OSError:
        return False
    _set(f"unavailable: {why} (remembered in {failed}; evotuner.runtime.build_fastpath() retries)")
    return True


_STEP = r"""
import json, os, sys
from torch.utils import cpp_extension
a = json.loads(sys.argv[1])
cpp_extension.load(name=a["name"], sources=[a["source"]], build_directory=a["dir"], extra_include_paths=a["includes"],
                   extra_cflags=["-O2", "-DEVOTUNER_BUILD_KEY=" + a["key"]], with_cuda=False, verbose=False,
                   is_python_module=True)
"""


def _compile(where: Path, timeout_s: float) -> str | None:
    """Build into a fresh folder beside ``where`` and publish it with one rename; None on
    success, else one line why (a compile error is remembered in ``<where>.failed``)."""
    global _child
    if shutil.which("ninja") is None and importlib.util.find_spec("ninja") is None:
        return "ninja is not installed (pip install ninja)"
    key = where.name
    tmp = where.parent / f"tmp-{uuid.uuid4().hex[:12]}"
    tmp.mkdir(parents=True)
    args = {"name": _module_name(key), "source": str(SOURCE), "dir": str(tmp), "key": key,
            "includes": _cuda_includes()}
    try:
        proc = childproc.start([sys.executable, "-c", _STEP, json.dumps(args)], cwd=tmp)
        _child = proc
        outcome = childproc.collect(proc, timeout_s)
    finally:
        _child = None
    if outcome.timed_out:
        shutil.rmtree(tmp, ignore_errors=True)
        return f"the build timed out after {timeout_s:g} s (evotuner.runtime.build_fastpath(timeout_s=...) retries)"
    if outcome.returncode != 0 or not (tmp / f"{args['name']}.so").is_file():
        lines = [ln.strip() for ln in outcome.output.decode(errors="replace").splitlines() if ln.strip()]
        errors = [ln for ln in lines if "error" in ln.lower()] or lines
        why = f"the C++ build failed: {' | '.join(errors[-3:])[:400] or 'no output'}"
        shutil.rmtree(tmp, ignore_errors=True)
        where.with_name(where.name + ".failed").write_text(why + "\n")
        return why
    try:
        os.rename(tmp, where)
    except OSError:              # another process published the same key first: use theirs
        shutil.rmtree(tmp, ignore_errors=True)
    where.with_name(where.name + ".failed").unlink(missing_ok=True)   # a retry that succeeded
    return None


def _cuda_includes() -> list[str]:
    """The CUDA toolkit's include folder when there is one (cuda.h checks the mirrored
    CUlaunchConfig's layout at compile time; the build needs no CUDA otherwise)."""
    homes = [os.environ.get(v, "") for v in ("CUDA_HOME", "CUDA_PATH")]
    try:
        homes.append(str(find_nvcc().resolve().parent.parent))
    except BuildError:
        pass
    homes.append("/usr/local/cuda")
    for home in filter(None, homes):
        if (Path(home) / "include" / "cuda.h").is_file():
            return [str(Path(home) / "include")]
    return []


def _load(where: Path) -> bool:
    """Load the module built in ``where`` (if there is one) and switch the calls to it."""
    global _native, run
    if _native is not None:
        return True
    name = _module_name(where.name)
    so = where / f"{name}.so"
    if not so.is_file():
        return False
    try:
        spec = importlib.util.spec_from_file_location(name, so)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {so}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except ImportError as exc:
        _set(f"unavailable: {so} does not load ({exc}); delete {where} to rebuild it")
        return True
    if getattr(module, "BUILD_KEY", None) != where.name:
        _set(f"unavailable: {so} was built from another source (build key {getattr(module, 'BUILD_KEY', None)}); "
             f"delete {where} to rebuild it")
        return True
    module.configure(KernelConfig, _launch_failed)
    with _lock:
        _native = module
        run = module.run
    _set(f"on ({so})")
    return True


def disable(why: str) -> None:
    """Turn the fast path off for this process (the Python path serves every call)."""
    global run, _native
    with _lock:
        run = None
        native, _native = _native, None
    if native is not None:
        native.clear()
    _set(f"unavailable: {why}")


def clear() -> None:
    """Forget every registered plan (evotuner.use_tuned does, with the Python plans)."""
    native = _native
    if native is not None:
        native.clear()


def native() -> Any:
    """The loaded C++ module (its ``key``, ``bind``, ``counts``: the tests'), or None."""
    return _native


def _launch_failed(code: int, plan: Any) -> None:
    """Raise the launch error the Python path would (the C++ side calls it with the CUresult)."""
    cuda.check(code, f"cuLaunchKernel({plan.module.entry} from {plan.module.source})")


def plan_spec(plan: Any) -> tuple | None:
    """What the C++ table needs of a resolved plan (:class:`evotuner.runtime.attention._Plan`),
    or None where it cannot serve it (no binder, pointer roles in another order)."""
    binder = plan.binder
    if binder is None:
        return None
    roles = tuple(r for r in _ROLES if r in binder.roles)
    if binder.roles != roles or binder.roles[:4] != _ROLES[:4] or ("lse" in roles) != (plan.lse_shape is not None) \
            or ("workspace" in roles) != bool(plan.workspace) or ("scratch" in roles) != bool(plan.scratch):
        return None
    lib = cuda.driver()
    fields = tuple((f.offset, f.width, f.shift, f.keep & _M64, f.keep >> 64, f.slot) for f in binder.fields)
    return (bytes(binder.template), fields, plan.lse_shape is not None, bool(plan.workspace), bool(plan.scratch),
            tuple(plan.geometry), int(plan.function.value or 0), _address(lib.cuLaunchKernelEx), tuple(plan.out_shape),
            tuple(plan.lse_shape) if plan.lse_shape is not None else None, plan, plan.choice)


def _address(fn: Any) -> int:
    return int(ctypes.cast(fn, ctypes.c_void_p).value or 0)


def publish(plan: Any, current_stream: Callable[[int], int], q: Any, k: Any, v: Any, causal: Any, scale: Any,
            config: Any, layout: Any, return_lse: Any, family: Any) -> None:
    """Register ``plan`` (just run by the Python path on ``current_stream(plan.device)``) for
    calls like this one; starts the fast path on the first call of the process (``$EVOTUNER_FASTPATH``
    is read then, once). Never raises for the fast path's sake; costs one check while the fast
    path is off or not loaded yet."""
    if not _started:
        start()
    native = _native
    if native is None or plan.spec is False:
        return
    stream = current_stream(plan.device)
    if plan.spec is None:
        plan.spec = plan_spec(plan) or False
        if plan.spec is False:
            return
    if plan.device not in _checked_devices and not _check_stream(native, plan.device, stream):
        return
    sc = plan.scratches.get(stream) if plan.scratch else None
    native.register(q, k, v, causal, scale, config, layout, return_lse, family, plan.spec, stream,
                    plan.workspaces.get(stream, 0) if plan.workspace else 0, sc.data_ptr() if sc is not None else 0)


def _check_stream(native: Any, device: int, stream: int) -> bool:
    """Once per device: the C++ side sees torch's current stream as Python does, else the fast
    path goes off (a torch whose c10 stream interface differs)."""
    try:
        seen = native.stream(device)
    except RuntimeError as exc:
        disable(f"torch's current stream is not readable from C++ ({exc})")
        return False
    if seen != stream:
        disable(f"torch's current stream seen from C++ ({seen:#x}) differs from Python's ({stream:#x})")
        return False
    _checked_devices.add(device)
    return True


@atexit.register
def _stop_build() -> None:
    """A background build still running at exit is killed with its process group."""
    proc = _child
    if proc is not None:
        childproc.kill_group(proc)
