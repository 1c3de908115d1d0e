"""Serve: the tuned configs ``evotuner.flash_attention`` runs, read from where a search put them.

A :class:`TunedTable` is a frozen list of :class:`TunedRow` s, one per tuned problem:
the family, the GPU model it was measured on, the static problem (head dim, dtype,
causal, packed or dense), its size and the best config. A packed variable-length study's
row serves ``flash_attention_varlen`` only, a dense study's ``flash_attention`` only. It is read once from

* a study database (``sqlite:///studies.db``, a PostgreSQL URL, or a path to a SQLite
  file): each study's best COMPLETE trial, with the study's problem and device; or
* an exported header (``evotuner export``): each row of each family's section, sized
  by its query-rows and seqlen buckets, with the device its provenance comment names; or
* the table the package ships for a GPU model (``kernels/<family>/tuned_*.toml``,
  written by ``scripts/make_tuned_table.py`` from recorded sweeps).

:meth:`TunedTable.pick` answers for one problem on one GPU model: of the rows of the
same GPU model (or of none named), family, head dim, dtype and causal flag, the row in
the problem's size bucket (the power-of-two bucket of its query rows B*H*Sq and of its
key length Sk, both :func:`evotuner.query_rows.bucket`), else (not for a shipped table)
the nearest tuned size within :data:`NEAREST_DOUBLINGS` doublings, else nothing (the
caller then runs the recommended config; where several families have a row,
:func:`evotuner.runtime.choice.choose` ranks them by :attr:`TunedRow.rate`). Header rows
are served by the header's own ``select()`` rule (:meth:`TunedTable.pick`; the C++
renders the same :mod:`evotuner.query_rows`): the query-rows bucket holding B*H*Sq, else
the nearest, then the smallest seqlen bucket holding Sk, else the largest. A header exported before rows had
a query-rows bucket is refused (:func:`evotuner.header.read_header`: re-export it). The
answer carries the row and a one-line reason.

Torch-free; storage is read through :mod:`evotuner.session` only.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from evotuner import query_rows as qr_rule
from evotuner.atomicfile import SQLITE_MAGIC
from evotuner.config import KernelConfig
from evotuner.errors import EvotunerError
from evotuner.problem import Problem

#: The environment variable naming the tuned table ``flash_attention`` serves by default.
ENV_VAR = "EVOTUNER_TUNED"
#: What names the table served, for remedies.
TUNED_SOURCES = f"evotuner.use_tuned() / ${ENV_VAR}"
#: How far (in doublings of query rows plus doublings of key length) a tuned size may lie
#: from the problem and still be served; farther, the recommended config runs.
NEAREST_DOUBLINGS = 4.0
_HEADER_SUFFIXES = (".h", ".hpp", ".hh", ".cuh", ".hxx")


class TunedError(EvotunerError):
    """A tuned table cannot be read."""


@dataclass(frozen=True)
class TunedRow:
    """One tuned problem and its best config."""

    family: str
    device: str            # GPU model name ("NVIDIA H100 80GB HBM3"); "" = not recorded (any GPU)
    head_dim: int
    dtype: str
    causal: bool
    seqlen_k: int          # the tuned problem's key length (a header row: its bucket's max_seqlen)
    query_rows: int | None  # B*H*Sq of the tuned problem; None for a header row (query_rows_bucket instead)
    config: KernelConfig
    median_us: float | None
    source: str            # where the row came from, for messages: "study 'x' trial 12"
    #: a packed variable-length study's row: serves flash_attention_varlen only (and a dense
    #: row flash_attention only); sized by its padded shape, B*H*longest Sq and the longest
    #: Sk, what a packed call knows without reading its offsets back from the device
    varlen: bool = False
    #: a header row's query-rows bucket (the header keeps the bucket only); None for the others
    query_rows_bucket: int | None = None
    #: the tuned problem's TFLOP/s at ``median_us`` (a study's problem, a header row's comment);
    #: None: :attr:`rate` estimates it from the row's size
    tflops: float | None = None

    def __post_init__(self) -> None:
        if (self.query_rows is None) == (self.query_rows_bucket is None):
            raise ValueError("a TunedRow has query_rows (a study's or shipped row) or query_rows_bucket "
                             "(a header row), exactly one")

    @property
    def rate(self) -> float | None:
        """TFLOP/s of the tuned config at its tuned problem: :attr:`tflops`, else 4*rows*Sk*D over
        the median (causal half), else None. What ranks two families' rows for one problem: their
        tuned sizes may differ within a bucket, their rates stay comparable."""
        if self.tflops is not None:
            return self.tflops
        if self.median_us is None or self.query_rows is None or self.median_us <= 0:
            return None
        flops = 4.0 * self.query_rows * self.seqlen_k * self.head_dim / (2 if self.causal else 1)
        return flops / (self.median_us * 1e-6) / 1e12

    @property
    def size(self) -> str:
        if self.query_rows is not None:
            return f"{self.query_rows} query rows, Sk={self.seqlen_k}"
        lo, hi = qr_rule.bounds(self.query_rows_bucket)
        return f"{lo}..{hi} query rows, Sk <= {self.seqlen_k}"


@dataclass(frozen=True)
class TunedPick:
    row: TunedRow
    why: str
    #: the row is of the problem's own size bucket (a header row: its query-rows bucket, holding
    #: Sk), not the nearest size: it outranks a nearer-by-rate row of another family
    in_bucket: bool = False


def _doublings(a: int, b: int) -> float:
    return abs(math.log2(max(a, 1) / max(b, 1)))


@dataclass(frozen=True)
class TunedTable:
    rows: tuple[TunedRow, ...]
    source: str
    #: shipped with the package: served only in a row's own size bucket (the recommended
    #: configs cover the sizes between), and its misses are not worth a note in the reason
    shipped: bool = False

    def __len__(self) -> int:
        return len(self.rows)

    def _static_match(self, problem: Problem, family: str | None) -> list[TunedRow]:
        """The rows of the problem's head dim, dtype, causal flag and kind (packed or dense; and
        family, if named)."""
        return [r for r in self.rows if r.head_dim == problem.shape.head_dim and r.dtype == problem.dtype
                and r.causal == problem.causal and r.varlen == problem.varlen
                and (family is None or r.family == family)]

    def pick(self, problem: Problem, device: str, family: str | None = None) -> TunedPick | None:
        """The row served for ``problem`` on GPU model ``device`` (module docstring), or None."""
        same = [r for r in self._static_match(problem, family) if r.device in (device, "")]
        if not same:
            return None
        exact = [r for r in same if r.device == device]
        same = exact or same
        sk, qr = problem.shape.seqlen_k, _padded_rows(problem)
        on = f" in {self.source}"

        def distance(r: TunedRow) -> float:
            return _doublings(sk, r.seqlen_k) + (_doublings(qr, r.query_rows) if r.query_rows is not None else 0.0)

        sized = [r for r in same if r.query_rows is not None]
        bucket = qr_rule.bucket
        fit = [r for r in sized if bucket(r.query_rows) == bucket(qr) and bucket(r.seqlen_k) == bucket(sk)]
        if fit:
            row = min(fit, key=lambda r: (distance(r), r.median_us or math.inf))
            return TunedPick(row, f"tuned: {row.source}{on}, same size bucket ({row.size})", in_bucket=True)
        headers = [r for r in same if r.query_rows is None]
        if headers:
            return _header_select(headers, qr, sk, on)
        if sized and not self.shipped:
            row = min(sized, key=lambda r: (distance(r), r.median_us or math.inf))
            d = distance(row)
            if d <= NEAREST_DOUBLINGS:
                return TunedPick(row, f"tuned: {row.source}{on}, the nearest tuned size ({row.size}, "
                                      f"{d:.1f} doublings away)")
        return None

    def nearest_note(self, problem: Problem, device: str, family: str | None = None) -> str:
        """Why :meth:`pick` found nothing, for the reason of the config that runs instead."""
        same = self._static_match(problem, family)
        if not same:
            return f"no tuned row for D={problem.shape.head_dim} {problem.dtype} " \
                   f"{'causal' if problem.causal else 'non-causal'}{' packed' if problem.varlen else ''} " \
                   f"in {self.source}"
        if not any(r.device in (device, "") for r in same):
            return f"the tuned rows for this problem in {self.source} are for {same[0].device}, not {device}"
        return f"no tuned size within {NEAREST_DOUBLINGS:g} doublings in {self.source}"


def _header_select(rows: list[TunedRow], query_rows: int, sk: int, on: str) -> TunedPick:
    """The exported header's select() over its rows of the call's (dtype, head dim, causal):
    the query-rows bucket holding ``query_rows``, else the nearest (:func:`evotuner.query_rows.rank`),
    then the smallest seqlen bucket holding ``sk``, else the largest."""
    want = qr_rule.bucket(query_rows)

    def rank(r: TunedRow) -> int:
        return int(qr_rule.rank(r.query_rows_bucket, want))

    nearest = min(rank(r) for r in rows)
    rows = [r for r in rows if rank(r) == nearest]
    which = "its query-rows bucket" if nearest == 0 else "the nearest query-rows bucket"
    holding = [r for r in rows if r.seqlen_k >= sk]
    if holding:
        row = min(holding, key=lambda r: r.seqlen_k)
        return TunedPick(row, f"tuned: {row.source}{on}, {which} ({row.size}), bucket Sk <= {row.seqlen_k}",
                         in_bucket=nearest == 0)
    row = max(rows, key=lambda r: r.seqlen_k)
    return TunedPick(row, f"tuned: {row.source}{on}, {which} ({row.size}), the largest bucket "
                          f"(Sk <= {row.seqlen_k})")


def _padded_rows(problem: Problem) -> int:
    """B*H*Sq of the problem's shape (a packed problem's: sequences x heads x the longest)."""
    s = problem.shape
    return s.batch * s.heads * s.seqlen_q


# --------------------------------------------------------------------------- reading


def is_header(source: str | Path) -> bool:
    return Path(str(source)).suffix.lower() in _HEADER_SUFFIXES


def load(source: str | Path) -> TunedTable:
    """A tuned table from a study database URL, a SQLite file, an exported header or a
    shipped ``.toml`` table (see the module docstring)."""
    text = str(source)
    if not text.strip():
        raise TunedError("tuned table: empty source", "give a database URL (sqlite:///studies.db) or a header path")
    if "://" not in text:
        path = Path(text).expanduser()
        if not path.is_file():
            raise TunedError(f"tuned table {path}: {'a directory' if path.is_dir() else 'no such file'}",
                             "give a study database (sqlite:///studies.db or its path) or a header from evotuner export")
        if is_header(path):
            return load_header(path)
        if path.suffix.lower() == ".toml":
            return load_shipped(path)
        if _not_sqlite(path):      # else the database layer's refusal would point at --storage
            raise TunedError(f"tuned table {path}: not an SQLite study database, and its suffix is none of "
                             f"{', '.join(_HEADER_SUFFIXES)} (a header) or .toml (a shipped table)",
                             "give a study database (sqlite:///studies.db or its path), or a header from "
                             "evotuner export named like tuned.h")
        text = f"sqlite:///{path.resolve()}"
    return load_studies(text)


def _not_sqlite(path: Path) -> bool:
    """Whether the non-empty file at ``path`` lacks the SQLite header (an empty file is left to the
    database layer, which says it holds no study)."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError:
        return False
    return bool(head) and head != SQLITE_MAGIC


