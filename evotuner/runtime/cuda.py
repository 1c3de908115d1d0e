"""A small ctypes binding to the CUDA driver API (``libcuda.so.1``).

Only what the kernel loader needs: load a cubin, look up its entry and its
family's meta table, raise the dynamic shared-memory limit, launch on a
stream. No torch headers are ever compiled; the driver shares torch's primary
context, so kernels launched here run on torch's streams and memory.

The library is opened lazily: importing this module on a machine without a
driver works; the first call that needs the driver raises
:class:`evotuner.errors.NoGpuError`.

Every driver call is checked; a failure becomes a :class:`CudaError` carrying
the numeric code, the driver's name for it (``CUDA_ERROR_ILLEGAL_ADDRESS``),
its description and the call that returned it.
"""

from __future__ import annotations

import ctypes
import threading
from ctypes import POINTER, byref, c_char_p, c_int, c_size_t, c_uint, c_uint64, c_void_p

from evotuner.errors import EvotunerError, NoGpuError

CUresult = c_int
CUdevice = c_int
CUdeviceptr = c_uint64
CUcontext = c_void_p
CUmodule = c_void_p
CUfunction = c_void_p
CUstream = c_void_p

# CUfunction_attribute (cuda.h)
FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0
FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1
FUNC_ATTRIBUTE_CONST_SIZE_BYTES = 2
FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3
FUNC_ATTRIBUTE_NUM_REGS = 4
FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8

# CUdevice_attribute (cuda.h)
DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97

#: Static shared memory a block may use without cuFuncSetAttribute.
DEFAULT_DYNAMIC_SMEM_LIMIT = 48 * 1024

#: Errors after which the context is corrupt: every later call in this process
#: fails the same way, so the process (the GPU worker) must be replaced.
STICKY_ERRORS = frozenset({
    "CUDA_ERROR_ILLEGAL_ADDRESS",
    "CUDA_ERROR_LAUNCH_TIMEOUT",
    "CUDA_ERROR_HARDWARE_STACK_ERROR",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_MISALIGNED_ADDRESS",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    "CUDA_ERROR_INVALID_PC",
    "CUDA_ERROR_LAUNCH_FAILED",
    "CUDA_ERROR_ECC_UNCORRECTABLE",
    "CUDA_ERROR_CONTEXT_IS_DESTROYED",
    "CUDA_ERROR_TENSOR_MEMORY_LEAK",
})


class CudaError(EvotunerError):
    """A CUDA driver call failed.

    ``code`` is the CUresult, ``name`` the driver's name for it, ``description``
    its text and ``call`` the function (and, where useful, the kernel) that
    returned it. :attr:`sticky` says whether the context is lost.
    """

    def __init__(self, code: int, name: str, description: str, call: str) -> None:
        self.code = code
        self.name = name
        self.description = description
        self.call = call
        remedy = (
            "the CUDA context is lost; restart the process" if name in STICKY_ERRORS else None
        )
        super().__init__(f"{call} failed: {name} ({code}): {description}", remedy)

    @property
    def sticky(self) -> bool:
        """True when the error corrupts the context (every later call fails)."""
        return self.name in STICKY_ERRORS

    @property
    def failure_kind(self) -> str:
        """The measure stage's failure kind for this error (see FAILURE_KINDS)."""
        if self.sticky:
            return "illegal_access"
        return "launch"


class LaunchConfig(ctypes.Structure):
    """CUlaunchConfig (cuda.h) for cuLaunchKernelEx: the geometry, the stream, no attributes."""

    _fields_ = [("gridDimX", c_uint), ("gridDimY", c_uint), ("gridDimZ", c_uint),
                ("blockDimX", c_uint), ("blockDimY", c_uint), ("blockDimZ", c_uint),
                ("sharedMemBytes", c_uint), ("hStream", c_void_p), ("attrs", c_void_p), ("numAttrs", c_uint)]


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_primary: dict[int, int] = {}  # device ordinal -> retained primary context handle


