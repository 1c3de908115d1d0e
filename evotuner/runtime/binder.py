"""Rebind the device pointers of a launch's argument bytes without rebuilding them.

A family's :meth:`~evotuner.family.KernelFamily.launch` builds the kernel's argument
bytes from pointers, shapes and strides; for the Hopper family that means encoding four
TMA tensor maps through the driver on every call (tens of µs of Python and ctypes). On
the hot path of :func:`evotuner.flash_attention` the shapes, strides, dtype, scale and
config are fixed by the plan's key; only the pointers change from call to call.

:meth:`ArgBinder.derive` learns, once per plan, where each pointer lives in the bytes:
it asks the family for the bytes at a base set of pointers and again with every address
bit a pointer can carry (bits 4..47: pointers are 16-byte aligned and below 2**48)
flipped, and expects each pointer to appear as contiguous runs of those bits, shifted,
inside the bytes (a raw pointer field, or the address field of a tensor map; a pointer may
have several, as the hopper kernel's O in its map and as a raw pointer). It then
checks the rule byte for byte against the family's own bytes at several random pointer
sets. Any pointer whose bytes do not follow the rule (an encoding that is not such a
field, a driver whose tensor-map format differs) makes ``derive`` return None, and the
caller builds the bytes through the family on every call instead: slower, never wrong.

Torch-free: it sees only the ``make(pointers) -> bytes`` callable.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass
from typing import Callable, Mapping

#: Address bits a pointer may carry: 16-byte aligned (bits 0-3 zero) and below 2**48.
LOW_BIT = 4
HIGH_BIT = 48
POINTER_LIMIT = 1 << HIGH_BIT
_SPAN = HIGH_BIT - LOW_BIT
_Q = struct.Struct("<Q")
_QQ = struct.Struct("<QQ")
_M64 = (1 << 64) - 1
#: Random pointer sets the derived rule must reproduce byte for byte.
VERIFY_TRIALS = 4


@dataclass(frozen=True)
class _Field:
    """One place of a pointer: an 8- or 16-byte little-endian window at ``offset`` where
    (ptr >> 4) sits at bit ``shift``; ``slot`` is the pointer's index in :attr:`ArgBinder.roles`."""

    role: str
    slot: int
    offset: int
    width: int    # 8 or 16 bytes
    shift: int
    keep: int     # the window's other bits (the template's value with the field cleared)


class ArgBinder:
    """Writes pointers into a copy of a template argument buffer (see the module docstring)."""

    __slots__ = ("template", "fields", "roles")

    def __init__(self, template: bytes, fields: tuple[_Field, ...], roles: tuple[str, ...]) -> None:
        self.template = template
        self.fields = fields
        self.roles = roles   # one per pointer, in the order bind_into takes them

    @classmethod
    def derive(cls, make: Callable[[Mapping[str, int]], bytes], pointers: Mapping[str, int],
               *, seed: int = 0) -> "ArgBinder | None":
        """The binder for ``make`` around ``pointers`` ({role: 16-byte aligned pointer below
        2**48}), or None where a pointer's bytes do not follow the field rule."""
        if any(p % 16 or not 0 < p < POINTER_LIMIT for p in pointers.values()):
            return None
        base = make(pointers)
        size = len(base)
        fields: list[_Field] = []
        span_mask = ((1 << _SPAN) - 1) << LOW_BIT
        run = (1 << _SPAN) - 1
        for slot, (role, ptr) in enumerate(pointers.items()):
            flipped = make({**pointers, role: ptr ^ span_mask})
            if len(flipped) != size:
                return None
            diff = int.from_bytes(bytes(a ^ b for a, b in zip(base, flipped)), "little")
            if diff == 0:
                return None
            while diff:                    # each run of the pointer's bits: one field
                first = (diff & -diff).bit_length() - 1
                if diff & (run << first) != run << first:
                    return None            # not a contiguous run of the pointer's bits
                diff &= ~(run << first)
                offset = first // 64 * 8   # the 8-byte word holding the run's first bit
                shift = first - offset * 8
                width = 8 if shift + _SPAN <= 64 else 16
                if offset + width > size:
                    return None
                window = int.from_bytes(base[offset:offset + width], "little")
                keep = window & ~(run << shift)
                fields.append(_Field(role, slot, offset, width, shift, keep))
        spans = sorted((f.offset, f.offset + f.width) for f in fields)
        if any(b[0] < a[1] for a, b in zip(spans, spans[1:])):
            return None                # two windows overlap: one write would undo the other
        binder = cls(base, tuple(fields), tuple(pointers))
        rng = random.Random(seed)
        for _ in range(VERIFY_TRIALS):
            trial = {role: rng.randrange(1 << 32, POINTER_LIMIT) & ~15 for role in pointers}
            if binder.bind(trial) != make(trial):
                return None
        return binder

    def bind(self, pointers: Mapping[str, int]) -> bytes:
        """The argument bytes for ``pointers`` (the caller checked alignment and range)."""
        buf = bytearray(self.template)
        self.bind_into(buf, tuple(pointers[r] for r in self.roles))
        return bytes(buf)

    def bind_into(self, buf: bytearray | memoryview, ptrs: tuple[int, ...]) -> None:
        """Write ``ptrs`` (in :attr:`roles` order) into ``buf``, a writable copy of the
        template: the hot path's form of :meth:`bind`."""
        for f in self.fields:
            value = f.keep | ((ptrs[f.slot] >> LOW_BIT) << f.shift)
            if f.width == 8:
                _Q.pack_into(buf, f.offset, value)
            else:
                _QQ.pack_into(buf, f.offset, value & _M64, value >> 64)