def load_studies(url: str, *, named_by: str = TUNED_SOURCES) -> TunedTable:
    """Every study's best COMPLETE trial in the database at ``url`` (opened read-only);
    ``named_by``: what named the database, for the remedies (a script's ``--storage``)."""
    from evotuner import session   # storage is only reached through the session module

    rows: list[TunedRow] = []
    store = session.open_store(url, must_exist=True, read_only=True, named_by=named_by)
    try:
        for info in store.list_studies():
            summary = store.summary(info.name)
            best = summary.best
            config = best.kernel_config if best is not None else None
            if config is None:
                continue
            device = summary.device if isinstance(summary.device, dict) else {}
            p = summary.problem
            rows.append(TunedRow(
                family=summary.kernel_family, device=str(device.get("name") or ""), head_dim=p.shape.head_dim,
                dtype=p.dtype, causal=p.causal, seqlen_k=p.shape.seqlen_k, query_rows=_padded_rows(p), config=config,
                median_us=best.value, source=f"study {info.name!r} trial {best.number}", varlen=p.varlen,
                tflops=p.tflops(best.value) if best.value else None))
        where = store.display_url
    finally:
        store.close()
    return TunedTable(tuple(rows), where)


def study_bests(url: str) -> dict[tuple[Problem, str], list[tuple[str, KernelConfig]]]:
    """``{(problem, family): [(study, its best config), ...]}`` of the database at ``url``
    (opened read-only): what a benchmark times beside the recommended config at exactly the
    problem a study tuned (the benchmarks' ``--tuned``)."""
    from evotuner import session   # storage is only reached through the session module

    out: dict[tuple[Problem, str], list[tuple[str, KernelConfig]]] = {}
    store = session.open_store(url, must_exist=True, read_only=True, named_by="--tuned")
    try:
        for info in store.list_studies():
            summary = store.summary(info.name)
            if summary.best is not None and summary.best.kernel_config is not None:
                out.setdefault((summary.problem, summary.kernel_family), []).append(
                    (info.name, summary.best.kernel_config))
    finally:
        store.close()
    return out


