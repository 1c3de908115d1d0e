"""Bounds that keep a search-space file from hanging evotuner.

A space file is user input. Python integers are unbounded, so an expression such as
``(((max_smem_per_sm ** 64) ** 64) ** 64) ** 64`` would compute a number with
billions of digits at 100% CPU; a deeply nested one would exhaust the recursion of
the checker; a duplicate check by ``list.count`` is quadratic in a long value list.
A space's size is bounded too: samplers and the loop enumerate its configs (the
fresh-proposal fallback lists every index tuple; the coverage check and the guided
sampler evaluate every config's constraints, about 0.1 ms each), so two parameters of
4096 values each (16.7 million configs) took 23.7 GB or minutes before anything else
was checked. :func:`check_size` refuses such a space when it is loaded, before any GPU
check or enumeration, naming the limit and the parameters with the most values.
These helpers bound each of them and raise a :class:`SpaceError` that names the
place and the limit.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Iterable, Sequence
from typing import Any

from evotuner.errors import SpaceError

#: Largest magnitude (in bits) of any intermediate value of a space expression.
#: Real limits (shared memory, registers, sequence lengths) need far fewer.
MAX_BITS = 256
#: Deepest nesting of a space expression's syntax tree.
MAX_DEPTH = 48
#: Most configs a space may have (the product of its parameters' value counts): 2**18,
#: 1.6 times the largest packaged spaces (hopper.toml, hopper_d96.toml, hopper_split.toml: 165,888). Enumerating it and
#: evaluating every config's constraints stays within seconds and a few tens of MB
#: (``SearchSpace.feasible`` lists hopper.toml's 5,640 feasible configs at D=128 in 0.04 s here).
MAX_CONFIGS = 1 << 18
#: Largest magnitude of a parameter value: each becomes a C ``int`` macro of the kernel.
MAX_PARAM_VALUE = 2**31 - 1
#: Largest space file read (the packaged ones are under 20 KB): a database or a log passed
#: as the space by mistake is refused before it is read whole.
MAX_SPACE_BYTES = 16 << 20


def check_size(counts: Sequence[tuple[str, int]], where: str) -> int:
    """The number of configs of parameters with these (name, value count) pairs; SpaceError
    naming :data:`MAX_CONFIGS` and the largest parameters when it is larger."""
    total = math.prod(n for _, n in counts)
    if total > MAX_CONFIGS:
        largest = sorted(counts, key=lambda nc: -nc[1])[:2]
        which = " and ".join(f"{name} ({n} values)" for name, n in largest)
        raise SpaceError(f"{where}: the space has {total} configs, more than the limit of {MAX_CONFIGS}",
                         f"list fewer values of {which}, or search a sub-grid of it ([space] base)")
    return total


def check_bits(value: Any, where: str) -> Any:
    """``value`` if it is a bool or an int of at most :data:`MAX_BITS` bits."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_BITS:
        raise SpaceError(f"{where}: a value exceeds {MAX_BITS} bits",
                         "space expressions compute sizes and counts; keep them within sane integer ranges")
    return value


def check_pow(base: int, exponent: int, where: str) -> None:
    """Refuse ``base ** exponent`` before computing it when the result would exceed :data:`MAX_BITS`."""
    bits = abs(int(base)).bit_length()
    if bits > 1 and (bits - 1) * exponent > MAX_BITS:
        raise SpaceError(f"{where}: {base} ** {exponent} exceeds {MAX_BITS} bits",
                         "space expressions compute sizes and counts; use a smaller exponent")


def check_depth(node: ast.AST, where: str) -> None:
    """Refuse a syntax tree nested deeper than :data:`MAX_DEPTH` (iteratively: no recursion)."""
    stack = [(node, 1)]
    while stack:
        current, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise SpaceError(f"{where}: expression nested deeper than {MAX_DEPTH} levels",
                             "split it into [derived] names")
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(current))


def first_duplicate(values: Iterable[Any]) -> Any | None:
    """The smallest value that occurs more than once (linear time), or None."""
    seen: set[Any] = set()
    dupes: set[Any] = set()
    for v in values:
        (dupes if v in seen else seen).add(v)
    return min(dupes) if dupes else None
