"""The one layout of everything the CLI prints as a table or a long line: whole at 80 columns.

A config such as ``TILE_M=128,TILE_N=64,MIN_CTAS=2,WARP_COUNT=4,DEPTH=3`` in one cell is
cut on an 80-column terminal right where configs differ. Tables instead give every
parameter its own column under a short header that does not depend on the width
(:func:`headers`: ``TM`` for ``TILE_M``) and say once, in a legend, what each stands for
(:func:`legend_lines`, never splitting a pair). :func:`table_lines` lays the columns out
with every value whole: groups of columns that do not fit beside each other are stacked
under the row instead of cut; :func:`kv_lines` and :func:`wrap` break long values (a path,
a gate's reason, a search's log line) at word boundaries.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Union

from rich.text import Text

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


def _pairs(short: Mapping[str, str]) -> list[str]:
    """``X = NAME`` for every header that is not the name itself."""
    return [f"{s} = {n}" for n, s in short.items() if s != n]


def legend_lines(short: Mapping[str, str], width: int, extra: Sequence[str] = ()) -> list[str]:
    """``TM = TILE_M, TN = TILE_N, ...`` for the headers that abbreviate, then the ``extra``
    pairs, in lines of at most ``width`` columns, never breaking an ``X = NAME`` pair (only a
    pair longer than ``width`` is wrapped, at its spaces)."""
    lines: list[str] = []
    line = ""
    for pair in [*_pairs(short), *extra]:
        if len(pair) + 1 > width:                     # a description longer than a line: wrapped alone
            lines.extend([line + ","] if line else [])
            *whole, line = wrap(pair, width - 1, 2)
            lines.extend(whole)
            continue
        if line and len(line) + 2 + len(pair) + 1 > width:
            lines.append(line + ",")
            line = pair
        else:
            line = f"{line}, {pair}" if line else pair
    return lines + [line] if line else lines


def count(n: int, noun: str) -> str:
    """``1 config``, ``2 configs``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


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


def headers(names: Iterable[str]) -> dict[str, str]:
    """The table header of each parameter, the same at every terminal width: initials of a
    ``_``-separated name (``WARP_COUNT`` -> ``WC``), a one-word name of at most 4 letters
    itself, a longer one its first 4 (``DEPTH`` -> ``DEPT``)."""
    return short_names(names, 4)


# -- one layout for every table and long line the CLI prints ---------------------------------

#: Where a line may break besides a space: after a comma (a config) or a semicolon.
_PIECES = re.compile(r"[^,;]*[,;]+|[^,;]+")
#: Where a piece still longer than a line may break: after an underscore.
_UNDERSCORED = re.compile(r"[^_]*_+|[^_]+")
#: A word: a `command` in backticks with what touches it, else what stands between spaces.
_TOKEN = re.compile(r"[^\s`]*`[^`]*`\S*|\S+")
#: A unit that stays on the line of the number before it (``300.0 µs``, ``gate 0.0 s,``).
_UNIT = re.compile(r"(µs|ms|s|TFLOPS|TF|GB|MB|KiB|MiB|GiB|B|%|x)[,;:.)]*")


def _words(text: str) -> list[str]:
    """``text``'s words, a unit joined to the number before it so no line starts with it, and
    the words of a `command` in backticks joined into one."""
    words: list[str] = []
    for word in _TOKEN.findall(text):
        if words and words[-1][-1:].isdigit() and _UNIT.fullmatch(word):
            words[-1] += " " + word
        else:
            words.append(word)
    return words


