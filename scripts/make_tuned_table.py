#!/usr/bin/env python3
"""Write the tuned table a kernel family ships (``kernels/<family>/tuned_<gpu>.toml``) from
recorded studies: each study's best COMPLETE trial on the named GPU model, one row per study.

    python scripts/make_tuned_table.py --storage sqlite:///tuned_h100.db --family hopper \\
        --device "NVIDIA H100 80GB HBM3" --output kernels/hopper/tuned_h100.toml

``evotuner.flash_attention`` serves a shipped row only to a problem in the same size bucket
(query rows B*H*Sq and key length Sk, power-of-two buckets) of the same GPU model, family,
head dim, dtype and causal flag (:mod:`evotuner.tuned`); elsewhere the family's recommended
config runs. The table is the output of this script, never edited by hand: rerun the
studies (``bash scripts/gpu_verify.sh shipped`` on the GPU machine) and this script to
refresh it. Exit status 1 with a one-line reason when no study qualifies. ``--output`` is
written atomically and only over a table this script wrote (never a link, a folder, a
database, nor any other file: delete that one or write elsewhere).
"""

from __future__ import annotations

import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from evotuner import tuned
from evotuner.atomicfile import write_text_atomic
from evotuner.errors import EvotunerError
from evotuner.scriptargs import ArgumentParser, output_path

#: The first line of every table this script writes (what a replaceable --output starts with).
MARK = "# Tuned configs shipped for "
#: What names the database, for the remedies of the database layer.
NAMED_BY = "--storage"


def _toml_str(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render(rows: list[tuned.TunedRow], source: str, device: str) -> str:
    lines = [
        f"# Tuned configs shipped for {device}: written by scripts/make_tuned_table.py from {source}",
        f"# on {datetime.now(timezone.utc).date().isoformat()}; do not edit, rerun the script. Served by",
        "# evotuner.flash_attention to problems in a row's size bucket on that GPU model (evotuner/tuned.py).",
    ]
    for r in sorted(rows, key=lambda r: (r.family, r.head_dim, r.dtype, r.causal, r.query_rows or 0, r.seqlen_k)):
        lines += ["", "[[row]]",
                  f"family = {_toml_str(r.family)}", f"device = {_toml_str(r.device)}",
                  f"head_dim = {r.head_dim}", f"dtype = {_toml_str(r.dtype)}", f"causal = {str(r.causal).lower()}",
                  f"query_rows = {r.query_rows}", f"seqlen_k = {r.seqlen_k}", f"config = {_toml_str(str(r.config))}",
                  f"median_us = {r.median_us:.3f}", f"source = {_toml_str(r.source)}"]
    return "\n".join(lines) + "\n"


def _check_replaceable(path: Path) -> None:
    """Refuse an existing --output that is not a table this script wrote (its data would be lost)."""
    if not path.is_file():
        return
    try:
        with open(path, encoding="utf-8") as f:
            first = f.readline()
    except (OSError, UnicodeDecodeError):
        first = ""
    if not (first.startswith(MARK) and "scripts/make_tuned_table.py" in first):
        raise EvotunerError(f"--output {path} exists and is not a tuned table this script wrote",
                            "delete it first if it may go, or give another --output")


def _load_studies(storage: str) -> tuned.TunedTable:
    """Every study's best trial in the --storage database; its errors name --storage (the
    database layer refuses a folder, a file that is no SQLite database, a foreign one)."""
    if not storage.strip():
        raise EvotunerError("--storage is empty", "give the study database: --storage sqlite:///studies.db")
    url = storage if "://" in storage else f"sqlite:///{Path(storage).expanduser().resolve()}"
    return tuned.load_studies(url, named_by=NAMED_BY)


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--storage", required=True, help="the study database (URL or SQLite path)")
    ap.add_argument("--family", required=True, help="the kernel family whose studies make the table")
    ap.add_argument("--device", required=True, help="the GPU model name the studies were measured on")
    ap.add_argument("--output", required=True, type=output_path, help="the .toml table to write")
    args = ap.parse_args(argv)
    try:
        _check_replaceable(args.output)
        table = _load_studies(args.storage)
    except EvotunerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    rows = [r for r in table.rows if r.family == args.family and r.device == args.device]
    if not rows:
        print(f"error: {table.source} holds no {args.family} study measured on {args.device!r} "
              f"(run the studies first: bash scripts/gpu_verify.sh shipped)", file=sys.stderr)
        return 1
    text = render(rows, table.source, args.device)
    try:
        with tempfile.TemporaryDirectory(prefix="make-tuned-table-") as scratch:   # never beside --output
            check = Path(scratch) / "table.toml"
            check.write_text(text, encoding="utf-8")
            if len(tuned.load_shipped(check)) != len(rows):
                raise EvotunerError("the written table does not read back", "report this as a bug")
        write_text_atomic(args.output, text)
    except EvotunerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {args.output}: {len(rows)} rows from {table.source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
