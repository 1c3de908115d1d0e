"""An exported header read back: the production build (scripts/build_extension.py), the
served tuned tables (:mod:`evotuner.tuned`) and the tests drive the kernel from its rows.
:mod:`evotuner.export` writes it (the layout is described there)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from evotuner.abi import DTYPE_NAMES
from evotuner.errors import ExportError
from evotuner.export_rows import BUCKET_EDGES, INT32_MAX, OPEN_BUCKET
from evotuner.family import DEFAULT_FAMILY, KernelFamily, families, get_family

#: Per-row macros that describe the problem, not a kernel parameter.
ROW_PROBLEM_MACROS = ("HEAD_DIM", "IS_CAUSAL", "DTYPE", "QUERY_ROWS_BUCKET", "MAX_SEQLEN")
#: Of those, the ones only select() reads (the row's buckets): the kernel build takes none.
ROW_BUCKET_MACROS = ("QUERY_ROWS_BUCKET", "MAX_SEQLEN")


@dataclass(frozen=True)
class HeaderInfo:
    """What an exported header declares for one family: its arch and, per row, the macro
    names it defines."""

    arch: str
    rows: tuple[tuple[str, ...], ...]   # row i -> names N of <T>_<i>_<N>, in header order
    family: str = DEFAULT_FAMILY
    #: row i -> (N, value) of each <T>_<i>_<N> macro, in header order
    values: tuple[tuple[tuple[str, int], ...], ...] = ()
    #: the family's export macro prefix <T>
    export_prefix: str = ""


def _family(family: KernelFamily | str | None) -> KernelFamily:
    return family if isinstance(family, KernelFamily) else get_family(family or DEFAULT_FAMILY)


def header_families(path: Path) -> tuple[str, ...]:
    """The registered families that have a section in the header at ``path``."""
    return _sections(Path(path).read_text(encoding="utf-8"))


def _sections(text: str) -> tuple[str, ...]:
    """The registered families with a ``<T>_COUNT`` macro in a header's text."""
    return tuple(f.name for f in families()
                 if re.search(rf"^#define\s+{re.escape(f.export_macro_prefix)}_COUNT\s+\d+\s*$", text, re.M))


def read_header(path: Path, family: KernelFamily | str | None = None) -> HeaderInfo:
    """Read one family's row macros (default family: the default one) of a header written
    by :func:`export_header`; raise ExportError otherwise."""
    fam = _family(family)
    t = re.escape(fam.export_macro_prefix)
    row_macro = re.compile(rf"^#define\s+{t}_(\d+)_([A-Z][A-Z0-9_]*)\b[ \t]*(.*?)\s*$", re.M)
    count_macro = re.compile(rf"^#define\s+{t}_COUNT\s+(\d+)\s*$", re.M)
    arch_macro = re.compile(rf'^#define\s+{t}_ARCH\s+"(sm_\d{{2,3}}[af]?)"\s*$', re.M)
    T = fam.export_macro_prefix
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ExportError(f"header {path}: cannot read it ({exc.strerror or exc})",
                          "give the header written by `evotuner export`") from None
    except UnicodeDecodeError:
        raise ExportError(f"header {path}: not a text file (not UTF-8)",
                          "give the header written by `evotuner export`") from None
    count, arch = count_macro.search(text), arch_macro.search(text)
    if count is None or arch is None:
        others = [name for name in _sections(text) if name != fam.name]
        raise ExportError(f"header {path}: no {T}_COUNT / {T}_ARCH (no {fam.name} section"
                          + (f"; it has a {' and a '.join(others)} section)" if others else ")"),
                          f"pass --family {others[0]}" if others else "give the header written by `evotuner export`")
    n = int(count.group(1))
    rows: list[list[str]] = [[] for _ in range(n)]
    values: list[list[tuple[str, int]]] = [[] for _ in range(n)]
    for m in row_macro.finditer(text):
        i = int(m.group(1))
        if not re.fullmatch(r"-?\d+", m.group(3)):      # else the row would be served without it
            raise ExportError(f"header {path}: {T}_{i}_{m.group(2)} is {m.group(3)!r}, not an integer",
                              "re-export the header; do not edit it by hand")
        if i >= n:
            raise ExportError(f"header {path}: row macro {T}_{i}_{m.group(2)} but only {n} rows",
                              "re-export the header; do not edit it by hand")
        if m.group(2) in rows[i]:
            raise ExportError(f"header {path}: {T}_{i}_{m.group(2)} is defined twice",
                              "re-export the header; do not edit it by hand")
        rows[i].append(m.group(2))
        values[i].append((m.group(2), int(m.group(3))))
    if rows and "QUERY_ROWS_BUCKET" not in rows[0] and "MAX_SEQLEN" in rows[0]:
        raise ExportError(f"header {path}: exported before rows had a query-rows bucket "
                          f"(no {T}_0_QUERY_ROWS_BUCKET), so a decode study may hold a prefill row",
                          f"re-export it from its studies: evotuner export --study ... --output {path}")
    for i, names in enumerate(rows):
        missing = [p for p in ROW_PROBLEM_MACROS if p not in names]
        if missing or len(names) == len(ROW_PROBLEM_MACROS):
            raise ExportError(f"header {path}: row {i} lacks macros "
                              f"{', '.join(f'{T}_{i}_{p}' for p in missing) or '(kernel parameters)'}",
                              "re-export the header; do not edit it by hand")
    for i, row in enumerate(values):
        _check_values(path, T, i, row, rows[0])
    if rows:
        _check_parameters(path, fam, rows[0])
    return HeaderInfo(arch=arch.group(1), rows=tuple(tuple(r) for r in rows), family=fam.name,
                      values=tuple(tuple(v) for v in values), export_prefix=T)


