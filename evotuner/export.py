"""Export: the best COMPLETE config per key of finished studies -> one C++ header.

Key = (kernel family, arch, dtype, head_dim, causal, query-rows bucket, seqlen bucket).
The query-rows bucket is that of the study's B*H*Sq (:mod:`evotuner.query_rows`: bucket
``b`` holds ``2^(b-1) < B*H*Sq <= 2^b``, bucket 0 one row); the seqlen bucket is the
power-of-two bucket of its ``seqlen_k`` with these edges::

    seqlen_k <=   512  -> max_seqlen   512
    seqlen_k <=  1024  -> max_seqlen  1024
    seqlen_k <=  2048  -> max_seqlen  2048
    seqlen_k <=  4096  -> max_seqlen  4096
    seqlen_k <=  8192  -> max_seqlen  8192
    seqlen_k  >  8192  -> max_seqlen  INT32_MAX (the open bucket)

When two studies land on one key the faster one (lower median µs) wins; the
winner's provenance comment names the studies it beat. Studies of different
query-rows buckets never compete (a decode study and a prefill study of one Sk
bucket are two rows).

The header holds one section per kernel family (several families share one
header; the production extension dispatches over all of them). A family's
section lives in its ``KernelFamily.export_namespace`` (FlashCore's is
``flashcore::tuned``) and holds ``struct Config``, the ``kConfigs`` table, the
query-rows rule rendered from :mod:`evotuner.query_rows` (``query_rows_bucket``,
``query_rows_rank``, constexpr), and ``select(head_dim, dtype, causal, seqlen,
query_rows)``: of the rows of the exact (dtype, head_dim, causal), those of the
query-rows bucket that holds the call's B*H*Sq, else of the nearest bucket (fewest
doublings away; at a tie the larger bucket); of those, the smallest seqlen bucket
whose ``max_seqlen >= seqlen``, else the largest; nullptr when no row has the
(dtype, head_dim, causal). (A deprecated four-argument ``select`` without query rows
serves the largest query-rows bucket.) For the kernel build the section has the
same values again as macros, ``<T>_<i>_<NAME>`` with ``<T>`` the family's
``export_macro_prefix`` (``HEAD_DIM``, ``IS_CAUSAL``, ``DTYPE``,
``QUERY_ROWS_BUCKET``, ``MAX_SEQLEN`` and one per kernel parameter) plus
``<T>_COUNT`` and ``<T>_ARCH``: macros cannot read constexpr values, so a
translation unit instantiating row ``i`` writes ``#define <P>_<NAME> <T>_<i>_<NAME>``
(``<P>``: the family's macro prefix). The header static_asserts that both spellings
agree.

A header exported before the query-rows bucket (its rows have no
``<T>_<i>_QUERY_ROWS_BUCKET``) is refused by every reader (:mod:`evotuner.header`:
the production build, :mod:`evotuner.tuned`) in one line naming the file: its rows
may be decode studies that took a prefill row's key; re-export it.

Every value written is checked to be an integer in range before anything is
written; the file is written atomically (temp file in the same folder, then
rename), so a failed export leaves the previous file, or none, never a partial one.
:mod:`evotuner.header` reads a written header back.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable

from evotuner.atomicfile import check_target, write_text_atomic
from evotuner.config import config_string
from evotuner.errors import EvotunerError, ExportError
from evotuner.export_render import CHECK_TOOLS, HEADER_MARK, render_header
from evotuner.export_rows import (BUCKET_EDGES, INT32_MAX, OPEN_BUCKET, ExportRow, ExportSource, best_row,
                                  seqlen_bucket, select_rows, with_optional_params)
from evotuner.storage.diagnostics import verdict

__all__ = ["BUCKET_EDGES", "CHECK_TOOLS", "INT32_MAX", "OPEN_BUCKET", "ExportError", "ExportResult", "ExportRow",
           "ExportSource", "best_row", "export_header", "render_header", "seqlen_bucket", "select_rows",
           "write_atomic"]


@dataclass(frozen=True)
class ExportResult:
    path: Path
    rows: tuple[ExportRow, ...]            # in header order (kConfigs[i] == rows[i])
    skipped: tuple[str, ...]              # studies left out because their arch differs from ``arch``
    sha256: str                           # of the header text written


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


def _row_config(row: ExportRow) -> str:
    return config_string(dict(row.params))


def _check_verdict(store: ExportSource, row: ExportRow) -> str:
    """passed / failed / unchecked from the study's ``evotuner check`` records."""
    return verdict(dict(store.latest_checks(row.study).get(_row_config(row)) or {}), CHECK_TOOLS)


def _foreign(output: Path) -> bool:
    """Whether ``output`` is a file export did not write that holds more than blank lines and ``//``
    comments (a source file, the user's own header, named by mistake): replacing it would lose that
    text. A header export wrote begins with :data:`~evotuner.export_render.HEADER_MARK`."""
    try:
        with open(output, "rb") as f:
            head = f.read(1 << 16)
    except OSError:               # absent (or unreadable: the write says why)
        return False
    if head.startswith(HEADER_MARK.encode()):
        return False
    lines = head.decode("utf-8", "replace").splitlines()[:-1 if len(head) == 1 << 16 else None]   # cut last line
    return any(line.strip() and not line.lstrip().startswith("//") for line in lines)


def export_header(store: ExportSource, study_names: list[str], output: Path, *, arch: str | None = None,
                  require_checked: bool = False,
                  study_args: Callable[[str], str] = lambda s: f"--study {shlex.quote(s)}") -> ExportResult:
    """Export the best COMPLETE config per key of ``study_names`` to the header ``output``.

    ``arch=None`` takes the studies' arch (they must agree); an explicit arch keeps
    only the studies that target it (the others are listed in ``ExportResult.skipped``).
    Each row records whether its config passed ``evotuner check`` (every tool of
    :data:`CHECK_TOOLS`, latest run); ``require_checked`` refuses, writing nothing,
    when a chosen row has not passed. ``study_args``: a study's options in a printed command
    (the CLI adds the database it was given, :func:`evotuner.cli_options.study_args`).
    An existing ``output`` that export did not write and that holds code or text (:func:`_foreign`)
    is refused, not replaced.
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
    if _foreign(output):
        raise ExportError(f"export: {raw} exists and is not a header evotuner export wrote (it holds more than "
                          f"comments and does not begin with '{HEADER_MARK}')",
                          f"write to another --output, or remove it first (rm -- {shlex.quote(str(raw))}) if it may go")
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
    rows = with_optional_params(rows)
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
            runs = " and ".join(f"`evotuner check {study_args(s)}`" for s in dict.fromkeys(r.study for r in bad))
            raise ExportError(
                f"export --require-checked: {len(bad)} row(s) did not pass evotuner check: {what}",
                f"run {runs} on the GPU machine (a failed config must be fixed or "
                "excluded), or export without --require-checked")
    text = render_header(chosen, arch)
    write_atomic(output, text, protect=store.database_files())
    return ExportResult(path=output, rows=tuple(chosen), skipped=skipped,
                        sha256=hashlib.sha256(text.encode()).hexdigest())

