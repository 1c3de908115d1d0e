"""`evotuner check` / `evotuner profile` through the CLI on a machine with no GPU and no
NVIDIA tools: each missing piece is a one-line error naming it; a sanitizer or profiler run
goes through the real GPU-worker client (GpuMeasure), with fake tools that write a REAL
saved output to their --log-file (tests/data/tools/) and exit, as a tool that cannot start
the worker would; verdicts are recorded and shown; export records them and
--require-checked refuses a row that has not passed."""

from __future__ import annotations

import json
import re
import os
import stat
from pathlib import Path

import pytest

import evotuner.measure
import evotuner.tools
from evotuner import cli
from evotuner.storage import StudyStore
from evotuner.storage import diagnostics

from cli_helpers import assert_one_line_error, run

DATA = Path(__file__).parent / "data"
SWEEP = DATA / "replay" / "synthetic_d64.csv"
SHAPE = "B=16,H=16,S=2048,D=64"


@pytest.fixture(autouse=True)
def env(monkeypatch, tmp_path):
    monkeypatch.delenv(cli.STORAGE_ENV, raising=False)
    for var in ("EVOTUNER_COMPUTE_SANITIZER", "EVOTUNER_NCU", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(evotuner.tools, "CUDA_ROOTS", ())       # the GPU machine has them in /usr/local/cuda
    monkeypatch.setenv("EVOTUNER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)


def _fake_tool(path: Path, log_text: str, exit_status: int = 1) -> Path:
    """A tool that writes ``log_text`` to the file after --log-file and exits (no worker)."""
    (path.parent / (path.name + ".txt")).write_text(log_text)
    path.write_text(f"""#!/bin/sh
while [ $# -gt 0 ]; do
  if [ "$1" = "--log-file" ]; then cp "{path}.txt" "$2"; fi
  shift
done
exit {exit_status}
""")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def study(capsys, tmp_path) -> str:
    db = f"sqlite:///{tmp_path / 'r.db'}"
    code, out, err = run(capsys, "search", "--study", "r", "--shape", SHAPE, "--trials", 6, "--replay", SWEEP,
                         "--storage", db)
    assert code == 0, err
    return db


def test_check_without_compute_sanitizer_names_it(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert_one_line_error(*run(capsys, "check", "--study", "r"), "compute-sanitizer not found on PATH")


def test_profile_without_ncu_names_it(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert_one_line_error(*run(capsys, "profile", "--study", "r"), "ncu not found on PATH")


@pytest.mark.parametrize("command,var", [("check", "EVOTUNER_COMPUTE_SANITIZER"), ("profile", "EVOTUNER_NCU")])
def test_without_a_gpu_the_tool_is_not_enough(capsys, monkeypatch, tmp_path, command, var):
    monkeypatch.setenv(var, str(_fake_tool(tmp_path / "tool", "")))
    monkeypatch.setattr(evotuner.measure, "gpu_available", lambda *a, **k: False)
    assert_one_line_error(*run(capsys, command, "--study", "r"), "no CUDA GPU", f"evotuner {command}")


def test_check_needs_a_study_or_a_config_and_shape(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("EVOTUNER_COMPUTE_SANITIZER", str(_fake_tool(tmp_path / "cs", "")))
    monkeypatch.setattr(evotuner.measure, "gpu_available", lambda *a, **k: True)
    assert_one_line_error(*run(capsys, "check", "--config", "BLOCK_M=128"), "--study", "--shape")
    assert_one_line_error(*run(capsys, "check", "--study", "r", "--tools", "memcheck,leakcheck"), "leakcheck")


def test_profile_without_counter_permission_is_one_line(capsys, monkeypatch, tmp_path, study):
    perm = ("==PROF== Connected to process 1 (/usr/bin/python3)\n"
            "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance "
            "Counters on the target device 0.\n")
    monkeypatch.setenv("EVOTUNER_NCU", str(_fake_tool(tmp_path / "ncu", perm)))
    monkeypatch.setattr(evotuner.measure, "gpu_available", lambda *a, **k: True)
    code, out, err = run(capsys, "profile", "--study", "r", "--top", 1, "--storage", study, "--timeout", 60)
    assert_one_line_error(code, "", err, "ERR_NVGPUCTRPERM", "performance counters")


def test_check_records_the_findings_show_displays_them_export_refuses(capsys, monkeypatch, tmp_path, study):
    fault = (DATA / "tools" / "sanitizer" / "memcheck_fault1.log").read_text()
    monkeypatch.setenv("EVOTUNER_COMPUTE_SANITIZER", str(_fake_tool(tmp_path / "cs", fault)))
    monkeypatch.setattr(evotuner.measure, "gpu_available", lambda *a, **k: True)
    code, out, err = run(capsys, "check", "--study", "r", "--top", 1, "--tools", "memcheck", "--storage", study,
                         "--timeout", 60)
    assert code == 1 and "Traceback" not in out + err
    words = " ".join(out.split())                 # the lines wrap at the console's width
    assert "memcheck: FAILED (4 error(s))" in words and "Invalid __global__ write of size 4 bytes" in words
    assert err.strip().startswith("error: check: 1 of 1 config(s) did not pass")
    # recorded: the tool's findings and the worker's fate
    with StudyStore(study) as store:
        (config, by_tool), = diagnostics.latest_checks(store, "r").items()
    rec = by_tool["memcheck"]
    assert not rec.passed and rec.errors == 4 and rec.complete
    assert rec.findings[0].startswith("Invalid __global__ write") and any(f.startswith("worker: crash") for f in rec.findings)
    assert len(rec.shapes) == 4 and all("D=64" in s for s in rec.shapes)
    # shown
    code, out, err = run(capsys, "show", "--study", "r", "--storage", study)
    assert code == 0 and "evotuner check" in out and "failed" in out and "4 err" in out
    code, out, err = run(capsys, "show", "--study", "r", "--storage", study, "--json")
    data = json.loads(out)
    assert data["checks"][config]["memcheck"]["errors"] == 4
    # export records the verdict; --require-checked refuses and writes nothing
    header = tmp_path / "tuned.h"
    code, out, err = run(capsys, "export", "--study", "r", "--output", header, "--storage", study)
    assert code == 0, err
    assert "evotuner check (compute-sanitizer memcheck, racecheck, synccheck, initcheck): failed" in header.read_text()
    header.unlink()
    code, out, err = run(capsys, "export", "--study", "r", "--output", header, "--storage", study, "--require-checked")
    assert_one_line_error(code, out, err, "--require-checked", "failed")
    assert not header.exists()


def test_export_require_checked_accepts_a_row_every_tool_passed(capsys, tmp_path, study):
    header = tmp_path / "tuned.h"
    code, out, err = run(capsys, "export", "--study", "r", "--output", header, "--storage", study, "--require-checked")
    assert_one_line_error(code, out, err, "--require-checked", "unchecked")
    assert not header.exists()
    with StudyStore(study) as store:
        best = store.summary("r").best
        config = best.config
        for tool in ("memcheck", "racecheck", "synccheck"):
            diagnostics.record_check(store, "r", config, tool, passed=True, errors=0)
    code, out, err = run(capsys, "export", "--study", "r", "--output", header, "--storage", study, "--require-checked")
    assert_one_line_error(code, out, err, "unchecked")           # initcheck never ran on it
    with StudyStore(study) as store:
        diagnostics.record_check(store, "r", config, "initcheck", passed=True, errors=0)
    code, out, err = run(capsys, "export", "--study", "r", "--output", header, "--storage", study, "--require-checked")
    assert code == 0, err
    assert ": passed" in header.read_text()
    assert re.search(r"\sok\s+\d+\.\d\s", out), out          # the row's chk column, before µs


def test_profiles_are_shown_by_show_and_report(capsys, tmp_path, study):
    from evotuner.tools import ncu

    figs = {name: ncu.combine(ncu.parse_raw_csv((DATA / "tools" / "ncu" / f).read_text()))
            for name, f in (("cfg", "flashcore_d64_b16h16s2048.csv"), ("sdpa", "sdpa_cudnn_d64_b16h16s2048.csv"))}
    with StudyStore(study) as store:
        config = store.summary("r").best.config
        diagnostics.record_profile(store, "r", config, "config", problem={}, figures=figs["cfg"], seconds=10.5)
        diagnostics.record_profile(store, "r", "sdpa_default", "sdpa", problem={}, figures=figs["sdpa"], seconds=9.9)
    code, out, err = run(capsys, "show", "--study", "r", "--storage", study)
    assert code == 0, err
    assert "ncu profiles" in out and "sdpa_default" in out and "1071.6" in out and "734.4" in out
    code, out, err = run(capsys, "report", "--study", "r", "--output", tmp_path / "rep", "--storage", study)
    assert code == 0, err
    md = (tmp_path / "rep" / "ncu_profiles.md").read_text()
    assert "cudnn_generated" in md and "254" in md and "wait 1.38" in md


def test_a_version_1_database_gains_the_diagnostics_tables(tmp_path, study):
    import sqlite3

    from evotuner.storage import SCHEMA_VERSION

    path = study.removeprefix("sqlite:///")
    with sqlite3.connect(path) as db:
        db.execute("drop table evotuner_checks")
        db.execute("drop table evotuner_profiles")
        db.execute("update evotuner_schema_version set version = 1")
    with StudyStore(study) as store:
        assert diagnostics.latest_checks(store, "r") == {}
        diagnostics.record_check(store, "r", "BLOCK_M=128", "memcheck", passed=True, errors=0)
    with sqlite3.connect(path) as db:
        assert db.execute("select version from evotuner_schema_version").fetchall() == [(SCHEMA_VERSION,)]
        assert SCHEMA_VERSION == 4   # 3: + evotuner_workers, evotuner_claims (issue 10); 4: creations under way
