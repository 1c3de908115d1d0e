"""Export: the best COMPLETE config per key of finished studies -> one C++ header.

Key = (arch, dtype, head_dim, causal, seqlen bucket). The bucket is the
power-of-two bucket of the study's ``seqlen_k`` with these edges::

    seqlen_k <=   512  -> max_seqlen   512
    seqlen_k <=  1024  -> max_seqlen  1024
    seqlen_k <=  2048  -> max_seqlen  2048
    seqlen_k <=  4096  -> max_seqlen  4096
    seqlen_k <=  8192  -> max_seqlen  8192
    seqlen_k  >  8192  -> max_seqlen  INT32_MAX (the open bucket)

When two studies land on one key the faster one (lower median µs) wins; the
winner's provenance comment names the studies it beat.

The header (``namespace flashcore::tuned``) holds ``struct Config``, the
``kConfigs`` table, ``select()`` (exact dtype/head_dim/causal match, smallest
bucket whose ``max_seqlen >= seqlen``, else the largest bucket, else nullptr),
and for the kernel build the same values again as macros,
``FLASHCORE_TUNED_<i>_<NAME>`` (``HEAD_DIM``, ``IS_CAUSAL``, ``DTYPE``,
``MAX_SEQLEN`` and one per kernel parameter) plus ``FLASHCORE_TUNED_COUNT``:
macros cannot read constexpr values, so a translation unit instantiating row
``i`` writes ``#define FLASHCORE_BLOCK_M FLASHCORE_TUNED_<i>_BLOCK_M``. The
header static_asserts that both spellings agree.

Every value written is checked to be an integer in range before anything is
written; the file is written atomically (temp file in the same folder, then
rename), so a failed export leaves the previous file, or none, never a partial one.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Protocol

from evotuner.atomicfile import write_text_atomic
from evotuner.build.instantiate import DTYPE_CODES, RESERVED
from evotuner.errors import EvotunerError
from evotuner.problem import HEAD_DIMS, Problem
from evotuner.textsafe import for_c_comment

#: Closed bucket edges (inclusive upper bounds of seqlen_k); above the last is the open bucket.
BUCKET_EDGES = (512, 1024, 2048, 4096, 8192)
INT32_MAX = 2**31 - 1
#: ``max_seqlen`` of the open bucket (seqlen_k > 8192).
OPEN_BUCKET = INT32_MAX
#: The arch a study targets when its summary does not say (DESIGN.md: Hopper only).
DEFAULT_ARCH = "sm_90a"

_PARAM = re.compile(r"^[A-Z][A-Z0-9_]*$")
#: Names the header's struct/macros use for the problem part; a parameter may not take them.
_HEADER_RESERVED = frozenset({"MAX_SEQLEN", "CAUSAL", "COUNT"}) | RESERVED


#: Field order in ``struct Config`` when the store cannot name the study's space (FlashCore's order);
#: any other parameter follows, sorted by name.
FIELD_ORDER = ("BLOCK_M", "BLOCK_N", "NUM_WARPS", "STAGES", "MIN_BLOCKS")


def field_order(names: Iterable[str]) -> tuple[str, ...]:
    names = set(names)
    return tuple(n for n in FIELD_ORDER if n in names) + tuple(sorted(names - set(FIELD_ORDER)))


class ExportError(EvotunerError):
    """The studies cannot be exported (missing, empty, inconsistent, or holding invalid values)."""


class _Store(Protocol):
    def summary(self, study_name: str) -> Any: ...


def seqlen_bucket(seqlen_k: int) -> int:
    """The bucket's ``max_seqlen`` for a study's ``seqlen_k`` (see the module docstring)."""
    for edge in BUCKET_EDGES:
        if seqlen_k <= edge:
            return edge
    return OPEN_BUCKET


@dataclass(frozen=True)
class ExportRow:
    """One row of the header: a study's best COMPLETE trial and where it came from."""

    study: str
    trial: int
    arch: str
    dtype: str
    head_dim: int
    causal: bool
    seqlen_k: int
    max_seqlen: int
    params: tuple[tuple[str, int], ...]   # sorted by name, like KernelConfig.items
    order: tuple[str, ...]                # the parameter names in the space file's order (struct fields)
    median_us: float
    tflops: float | None
    date: str
    nvcc_version: str
    source_hash: str
    device_name: str
    beat: tuple[tuple[str, float], ...] = ()   # (study, µs) of same-key studies this row won over

    @property
    def key(self) -> tuple[str, str, int, bool, int]:
        return (self.arch, self.dtype, self.head_dim, self.causal, self.max_seqlen)

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.params)


