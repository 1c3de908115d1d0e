"""Config tables that read at 80 columns: one narrow column per kernel parameter.

A config such as ``TILE_M=128,TILE_N=64,MIN_CTAS=2,WARP_COUNT=4,DEPTH=3`` in one
cell is cut on an 80-column terminal right where configs differ, so the top rows of
a table look identical. Tables instead give every parameter its own column under a
short header (``TM`` for ``TILE_M``) and say once, in a legend, what each header
stands for; every value stays visible. Where even those headers are too wide (a family
with ten parameters), :func:`fitting_names` shortens the one-word ones further
(``DEPTH`` -> ``DEPT`` -> ``DE``) until the table fits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

#: A parameter name this short is its own header.
_SHORT_ENOUGH = 6


def short_names(names: Iterable[str], longest: int = _SHORT_ENOUGH) -> dict[str, str]:
    """A unique short header per parameter: initials of its ``_``-parts (``WARP_COUNT`` ->
    ``WC``), the name itself when it is at most ``longest`` long (``DEPTH``), else its first
    ``longest`` letters; the full name on a clash."""
    names = list(dict.fromkeys(names))
    out: dict[str, str] = {}
    for name in names:
        parts = [p for p in name.split("_") if p]
        if len(name) <= longest or len(parts) < 2:
            short = name if len(name) <= longest else name[:longest]
        else:
            short = "".join(p[0] for p in parts)
        out[name] = short
    counts: dict[str, int] = {}
    for short in out.values():
        counts[short] = counts.get(short, 0) + 1
    return {n: (s if counts[s] == 1 and (s == n or s not in names) else n) for n, s in out.items()}


def legend(short: Mapping[str, str]) -> str:
    """``TM = TILE_M, TN = TILE_N, ...`` for the headers that abbreviate."""
    return ", ".join(_pairs(short))


def _pairs(short: Mapping[str, str]) -> list[str]:
    """``X = NAME`` for every header that is not the name itself."""
    return [f"{s} = {n}" for n, s in short.items() if s != n]


def legend_lines(short: Mapping[str, str], width: int) -> list[str]:
    """:func:`legend` in lines of at most ``width`` columns, never breaking an ``X = NAME`` pair
    (a pair longer than ``width`` gets a line of its own)."""
    lines: list[str] = []
    line = ""
    for pair in _pairs(short):
        if line and len(line) + 2 + len(pair) + 1 > width:
            lines.append(line + ",")
            line = pair
        else:
            line = f"{line}, {pair}" if line else pair
    return lines + [line] if line else lines


def param_names(configs: Iterable[Mapping[str, int]], order: Sequence[str] = ()) -> list[str]:
    """The parameter names of ``configs``: ``order`` first (the space file's), then the rest sorted."""
    seen: set[str] = set()
    for c in configs:
        seen.update(c)
    return [n for n in order if n in seen] + sorted(seen - set(order))


def cells(config: Mapping[str, int] | None, names: Sequence[str]) -> list[str]:
    """One cell per parameter (``-`` where a config lacks it)."""
    config = config or {}
    return [str(config[n]) if n in config else "-" for n in names]


def fitting_names(names: Sequence[str], widths: Mapping[str, int], others: int, gap: int, width: int) -> dict[str, str]:
    """The longest short headers (:func:`short_names`, ``longest`` 6, then 4, then 2) with which a
    table fits ``width`` columns: each parameter's column is as wide as its header or its widest
    value (``widths``), the other columns take ``others`` in all, and ``gap`` separates each two
    columns. The shortest try when none fits (the table then squeezes what it must)."""
    short: dict[str, str] = {}
    for longest in (_SHORT_ENOUGH, 4, 2):
        short = short_names(names, longest)
        total = others + sum(max(len(short[n]), widths.get(n, 1)) for n in names) + gap * len(names)
        if total <= width:
            break
    return short
