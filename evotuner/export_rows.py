"""Export's rows: a finished study's best COMPLETE trial as a validated :class:`ExportRow`,
its key and seqlen bucket, and the choice of one row per key (:func:`select_rows`).

The header format, the key and its buckets are described in :mod:`evotuner.export`; the
query-rows bucket rule is :mod:`evotuner.query_rows`."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Iterable, Mapping, Protocol

from evotuner.abi import DTYPE_CODES
from evotuner.errors import EvotunerError, ExportError
from evotuner.family import KernelFamily, get_family
from evotuner.problem import Problem
from evotuner.query_rows import bucket as query_rows_bucket
from evotuner.space import SearchSpace, stored_space
from evotuner.storage.diagnostics import CheckRecord
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
_HEADER_NAMES = frozenset({"MAX_SEQLEN", "QUERY_ROWS_BUCKET", "CAUSAL", "COUNT", "ARCH"})


def _header_reserved(family: KernelFamily) -> frozenset[str]:
    return _HEADER_NAMES | family.reserved()


class ExportSource(Protocol):
    """What export reads of the study database (:class:`~evotuner.storage.StudyStore`)."""

    def summary(self, study_name: str) -> StudySummary: ...          # StorageError when missing
    def study_info(self, name: str) -> StudyRecord: ...              # its space's text
    def latest_checks(self, study: str) -> Mapping[str, Mapping[str, CheckRecord]]: ...  # `evotuner check`
    def value_damage(self, study_name: str, number: int) -> EvotunerError | None: ...  # a bad median's cell
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
    query_rows: int                       # B*H*Sq of the study's problem
    query_rows_bucket: int                # its bucket (evotuner.query_rows.bucket)
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
    def key(self) -> tuple[str, str, str, int, bool, int, int]:
        """Rows of one key compete (the faster wins); rows of different query-rows or seqlen
        buckets never do."""
        return (self.family, self.arch, self.dtype, self.head_dim, self.causal, self.query_rows_bucket,
                self.max_seqlen)

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.params)


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


def _bad_median(store: ExportSource, study: str, number: int, value: object) -> ExportError:
    """A COMPLETE trial without a positive finite median: the damaged cell of the database
    when the store names one (what ``use_tuned`` says), else the value the summary holds."""
    remedy = (f"the database was damaged or edited by hand: restore it from a copy, or export the other "
              f"studies without {study!r}")
    found = store.value_damage(study, number)
    if found is not None:
        return _fail(study, f"trial {number}: {found.message}", remedy)
    return _fail(study, f"trial {number}: median µs {value!r} is not a positive finite number", remedy)


def comment_text(value: object) -> str:
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
            return comment_text(line.split("release", 1)[1])
    return comment_text(text.strip().splitlines()[-1] if text.strip() else None)


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
            raise _bad_median(store, study, trial.number, value)
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
    query_rows = math.prod(_int_value(study, name, getattr(shape, name), 1, INT32_MAX)
                           for name in ("batch", "heads", "seqlen_q"))
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
        causal=problem.causal, seqlen_k=seqlen_k, max_seqlen=seqlen_bucket(seqlen_k), query_rows=query_rows,
        query_rows_bucket=query_rows_bucket(query_rows),
        params=tuple(sorted(params.items())), order=order, median_us=float(best.value),
        tflops=None if tflops is None else float(tflops), date=comment_text(date),
        nvcc_version=_nvcc_short(summary.nvcc_version),
        source_hash=comment_text(summary.source_hash),
        device_name=comment_text(device.get("name")),
        replayed=bool(device.get("replayed")),
    )


def _study_space(info: StudyRecord) -> SearchSpace:
    """The space the study was created with (its arch, kernel family and parameter order)."""
    return stored_space(info.space_text, info.name, info.space_name)


def _study_family(study: str, space: SearchSpace) -> KernelFamily:
    """The kernel family the study tuned (its space's ``kernel``)."""
    try:
        return get_family(space.kernel)
    except EvotunerError as exc:
        raise _fail(study, exc.message, exc.remedy) from None


def select_rows(rows: Iterable[ExportRow]) -> list[ExportRow]:
    """Keep the fastest row per key (ties: the earlier study named); header order: family,
    dtype, head dim, causal, seqlen bucket, query-rows bucket."""
    winners: dict[tuple[str, str, str, int, bool, int, int], ExportRow] = {}
    losers: dict[tuple[str, str, str, int, bool, int, int], list[tuple[str, float]]] = {}
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
    out.sort(key=lambda r: (r.family, DTYPE_CODES[r.dtype], r.head_dim, r.causal, r.max_seqlen,
                            r.query_rows_bucket))
    return out


def with_optional_params(rows: list[ExportRow]) -> list[ExportRow]:
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