def _declare(lib: ctypes.CDLL) -> None:
    sig = {
        "cuInit": [c_uint],
        "cuDeviceGet": [POINTER(CUdevice), c_int],
        "cuDeviceGetAttribute": [POINTER(c_int), c_int, CUdevice],
        "cuDevicePrimaryCtxRetain": [POINTER(CUcontext), CUdevice],
        "cuCtxGetCurrent": [POINTER(CUcontext)],
        "cuCtxSetCurrent": [CUcontext],
        "cuCtxSynchronize": [],
        "cuModuleLoadData": [POINTER(CUmodule), c_void_p],
        "cuModuleUnload": [CUmodule],
        "cuModuleGetFunction": [POINTER(CUfunction), CUmodule, c_char_p],
        "cuModuleGetGlobal_v2": [POINTER(CUdeviceptr), POINTER(c_size_t), CUmodule, c_char_p],
        "cuMemcpyDtoH_v2": [c_void_p, CUdeviceptr, c_size_t],
        "cuFuncSetAttribute": [CUfunction, c_int, c_int],
        "cuFuncGetAttribute": [POINTER(c_int), c_int, CUfunction],
        "cuLaunchKernel": [CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint,
                           CUstream, POINTER(c_void_p), POINTER(c_void_p)],
        "cuStreamSynchronize": [CUstream],
        "cuLaunchKernelEx": [c_void_p, CUfunction, c_void_p, c_void_p],
        "cuMemsetD8Async": [CUdeviceptr, ctypes.c_ubyte, c_size_t, CUstream],
        "cuGetErrorName": [CUresult, POINTER(c_char_p)],
        "cuGetErrorString": [CUresult, POINTER(c_char_p)],
        "cuDriverGetVersion": [POINTER(c_int)],
    }
    for name, args in sig.items():
        fn = getattr(lib, name, None)
        if fn is None:      # a driver older than the call (cuLaunchKernelEx: CUDA 12.0)
            continue
        fn.argtypes = args
        fn.restype = CUresult


def driver() -> ctypes.CDLL:
    """The loaded, initialised driver library; NoGpuError when there is none."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
            except OSError as exc:
                raise NoGpuError(
                    f"CUDA driver: cannot load libcuda.so.1 ({exc})",
                    "run on a machine with an NVIDIA GPU and driver",
                ) from None
            _declare(lib)
            _check(lib, lib.cuInit(0), "cuInit")
            _lib = lib
    return _lib


def error_name(code: int) -> tuple[str, str]:
    """The driver's (name, description) for a CUresult."""
    lib = driver()
    name, text = c_char_p(), c_char_p()
    if lib.cuGetErrorName(code, byref(name)) != 0 or not name.value:
        return f"CUDA_ERROR_{code}", "unknown error code"
    lib.cuGetErrorString(code, byref(text))
    return name.value.decode(), (text.value or b"").decode()


def _check(lib: ctypes.CDLL, code: int, call: str) -> None:
    if code == 0:
        return
    raise CudaError(code, *error_name(code), call)


def check(code: int, call: str) -> None:
    """Raise CudaError when ``code`` (a CUresult) is not CUDA_SUCCESS."""
    _check(driver(), code, call)


def ensure_context(device: int) -> int:
    """Make ``device``'s primary context (the one torch uses) current on this thread.

    torch's runtime API works in the device's primary context; retaining it
    here (once per device, for the life of the process) and making it current
    lets modules loaded through the driver run on torch's streams and memory.
    Returns the context handle.
    """
    lib = driver()
    ctx = _primary.get(device)
    if ctx is None:
        with _lock:
            ctx = _primary.get(device)
            if ctx is None:
                dev = CUdevice()
                _check(lib, lib.cuDeviceGet(byref(dev), device), f"cuDeviceGet({device})")
                handle = CUcontext()
                _check(lib, lib.cuDevicePrimaryCtxRetain(byref(handle), dev),
                       f"cuDevicePrimaryCtxRetain({device})")
                ctx = _primary[device] = int(handle.value or 0)
    current = CUcontext()
    _check(lib, lib.cuCtxGetCurrent(byref(current)), "cuCtxGetCurrent")
    if (current.value or 0) != ctx:
        _check(lib, lib.cuCtxSetCurrent(CUcontext(ctx)), "cuCtxSetCurrent")
    return ctx


_current = threading.local()


def current_context() -> int:
    """The handle of the context current on this thread (0: none); one driver call."""
    holder = getattr(_current, "ctx", None)
    if holder is None:
        holder = _current.ctx = CUcontext()
        _current.ref = byref(holder)
        _current.fn = driver().cuCtxGetCurrent
    code = _current.fn(_current.ref)
    if code:
        check(code, "cuCtxGetCurrent")
    return holder.value or 0