def wrap(text: str, width: int, indent: int = 0) -> list[str]:
    """``text`` in lines of at most ``width`` columns, broken at spaces; a word longer than a
    line (a config, a kernel's name) is broken after a ``,`` or ``;`` in it, so ``TILE_M=128``
    is never split, and a piece still longer than a line after a ``_``; a unit stays with its
    number (``300.0 µs``).
    What a user copies is never broken (:func:`whole_unit`): a path, a URL or a `command` in
    backticks starts a line of its own where it does not fit, and one longer than a whole line
    stands alone past ``width`` (the terminal folds it; copied, it is one piece).
    Lines after the first are indented by ``indent``. Only what is longer than a whole line
    even then is cut, where it must be."""
    width = max(width, indent + 8)
    lines: list[str] = []
    line = ""

    def add(piece: str, space: str) -> None:
        nonlocal line
        if line.strip() and len(line) + len(space) + len(piece) > width:
            lines.append(line)
            line = " " * indent
            space = ""
        line += (space if line.strip() else "") + piece
        while len(line) > width:                              # a piece longer than a whole line
            lines.append(line[:width])
            line = " " * indent + line[width:]

    for word in _words(text):
        room = width - (indent if lines or line.strip() else 0)
        if len(word) <= room or (line.strip() and len(line) + 1 + len(word) <= width):
            add(word, " ")
            continue
        if whole_unit(word):                                     # on a line of its own, uncut
            if line.strip():
                lines.append(line)
                line = " " * indent
            lines.append(line + word)
            line = " " * indent
            continue
        pieces = [part for piece in _PIECES.findall(word)        # then after a '_' (a kernel's name)
                  for part in (_UNDERSCORED.findall(piece) if len(piece) > width - indent else [piece])]
        for n, piece in enumerate(pieces):
            add(piece, " " if n == 0 else "")
    if line.strip() or not lines:
        lines.append(line.rstrip())
    return lines


#: A path (``/x/y``, ``out/x.h``, ``~/x``) or a URL (``sqlite:///x.db``): a word with a ``/``
#: and no ``,`` or ``;`` (``H=32/8,S=4096`` is a shape), quotes or a bracket around it allowed.
_PATH = re.compile(r"[\"'(\[]?[^\s,;]*/[^\s,;]*[.,;:)\]\"']*")
#: A `command` in backticks, its closing punctuation included.
_COMMAND = re.compile(r"[(\[]?`[^`]+`[.,;:)\]]*")


def whole_unit(word: str) -> bool:
    """Whether ``word`` (one of :func:`wrap`'s words) is what a user copies: a path, a URL or a
    `command` in backticks. :func:`wrap` never breaks one."""
    return bool(_PATH.fullmatch(word) or _COMMAND.fullmatch(word))


@dataclass(frozen=True)
class Col:
    """A column of :func:`table_lines`: its header (never changed for the width), right-aligned
    or not, and its group: a group's columns stay on one line, and a group that does not fit
    beside the ones before goes on a line of its own under them (the row is stacked, never cut).
    ``key`` columns instead repeat at the start of every band, each band a table of its own.
    ``tight`` columns (a config's parameters, single-word headers) may stand :data:`TIGHT_GAP`
    apart from a tight neighbour of their group where that keeps the row on one line."""

    head: str
    right: bool = False
    group: int = 0
    key: bool = False
    tight: bool = False


#: The gap between two ``tight`` columns of one group when the row fits one line only so.
TIGHT_GAP = 1


Cell = Union[str, Text]


def _bands(cols: Sequence[Col], widths: list[int], width: int, gaps: Sequence[int],
           indent: int) -> list[list[int]]:
    """The columns of each line a row takes: whole groups while they fit (a group wider than a
    line, column by column); the first band from the left edge, the others from ``indent`` or
    after the key columns. ``gaps[i]`` is the space after column ``i``."""
    keys = [i for i, c in enumerate(cols) if c.key]
    lead = sum(widths[i] + gaps[i] for i in keys) if keys else indent
    groups: list[list[int]] = []
    for i, c in enumerate(cols):
        if c.key:
            continue
        if groups and cols[groups[-1][0]].group == c.group:
            groups[-1].append(i)
        else:
            groups.append([i])
    bands: list[list[int]] = [list(keys)]
    pos = lead if keys else 0                     # where the next cell of this band starts
    for group in groups:
        need = sum(widths[i] for i in group) + sum(gaps[i] for i in group[:-1])
        if len(bands[-1]) > len(keys) and pos + need > width:
            bands.append(list(keys))
            pos = lead
        for i in group:
            if len(bands[-1]) > len(keys) and pos + widths[i] > width:
                bands.append(list(keys))
                pos = lead
            bands[-1].append(i)
            pos += widths[i] + gaps[i]
    return bands


