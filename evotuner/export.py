"""Export: the best COMPLETE config per key of finished studies -> one C++ header.

Key = (kernel family, arch, dtype, head_dim, causal, seqlen bucket). The bucket is the
power-of-two bucket of the study's ``seqlen_k`` with these edges::

    seqlen_k <=   512  -> max_seqlen   512
    seqlen_k <=  1024  -> max_seqlen  1024
    seqlen_k <=  2048  -> max_seqlen  2048
    seqlen_k <=  4096  -> max_seqlen  4096
    seqlen_k <=  8192  -> max_seqlen  8192
    seqlen_k  >  8192  -> max_seqlen  INT32_MAX (the open bucket)

When two studies land on one key the faster one (lower median µs) wins; the
winner's provenance comment names the studies it beat.

The header holds one section per kernel family (several families share one
header; the production extension dispatches over all of them). A family's
section lives in its ``KernelFamily.export_namespace`` (FlashCore's is
``flashcore::tuned``) and holds ``struct Config``, the ``kConfigs`` table,
``select()`` (exact dtype/head_dim/causal match, smallest bucket whose
``max_seqlen >= seqlen``, else the largest bucket, else nullptr), and for the
kernel build the same values again as macros, ``<T>_<i>_<NAME>`` with ``<T>``
the family's ``export_macro_prefix`` (``HEAD_DIM``, ``IS_CAUSAL``, ``DTYPE``,
``MAX_SEQLEN`` and one per kernel parameter) plus ``<T>_COUNT`` and
``<T>_ARCH``: macros cannot read constexpr values, so a translation unit
instantiating row ``i`` writes ``#define <P>_<NAME> <T>_<i>_<NAME>`` (``<P>``: the
family's macro prefix). The header static_asserts that both spellings agree.

Every value written is checked to be an integer in range before anything is
written; the file is written atomically (temp file in the same folder, then
rename), so a failed export leaves the previous file, or none, never a partial one.
:mod:`evotuner.header` reads a written header back.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Iterable, Mapping, Protocol

from evotuner.abi import DTYPE_CODES
from evotuner.atomicfile import check_target, write_text_atomic
from evotuner.config import config_string
from evotuner.errors import EvotunerError, ExportError
from evotuner.family import KernelFamily, get_family
from evotuner.problem import Problem
from evotuner.space import SearchSpace, parse_space
from evotuner.storage.diagnostics import CheckRecord, verdict
from evotuner.storage.records import StudyRecord, StudySummary
from evotuner.textsafe import for_c_comment

#: Closed bucket edges (inclusive upper bounds of seqlen_k); above the last is the open bucket.
BUCKET_EDGES = (512, 1024, 2048, 4096, 8192)
INT32_MAX = 2**31 - 1
#: ``max_seqlen`` of the open bucket (seqlen_k > 8192).
OPEN_BUCKET = INT32_MAX

_PARAM = re.compile(r"^[A-Z][A-Z0-9_]*\Z")
#: Names the header's struct/macros use for the problem part; a parameter may not take them
#: (nor any name the family reserves).
_HEADER_NAMES = frozenset({"MAX_SEQLEN", "CAUSAL", "COUNT", "ARCH"})


def _header_reserved(family: KernelFamily) -> frozenset[str]:
    return _HEADER_NAMES | family.reserved()


class ExportSource(Protocol):
    """What export reads of the study database (:class:`~evotuner.storage.StudyStore`)."""

    def summary(self, study_name: str) -> StudySummary: ...          # StorageError when missing
    def study_info(self, name: str) -> StudyRecord: ...              # its space's text
    def latest_checks(self, study: str) -> Mapping[str, Mapping[str, CheckRecord]]: ...  # `evotuner check`
    def database_files(self) -> tuple[Path, ...]: ...                # never replaced by the header


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
    family: str
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
    checked: str = "unchecked"                 # `evotuner check`: passed, failed or unchecked
    replayed: bool = False                     # its figures are a recorded sweep's (search --replay)

    @property
    def key(self) -> tuple[str, str, str, int, bool, int]:
        return (self.family, self.arch, self.dtype, self.head_dim, self.causal, self.max_seqlen)

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


def best_row(store: ExportSource, study: str) -> ExportRow:
    """The study's best COMPLETE trial as an :class:`ExportRow` (validated)."""
    summary = store.summary(study)   # StorageError naming the study when it is missing
    problem = summary.problem
    if not isinstance(problem, Problem):
        raise _fail(study, f"has no problem record (got {type(problem).__name__})")
    if problem.varlen:   # the header's select() keys dense calls only: a packed study's best would serve them
        raise _fail(study, "tunes a packed variable-length batch, which the header's dense rows cannot hold",
                    "leave it out of the export; serve it to flash_attention_varlen with evotuner.use_tuned(DB)")
    best = None
    for trial in summary.trials:
        if trial.state != "COMPLETE":
            continue
        value = trial.value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise _fail(study, f"trial {trial.number}: median µs {value!r} is not a positive finite number",
                        "the study database holds a value evotuner did not write; re-run the trial")
        if best is None or (value, trial.number) < (best.value, best.number):
            best = trial
    if best is None:
        states = sorted({t.state for t in summary.trials}) or ["no trials"]
        raise _fail(study, f"has no COMPLETE trial ({', '.join(states)})",
                    "resume the study until a config passes, or leave it out of the export")
    params: dict[str, int] = {}
    if not best.params:
        raise _fail(study, f"trial {best.number} has no parameters")
    space = _study_space(store.study_info(study))
    family = _study_family(study, space)
    reserved = _header_reserved(family)
    for name, value in best.params.items():
        if not isinstance(name, str) or not _PARAM.match(name) or name in reserved:
            raise _fail(study, f"trial {best.number}: parameter name {name!r} cannot become a C++ field",
                        "parameters are upper-case identifiers and not one of " + ", ".join(sorted(reserved)))
        params[name] = _int_value(study, f"trial {best.number}: {name}", value, 0, INT32_MAX)
    shape = problem.shape
    head_dim = _int_value(study, "head_dim", shape.head_dim, 1, INT32_MAX)
    if head_dim not in family.head_dims:
        raise _fail(study, f"head_dim={head_dim} is not one of {family.head_dims}")
    seqlen_k = _int_value(study, "seqlen_k", shape.seqlen_k, 1, INT32_MAX)
    if problem.dtype not in DTYPE_CODES:
        raise _fail(study, f"dtype {problem.dtype!r} has no kernel code", f"use one of {', '.join(DTYPE_CODES)}")
    if not isinstance(problem.causal, bool):
        raise _fail(study, f"causal={problem.causal!r} is not a bool")
    tflops = best.tflops
    if tflops is not None and (isinstance(tflops, bool) or not isinstance(tflops, (int, float))
                               or not math.isfinite(tflops)):
        raise _fail(study, f"trial {best.number}: tflops={tflops!r} is not a finite number")
    device = summary.device or {}
    declared = space.names
    order = tuple(n for n in declared if n in params) + tuple(sorted(set(params) - set(declared)))
    date = best.datetime or summary.created
    return ExportRow(
        study=study, trial=int(best.number), arch=space.arch, family=family.name, dtype=problem.dtype,
        head_dim=head_dim,
        causal=problem.causal, seqlen_k=seqlen_k, max_seqlen=seqlen_bucket(seqlen_k),
        params=tuple(sorted(params.items())), order=order, median_us=float(best.value),
        tflops=None if tflops is None else float(tflops), date=_text(date),
        nvcc_version=_nvcc_short(summary.nvcc_version),
        source_hash=_text(summary.source_hash),
        device_name=_text(device.get("name")),
        replayed=bool(device.get("replayed")),
    )


