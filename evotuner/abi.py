"""The kernel ABI every family shares, in Python: the meta table's common layout,
the ABI version and the dtype codes (``kernels/evotuner_abi.h`` is the C side;
tests/test_params_abi.py compiles it on the host and compares every value).

Used by both the build stage (reading the table out of a cubin) and the runtime
(reading it through the driver). Torch-free. A family's own meta fields follow
the common ones, in the order its :attr:`KernelFamily.meta_fields` names them.
"""

from __future__ import annotations

import re
import struct
from typing import Mapping, Sequence

from evotuner.errors import EvotunerError

#: EVOTUNER_ABI_VERSION; a cubin built for another ABI is refused.
ABI_VERSION = 3
#: The shared header's file name under the kernels root.
ABI_HEADER = "evotuner_abi.h"

#: Python names of the common entries, in index order (EVOTUNER_META_<NAME.upper()>).
COMMON_FIELDS: tuple[str, ...] = (
    "abi",          # EVOTUNER_META_ABI
    "threads",      # EVOTUNER_META_THREADS
    "smem_bytes",   # EVOTUNER_META_SMEM_BYTES
    "head_dim",     # EVOTUNER_META_HEAD_DIM
    "is_causal",    # EVOTUNER_META_IS_CAUSAL
    "dtype",        # EVOTUNER_META_DTYPE
    "min_blocks",   # EVOTUNER_META_MIN_BLOCKS
)
COMMON_LEN = len(COMMON_FIELDS)
#: EVOTUNER_DTYPE_* codes.
DTYPE_CODES = {"fp16": 0, "bf16": 1}
DTYPE_NAMES = {v: k for k, v in DTYPE_CODES.items()}


class MetaError(EvotunerError):
    """A cubin's meta table is missing, short or inconsistent."""


def meta_fields(family_fields: Sequence[str] = ()) -> tuple[str, ...]:
    """Every field name of a family's table, in index order."""
    return COMMON_FIELDS + tuple(family_fields)


def decode_meta(raw: bytes | Sequence[int], family_fields: Sequence[str] = (), *,
                source: str = "meta table") -> dict[str, int]:
    """Turn the table's bytes (little-endian int32) or ints into a dict keyed by field name.

    The table must hold exactly the common fields plus ``family_fields``.
    """
    fields = meta_fields(family_fields)
    n = len(fields)
    if isinstance(raw, (bytes, bytearray)):
        if len(raw) != 4 * n:
            raise MetaError(
                f"{source}: table has {len(raw)} bytes, expected {4 * n} ({n} int32: "
                f"{COMMON_LEN} common + {len(fields) - COMMON_LEN} family fields)",
                "rebuild the cubin against the current kernels (clear the build cache)",
            )
        values = struct.unpack_from(f"<{n}i", raw)
    else:
        values = tuple(int(x) for x in raw)
        if len(values) != n:
            raise MetaError(f"{source}: table has {len(values)} entries, expected {n}",
                            "rebuild the cubin against the current kernels (clear the build cache)")
    meta = dict(zip(fields, values))
    if meta["abi"] != ABI_VERSION:
        raise MetaError(
            f"{source}: ABI version {meta['abi']}, this evotuner expects {ABI_VERSION}",
            "rebuild the cubin (clear the build cache)",
        )
    for name in ("threads", "head_dim", "min_blocks"):
        if meta[name] <= 0:
            raise MetaError(f"{source}: {name}={meta[name]} must be positive")
    if meta["smem_bytes"] < 0:
        raise MetaError(f"{source}: smem_bytes={meta['smem_bytes']} is negative")
    if meta["is_causal"] not in (0, 1):
        raise MetaError(f"{source}: is_causal={meta['is_causal']} is neither 0 nor 1")
    if meta["dtype"] not in DTYPE_NAMES:
        raise MetaError(f"{source}: dtype code {meta['dtype']} is neither 0 (fp16) nor 1 (bf16)")
    return meta


def meta_mismatch(a: Mapping[str, int], b: Mapping[str, int]) -> str | None:
    """The first field on which two tables disagree (keys missing from either are skipped)."""
    for name in sorted(set(a) & set(b), key=lambda k: (k not in COMMON_FIELDS, k)):
        if int(a[name]) != int(b[name]):
            return f"{name}: {a[name]} != {b[name]}"
    return None


def header_layout(text: str) -> tuple[dict[str, int], int, int]:
    """Parse the shared header: ({field: index}, EVOTUNER_META_COMMON_LEN, EVOTUNER_ABI_VERSION)."""
    fields: dict[str, int] = {}
    length = abi = -1
    for name, value in re.findall(r"^\s*#define\s+EVOTUNER_(META_\w+|ABI_VERSION)\s+(\d+)", text, re.M):
        if name == "META_COMMON_LEN":
            length = int(value)
        elif name == "ABI_VERSION":
            abi = int(value)
        else:
            fields[name[len("META_"):].lower()] = int(value)
    return fields, length, abi
