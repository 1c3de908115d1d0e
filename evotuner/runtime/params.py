"""ctypes mirror of ``flashcore::Params`` and the ``flashcore_meta`` table.

Both must match kernels/flashcore/params.h byte for byte; tests/test_params_abi.py
compiles that header on the host and compares every offset and meta index.
"""

from __future__ import annotations

import ctypes
import struct
from ctypes import c_float, c_int32, c_int64, c_void_p
from typing import Mapping, Sequence

from evotuner.errors import EvotunerError

#: FLASHCORE_ABI_VERSION in params.h; a cubin built for another ABI is refused.
ABI_VERSION = 1

#: Python names of the flashcore_meta entries, in index order (FLASHCORE_META_<NAME.upper()>).
META_FIELDS: tuple[str, ...] = (
    "abi",          # FLASHCORE_META_ABI
    "threads",      # FLASHCORE_META_THREADS
    "smem_bytes",   # FLASHCORE_META_SMEM_BYTES
    "block_m",      # FLASHCORE_META_BLOCK_M
    "block_n",      # FLASHCORE_META_BLOCK_N
    "head_dim",     # FLASHCORE_META_HEAD_DIM
    "is_causal",    # FLASHCORE_META_IS_CAUSAL
    "dtype",        # FLASHCORE_META_DTYPE (0 fp16, 1 bf16)
    "min_blocks",   # FLASHCORE_META_MIN_BLOCKS
)
META_LEN = len(META_FIELDS)
META_INDEX = {name: i for i, name in enumerate(META_FIELDS)}
#: FLASHCORE_META_DTYPE codes.
DTYPE_CODES = {"fp16": 0, "bf16": 1}
DTYPE_NAMES = {v: k for k, v in DTYPE_CODES.items()}


class MetaError(EvotunerError):
    """A cubin's flashcore_meta table is missing, short or inconsistent."""


class Params(ctypes.Structure):
    """``flashcore::Params`` (params.h), passed by value as the kernel's one argument."""

    _fields_ = [
        ("q", c_void_p),
        ("k", c_void_p),
        ("v", c_void_p),
        ("o", c_void_p),
        ("lse", c_void_p),
        ("q_batch_stride", c_int64), ("q_head_stride", c_int64), ("q_row_stride", c_int64),
        ("k_batch_stride", c_int64), ("k_head_stride", c_int64), ("k_row_stride", c_int64),
        ("v_batch_stride", c_int64), ("v_head_stride", c_int64), ("v_row_stride", c_int64),
        ("o_batch_stride", c_int64), ("o_head_stride", c_int64), ("o_row_stride", c_int64),
        ("batch", c_int32), ("heads", c_int32), ("seqlen_q", c_int32), ("seqlen_k", c_int32),
        ("scale", c_float),
        ("scale_log2", c_float),
    ]


def decode_meta(raw: bytes | Sequence[int], *, source: str = "flashcore_meta") -> dict[str, int]:
    """Turn the table's bytes (little-endian int32) or ints into a dict keyed by META_FIELDS."""
    if isinstance(raw, (bytes, bytearray)):
        if len(raw) < 4 * META_LEN:
            raise MetaError(
                f"{source}: table has {len(raw)} bytes, expected {4 * META_LEN} ({META_LEN} int32)",
                "rebuild the cubin against the current kernels/flashcore/params.h",
            )
        values = struct.unpack_from(f"<{META_LEN}i", raw)
    else:
        values = tuple(int(x) for x in raw)
        if len(values) < META_LEN:
            raise MetaError(f"{source}: table has {len(values)} entries, expected {META_LEN}")
    meta = dict(zip(META_FIELDS, values))
    if meta["abi"] != ABI_VERSION:
        raise MetaError(
            f"{source}: ABI version {meta['abi']}, this evotuner expects {ABI_VERSION}",
            "rebuild the cubin (clear the build cache)",
        )
    for name in ("threads", "block_m", "block_n", "head_dim"):
        if meta[name] <= 0:
            raise MetaError(f"{source}: {name}={meta[name]} must be positive")
    if meta["smem_bytes"] < 0:
        raise MetaError(f"{source}: smem_bytes={meta['smem_bytes']} is negative")
    if meta["dtype"] not in DTYPE_NAMES:
        raise MetaError(f"{source}: dtype code {meta['dtype']} is neither 0 (fp16) nor 1 (bf16)")
    return meta


def meta_mismatch(a: Mapping[str, int], b: Mapping[str, int]) -> str | None:
    """The first META_FIELDS key on which two tables disagree (missing keys are skipped)."""
    for name in META_FIELDS:
        if name in a and name in b and int(a[name]) != int(b[name]):
            return f"{name}: {a[name]} != {b[name]}"
    return None
