"""Sweep files: every config of a space at one problem, as recorded (``scripts/sweep.py``).

A *sweep* is one CSV row per config and a sidecar ``<csv>.json`` with the problem, the space
fingerprint, the device fingerprint and the SDPA baselines of the same run.

CSV columns, in this order::

    <one column per space parameter>, status, median_us, tflops, max_error,
    registers, spill_bytes, smem_bytes, reason,
    p20_us, p80_us, tolerance, repetitions, failure_kind, meta, ptxas_log

``status`` is ``ok`` (measured), ``gated`` (rejected before the GPU: by a static
constraint, ``failure_kind`` empty and no ptxas log; or by the ptxas gate,
``failure_kind`` = ``gate``) or ``failed`` (``failure_kind`` = ``build`` for a
compile error, else one of :data:`~evotuner.measure.base.FAILURE_KINDS`).
``meta`` is the artifact's meta table (evotuner/abi.py) as JSON and ``ptxas_log``
the build's ``-Xptxas -v`` output verbatim (newlines written as ``\\n``);
empty where the config never compiled.

:func:`read_sweep` reads and checks one (a :class:`SweepTable` of :class:`SweepRow`);
:func:`write_sweep` writes one. :mod:`evotuner.measure.replay` answers a search from it.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from evotuner.atomicfile import write_text_atomic
from evotuner.config import KernelConfig
from evotuner.errors import EvotunerError
from evotuner.measure.base import FAILURE_KINDS, Measurement
from evotuner.numbers import INT32_MAX, parse_real, parse_whole, real, whole
from evotuner.problem import Problem

#: Sweep row statuses.
STATUSES = ("ok", "gated", "failed")
#: The columns after the parameter columns; the first eight are the issue's contract.
RESULT_COLUMNS = (
    "status", "median_us", "tflops", "max_error", "registers", "spill_bytes", "smem_bytes", "reason",
    "p20_us", "p80_us", "tolerance", "repetitions", "failure_kind", "meta", "ptxas_log",
)
#: ``failure_kind`` of a ptxas-gated row and of a failed compile.
GATE_KIND = "gate"
BUILD_KIND = "build"
#: Sidecar keys every sweep writes (``problem`` is Problem.as_dict()).
SIDECAR_KEYS = ("problem", "space_fingerprint", "device", "baselines")
#: ``ptxas_log`` cells escape backslash and newline (``\\`` and ``\n``): one CSV line per row.
_UNESCAPE = re.compile(r"\\(.)")
#: What to do about a sweep file or sidecar that is damaged (scripts/sweep.py records sweeps).
RERECORD = "re-record the sweep with scripts/sweep.py"
SIDECAR_REMEDY = "rerun scripts/sweep.py, or fix the sidecar by hand"


class ReplayError(EvotunerError):
    """A sweep file is missing, malformed, or does not fit the study."""


@dataclass(frozen=True)
class SweepRow:
    """One config of a sweep, as recorded."""

    config: KernelConfig
    status: str
    reason: str = ""
    median_us: float | None = None
    p20_us: float | None = None
    p80_us: float | None = None
    tflops: float | None = None
    max_error: float | None = None
    tolerance: float | None = None
    repetitions: int | None = None
    registers: int | None = None
    spill_bytes: int | None = None
    smem_bytes: int | None = None
    failure_kind: str = ""
    meta: dict[str, int] = field(default_factory=dict, hash=False, compare=False)
    ptxas_log: str = ""

    @property
    def compiled(self) -> bool:
        """True when the sweep has the config's build (a meta table and a ptxas report)."""
        return bool(self.meta) and bool(self.ptxas_log)

    @property
    def statically_pruned(self) -> bool:
        return self.status == "gated" and self.failure_kind != GATE_KIND

    def measurement(self) -> Measurement:
        if self.status != "ok" or self.median_us is None:
            raise ValueError(f"{self.config} was not measured (status {self.status})")
        return Measurement(
            median_us=self.median_us,
            p20_us=self.p20_us if self.p20_us is not None else self.median_us,
            p80_us=self.p80_us if self.p80_us is not None else self.median_us,
            tflops=self.tflops if self.tflops is not None else math.nan,
            max_error=self.max_error if self.max_error is not None else math.nan,
            tolerance=self.tolerance if self.tolerance is not None else math.nan,
            repetitions=self.repetitions or 0,
        )

    def as_csv(self, names: tuple[str, ...]) -> list[str]:
        def num(v: float | int | None) -> str:
            return "" if v is None else repr(v) if isinstance(v, float) else str(v)

        return [str(self.config[n]) for n in names] + [
            self.status, num(self.median_us), num(self.tflops), num(self.max_error), num(self.registers),
            num(self.spill_bytes), num(self.smem_bytes), one_line(self.reason), num(self.p20_us), num(self.p80_us),
            num(self.tolerance), num(self.repetitions), self.failure_kind,
            json.dumps(self.meta, sort_keys=True, separators=(",", ":")) if self.meta else "",
            self.ptxas_log.replace("\\", "\\\\").replace("\n", "\\n"),
        ]