@dataclass(frozen=True)
class ExportResult:
    path: Path
    rows: tuple[ExportRow, ...]            # in header order (kConfigs[i] == rows[i])
    skipped: tuple[str, ...]              # studies left out because their arch differs from ``arch``
    sha256: str                           # of the header text written


# ---------------------------------------------------------------------------------------------
# reading the studies


def _fail(study: str, what: str, remedy: str | None = None) -> ExportError:
    return ExportError(f"export: study {study!r}: {what}", remedy)


def _int_value(study: str, where: str, value: object, lo: int, hi: int) -> int:
    """``value`` if it is a true int in [lo, hi]; anything else (bool, float, NaN, str) is refused."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(study, f"{where}={value!r} is not an integer",
                    "the study database holds a value evotuner did not write; re-run the trial or drop the study")
    if not lo <= value <= hi:
        raise _fail(study, f"{where}={value} is out of range {lo}..{hi}",
                    "the study database holds a value evotuner did not write; re-run the trial or drop the study")
    return value


def _state_name(state: object) -> str:
    return str(getattr(state, "name", state)).upper()


def _text(value: object) -> str:
    """A single-line comment-safe rendering of a provenance value."""
    if value is None or value == "":
        return "unknown"
    if isinstance(value, datetime):
        value = value.isoformat(timespec="seconds")
    return for_c_comment(value)


def _nvcc_short(version: object) -> str:
    """``nvcc --version`` text -> its release line part, e.g. ``13.0, V13.0.88``."""
    text = str(version or "")
    for line in text.splitlines():
        if "release" in line:
            return _text(line.split("release", 1)[1])
    return _text(text.strip().splitlines()[-1] if text.strip() else None)


def best_row(store: _Store, study: str) -> ExportRow:
    """The study's best COMPLETE trial as an :class:`ExportRow` (validated)."""
    try:
        summary = store.summary(study)   # StudyStore raises StorageError (naming the study) itself
    except KeyError:
        summary = None
    if summary is None:
        raise _fail(study, "not found in the study database", "check the study name and the --storage URL")
    problem = summary.problem
    if not isinstance(problem, Problem):
        raise _fail(study, f"has no problem record (got {type(problem).__name__})")
    best = None
    for trial in summary.trials:
        if _state_name(trial.state) != "COMPLETE":
            continue
        value = trial.value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise _fail(study, f"trial {trial.number}: median µs {value!r} is not a positive finite number",
                        "the study database holds a value evotuner did not write; re-run the trial")
        if best is None or (value, trial.number) < (best.value, best.number):
            best = trial
    if best is None:
        states = sorted({_state_name(t.state) for t in summary.trials}) or ["no trials"]
        raise _fail(study, f"has no COMPLETE trial ({', '.join(states)})",
                    "resume the study until a config passes, or leave it out of the export")
    params: dict[str, int] = {}
    if not best.params:
        raise _fail(study, f"trial {best.number} has no parameters")
    for name, value in best.params.items():
        if not isinstance(name, str) or not _PARAM.match(name) or name in _HEADER_RESERVED:
            raise _fail(study, f"trial {best.number}: parameter name {name!r} cannot become a C++ field",
                        "parameters are upper-case identifiers like BLOCK_M and not one of "
                        + ", ".join(sorted(_HEADER_RESERVED)))
        params[name] = _int_value(study, f"trial {best.number}: {name}", value, 0, INT32_MAX)
    shape = problem.shape
    head_dim = _int_value(study, "head_dim", shape.head_dim, 1, INT32_MAX)
    if head_dim not in HEAD_DIMS:
        raise _fail(study, f"head_dim={head_dim} is not one of {HEAD_DIMS}")
    seqlen_k = _int_value(study, "seqlen_k", shape.seqlen_k, 1, INT32_MAX)
    if problem.dtype not in DTYPE_CODES:
        raise _fail(study, f"dtype {problem.dtype!r} has no kernel code", f"use one of {', '.join(DTYPE_CODES)}")
    if not isinstance(problem.causal, bool):
        raise _fail(study, f"causal={problem.causal!r} is not a bool")
    tflops = getattr(best, "tflops", None)
    if tflops is not None and (isinstance(tflops, bool) or not isinstance(tflops, (int, float))
                               or not math.isfinite(tflops)):
        raise _fail(study, f"trial {best.number}: tflops={tflops!r} is not a finite number")
    device = getattr(summary, "device", None) or {}
    arch, order = _study_space(store, study, tuple(params))
    date = getattr(best, "datetime", None) or getattr(summary, "created", None)
    return ExportRow(
        study=study, trial=int(best.number), arch=str(arch), dtype=problem.dtype, head_dim=head_dim,
        causal=problem.causal, seqlen_k=seqlen_k, max_seqlen=seqlen_bucket(seqlen_k),
        params=tuple(sorted(params.items())), order=order, median_us=float(best.value),
        tflops=None if tflops is None else float(tflops), date=_text(date),
        nvcc_version=_nvcc_short(getattr(summary, "nvcc_version", None)),
        source_hash=_text(getattr(summary, "source_hash", None)),
        device_name=_text(device.get("name") if isinstance(device, dict) else None),
    )


