"""scripts/bench_gpus.py rehearsed without a GPU: replayed searches, one then two GPU threads."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "tests" / "data" / "sweep_h100_hopper_d64.csv"


@pytest.fixture()
def bench():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import bench_gpus

        yield bench_gpus
    finally:
        sys.path.remove(str(ROOT / "scripts"))


def test_time_split_line_is_read(bench) -> None:
    log = ("study 'x' has 8 finished trials\n"
           "time split (average of 2 GPU threads): baselines 0.1 s, sampler 1.6 s, waiting\n"
           "    on builds 0.0 s, gate 0.0 s, measuring 1.3 s, recording 1.3 s\nbest 10 of 8 trials\n")
    assert bench.time_split(log) == {"baselines": 0.1, "sampler": 1.6, "waiting on builds": 0.0, "gate": 0.0,
                                     "measuring": 1.3, "recording": 1.3}
    assert bench.time_split("no such line") == {}


def test_runs_are_checked_and_compared(bench, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("EVOTUNER_CACHE_DIR", str(tmp_path / "outer-cache"))
    out = tmp_path / "report.json"
    code = bench.main(["--trials", "12", "--shape", "B=16,H=16,S=2048,D=64", "--runs", "none,0+1",
                       "--replay", str(SWEEP), "--replay-delay", "0.02,0.05", "--workdir", str(tmp_path / "w"),
                       "-o", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    one, two = report["runs"]["0-none"], report["runs"]["1-0+1"]
    for run in (one, two):
        assert run["exact"] and run["finished"] == 12 and run["running"] == 0
        assert run["configs_measured_twice"] == 0 and run["measured"] >= 1
        assert 0 < run["to_first_measurement_s"] <= run["wall_s"]
        assert set(run["loop_split_s"]) >= {"sampler", "measuring", "recording"}
        assert run["best_us"] > 0
    assert one["gpus"] == 1 and two["gpus"] == 2 and set(two["per_gpu"]) == {"0", "1"}
    assert two["speedup_measuring"] > 0 and one["speedup_measuring"] == 1.0
    # a second run into the same work dir would not be cold: refused in one line, before any run
    capsys.readouterr()
    before = sorted(p.name for p in (tmp_path / "w").iterdir())
    assert bench.main(["--trials", "4", "--runs", "none", "--replay", str(SWEEP), "--workdir", str(tmp_path / "w"),
                       "-o", str(tmp_path / "again.json")]) == 1
    captured = capsys.readouterr()
    assert captured.err == f"error: {tmp_path / 'w' / '0-none'} exists, so this run would not be cold " \
                           "(use a fresh --workdir)\n", captured.err
    assert "$" not in captured.out and not (tmp_path / "again.json").exists()
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == before