@dataclass(frozen=True)
class SweepTable:
    """A sweep read from disk: its sidecar and its rows by config."""

    path: Path
    sha256: str
    names: tuple[str, ...]
    header: dict[str, Any] = field(hash=False)
    rows: dict[KernelConfig, SweepRow] = field(hash=False)

    @property
    def problem(self) -> Problem:
        return Problem.from_dict(self.header["problem"])

    def optimum(self) -> SweepRow | None:
        ok = [r for r in self.rows.values() if r.status == "ok" and r.median_us is not None]
        return min(ok, key=lambda r: r.median_us) if ok else None


# --------------------------------------------------------------------------- files


def sidecar_path(csv_path: str | Path) -> Path:
    p = Path(csv_path)
    return p.with_name(p.name + ".json")


def write_sweep(path: str | Path, names: Iterable[str], rows: Iterable[SweepRow], header: Mapping[str, Any]) -> Path:
    """Write a whole sweep (CSV + sidecar). ``header`` must hold :data:`SIDECAR_KEYS`."""
    names = tuple(names)
    missing = [k for k in SIDECAR_KEYS if k not in header]
    if missing:
        raise ValueError(f"sweep header lacks {', '.join(missing)}")
    path = Path(path)
    buffer = io.StringIO()
    w = csv.writer(buffer, lineterminator="\n")
    w.writerow(list(names) + list(RESULT_COLUMNS))
    for row in rows:
        w.writerow(row.as_csv(names))
    write_text_atomic(path, buffer.getvalue())      # evotuner's output rule: never a link or a database
    write_sidecar(path, header)
    return path


def write_sidecar(path: str | Path, header: Mapping[str, Any]) -> Path:
    side = sidecar_path(path)
    write_text_atomic(side, json.dumps(dict(header), indent=2, sort_keys=True, default=str) + "\n")
    return side