def _study_space(info: StudyRecord) -> SearchSpace:
    """The space the study was created with (its arch, kernel family and parameter order)."""
    return parse_space(info.space_text, f"study '{info.name}' (space {info.space_name})")


def _study_family(study: str, space: SearchSpace) -> KernelFamily:
    """The kernel family the study tuned (its space's ``kernel``)."""
    try:
        return get_family(space.kernel)
    except EvotunerError as exc:
        raise _fail(study, exc.message, exc.remedy) from None


def select_rows(rows: Iterable[ExportRow]) -> list[ExportRow]:
    """Keep the fastest row per key (ties: the earlier study named); header order."""
    winners: dict[tuple[str, str, str, int, bool, int], ExportRow] = {}
    losers: dict[tuple[str, str, str, int, bool, int], list[tuple[str, float]]] = {}
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
    out.sort(key=lambda r: (r.family, DTYPE_CODES[r.dtype], r.head_dim, r.causal, r.max_seqlen))
    return out


# ---------------------------------------------------------------------------------------------
# rendering


def render_header(rows: list[ExportRow], arch: str) -> str:
    """The header text for validated rows: one section per family (each family's rows
    share one parameter-name set), families in name order."""
    if not rows:
        raise ExportError("export: no rows to write", "name at least one study with a COMPLETE trial")
    names = sorted({r.family for r in rows})
    fams = [get_family(n) for n in names]
    what = (f"the best tuned {fams[0].title or fams[0].name} config per" if len(fams) == 1
            else f"the best tuned config of each kernel family ({', '.join(names)}) per")
    lines = [
        f"// generated by evotuner export: {what}",
        "// (dtype, head_dim, causal, seqlen bucket). Do not edit; re-export instead.",
        f"// arch {arch}; seqlen buckets by seqlen_k: <= {', <= '.join(map(str, BUCKET_EDGES))}, "
        f"> {BUCKET_EDGES[-1]} (max_seqlen {OPEN_BUCKET}).",
        f"// dtype: 0 = fp16, 1 = bf16 ({fams[0].macro_prefix}_DTYPE)." if len(fams) == 1 else
        "// dtype: 0 = fp16, 1 = bf16 (<PREFIX>_DTYPE of each family, kernels/evotuner_abi.h).",
        "#pragma once",
        "",
        "#include <cstdint>",
        "",
    ]
    for k, fam in enumerate(fams):
        if k:
            lines.append("")
        lines += _render_section([r for r in rows if r.family == fam.name], arch, fam)
    return "\n".join(lines)


