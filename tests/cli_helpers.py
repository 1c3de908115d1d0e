"""Shared helpers for the CLI tests: run the console script's entry point in-process
(its error boundary included), with the scaffold measure stage injected through
``cli.main(..., measure_factory=...)``, and check the one-line error contract."""

from __future__ import annotations

import shutil
from pathlib import Path

from evotuner import cli
from scaffold import make_measure

TESTS = Path(__file__).parent
#: The measure stage ``run`` injects (set by ``scaffold_env``; None: the real GPU stage).
MEASURE = {"factory": None}


def scaffold_env(monkeypatch, cache_dir: Path, workdir: Path) -> None:
    """The CLI with the test-only scaffold measure stage, a shared build cache, no storage
    or debug variables from the caller's shell, and ``workdir`` as the current directory."""
    monkeypatch.setenv("EVOTUNER_CACHE_DIR", str(cache_dir))
    monkeypatch.setitem(MEASURE, "factory", make_measure)
    monkeypatch.delenv(cli.STORAGE_ENV, raising=False)
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    monkeypatch.delenv("EVOTUNER_SCAFFOLD_FAIL", raising=False)
    monkeypatch.chdir(workdir)


def run(capsys, *argv):
    """(exit code, stdout, stderr) of ``evotuner ARGV``."""
    code = cli.main([str(a) for a in argv], measure_factory=MEASURE["factory"])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, out, err, *fragments):
    """Non-zero exit, no traceback, exactly one ``error: ...`` line holding every fragment."""
    assert code != 0
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def sweep_copy(sweep: Path, dest: Path) -> Path:
    """A copy of recorded sweep ``sweep`` (and its sidecar) in folder ``dest``: a test that may
    damage or move it leaves the fixture alone."""
    dest.mkdir(parents=True, exist_ok=True)
    csv = dest / sweep.name
    shutil.copy(sweep, csv)
    shutil.copy(sweep.with_name(sweep.name + ".json"), dest / (sweep.name + ".json"))
    return csv