def read_sweep(path: str | Path) -> SweepTable:
    """Read and validate a sweep CSV and its sidecar; ReplayError names the file, line and column."""
    path = Path(path)
    if not path.is_file():
        what = ("is a folder, not a sweep file" if path.is_dir()
                else "is not a regular file" if path.exists() else "sweep file not found")
        raise ReplayError(f"--replay {path}: {what}",
                          "give a sweep's CSV file, as scripts/sweep.py records it, its .json sidecar beside it")
    side = sidecar_path(path)
    if not side.is_file():
        raise ReplayError(f"--replay {path}: its sidecar {side.name} is missing",
                          "keep the .json that scripts/sweep.py writes beside the CSV")
    try:
        header = json.loads(side.read_text(encoding="utf-8"), parse_constant=_no_constant)
    except (OSError, ValueError) as exc:
        raise ReplayError(f"{side}: cannot read the sweep sidecar: {exc}", SIDECAR_REMEDY) from None
    if not isinstance(header, dict):
        raise ReplayError(f"{side}: the sweep sidecar is not a JSON object", SIDECAR_REMEDY)
    for key in SIDECAR_KEYS:
        if key not in header:
            raise ReplayError(f"{side}: sidecar key {key!r} is missing", "rerun scripts/sweep.py")
    try:
        Problem.from_dict(header["problem"])
    except (EvotunerError, KeyError, TypeError, ValueError) as exc:
        raise ReplayError(f"{side}: sidecar 'problem' is not a problem: {exc}", SIDECAR_REMEDY) from None
    _check_sidecar(side, header)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ReplayError(f"--replay {path}: cannot read the sweep: {exc.strerror}",
                          "check the file and its permissions") from None
    text = data.decode("utf-8", errors="replace")
    reader = _Cells(path, csv.reader(text.splitlines()))
    try:
        columns = next(reader)
    except StopIteration:
        raise ReplayError(f"{path}: empty sweep file",
                          f"{RERECORD} (it writes a header and a row per config)") from None
    n_params = len(columns) - len(RESULT_COLUMNS)
    if n_params < 1 or tuple(columns[n_params:]) != RESULT_COLUMNS:
        raise ReplayError(
            f"{path}: header must be the parameter columns then {', '.join(RESULT_COLUMNS)}",
            "this file was not written by scripts/sweep.py (or by an incompatible version)",
        )
    names = tuple(columns[:n_params])
    rows: dict[KernelConfig, SweepRow] = {}
    for lineno, cells in enumerate(reader, start=2):
        if not cells:
            continue
        if len(cells) != len(columns):
            raise ReplayError(f"{path}:{lineno}: {len(cells)} cells, the header has {len(columns)}",
                              "give a whole sweep file as evotuner wrote it (this row is cut short or damaged)")
        row = parse_row(path, lineno, names, cells)
        if row.config in rows:
            raise ReplayError(f"{path}:{lineno}: config {row.config} appears twice",
                              f"delete one of its rows (fix line {lineno}), or {RERECORD}")
        rows[row.config] = row
    return SweepTable(path=path, sha256=hashlib.sha256(data).hexdigest(), names=names, header=header, rows=rows)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a finite number")


def _check_sidecar(side: Path, header: dict[str, Any]) -> None:
    """The sidecar's device (null, or an object whose name is a string) and baselines (backend -> positive
    finite µs or null); a wrong type is a ReplayError naming the key, not a trial's traceback."""
    device = header["device"]
    if device is not None and (not isinstance(device, dict) or not isinstance(device.get("name", ""), str)):
        raise ReplayError(f"{side}: sidecar 'device' is neither null nor an object with a name string",
                          "rerun scripts/sweep.py, or fix the sidecar by hand")
    baselines = header["baselines"]
    if not isinstance(baselines, dict):
        raise ReplayError(f"{side}: sidecar 'baselines' is not an object of backend -> microseconds",
                          "rerun scripts/sweep.py, or fix the sidecar by hand")
    for name, us in baselines.items():
        if us is not None:
            real(us, f"{side}: sidecar baselines {name}", above=0.0, error=ReplayError,
                 remedy="a baseline is a positive time in microseconds, or null")


class _Cells:
    """csv.reader whose errors (a cell over csv's field size limit, a stray NUL) are ReplayErrors naming the line."""

    def __init__(self, path: Path, reader: Any) -> None:
        self.path, self.reader = path, reader

    def __iter__(self) -> "_Cells":
        return self

    def __next__(self) -> list[str]:
        try:
            return next(self.reader)
        except csv.Error as exc:
            raise ReplayError(f"{self.path}:{self.reader.line_num}: not a sweep row ({exc})",
                              "this file was not written by scripts/sweep.py") from None