def _render_section(rows: list[ExportRow], arch: str, family: KernelFamily) -> list[str]:
    names = rows[0].order
    fields = [n.lower() for n in names]
    ns, t, prefix = family.export_namespace, family.export_macro_prefix, family.macro_prefix
    tag = t.lower()
    lines = [
        f"#define {t}_COUNT {len(rows)}",
        f'#define {t}_ARCH "{arch}"',
        "",
        f"namespace {ns} {{",
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
        if r.replayed:   # a line of its own: the device line ends with the GPU's name (evotuner.tuned reads it)
            lines.append("    //     replayed from a sweep recorded on that device: not measured by this study")
        lines.append(f"    //     evotuner check (compute-sanitizer {', '.join(CHECK_TOOLS)}): {r.checked}")
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
        f"}}  // namespace {ns}",
        "",
        "// The same values as macros, for translation units that instantiate one row of the",
        f"// kernel (#define {prefix}_<NAME> {t}_<i>_<NAME> ...).",
    ]
    for i, r in enumerate(rows):
        params = dict(r.params)
        macros = [("HEAD_DIM", r.head_dim), ("IS_CAUSAL", int(r.causal)), ("DTYPE", DTYPE_CODES[r.dtype]),
                  ("MAX_SEQLEN", r.max_seqlen), *[(n, params[n]) for n in names]]
        mw = max(len(f"{t}_{i}_{n}") for n, _ in macros)
        lines += [f"#define {f'{t}_{i}_{n}':<{mw}} {v}" for n, v in macros]
        checks = [f"{ns}::kConfigs[{i}].head_dim == {t}_{i}_HEAD_DIM",
                  f"{ns}::kConfigs[{i}].dtype == {t}_{i}_DTYPE",
                  f"int({ns}::kConfigs[{i}].causal) == {t}_{i}_IS_CAUSAL",
                  f"{ns}::kConfigs[{i}].max_seqlen == {t}_{i}_MAX_SEQLEN",
                  *[f"{ns}::kConfigs[{i}].{n.lower()} == {t}_{i}_{n}" for n in names]]
        lines.append(f"static_assert({' && '.join(checks)},")
        lines.append(f'              "{tag}: row {i} macros disagree with kConfigs");')
    lines += [
        f"static_assert({ns}::kNumConfigs == {t}_COUNT,",
        f'              "{tag}: {t}_COUNT disagrees with kConfigs");',
        "",
    ]
    return lines


def write_atomic(path: Path, text: str, protect: Iterable[Path] = ()) -> None:
    """Write ``text`` to ``path`` under evotuner's output rule (:mod:`evotuner.atomicfile`: never
    a link, a non-regular file, a database or one of ``protect``; a temp file in the same folder
    and a rename, keeping the existing file's mode, 0666 less the umask for a new file)."""
    try:
        write_text_atomic(path, text, protect=protect)
    except ExportError:
        raise
    except EvotunerError as exc:
        raise ExportError(f"export: {exc.message}", exc.remedy) from None


#: The compute-sanitizer tools a row must have passed to count as checked.
CHECK_TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")


def _row_config(row: ExportRow) -> str:
    return config_string(dict(row.params))