def _study_space(store: _Store, study: str, names: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """(arch, parameter order) from the space the study was created with
    (``store.study_info(name).space``); a store without ``study_info`` gives
    :data:`DEFAULT_ARCH` and :func:`field_order`."""
    study_info = getattr(store, "study_info", None)
    if study_info is None:
        return DEFAULT_ARCH, field_order(names)
    space = study_info(study).space
    declared = [p.name for p in space.params]
    order = tuple(n for n in declared if n in names) + tuple(sorted(set(names) - set(declared)))
    return str(space.arch), order


def select_rows(rows: Iterable[ExportRow]) -> list[ExportRow]:
    """Keep the fastest row per key (ties: the earlier study named); header order."""
    winners: dict[tuple[str, str, int, bool, int], ExportRow] = {}
    losers: dict[tuple[str, str, int, bool, int], list[tuple[str, float]]] = {}
    for row in rows:
        current = winners.get(row.key)
        if current is None:
            winners[row.key] = row
        elif row.median_us < current.median_us:
            losers.setdefault(row.key, []).append((current.study, current.median_us))
            winners[row.key] = row
        else:
            losers.setdefault(row.key, []).append((row.study, row.median_us))
    out = [
        ExportRow(**{**r.__dict__, "beat": tuple(losers.get(key, ()))}) for key, r in winners.items()
    ]
    out.sort(key=lambda r: (DTYPE_CODES[r.dtype], r.head_dim, r.causal, r.max_seqlen))
    return out


# ---------------------------------------------------------------------------------------------
# rendering


def render_header(rows: list[ExportRow], arch: str) -> str:
    """The header text for validated rows (all sharing one parameter-name set)."""
    if not rows:
        raise ExportError("export: no rows to write", "name at least one study with a COMPLETE trial")
    names = rows[0].order
    fields = [n.lower() for n in names]
    w = max(len(f) for f in ["max_seqlen", *fields])
    lines = [
        "// generated by evotuner export: the best tuned FlashCore config per",
        "// (dtype, head_dim, causal, seqlen bucket). Do not edit; re-export instead.",
        f"// arch {arch}; seqlen buckets by seqlen_k: <= {', <= '.join(map(str, BUCKET_EDGES))}, "
        f"> {BUCKET_EDGES[-1]} (max_seqlen {OPEN_BUCKET}).",
        "// dtype: 0 = fp16, 1 = bf16 (FLASHCORE_DTYPE).",
        "#pragma once",
        "",
        "#include <cstdint>",
        "",
        f"#define FLASHCORE_TUNED_COUNT {len(rows)}",
        f'#define FLASHCORE_TUNED_ARCH "{arch}"',
        "",
        "namespace flashcore::tuned {",
        "",
        "struct Config {",
        "    int head_dim;",
        "    int dtype;  // 0 fp16, 1 bf16",
        "    bool causal;",
        "    int max_seqlen;  // the bucket: this row serves seqlen_k <= max_seqlen",
        *[f"    int {f};" for f in fields],
        "};",
        "",
        f'inline constexpr const char kArch[] = "{arch}";',
        "",
        "inline constexpr Config kConfigs[] = {",
    ]
    for i, r in enumerate(rows):
        tf = "unknown" if r.tflops is None else f"{r.tflops:.2f}"
        lines.append(f"    // [{i}] study {_text(r.study)!s}, trial {r.trial}: {r.median_us:.3f} us, {tf} TFLOPS "
                     f"(seqlen_k {r.seqlen_k})")
        lines.append(f"    //     {r.date}; nvcc {r.nvcc_version}; source {r.source_hash}; device {r.device_name}")
        if r.beat:
            beaten = ", ".join(f"study {_text(s)} ({us:.3f} us)" for s, us in r.beat)
            lines.append(f"    //     won its key over {beaten}")
        params = dict(r.params)
        values = ", ".join(str(params[n]) for n in names)
        lines.append(f"    {{{r.head_dim}, {DTYPE_CODES[r.dtype]}, {'true' if r.causal else 'false'}, "
                     f"{r.max_seqlen}, {values}}},")
    lines += [
        "};",
        "",
        "inline constexpr int kNumConfigs = static_cast<int>(sizeof(kConfigs) / sizeof(kConfigs[0]));",
        "",
        "// Exact (dtype, head_dim, causal) match; the smallest bucket whose max_seqlen >= seqlen,",
        "// else the largest bucket; nullptr when no row matches.",
        "constexpr const Config* select(int head_dim, int dtype, bool causal, int seqlen) {",
        "    const Config* fit = nullptr;",
        "    const Config* largest = nullptr;",
        "    for (int i = 0; i < kNumConfigs; ++i) {",
        "        const Config& c = kConfigs[i];",
        "        if (c.head_dim != head_dim || c.dtype != dtype || c.causal != causal) continue;",
        "        if (c.max_seqlen >= seqlen && (fit == nullptr || c.max_seqlen < fit->max_seqlen)) fit = &c;",
        "        if (largest == nullptr || c.max_seqlen > largest->max_seqlen) largest = &c;",
        "    }",
        "    return fit != nullptr ? fit : largest;",
        "}",
        "",
        "// Index of a row in kConfigs (-1 for nullptr): the production extension dispatches on it.",
        "constexpr int index_of(const Config* c) { return c == nullptr ? -1 : static_cast<int>(c - kConfigs); }",
        "",
        "}  // namespace flashcore::tuned",
        "",
        "// The same values as macros, for translation units that instantiate one row of the",
        "// kernel (#define FLASHCORE_BLOCK_M FLASHCORE_TUNED_<i>_BLOCK_M ...).",
    ]
    for i, r in enumerate(rows):
        params = dict(r.params)
        macros = [("HEAD_DIM", r.head_dim), ("IS_CAUSAL", int(r.causal)), ("DTYPE", DTYPE_CODES[r.dtype]),
                  ("MAX_SEQLEN", r.max_seqlen), *[(n, params[n]) for n in names]]
        mw = max(len(f"FLASHCORE_TUNED_{i}_{n}") for n, _ in macros)
        lines += [f"#define {f'FLASHCORE_TUNED_{i}_{n}':<{mw}} {v}" for n, v in macros]
        checks = [f"flashcore::tuned::kConfigs[{i}].head_dim == FLASHCORE_TUNED_{i}_HEAD_DIM",
                  f"flashcore::tuned::kConfigs[{i}].dtype == FLASHCORE_TUNED_{i}_DTYPE",
                  f"int(flashcore::tuned::kConfigs[{i}].causal) == FLASHCORE_TUNED_{i}_IS_CAUSAL",
                  f"flashcore::tuned::kConfigs[{i}].max_seqlen == FLASHCORE_TUNED_{i}_MAX_SEQLEN",
                  *[f"flashcore::tuned::kConfigs[{i}].{n.lower()} == FLASHCORE_TUNED_{i}_{n}" for n in names]]
        lines.append(f"static_assert({' && '.join(checks)},")
        lines.append(f'              "flashcore_tuned: row {i} macros disagree with kConfigs");')
    lines += [
        "static_assert(flashcore::tuned::kNumConfigs == FLASHCORE_TUNED_COUNT,",
        '              "flashcore_tuned: FLASHCORE_TUNED_COUNT disagrees with kConfigs");',
        "",
    ]
    return "\n".join(lines)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temp file in the same folder and a rename, keeping
    the existing file's mode (0666 less the umask for a new file); see :mod:`evotuner.atomicfile`."""
    try:
        write_text_atomic(path, text)
    except ExportError:
        raise
    except EvotunerError as exc:
        raise ExportError(f"export: {exc.message}", exc.remedy) from None


def export_header(store: _Store, study_names: list[str], output: Path, *, arch: str | None = None) -> ExportResult:
    """Export the best COMPLETE config per key of ``study_names`` to the header ``output``.

    ``arch=None`` takes the studies' arch (they must agree); an explicit arch keeps
    only the studies that target it (the others are listed in ``ExportResult.skipped``).
    """
    output = Path(output)
    if not study_names:
        raise ExportError("export: no study named", "name one or more studies to export")
    if len(set(study_names)) != len(study_names):
        dup = sorted({s for s in study_names if study_names.count(s) > 1})
        raise ExportError(f"export: study {dup[0]!r} is named twice", "name each study once")
    if not output.parent.is_dir():
        raise ExportError(f"export: output directory {output.parent} does not exist",
                          f"create it first (mkdir -p {output.parent})")
    if output.is_dir():
        raise ExportError(f"export: output {output} is a directory", "give a file name, e.g. flashcore_config.h")
    rows = [best_row(store, name) for name in study_names]
    skipped: tuple[str, ...] = ()
    if arch is None:
        archs = sorted({r.arch for r in rows})
        if len(archs) > 1:
            by = ", ".join(f"{r.study} ({r.arch})" for r in rows)
            raise ExportError(f"export: the studies target different archs: {by}",
                              "export the studies of one arch per header (export_header(..., arch=...))")
        arch = archs[0]
    else:
        skipped = tuple(r.study for r in rows if r.arch != arch)
        rows = [r for r in rows if r.arch == arch]
        if not rows:
            raise ExportError(f"export: none of the studies targets arch {arch}",
                              "leave --arch out to use the studies' own arch")
    if not re.match(r"^sm_\d{2,3}[af]?$", arch):
        raise ExportError(f"export: arch {arch!r} is not an SM target", "use e.g. sm_90a")
    names = rows[0].param_names
    for r in rows[1:]:
        if r.param_names != names:
            raise ExportError(
                f"export: study {r.study!r} has parameters {', '.join(r.param_names)} but study "
                f"{rows[0].study!r} has {', '.join(names)}",
                "export studies of the same search space together (one header per space)")
    chosen = select_rows(rows)
    text = render_header(chosen, arch)
    write_atomic(output, text)
    return ExportResult(path=output, rows=tuple(chosen), skipped=skipped,
                        sha256=hashlib.sha256(text.encode()).hexdigest())


# ---------------------------------------------------------------------------------------------
# reading an exported header back (the production build and the tests drive the kernel from it)

_ROW_MACRO = re.compile(r"^#define\s+FLASHCORE_TUNED_(\d+)_([A-Z][A-Z0-9_]*)\s+(-?\d+)\s*$", re.M)
_COUNT_MACRO = re.compile(r"^#define\s+FLASHCORE_TUNED_COUNT\s+(\d+)\s*$", re.M)
_ARCH_MACRO = re.compile(r'^#define\s+FLASHCORE_TUNED_ARCH\s+"(sm_\d{2,3}[af]?)"\s*$', re.M)
#: Per-row macros that describe the problem, not a kernel parameter.
ROW_PROBLEM_MACROS = ("HEAD_DIM", "IS_CAUSAL", "DTYPE", "MAX_SEQLEN")


@dataclass(frozen=True)
class HeaderInfo:
    """What an exported header declares: its arch and, per row, the macro names it defines."""

    arch: str
    rows: tuple[tuple[str, ...], ...]   # row i -> names N of FLASHCORE_TUNED_<i>_<N>, in header order


def read_header(path: Path) -> HeaderInfo:
    """Read the row macros of a header written by :func:`export_header`; raise ExportError otherwise."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ExportError(f"header {path}: cannot read it ({exc.strerror or exc})",
                          "give the header written by `evotuner export`") from None
    count, arch = _COUNT_MACRO.search(text), _ARCH_MACRO.search(text)
    if count is None or arch is None:
        raise ExportError(f"header {path}: no FLASHCORE_TUNED_COUNT / FLASHCORE_TUNED_ARCH",
                          "give the header written by `evotuner export`")
    n = int(count.group(1))
    rows: list[list[str]] = [[] for _ in range(n)]
    for m in _ROW_MACRO.finditer(text):
        i = int(m.group(1))
        if i >= n:
            raise ExportError(f"header {path}: row macro FLASHCORE_TUNED_{i}_{m.group(2)} but only {n} rows",
                              "re-export the header; do not edit it by hand")
        rows[i].append(m.group(2))
    for i, names in enumerate(rows):
        missing = [p for p in ROW_PROBLEM_MACROS if p not in names]
        if missing or len(names) == len(ROW_PROBLEM_MACROS):
            raise ExportError(f"header {path}: row {i} lacks macros "
                              f"{', '.join(f'FLASHCORE_TUNED_{i}_{p}' for p in missing) or '(kernel parameters)'}",
                              "re-export the header; do not edit it by hand")
    return HeaderInfo(arch=arch.group(1), rows=tuple(tuple(r) for r in rows))


def row_instantiation(header: str, index: int, names: Iterable[str], family: str, *,
                      kernel_name: str | None = None, meta_name: str | None = None) -> str:
    """A ``.cu`` source that instantiates ``<family>/instantiate.cuh`` for row ``index`` of
    the header, taking every FLASHCORE_* value from the header's FLASHCORE_TUNED_<index>_* macros.

    ``kernel_name``/``meta_name`` set FLASHCORE_KERNEL_NAME/FLASHCORE_META_NAME (several
    rows in one binary need unique names); None keeps the family's defaults.
    """
    lines = [f"// generated by evotuner: row {index} of {header}",
             f'#include "{header}"',
             f"#if FLASHCORE_TUNED_COUNT <= {index}",
             f'#error "{header} has no row {index}"',
             "#endif"]
    for name in names:
        if name == "MAX_SEQLEN":
            continue
        lines.append(f"#define FLASHCORE_{name} FLASHCORE_TUNED_{index}_{name}")
    if kernel_name is not None:
        lines.append(f"#define FLASHCORE_KERNEL_NAME {kernel_name}")
    if meta_name is not None:
        lines.append(f"#define FLASHCORE_META_NAME {meta_name}")
    lines.append(f'#include "{family}/instantiate.cuh"')
    return "\n".join(lines) + "\n"