def device_attribute(device: int, attribute: int) -> int:
    lib = driver()
    dev = CUdevice()
    _check(lib, lib.cuDeviceGet(byref(dev), device), f"cuDeviceGet({device})")
    value = c_int()
    _check(lib, lib.cuDeviceGetAttribute(byref(value), attribute, dev),
           f"cuDeviceGetAttribute({attribute})")
    return value.value


def driver_version() -> int:
    lib = driver()
    v = c_int()
    _check(lib, lib.cuDriverGetVersion(byref(v)), "cuDriverGetVersion")
    return v.value


def module_load_data(image: bytes) -> int:
    """Load a cubin image into the current context; returns the CUmodule handle."""
    lib = driver()
    buf = ctypes.create_string_buffer(image, len(image))
    mod = CUmodule()
    _check(lib, lib.cuModuleLoadData(byref(mod), ctypes.cast(buf, c_void_p)), "cuModuleLoadData")
    return int(mod.value or 0)


def module_unload(module: int) -> None:
    lib = driver()
    _check(lib, lib.cuModuleUnload(CUmodule(module)), "cuModuleUnload")


def module_get_function(module: int, name: str) -> int:
    lib = driver()
    fn = CUfunction()
    _check(lib, lib.cuModuleGetFunction(byref(fn), CUmodule(module), name.encode()),
           f"cuModuleGetFunction({name!r})")
    return int(fn.value or 0)


def module_get_global(module: int, name: str) -> tuple[int, int]:
    """(device pointer, size in bytes) of a ``__device__``/``__constant__`` symbol."""
    lib = driver()
    ptr, size = CUdeviceptr(), c_size_t()
    _check(lib, lib.cuModuleGetGlobal_v2(byref(ptr), byref(size), CUmodule(module), name.encode()),
           f"cuModuleGetGlobal({name!r})")
    return int(ptr.value), int(size.value)


def memcpy_dtoh(ptr: int, nbytes: int) -> bytes:
    lib = driver()
    buf = ctypes.create_string_buffer(nbytes)
    _check(lib, lib.cuMemcpyDtoH_v2(ctypes.cast(buf, c_void_p), CUdeviceptr(ptr), nbytes), "cuMemcpyDtoH")
    return buf.raw


def func_set_attribute(function: int, attribute: int, value: int, *, what: str = "") -> None:
    lib = driver()
    _check(lib, lib.cuFuncSetAttribute(CUfunction(function), attribute, value),
           f"cuFuncSetAttribute({what or attribute}={value})")


def func_get_attribute(function: int, attribute: int) -> int:
    lib = driver()
    value = c_int()
    _check(lib, lib.cuFuncGetAttribute(byref(value), attribute, CUfunction(function)),
           f"cuFuncGetAttribute({attribute})")
    return value.value


def launch_kernel(
    function: int,
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    shared_bytes: int,
    stream: int,
    args: ctypes.Structure | bytes | tuple[bytes | ctypes.Structure, ...],
    *,
    what: str = "cuLaunchKernel",
) -> None:
    """Launch ``function`` with its by-value kernel arguments, one entry each (a ctypes
    struct or its exact bytes, e.g. a ``__grid_constant__`` Params).

    The driver copies the argument bytes at launch, so ``args`` may be freed
    as soon as this returns.
    """
    lib = driver()
    items = args if isinstance(args, tuple) else (args,)
    buffers = [a if isinstance(a, ctypes.Structure) else ctypes.create_string_buffer(bytes(a), max(1, len(a)))
               for a in items]
    arg_ptrs = (c_void_p * len(buffers))(*[ctypes.addressof(b) for b in buffers])
    _check(
        lib,
        lib.cuLaunchKernel(CUfunction(function), grid[0], grid[1], grid[2], block[0], block[1], block[2],
                           shared_bytes, CUstream(stream or None), arg_ptrs, None),
        what,
    )


def memset_d8_async(ptr: int, value: int, nbytes: int, stream: int) -> None:
    """Set ``nbytes`` bytes at device ``ptr`` to ``value``, ordered on ``stream``."""
    lib = driver()
    _check(lib, lib.cuMemsetD8Async(CUdeviceptr(ptr), value, nbytes, CUstream(stream or None)), "cuMemsetD8Async")


def stream_synchronize(stream: int, *, what: str = "cuStreamSynchronize") -> None:
    """Wait for ``stream``; an asynchronous kernel fault is raised here as CudaError."""
    lib = driver()
    _check(lib, lib.cuStreamSynchronize(CUstream(stream or None)), what)