def _gaps(cols: Sequence[Col], widths: list[int], width: int, gap: int, indent: int) -> list[int]:
    """The space after each column: ``gap``, or :data:`TIGHT_GAP` between two ``tight`` columns
    of one group where the row then fits one line and would not otherwise (a hopper config's
    eleven or thirteen parameters beside the figures at 80 columns)."""
    wide = [gap] * len(cols)
    if len(_bands(cols, widths, width, wide, indent)) == 1:
        return wide
    tight = [TIGHT_GAP if c.tight and n.tight and c.group == n.group and not c.key else gap
             for c, n in zip(cols, cols[1:])] + [gap]
    return tight if len(_bands(cols, widths, width, tight, indent)) == 1 else wide


def table_lines(cols: Sequence[Col], rows: Sequence[Sequence[Cell]], width: int, *, gap: int = 2,
                indent: int = 4, notes: Sequence[str | None] = (), title: str = "") -> list[Text]:
    """A table as lines of at most ``width`` columns with every value whole: fixed headers,
    ``gap`` spaces between columns (one between ``tight`` ones where that keeps a row on one
    line), a rule under the headers, no vertical rules. Groups of
    columns that do not fit beside each other stack under the row (``indent`` in) or, with
    ``key`` columns, make further tables that repeat them; ``notes[i]`` (a reason, a path) is
    wrapped at word boundaries under row ``i``; ``title`` is wrapped above."""
    widths = [max([len(c.head), *(len(_plain(r[i])) for r in rows)]) for i, c in enumerate(cols)]
    gaps = _gaps(cols, widths, width, gap, indent)
    bands = _bands(cols, widths, width, gaps, indent)
    keyed = any(c.key for c in cols)
    out = [Text(line) for line in wrap(title, width, 2)] if title else []

    def line(band: list[int], cells: Sequence[Cell], lead: int) -> Text:
        text = Text(" " * lead)
        for n, i in enumerate(band):
            cell = cells[i] if isinstance(cells[i], Text) else Text(str(cells[i]))
            pad = " " * (widths[i] - len(cell.plain))
            text.append_text(Text(pad) + cell if cols[i].right else cell + Text(pad))
            if n < len(band) - 1:
                text.append(" " * gaps[i])
        text.rstrip()
        return text

    def lead(b: int) -> int:
        return 0 if keyed or b == 0 else indent

    def heads(bs: Sequence[int]) -> list[Text]:
        hs = [line(bands[b], [c.head for c in cols], lead(b)) for b in bs]
        rule = max((len(h.plain) for h in hs), default=0)
        return [*hs, Text("─" * rule)]

    groups = [[b] for b in range(len(bands))] if keyed else [list(range(len(bands)))]
    for bs in groups:
        if keyed and bs[0] > 0:
            out.append(Text(""))
        out.extend(heads(bs))
        for r, cells in enumerate(rows):
            for b in bs:
                out.append(line(bands[b], cells, lead(b)))
            note = notes[r] if r < len(notes) else None
            if note and bs[-1] == len(bands) - 1:
                out.extend(Text(" " * indent + s) for s in wrap(note, width - indent, 2))
    return out


def kv_lines(pairs: Sequence[tuple[str, Cell]], width: int, gap: int = 2) -> list[Text]:
    """``key  value`` lines, the keys in one column and each value wrapped at word boundaries
    under itself (a path, a gate's reason) so no line passes ``width``."""
    keyw = max((len(k) for k, _ in pairs), default=0)
    out: list[Text] = []
    for key, value in pairs:
        style = value.style if isinstance(value, Text) else ""
        for n, part in enumerate(wrap(_plain(value), width - keyw - gap)):
            out.append(Text((key if n == 0 else "").ljust(keyw) + " " * gap) + Text(part, style=style))
    return out


def _plain(cell: Cell) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)
