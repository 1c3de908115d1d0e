"""The Hopper family's host side, torch-free: the ctypes mirror of ``hopper::Params``
(kernels/hopper/params.h; tests/test_hopper_params_abi.py compiles params.h on the host
and compares every offset), the ``hopper_meta`` table layout, and the four TMA tensor
maps encoded through the driver API (``cuTensorMapEncodeTiled``), cached per
(pointer, shape, strides, dtype, box).

The tensor-map rules (dims, strides, box, modes, refused layouts) are launch.py's, the one
description the production extension's C++ shares (extension/launch_rules.h).
"""

from __future__ import annotations

import ctypes
import struct
import threading
from collections import OrderedDict
from ctypes import POINTER, c_int, c_int32, c_uint, c_uint32, c_uint64, c_void_p  # noqa: F401

from evotuner.abi import ABI_VERSION, DTYPE_NAMES, MetaError
from evotuner.errors import ShapeError
from evotuner.kernels.hopper import launch
from evotuner.runtime import cuda  # torch-free; the driver is opened on first use

#: HOPPER_ABI_VERSION (params.h): the kernel's own table version.
HOPPER_ABI_VERSION = 7
#: ``hopper_meta`` entries in index order (HOPPER_META_* in params.h).
HOPPER_META = ("abi", "threads", "smem_bytes", "block_m", "block_n", "head_dim", "is_causal", "dtype",
               "stages", "consumer_wgs", "reg_prod", "reg_cons", "overlap", "pingpong", "o_box_rows",
               "sched", "rescale_log2", "exp_emu", "varlen", "splits", "pack_gqa", "ctas_per_sm", "cluster")
#: The family's own fields as the generic stages see them (after evotuner.abi's common ones).
META_FIELDS = ("block_m", "block_n", "stages", "consumer_wgs", "reg_prod", "reg_cons", "overlap", "pingpong",
               "o_box_rows", "sched", "rescale_log2", "exp_emu", "varlen", "splits", "pack_gqa", "ctas_per_sm",
               "cluster")

# cuTensorMapEncodeTiled's enumerators, as launch.py names them (their values: launch.CUDA_ENUMS)
TMA_DTYPE = {dt: launch.CUDA_ENUMS[name] for dt, name in launch.TMA_DATA_TYPE.items()}
_MODES = tuple(launch.CUDA_ENUMS[f"{kind}_{name}"] for kind, name in launch.TMA_MODES.items())


class CUtensorMap(ctypes.Structure):
    """CUtensorMap: 128 opaque bytes, 128-byte aligned (16 x uint64 in cuda.h)."""

    _fields_ = [("opaque", c_uint64 * 16)]


class Params(ctypes.Structure):
    """``hopper::Params`` (params.h, ``alignas(128)``): 4 tensor maps, then the scalars,
    padded to a multiple of 128 bytes (``sizeof`` 640)."""

    _fields_ = [
        ("tm_q", CUtensorMap), ("tm_k", CUtensorMap), ("tm_v", CUtensorMap), ("tm_o", CUtensorMap),
        ("lse", c_void_p),
        ("batch", c_int32), ("heads", c_int32), ("seqlen_q", c_int32), ("seqlen_k", c_int32),
        ("scale_log2", ctypes.c_float),
        ("kv_group", c_int32),
        ("tile_counter", c_void_p),
        ("cu_seqlens_q", c_void_p), ("cu_seqlens_k", c_void_p),
        ("o_ptr", c_void_p), ("o_row_stride", ctypes.c_int64), ("o_head_stride", ctypes.c_int64),
        ("total_q", c_int32),
        ("scratch", c_void_p), ("o_batch_stride", ctypes.c_int64),
        ("tail_first", c_int32), ("tail_parts", c_int32),
        ("_pad", ctypes.c_uint8 * 16),   # tail padding to alignas(128): 512 + 112 -> 640
    ]


PARAMS_ALIGN = 128


def decode_hopper_meta(raw: bytes, *, source: str = "hopper_meta") -> dict[str, int]:
    """``hopper_meta`` bytes -> the common fields (evotuner/abi.py names) + META_FIELDS.

    The kernel keeps its own layout (HOPPER_META_* in params.h, version HOPPER_ABI_VERSION);
    ``abi`` is reported as evotuner's ABI_VERSION once the kernel's own version checked out,
    and ``min_blocks`` is the kernel's ``__launch_bounds__(THREADS, CTAS_PER_SM)``."""
    n = len(HOPPER_META)
    if len(raw) != 4 * n:
        raise MetaError(f"{source}: table has {len(raw)} bytes, expected {4 * n} ({n} int32, HOPPER_META_LEN)",
                        "rebuild the cubin against the current kernels/hopper (clear the build cache)")
    t = dict(zip(HOPPER_META, struct.unpack_from(f"<{n}i", raw)))
    if t["abi"] != HOPPER_ABI_VERSION:
        raise MetaError(f"{source}: HOPPER_ABI_VERSION {t['abi']}, this evotuner expects {HOPPER_ABI_VERSION}",
                        "rebuild the cubin (clear the build cache) or update evotuner")
    if (t["dtype"] not in DTYPE_NAMES or t["is_causal"] not in (0, 1) or t["threads"] <= 0 or t["head_dim"] <= 0
            or t["ctas_per_sm"] not in (1, 2) or t["cluster"] not in (1, 2)):
        raise MetaError(f"{source}: inconsistent table {t}", "rebuild the cubin (clear the build cache)")
    meta = {"abi": ABI_VERSION, "threads": t["threads"], "smem_bytes": t["smem_bytes"], "head_dim": t["head_dim"],
            "is_causal": t["is_causal"], "dtype": t["dtype"], "min_blocks": t["ctas_per_sm"]}
    meta.update({f: t[f] for f in META_FIELDS})
    return meta


