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
    """The registered families with a ``<T>_COUNT`` macro in a header's text (of any value: read_header
    refuses a count export never writes). A section is one family's: of families sharing a prefix ``<T>``
    (a variant keeping FlashCore's contract), the first registered, else its rows were served twice."""
    firsts: dict[str, str] = {}
    for f in families():
        firsts.setdefault(f.export_macro_prefix, f.name)
    return tuple(name for t, name in firsts.items() if re.search(rf"^#define\s+{re.escape(t)}_COUNT\b", text, re.M))


def read_header(path: Path, family: KernelFamily | str | None = None) -> HeaderInfo:
    """Read one family's row macros (default family: the default one) of a header written
    by :func:`export_header`; raise ExportError otherwise."""
    fam = _family(family)
    t = re.escape(fam.export_macro_prefix)
    row_macro = re.compile(rf"^#define\s+{t}_([0-9]+)_([A-Z][A-Z0-9_]*)\b[ \t]*(.*?)\s*$", re.M)
    count_macro = re.compile(rf"^#define\s+{t}_COUNT\b[ \t]*(.*?)\s*$", re.M)
    arch_macro = re.compile(rf"^#define\s+{t}_ARCH\b[ \t]*(.*?)\s*$", re.M)
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
    if count is None:
        others = [name for name in _sections(text) if name != fam.name]
        raise ExportError(f"header {path}: no {T}_COUNT / {T}_ARCH (no {fam.name} section"
                          + (f"; it has a {' and a '.join(others)} section)" if others else ")"),
                          f"pass --family {others[0]}" if others else "give the header written by `evotuner export`")
    target = None if arch is None else re.fullmatch(r'"(sm_[0-9]{2,3}[af]?)"', arch.group(1))
    if target is None:
        raise ExportError(f"header {path}: " + (f"{T}_COUNT but no {T}_ARCH" if arch is None else
                          f"{T}_ARCH is {_shown(arch.group(1))}, not an SM target such as \"sm_90a\""),
                          "re-export the header; do not edit it by hand")
    n, counts = _decimal(count.group(1)), len(count_macro.findall(text))
    if n is None or n < 0 or counts > 1:
        raise ExportError(f"header {path}: {T}_COUNT is {_shown(count.group(1))}, "
                          + ("not a row count" if n is None or n < 0 else f"defined {counts} times"),
                          "re-export the header; do not edit it by hand")
    found = list(row_macro.finditer(text))
    for m in found:
        if _decimal(m.group(1)) is None:       # 01 or a row number past int64: no row export writes
            raise ExportError(f"header {path}: {T}_{_shown(m.group(1), quote=False)}_{m.group(2)}: not a row "
                              "number export writes", "re-export the header; do not edit it by hand")
    present = {int(m.group(1)) for m in found}   # a row without any macro, before a list of n rows is made
    gone = next((i for i in range(min(n, len(found) + 1)) if i not in present), None)   # (a count of 10**9)
    if gone is not None:
        raise ExportError(f"header {path}: row {gone} lacks macros "
                          f"{', '.join(f'{T}_{gone}_{p}' for p in ROW_PROBLEM_MACROS)}",
                          "re-export the header; do not edit it by hand")
    rows: list[list[str]] = [[] for _ in range(n)]
    values: list[list[tuple[str, int]]] = [[] for _ in range(n)]
    for m in found:
        i, value = int(m.group(1)), _decimal(m.group(3))
        if value is None:      # else the row would be served without it, or 010 read as 10 (C++: octal 8)
            raw = m.group(3)
            why = ("an integer with a leading 0 (octal to C++)" if re.fullmatch(r"-?0[0-9]+", raw) else
                   "past every value export writes" if re.fullmatch(r"-?[0-9]+", raw) else "not an integer")
            raise ExportError(f"header {path}: {T}_{i}_{m.group(2)} is {_shown(raw)}, {why}",
                              "re-export the header; do not edit it by hand")
        if i >= n:
            raise ExportError(f"header {path}: row macro {T}_{i}_{m.group(2)} but only {n} rows",
                              "re-export the header; do not edit it by hand")
        if m.group(2) in rows[i]:
            raise ExportError(f"header {path}: {T}_{i}_{m.group(2)} is defined twice",
                              "re-export the header; do not edit it by hand")
        rows[i].append(m.group(2))
        values[i].append((m.group(2), value))
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
        _check_table(path, text, fam, values)
    return HeaderInfo(arch=target.group(1), rows=tuple(tuple(r) for r in rows), family=fam.name,
                      values=tuple(tuple(v) for v in values), export_prefix=T)


def _decimal(text: str) -> int | None:
    """A macro's value as export writes it: a decimal integer of ASCII digits without a leading 0
    (C++ reads 010 as octal 8, Python as 10) and of at most 18 digits (past int64, where no value
    export writes lies; int() refuses thousands of digits), else None."""
    return int(text) if re.fullmatch(r"-?(?:0|[1-9][0-9]{0,17})", text) else None


def _shown(text: str, quote: bool | None = None) -> str:
    """``text`` for a message: repr'd unless it is digits (or ``quote`` says), cut past 40 characters."""
    quote = not re.fullmatch(r"-?[0-9]+", text) if quote is None else quote
    cut = text if len(text) <= 40 else f"{text[:20]}...{text[-8:]}"
    return (repr(cut) if quote else cut) + ("" if len(text) <= 40 else f" ({len(text)} characters)")


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


def _check_table(path: Path, text: str, fam: KernelFamily, values: list[list[tuple[str, int]]]) -> None:
    """Refuse a section whose ``kConfigs`` rows are not its macros' values (a row or a value edited
    in one of the two): the header's static_asserts stop its build, so no reader may serve it."""
    T, ns = fam.export_macro_prefix, fam.export_namespace
    section = text[re.search(rf"^#define\s+{re.escape(T)}_COUNT\b", text, re.M).end():]
    ends = [m.start() for f in families() if f.export_macro_prefix != T   # up to the next family's section
            for m in [re.search(rf"^#define\s+{re.escape(f.export_macro_prefix)}_COUNT\b", section, re.M)] if m]
    section = section[:min(ends, default=len(section))]
    table = re.search(r"\bConfig\s+kConfigs\[\]\s*=\s*\{(.*?)^\s*\};", section, re.M | re.S)
    got = [] if table is None else [re.sub(r"\s+", "", m.group(1)).replace("true", "1").replace("false", "0")
                                    for m in re.finditer(r"^\s*\{([^{}]*)\}\s*,?\s*$", table.group(1), re.M)]
    order = ("HEAD_DIM", "DTYPE", "IS_CAUSAL", "QUERY_ROWS_BUCKET", "MAX_SEQLEN")   # the struct's field order
    want = [",".join(str(v) for v in (*(dict(row)[n] for n in order),
                                      *(x for n, x in row if n not in ROW_PROBLEM_MACROS))) for row in values]
    if got != want:
        i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        what = (f"{ns}::kConfigs[{i}] is {{{_shown(got[i], quote=False)}}}, its macros {T}_{i}_* say "
                f"{{{want[i]}}}" if i < len(got) and i < len(want) else
                f"{ns}::kConfigs has {len(got)} rows, {T}_COUNT is {len(want)}")
        raise ExportError(f"header {path}: {what} (the header's static_asserts refuse it)",
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
