"""The offline analysis scripts fail cleanly on bad inputs, run as a user runs them: a usage error
is one line at parse time (exit 2), a missing or malformed input file one line (exit 1), never a
traceback, and nothing is written in the folder they run in."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
HOPPER = DATA / "sweep_h100_hopper_d64.csv"         # a hopper_grid sweep
HOPPER_CAUSAL = DATA / "sweep_h100_hopper_d64_causal.csv"
FLASHCORE = DATA / "sweep_h100_d64.csv"             # a sweep of another space (flashcore)
GRID = REPO / "search_spaces" / "hopper_grid.toml"


@pytest.fixture()
def here(tmp_path: Path) -> Path:
    """A folder to run in, holding bad inputs: a folder, an empty file, a CSV of another kind, a
    binary file, an empty sweep CSV with a valid sidecar."""
    (tmp_path / "adir").mkdir()
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "plain.csv").write_text("a,b\n1,2\n")
    (tmp_path / "binary.csv").write_bytes(b"SQLite format 3\x00\xa4\xff" + bytes(64))
    (tmp_path / "nosweep.csv").write_text("")
    shutil.copy(str(HOPPER) + ".json", tmp_path / "nosweep.csv.json")
    return tmp_path


def _listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _refused(folder: Path, script: str, argv: list[str], code: int, says: str) -> str:
    """Run ``scripts/<script>.py argv`` in ``folder``: exit ``code``, one ``error: `` line on
    stderr naming ``says``, no traceback, nothing created or changed in ``folder``."""
    before = {p: p.stat().st_mtime_ns for p in folder.rglob("*")}
    ran = subprocess.run([sys.executable, str(REPO / "scripts" / f"{script}.py"), *argv], cwd=folder,
                         capture_output=True, text=True, timeout=120, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    err = ran.stderr
    assert ran.returncode == code, (ran.returncode, err[-2000:])
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err[-2000:]
    assert err.startswith("error: ") and says in err, err
    assert {p: p.stat().st_mtime_ns for p in folder.rglob("*")} == before, _listing(folder)
    return err


# ------------------------------------------------------------------------------ proposal_cost.py

@pytest.mark.parametrize("argv,says", [
    (["--trials", "0"], "at least 1"), (["--seed", "-1"], "seed"), (["--ranges", "5-1"], "'5-1' is empty"),
    (["--ranges", "abc"], "LOW-HIGH"), (["--sampler", "nope"], "invalid choice"),
    (["--output", "adir"], "not a regular file"), (["--output", "nof/x.json"], "does not exist"),
    (["--output", ""], "the path is empty"),
])
def test_proposal_cost_usage_errors(here, argv, says):
    _refused(here, "proposal_cost", [str(HOPPER), "--space", str(GRID), "--trials", "2", *argv], 2, says)


@pytest.mark.parametrize("argv,says", [
    (["missing.csv"], "missing.csv: sweep file not found"), (["adir"], "adir: is a folder"),
    (["plain.csv"], "plain.csv.json is missing"), (["nosweep.csv"], "empty sweep file"),
    ([str(FLASHCORE)], "differ from the space's"),
    ([str(HOPPER), "--related", "missing.csv"], "--related missing.csv: sweep file not found"),
    ([str(HOPPER), "--related", str(FLASHCORE)], "recorded with space default, not hopper_grid"),
    ([str(HOPPER), "--space", "nope.toml"], "nope.toml: space file not found"),
])
def test_proposal_cost_input_errors(here, argv, says):
    args = ["--space", str(GRID), *argv] if "--space" not in argv else argv
    err = _refused(here, "proposal_cost", [*args, "--trials", "2", "--output", "out.json"], 1, says)
    assert "--replay" not in err


# ------------------------------------------------------------------------------ proposal_cost_seeded.py

@pytest.mark.parametrize("argv,says", [
    (["--shape", "B=1,H=2,S=128", "--space", str(GRID)], "argument --shape: missing dimension D"),
    (["--shape", "B=1,H=2,S=128,D=64"], "--shape needs"),
    (["--shape", "B=1,H=2,S=128,D=64", "--space", str(GRID), "--trials", "0"], "at least 1"),
    (["--shape", "B=1,H=2,S=128,D=64", "--space", str(GRID), "--seed", "-1"], "seed"),
    (["--storage", "sqlite:///x.db", "--study", "g3", "--sources", ","], "an empty study name"),
])
def test_proposal_cost_seeded_usage_errors(here, argv, says):
    _refused(here, "proposal_cost_seeded", argv, 2, says)


@pytest.mark.parametrize("argv,says", [
    (["--storage", "sqlite:///missing.db", "--study", "x"], "no study database"),
    (["--storage", "sqlite:///plain.csv", "--study", "x"], "not a database"),
    (["--shape", "B=1,H=2,S=128,D=64", "--space", "nope.toml"], "space file not found"),
    (["--shape", "B=1,H=2,S=128,D=64", "--space", str(REPO / "search_spaces" / "flashcore.toml")], "cost model"),
])
def test_proposal_cost_seeded_input_errors(here, argv, says):
    _refused(here, "proposal_cost_seeded", [*argv, "--trials", "2"], 1, says)


def test_proposal_cost_seeded_refuses_a_source_not_in_the_database(here):
    with gzip.open(REPO / "docs" / "measurements" / "gqa" / "bars_h100_1126i" / "bars.db.gz") as f:
        (here / "bars.db").write_bytes(f.read())
    _refused(here, "proposal_cost_seeded", ["--storage", "sqlite:///bars.db", "--study", "g3", "--sources", "g2,nope",
                                            "--trials", "2"], 1, "--sources: no study 'nope'")


# ------------------------------------------------------------------------------ race_simulation.py

@pytest.mark.parametrize("argv,says", [
    (["--orders", "0"], "--orders: 0 must be at least 1"), (["--boundary", "0"], "--boundary"),
    (["--top", "-1"], "--top"), (["--rho", "1.5"], "--rho"), (["--seed", "-1"], "seed"),
    (["--output", "adir"], "not a regular file"), (["--output", "nof/x.json"], "does not exist"),
])
def test_race_simulation_usage_errors(here, argv, says):
    _refused(here, "race_simulation", ["--sweeps", str(FLASHCORE), "--boundary", "10", *argv], 2, says)


@pytest.mark.parametrize("sweeps,says", [
    ("empty.csv", "empty.csv: empty file"), ("plain.csv", "plain.csv: no column status"),
    ("adir", "adir: cannot read it"), ("binary.csv", "not a CSV text file"), ("bad.csv", "bad.csv: line 2"),
    ("noneok.csv", "no measured config"),
])
def test_race_simulation_input_errors(here, sweeps, says):
    (here / "bad.csv").write_text("status,median_us,p20_us,p80_us,repetitions\nok,abc,1,2,3\n")
    (here / "noneok.csv").write_text("status,median_us,p20_us,p80_us,repetitions\nfailed,,,,\n")
    _refused(here, "race_simulation", ["--sweeps", sweeps, "--boundary", "10", "--output", "out.json"], 1, says)


# ------------------------------------------------------------------------------ transfer_benchmark.py

@pytest.mark.parametrize("argv,says", [
    ([str(HOPPER), str(HOPPER)], "two sweeps named"),
    ([str(HOPPER), str(HOPPER_CAUSAL), "--seeds", "0"], "--seeds"),
    ([str(HOPPER), str(HOPPER_CAUSAL), "--workers", "0"], "--workers"),
    ([str(HOPPER), str(HOPPER_CAUSAL), "--output", "adir"], "not a regular file"),
    ([str(HOPPER), str(HOPPER_CAUSAL), "--output", "nof/x.json"], "does not exist"),
])
def test_transfer_benchmark_usage_errors(here, argv, says):
    _refused(here, "transfer_benchmark", [*argv, "--space", str(GRID)], 2, says)


@pytest.mark.parametrize("argv,says", [
    (["missing.csv", str(HOPPER), "--space", str(GRID)], "missing.csv: sweep file not found"),
    (["nosweep.csv", str(HOPPER), "--space", str(GRID)], "empty sweep file"),
    ([str(FLASHCORE), str(HOPPER), "--space", str(GRID)], "differ from the space's"),
    ([str(HOPPER), str(HOPPER_CAUSAL), "--space", "nope.toml"], "space file not found"),
    ([str(FLASHCORE), str(DATA / "sweep_h100_d128.csv"), "--space", str(REPO / "search_spaces" / "flashcore.toml"),
      "--correlations"], "no measured config"),
])
def test_transfer_benchmark_input_errors(here, argv, says):
    err = _refused(here, "transfer_benchmark", [*argv, "--seeds", "1", "--source-trials", "2", "--max-trials", "2",
                                                "--workers", "1"], 1, says)
    assert "--replay" not in err


# ------------------------------------------------------------------------------ feasible_benchmark.py

@pytest.mark.parametrize("repeat", ["0", "-1"])
def test_feasible_benchmark_refuses_no_repeats(here, repeat):
    _refused(here, "feasible_benchmark", ["--repeat", repeat, "--no-reference"], 2, "--repeat")


# ------------------------------------------------------------------------------ sweep.py

@pytest.mark.parametrize("output,says", [
    ("nof/x.csv", "the folder nof does not exist"), ("nof/sub/x.csv", "does not exist"),
    ("side.csv", "side.csv.json: it exists and is not a regular file"),
])
def test_sweep_refuses_a_sweep_output_it_cannot_write(here, output, says):
    (here / "side.csv.json").mkdir()
    err = _refused(here, "sweep", ["--sweep", f"B=1,H=2,S=128,D=64:fp16:{output}"], 2, says)
    assert "argument --sweep" in err
    assert not (here / "nof").exists()


# ------------------------------------------------------------------------------ bench_gpus.py

def test_bench_gpus_says_in_one_line_that_a_run_would_not_be_cold(here):
    (here / "w" / "0-none").mkdir(parents=True)
    _refused(here, "bench_gpus", ["--runs", "none", "--trials", "2", "--replay", str(HOPPER), "--workdir", "w",
                                  "-o", "out.json"], 1, "would not be cold (use a fresh --workdir)")