# --------------------------------------------------------------------------- tensor maps


class TmaStrideError(ShapeError):
    """A tensor's layout is one TMA cannot describe (evotuner.flash_attention falls back)."""


def check_tma_view(name: str, ptr: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> None:
    """Raise TmaStrideError naming the offending stride/pointer of a [B, H, S, D] view
    (the rules: launch.tma_fault)."""
    B, H, S, D = shape
    sb, sh, ss, sd = strides
    fault = launch.tma_fault(ptr, B, H, D, sb, sh, ss, sd)
    if fault == launch.FAULT_NONE:
        return
    if fault == launch.FAULT_HEAD_DIM:
        raise TmaStrideError(f"{name}: head dim D={D} is neither 96 nor a multiple of 64 (128-byte swizzle panels)",
                             "use D=64, 96, 128, 192 or 256 with the hopper family, or the flashcore family")
    if fault == launch.FAULT_D_STRIDE:
        raise TmaStrideError(f"{name}: D stride is {sd}, TMA needs it 1 (contiguous head dim)",
                             "make the tensor's last dim contiguous (.contiguous())")
    if fault == launch.FAULT_BASE:
        raise TmaStrideError(f"{name}: base pointer {ptr:#x} is not 16-byte aligned (TMA)",
                             "use a 16-byte aligned tensor (e.g. .contiguous() / .clone())")
    stride = {launch.FAULT_BATCH_STRIDE: sb, launch.FAULT_HEAD_STRIDE: sh, launch.FAULT_ROW_STRIDE: ss}[fault]
    size = launch.ELEMENT_BYTES
    raise TmaStrideError(
        f"{name}: {launch.FAULT_SUBJECTS[fault]} {stride} elements ({stride * size} B) is not a positive multiple of "
        f"16 bytes below 2^40 (TMA tensor-map rule)",
        "make the tensor contiguous (.contiguous()), or run it with the flashcore family")


_cache_lock = threading.Lock()
_cache: "OrderedDict[tuple, bytes]" = OrderedDict()
_CACHE_MAX = 4096
_encode_fn = None


def _driver_encode():
    global _encode_fn
    if _encode_fn is None:
        lib = driver_library()
        fn = lib.cuTensorMapEncodeTiled
        fn.argtypes = [c_void_p, c_int, c_uint, c_void_p, POINTER(c_uint64), POINTER(c_uint64),
                       POINTER(c_uint32), POINTER(c_uint32), c_int, c_int, c_int, c_int]
        fn.restype = c_int
        _encode_fn = fn
    return _encode_fn


def driver_library():
    """The driver library as evotuner's runtime loaded it (NoGpuError without one)."""
    return cuda.driver()


def encode_tensor_map(ptr: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: str,
                      box_rows: int, box_panels: int, *, name: str = "tensor") -> bytes:
    """The 128 bytes of one tensor's map (params.h rules); cached per
    (pointer, shape, strides, dtype, box). TmaStrideError for a layout TMA cannot take."""
    key = (ptr, tuple(shape), tuple(strides), dtype, box_rows, box_panels)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
    check_tma_view(name, ptr, shape, strides)
    B, H, S, D = shape
    view = launch.tma_view(B, H, S, D, strides[0], strides[1], strides[2], box_rows, box_panels)
    dims = (c_uint64 * launch.TMA_RANK)(*view["dims"])
    bstr = (c_uint64 * (launch.TMA_RANK - 1))(*view["byte_strides"])
    box = (c_uint32 * launch.TMA_RANK)(*view["box"])
    estr = (c_uint32 * launch.TMA_RANK)(*view["element_strides"])
    # cuda.h declares CUtensorMap alignas(64) (128 in hopper::Params): encode into a 128-B aligned slot
    buf = ctypes.create_string_buffer(2 * ctypes.sizeof(CUtensorMap))
    addr = (ctypes.addressof(buf) + PARAMS_ALIGN - 1) & ~(PARAMS_ALIGN - 1)
    code = _driver_encode()(c_void_p(addr), TMA_DTYPE[dtype], launch.TMA_RANK, c_void_p(ptr), dims, bstr, box, estr,
                            *_MODES)
    if code != 0:
        cuda.check(code, f"cuTensorMapEncodeTiled({name}: shape {tuple(shape)}, strides {tuple(strides)}, "
                         f"box {box_rows}x{box_panels})")
    data = ctypes.string_at(addr, ctypes.sizeof(CUtensorMap))
    with _cache_lock:
        _cache[key] = data
        while len(_cache) > _CACHE_MAX:
            _cache.popitem(last=False)
    return data