def _check_verdict(store: ExportSource, row: ExportRow) -> str:
    """passed / failed / unchecked from the study's ``evotuner check`` records."""
    return verdict(dict(store.latest_checks(row.study).get(_row_config(row)) or {}), CHECK_TOOLS)


def export_header(store: ExportSource, study_names: list[str], output: Path, *, arch: str | None = None,
                  require_checked: bool = False) -> ExportResult:
    """Export the best COMPLETE config per key of ``study_names`` to the header ``output``.

    ``arch=None`` takes the studies' arch (they must agree); an explicit arch keeps
    only the studies that target it (the others are listed in ``ExportResult.skipped``).
    Each row records whether its config passed ``evotuner check`` (every tool of
    :data:`CHECK_TOOLS`, latest run); ``require_checked`` refuses, writing nothing,
    when a chosen row has not passed.
    """
    if str(output) == "-":       # the usual "standard output" would be a stray file named '-'
        raise ExportError("export: --output -: export writes a header file, not to standard output",
                          "name the file, e.g. -o tuned_config.h (./- for a file named '-')")
    raw, output = output, Path(output)
    if not study_names:
        raise ExportError("export: no study named", "name one or more studies to export")
    if len(set(study_names)) != len(study_names):
        dup = sorted({s for s in study_names if study_names.count(s) > 1})
        raise ExportError(f"export: study {dup[0]!r} is named twice", "name each study once")
    if not output.parent.is_dir():
        file = next((p for p in output.parents if p.exists() and not p.is_dir()), None)   # a file on the way
        raise ExportError(f"export: {file} is a file, not a folder" if file else f"export: output directory "
                          f"{output.parent} does not exist", "name a path inside a folder" if file else
                          f"create it first (mkdir -p {output.parent})")
    try:
        is_dir = output.is_dir()
    except OSError:              # e.g. a name too long: the output rule below says so
        is_dir = False
    if is_dir or str(raw).endswith("/"):
        raise ExportError(f"export: output {raw} {'is a directory' if is_dir else 'names a folder (it ends in /)'}",
                          "give a file name, e.g. tuned_config.h")
    try:                         # refuse the database, a link or a device before any work
        check_target(output, protect=store.database_files())
    except EvotunerError as exc:
        raise ExportError(f"export: {exc.message}", exc.remedy) from None
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
    if not re.match(r"^sm_\d{2,3}[af]?\Z", arch):
        raise ExportError(f"export: arch {arch!r} is not an SM target", "use e.g. sm_90a")
    rows = _with_optional_params(rows)
    first: dict[str, ExportRow] = {}
    for r in rows:
        ref = first.setdefault(r.family, r)
        if r.param_names != ref.param_names:
            raise ExportError(
                f"export: study {r.study!r} has parameters {', '.join(r.param_names)} but study "
                f"{ref.study!r} has {', '.join(ref.param_names)} (both of kernel family {r.family})",
                "export studies of one search space per family together (one header per space and family)")
    chosen = [replace(r, checked=_check_verdict(store, r)) for r in select_rows(rows)]
    if require_checked:
        bad = [r for r in chosen if r.checked != "passed"]
        if bad:
            what = "; ".join(f"study {r.study!r} trial {r.trial} ({_row_config(r)}): {r.checked}" for r in bad)
            raise ExportError(
                f"export --require-checked: {len(bad)} row(s) did not pass evotuner check: {what}",
                "run `evotuner check --study S` on the GPU machine (a failed config must be fixed or "
                "excluded), or export without --require-checked")
    text = render_header(chosen, arch)
    write_atomic(output, text, protect=store.database_files())
    return ExportResult(path=output, rows=tuple(chosen), skipped=skipped,
                        sha256=hashlib.sha256(text.encode()).hexdigest())


def _with_optional_params(rows: list[ExportRow]) -> list[ExportRow]:
    """Rows of one family whose spaces differ only in knobs with a family default
    (``KernelFamily.optional_params``: hopper.toml and hopper_split.toml, a study made before
    a knob existed) share one parameter list: a row without such a knob takes its default,
    which is what its build compiled."""
    names: dict[str, list[str]] = {}
    for r in rows:
        known = names.setdefault(r.family, [])
        known.extend(n for n in r.order if n not in known)
    out = []
    for r in rows:
        defaults = get_family(r.family).optional_params
        missing = [n for n in names[r.family] if n not in r.param_names and n in defaults]
        params = tuple(sorted((*r.params, *((n, int(defaults[n])) for n in missing))))
        have = {n for n, _ in params}
        out.append(replace(r, params=params, order=tuple(n for n in names[r.family] if n in have)))
    return out