def parse_row(path: Path, lineno: int, names: tuple[str, ...], cells: list[str]) -> SweepRow:
    """Row ``lineno`` of a sweep; ReplayError naming file, line and column, with a remedy."""
    try:
        return _parse_row(path, lineno, names, cells)
    except ReplayError as exc:
        if exc.remedy:
            raise
        raise ReplayError(exc.message, f"fix line {lineno} of {path.name}, or {RERECORD}") from None


def _parse_row(path: Path, lineno: int, names: tuple[str, ...], cells: list[str]) -> SweepRow:
    where = f"{path}:{lineno}"
    values = dict(zip(names + RESULT_COLUMNS, cells))

    def num(col: str, kind: type = float) -> Any:
        """A cell as a finite number (times and ratios >= 0; counts whole, 0 to INT32_MAX), or None."""
        raw = values[col].strip()
        if not raw:
            return None
        if kind is int:
            return parse_whole(raw, f"{where}: column {col}", lo=0, error=ReplayError)
        return parse_real(raw, f"{where}: column {col}", lo=0.0, error=ReplayError)

    try:
        config = KernelConfig.of({n: values[n] for n in names})
    except EvotunerError as exc:
        raise ReplayError(f"{where}: {exc.message}") from None
    status = values["status"].strip()
    if status not in STATUSES:
        raise ReplayError(f"{where}: column status: {status!r} is not one of {', '.join(STATUSES)}")
    kind = values["failure_kind"].strip()
    try:
        meta = json.loads(values["meta"], parse_constant=_no_constant) if values["meta"].strip() else {}
    except ValueError:
        raise ReplayError(f"{where}: column meta is not JSON") from None
    if not isinstance(meta, dict):
        raise ReplayError(f"{where}: column meta is not a JSON object of the build's meta table")
    for k, v in meta.items():
        whole(v, f"{where}: column meta: {k}", lo=-INT32_MAX, error=ReplayError)
    log = _UNESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), values["ptxas_log"])
    row = SweepRow(
        config=config, status=status, reason=values["reason"], median_us=num("median_us"), p20_us=num("p20_us"),
        p80_us=num("p80_us"), tflops=num("tflops"), max_error=num("max_error"), tolerance=num("tolerance"),
        repetitions=num("repetitions", int), registers=num("registers", int), spill_bytes=num("spill_bytes", int),
        smem_bytes=num("smem_bytes", int), failure_kind=kind, meta=meta, ptxas_log=log,
    )
    for col, value in (("p20_us", row.p20_us), ("p80_us", row.p80_us)):
        if value is not None and not value > 0:
            raise ReplayError(f"{where}: column {col}: {value!r} is not a positive time")
    if status == "ok" and (row.median_us is None or not row.median_us > 0):
        raise ReplayError(f"{where}: status ok needs a positive median_us")
    if status == "ok" and not row.compiled:
        raise ReplayError(f"{where}: status ok needs the build's meta and ptxas_log")
    if status == "gated" and kind not in ("", GATE_KIND):
        raise ReplayError(f"{where}: a gated row has failure_kind '' (static constraint) or '{GATE_KIND}'")
    if status == "gated" and kind == GATE_KIND and not row.compiled:
        raise ReplayError(f"{where}: a ptxas-gated row needs the build's meta and ptxas_log")
    if status == "failed" and kind not in (BUILD_KIND,) + FAILURE_KINDS:
        raise ReplayError(f"{where}: column failure_kind: {kind!r} is not {BUILD_KIND} or one of {', '.join(FAILURE_KINDS)}")
    if status == "failed" and kind != BUILD_KIND and not row.compiled:
        raise ReplayError(f"{where}: a measure failure needs the build's meta and ptxas_log")
    return row


def one_line(text: str | None) -> str:
    """``text`` on one line: its whitespace runs as single spaces."""
    return " ".join((text or "").split())
