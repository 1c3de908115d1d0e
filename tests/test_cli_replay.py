"""`evotuner search/resume --replay` and `evotuner report` through the CLI, on a machine
with no GPU and no nvcc: the recorded sweep answers builds and measurements.

The sweep used is the SYNTHETIC fixture (tests/data/replay/README.md): real builds and
gates, made-up latencies; these tests check plumbing, never speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evotuner import cli
from cli_helpers import run

SWEEP = Path(__file__).parent / "data" / "replay" / "synthetic_d64.csv"
SHAPE = "B=16,H=16,S=2048,D=64"


@pytest.fixture(autouse=True)
def env(monkeypatch, tmp_path):
    monkeypatch.delenv(cli.STORAGE_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools"))      # no nvcc, no nvidia-smi
    monkeypatch.setenv("EVOTUNER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)


def test_replayed_search_resume_show_and_report(capsys, tmp_path):
    db = f"sqlite:///{tmp_path / 'r.db'}"
    code, out, err = run(capsys, "search", "--study", "r", "--shape", SHAPE, "--trials", 12,
                         "--replay", SWEEP, "--storage", db)
    assert code == 0, err
    code, out, err = run(capsys, "resume", "--study", "r", "--trials", 20, "--replay", SWEEP, "--storage", db)
    assert code == 0, err
    code, out, err = run(capsys, "show", "--study", "r", "--json", "--storage", db)
    assert code == 0, err
    shown = json.loads(out)
    states = [t["state"] for t in shown["trials"]]
    assert len(states) == 20 and "RUNNING" not in states
    assert shown["best"] is not None and shown["best"]["value"] > 0
    # every config appears once as its own trial; repeats are marked, never re-measured
    own = [json.dumps(t["params"], sort_keys=True) for t in shown["trials"] if t.get("duplicate_of") is None]
    assert len(own) == len(set(own))

    code, out, err = run(capsys, "report", "--study", "r", "--output", tmp_path / "rep", "--storage", db)
    assert code == 0, err
    assert (tmp_path / "rep" / "history.png").stat().st_size > 10_000
    assert "wrote" in out


def test_replay_of_another_shape_is_refused_before_writing(capsys, tmp_path):
    db = tmp_path / "r.db"
    code, out, err = run(capsys, "search", "--study", "r", "--shape", "B=16,H=16,S=1024,D=64",
                         "--replay", SWEEP, "--storage", f"sqlite:///{db}")
    assert code != 0 and "Traceback" not in out + err
    assert err.startswith("error: ") and "--replay" in err and len(err.strip().splitlines()) == 1
    # the study was never created
    code, out, err = run(capsys, "show", "--study", "r", "--storage", f"sqlite:///{db}")
    assert code != 0


def test_search_without_gpu_or_replay_refuses(capsys, tmp_path):
    db = tmp_path / "n.db"
    code, out, err = run(capsys, "search", "--study", "n", "--shape", SHAPE, "--storage", f"sqlite:///{db}")
    assert code != 0 and "no CUDA GPU" in err and "--replay" not in out
    assert not db.exists()


def test_report_of_a_missing_study_is_one_line(capsys, tmp_path):
    db = tmp_path / "r.db"
    run(capsys, "search", "--study", "r", "--shape", SHAPE, "--trials", 3, "--replay", SWEEP,
        "--storage", f"sqlite:///{db}")
    code, out, err = run(capsys, "report", "--study", "nope", "--output", tmp_path / "x", "--storage", f"sqlite:///{db}")
    assert code != 0 and err.startswith("error: ") and "nope" in err and "Traceback" not in err
