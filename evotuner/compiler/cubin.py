"""Read a family's meta table out of a cubin (an ELF64 file) without CUDA.

The kernel defines ``extern "C" __constant__ int32_t <meta symbol>[...]`` (layout:
kernels/evotuner_abi.h, evotuner/abi.py); nvcc places it in a ``.nv.constant3`` section with a symbol whose ``st_value``
is the offset inside that section. The reader walks the section headers, finds
``.symtab`` and its string table, looks the symbol up by name (any binding:
nvcc emits it LOCAL) and decodes ``st_size`` bytes as little-endian int32.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from evotuner.abi import MetaError, decode_meta, meta_fields
from evotuner.errors import EvotunerError

if TYPE_CHECKING:  # only for annotations
    from evotuner.family.base import KernelFamily

_SHT_SYMTAB = 2
_SHT_NOBITS = 8
_SHN_UNDEF = 0
_SHN_LORESERVE = 0xFF00


class CubinError(EvotunerError):
    """A cubin is not a readable ELF64 file or lacks a valid meta table."""


def read_symbol(data: bytes, name: str) -> bytes:
    """The bytes of the defined object symbol ``name`` in an ELF64 little-endian image."""
    if data[:4] != b"\x7fELF":
        raise CubinError("cubin: not an ELF file (bad magic)", "rebuild it; the cache entry may be corrupt")
    if data[4] != 2 or data[5] != 1:
        raise CubinError("cubin: not a little-endian ELF64 file", "rebuild it with nvcc -cubin")
    try:
        e_shoff, = struct.unpack_from("<Q", data, 0x28)
        e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHH", data, 0x3A)
        sections = [struct.unpack_from("<IIQQQQIIQQ", data, e_shoff + i * e_shentsize) for i in range(e_shnum)]
        for sh_name, sh_type, _, _, sh_offset, sh_size, sh_link, _, _, sh_entsize in sections:
            if sh_type != _SHT_SYMTAB:
                continue
            str_offset = sections[sh_link][4]
            entsize = sh_entsize or 24
            for off in range(sh_offset, sh_offset + sh_size, entsize):
                st_name, _, _, st_shndx, st_value, st_size = struct.unpack_from("<IBBHQQ", data, off)
                if _cstr(data, str_offset + st_name) != name:
                    continue
                if st_shndx == _SHN_UNDEF or st_shndx >= _SHN_LORESERVE:
                    raise CubinError(f"cubin: symbol {name} is not defined in a section", "rebuild the kernel")
                if sections[st_shndx][1] == _SHT_NOBITS:  # zero-initialised, no file bytes
                    return bytes(st_size)
                base = sections[st_shndx][4] + st_value
                blob = data[base:base + st_size]
                if len(blob) != st_size:
                    raise CubinError(f"cubin: symbol {name} runs past the end of the file", "rebuild it")
                return blob
    except (struct.error, IndexError, ValueError):
        raise CubinError("cubin: truncated or malformed ELF headers", "rebuild it; the cache entry may be corrupt") from None
    raise CubinError(
        f"cubin: no symbol {name}",
        'the family\'s instantiate.cuh must define extern "C" __constant__ int32_t '
        f"{name}[...] (kernels/evotuner_abi.h)",
    )


def _cstr(data: bytes, offset: int) -> str:
    end = data.index(b"\0", offset)
    return data[offset:end].decode("ascii", errors="replace")


def read_meta(cubin: bytes | Path, symbol: str, family_fields: Sequence[str] = ()) -> dict[str, int]:
    """Decode the meta table ``symbol`` into {abi, threads, smem_bytes, ..., family fields};
    check its length and ABI."""
    data = cubin.read_bytes() if isinstance(cubin, Path) else cubin
    blob = read_symbol(data, symbol)
    n = len(meta_fields(family_fields))
    if len(blob) != 4 * n:
        raise CubinError(
            f"cubin: {symbol} has {len(blob)} bytes, expected {4 * n} ({n} int32)",
            "the kernel and evotuner disagree on the meta table; rebuild with matching versions",
        )
    try:
        return decode_meta(blob, family_fields, source=f"cubin: {symbol}")
    except MetaError as exc:
        raise CubinError(exc.message, exc.remedy) from None


def read_family_meta(cubin: bytes | Path, family: "KernelFamily") -> dict[str, int]:
    """Decode ``family``'s meta table (:meth:`KernelFamily.decode_meta`: the shared layout
    by default, or the family's own)."""
    data = cubin.read_bytes() if isinstance(cubin, Path) else cubin
    symbol = family.meta_symbol
    blob = read_symbol(data, symbol)
    try:
        return family.decode_meta(blob, source=f"cubin: {symbol}")
    except MetaError as exc:
        raise CubinError(exc.message, exc.remedy) from None