#: The values export writes for a row's problem macros (a row edited by hand out of these would
#: serve no call, or a wrong one): QUERY_ROWS_BUCKET up to 63, the bucket of the largest int64
#: B*H*Sq that the header's select() takes.
_PROBLEM_VALUES = {"HEAD_DIM": range(1, INT32_MAX + 1), "IS_CAUSAL": range(2), "DTYPE": tuple(DTYPE_NAMES),
                   "QUERY_ROWS_BUCKET": range(64), "MAX_SEQLEN": (*BUCKET_EDGES, OPEN_BUCKET)}


def _check_values(path: Path, T: str, i: int, row: tuple[tuple[str, int], ...] | list[tuple[str, int]],
                  first: list[str]) -> None:
    """Refuse a row whose values export never writes, or whose kernel parameters differ from row 0's."""
    names = [n for n, _ in row]
    if sorted(names) != sorted(first):
        missing = sorted(set(first) - set(names))
        extra = sorted(set(names) - set(first))
        what = (f"lacks {', '.join(f'{T}_{i}_{d}' for d in missing)} (row 0 has them)" if missing else
                f"has {', '.join(f'{T}_{i}_{d}' for d in extra)}, which row 0 lacks")
        raise ExportError(f"header {path}: row {i} {what}", "re-export the header; do not edit it by hand")
    for name, value in row:
        allowed = _PROBLEM_VALUES.get(name, range(INT32_MAX + 1))
        if value not in allowed:
            shown = f"{allowed.start}..{allowed.stop - 1}" if isinstance(allowed, range) else \
                ", ".join(map(str, allowed))
            raise ExportError(f"header {path}: {T}_{i}_{name} is {value}, not one of {shown}",
                              "re-export the header; do not edit it by hand")


def _check_parameters(path: Path, fam: KernelFamily, names: list[str]) -> None:
    """Refuse rows whose kernel parameters are not the family's: one it does not have (another
    family's section renamed, a typo), or one it needs left out (every row has row 0's names)."""
    from evotuner.defaults import family_parameters

    T, known = fam.export_macro_prefix, family_parameters(fam.name)
    given = [n for n in names if n not in ROW_PROBLEM_MACROS]
    unknown = [n for n in given if n not in known]
    missing = sorted(known - set(fam.optional_params) - set(given))
    if unknown or missing:
        what = (f"{', '.join(f'{T}_0_{n}' for n in unknown)}: not a {fam.name} kernel parameter" if unknown else
                f"no {', '.join(f'{T}_0_{n}' for n in missing)}: the {fam.name} kernel needs "
                f"{'it' if len(missing) == 1 else 'them'}")
        raise ExportError(f"header {path}: {what} (its parameters: {', '.join(sorted(known))})",
                          "re-export the header; do not edit it by hand")


def row_instantiation(header: str, index: int, names: Iterable[str], family: KernelFamily | str, *,
                      kernel_name: str | None = None, meta_name: str | None = None) -> str:
    """A ``.cu`` source that instantiates ``<family>/instantiate.cuh`` for row ``index`` of
    the family's section of the header, taking every ``<P>_*`` value from the header's
    ``<T>_<index>_*`` macros (P: the family's macro prefix, T: its export macro prefix).

    ``kernel_name``/``meta_name`` set ``<P>_KERNEL_NAME``/``<P>_META_NAME`` (several
    rows in one binary need unique names); None keeps the family's defaults.
    """
    fam = _family(family)
    P, T = fam.macro_prefix, fam.export_macro_prefix
    lines = [f"// generated by evotuner: row {index} of {header}",
             f'#include "{header}"',
             f"#if {T}_COUNT <= {index}",
             f'#error "{header} has no row {index}"',
             "#endif"]
    for name in names:
        if name in ROW_BUCKET_MACROS:
            continue
        lines.append(f"#define {P}_{name} {T}_{index}_{name}")
    if kernel_name is not None:
        lines.append(f"#define {P}_KERNEL_NAME {kernel_name}")
    if meta_name is not None:
        lines.append(f"#define {P}_META_NAME {meta_name}")
    lines.append(f'#include "{fam.name}/instantiate.cuh"')
    return "\n".join(lines) + "\n"