_ROW_COMMENT = re.compile(r"^\s*// \[(\d+)\] study (.*), trial (\d+): ([0-9.]+) us(?:, ([0-9.]+) TFLOPS)?")
_DEVICE_COMMENT = re.compile(r"; device (.*?)\s*$")


def load_header(path: Path) -> TunedTable:
    """The rows of every family's section of a header written by ``evotuner export``."""
    from evotuner.abi import DTYPE_NAMES
    from evotuner.errors import ExportError
    from evotuner.header import ROW_PROBLEM_MACROS, header_families, read_header

    try:
        text = Path(path).read_text(encoding="utf-8")
        names = header_families(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise TunedError(f"tuned table {path}: cannot read it ({exc})", "give the header evotuner export wrote") from None
    if not names:
        raise TunedError(f"tuned table {path}: no family section (no <PREFIX>_COUNT macro)",
                         "give a header written by `evotuner export`")
    rows: list[TunedRow] = []
    for name in names:
        try:
            info = read_header(path, name)
        except ExportError as exc:
            raise TunedError(f"tuned table {exc.message}", exc.remedy) from None
        for i, values in enumerate(info.values):
            v = dict(values)
            params = {n: x for n, x in values if n not in ROW_PROBLEM_MACROS}
            device, tflops = _header_provenance(text, info.export_prefix, i)
            rows.append(TunedRow(
                family=name, device=device, head_dim=v["HEAD_DIM"],
                dtype=DTYPE_NAMES.get(v["DTYPE"], "?"), causal=bool(v["IS_CAUSAL"]), seqlen_k=v["MAX_SEQLEN"],
                query_rows=None, config=KernelConfig.of(params), median_us=None,
                source=f"{name} row {i}", query_rows_bucket=v["QUERY_ROWS_BUCKET"], tflops=tflops))
    return TunedTable(tuple(rows), str(path))


def _header_provenance(text: str, prefix: str, index: int) -> tuple[str, float | None]:
    """The ``device`` a row's provenance comment names ("" when it says unknown) and the TFLOPS
    it records (None when it has none)."""
    section = text.split(f"#define {prefix}_COUNT", 1)[-1]
    lines = section.splitlines()
    for k, line in enumerate(lines):
        m = _ROW_COMMENT.match(line)
        if m and int(m.group(1)) == index and k + 1 < len(lines):
            d = _DEVICE_COMMENT.search(lines[k + 1])
            name = d.group(1) if d else ""
            tflops = float(m.group(5)) if m.group(5) else None
            return ("" if name == "unknown" else name), tflops
    return "", None


def load_shipped(path: Path) -> TunedTable:
    """A table the package ships (``scripts/make_tuned_table.py`` writes it)."""
    try:
        import tomllib  # Python 3.11+
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise TunedError(f"tuned table {path}: cannot read it ({exc})", "regenerate it with scripts/make_tuned_table.py") \
            from None
    rows = []
    for i, r in enumerate(data.get("row", [])):
        try:
            rows.append(TunedRow(
                family=str(r["family"]), device=str(r["device"]), head_dim=int(r["head_dim"]), dtype=str(r["dtype"]),
                causal=bool(r["causal"]), seqlen_k=int(r["seqlen_k"]), query_rows=int(r["query_rows"]),
                config=KernelConfig.parse(str(r["config"])), median_us=float(r["median_us"]),
                source=str(r["source"])))
        except (KeyError, TypeError, ValueError, EvotunerError) as exc:
            raise TunedError(f"tuned table {path}: row {i} is malformed ({exc})",
                             "regenerate it with scripts/make_tuned_table.py") from None
    return TunedTable(tuple(rows), f"the shipped table {Path(path).name}", shipped=True)


def shipped_tables(families: Iterable[object]) -> tuple[Path, ...]:
    """The tables shipped with the registered families (``<family folder>/tuned_*.toml``)."""
    out: list[Path] = []
    for fam in families:
        root = getattr(fam, "kernels_root", None)
        name = getattr(fam, "name", "")
        if root is None or not name:
            continue
        folder = Path(str(root())) / name
        out.extend(sorted(folder.glob("tuned_*.toml")) if folder.is_dir() else ())
    return tuple(out)


def from_environment() -> str | None:
    """``$EVOTUNER_TUNED`` when set and not empty."""
    value = os.environ.get(ENV_VAR, "").strip()
    return value or None
