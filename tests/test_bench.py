"""`evotuner bench` and scripts/bench_tuner.py, on CPU: the real Builder (nvcc, the tiny
space), real SQLite files, and tests/scaffold.py's deterministic measure stage in place of
the GPU (through the CLI's test-only hook, or injected into the script)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from evotuner import cli
import cli_helpers
from cli_helpers import assert_one_line_error as one_line_error, run, scaffold_env
from scaffold import make_measure
from evotuner.bench import BenchResult, bench_study, ratios
from evotuner.compiler import Builder
from evotuner import columns
from evotuner.config import KernelConfig
from evotuner.problem import Problem, Shape
from evotuner.space import load_space
from evotuner.storage import StudyStore

from scaffold import BASELINES, ScaffoldMeasure, scaffold_median_us

TESTS = Path(__file__).parent
ROOT = TESTS.parent
TINY = TESTS / "data" / "loop_tiny.toml"
SHAPE = "B=1,H=2,S=256,D=32"


@pytest.fixture(autouse=True)
def env(monkeypatch, build_cache_dir, tmp_path):
    scaffold_env(monkeypatch, build_cache_dir, tmp_path)




@pytest.fixture(scope="module")
def studied(tmp_path_factory, build_cache_dir):
    """A 6-trial study of the tiny space (scaffold timings), made once for this module."""
    import os

    db = tmp_path_factory.mktemp("bench-study") / "studies.db"
    env = {"EVOTUNER_CACHE_DIR": str(build_cache_dir)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        code = cli.main(["search", "--study", "s", "--shape", SHAPE, "--space", str(TINY), "--trials", "6",
                         "--jobs", "2", "--storage", f"sqlite:///{db}"], measure_factory=make_measure)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert code == 0
    return db


def expected_best(db: Path, top: int) -> list[tuple[int, KernelConfig, float]]:
    """The study's fastest distinct COMPLETE configs, read back independently of evotuner.bench."""
    with StudyStore(f"sqlite:///{db}") as store:
        trials = store.summary("s").trials
    seen, out = set(), []
    for t in sorted((t for t in trials if t.state == "COMPLETE"), key=lambda t: (t.value, t.number)):
        config = KernelConfig.of(t.attrs["config"])
        if config not in seen:
            seen.add(config)
            out.append((t.number, config, t.value))
    return out[:top]


# -- evotuner bench -------------------------------------------------------------------------


def test_bench_json_remeasures_the_best_configs_and_the_baselines(capsys, studied):
    want = expected_best(studied, 2)
    assert len(want) == 2
    code, out, err = run(capsys, "bench", "--study", "s", "--top", 2, "--json", "--storage", f"sqlite:///{studied}")
    assert code == 0, err
    data = json.loads(out)
    assert data["study"] == "s" and data["shape"] == SHAPE
    assert {k: v["us"] for k, v in data["baselines"].items()} == BASELINES
    assert [(r["trial"], r["config"]) for r in data["rows"]] == [(n, str(c)) for n, c, _ in want]
    for row, (_, config, recorded) in zip(data["rows"], want):
        us = scaffold_median_us(config)
        assert row["median_us"] == pytest.approx(us) and row["recorded_us"] == pytest.approx(recorded)
        assert row["cached"] is True                       # the search built it into this cache
        assert row["failure"] is None
        for name, base in BASELINES.items():
            assert row["ratios"][name] == pytest.approx(base / us)
    assert data["best"]["trial"] == want[0][0]
    assert data["device"]["name"] == "scaffold (test only)"


def test_bench_table_shows_configs_baselines_and_ratios(capsys, studied, monkeypatch):
    want = expected_best(studied, 3)
    monkeypatch.setenv("COLUMNS", "160")         # one row per config
    code, out, err = run(capsys, "bench", "--study", "s", "--top", 3, "--storage", f"sqlite:///{studied}")
    assert code == 0, err
    lines = out.splitlines()
    header = next(line for line in lines if "TFLOPS" in line and "was" in line).split()
    names = list(load_space(TINY).names)
    heads = [columns.headers(names)[n] for n in names]
    assert header == ["#", *heads, "µs", "TFLOPS", "default", "flash", "efficient", "was"]
    rows = {line.split()[0]: line.split() for line in lines if line.split()}
    for number, config, recorded in want:
        us = scaffold_median_us(config)
        cells = rows[str(number)]
        assert cells[1:1 + len(names)] == [str(config.as_dict()[n]) for n in names]
        assert cells[1 + len(names)] == f"{us:.1f}" and cells[-1] == f"{recorded:.1f}"
        assert cells[-4:-1] == [f"{BASELINES[n] / us:.2f}x" for n in ("sdpa_default", "sdpa_flash", "sdpa_efficient")]
    for name, us in BASELINES.items():
        assert rows[name][1] == f"{us:.1f}"
    assert "default/flash/efficient = that SDPA backend's µs / µs (>1: faster)" in out


def test_bench_records_the_baselines_unless_told_not_to(capsys, tmp_path, studied):
    import shutil

    db = tmp_path / "copy.db"
    shutil.copy(studied, db)
    before = _baseline_rows(db)
    assert before >= 3                                   # the search recorded one set
    assert run(capsys, "bench", "--study", "s", "--top", 1, "--no-record", "--storage", f"sqlite:///{db}")[0] == 0
    assert _baseline_rows(db) == before
    assert run(capsys, "bench", "--study", "s", "--top", 1, "--storage", f"sqlite:///{db}")[0] == 0
    assert _baseline_rows(db) == before + 3              # one row per backend, this run's device


def _baseline_rows(db: Path) -> int:
    import sqlite3

    with sqlite3.connect(db) as con:
        return con.execute("SELECT COUNT(*) FROM evotuner_baselines").fetchone()[0]


def test_a_failing_config_is_a_row_not_an_error(capsys, studied, monkeypatch):
    want = expected_best(studied, 2)
    monkeypatch.setenv("EVOTUNER_SCAFFOLD_FAIL", str(want[0][1]))
    code, out, err = run(capsys, "bench", "--study", "s", "--top", 2, "--json", "--storage", f"sqlite:///{studied}")
    assert code == 0, err
    rows = json.loads(out)["rows"]
    assert rows[0]["failure"] == "wrong_result: max error 1.0 over tolerance 0.01 (scaffold)"
    assert rows[0]["median_us"] is None and all(v is None for v in rows[0]["ratios"].values())
    assert rows[1]["median_us"] == pytest.approx(scaffold_median_us(want[1][1]))
    assert json.loads(out)["best"]["trial"] == want[1][0]


def test_bench_without_a_gpu_refuses_like_search(capsys, studied, monkeypatch):
    import evotuner.measure

    monkeypatch.setitem(cli_helpers.MEASURE, "factory", None)   # the real GPU stage
    monkeypatch.setattr(evotuner.measure, "gpu_available", lambda *a, **k: False)
    before = studied.read_bytes()
    code, out, err = run(capsys, "bench", "--study", "s", "--storage", f"sqlite:///{studied}")
    one_line_error(code, out, err, "no CUDA GPU on this machine")
    assert "evotuner bench needs one" in err and "evotuner search" not in err   # names the command run
    assert studied.read_bytes() == before


def test_bench_refuses_unknown_studies_and_missing_databases(capsys, tmp_path, studied):
    one_line_error(*run(capsys, "bench", "--study", "nope", "--storage", f"sqlite:///{studied}"), "nope")
    missing = tmp_path / "missing.db"
    one_line_error(*run(capsys, "bench", "--study", "s", "--storage", f"sqlite:///{missing}"), str(missing))
    assert not missing.exists()


def test_a_study_without_complete_trials_cannot_be_benched(tmp_path, build_cache_dir):
    space = load_space(TINY)
    problem = Problem(Shape.parse(SHAPE), "fp16")
    with StudyStore(f"sqlite:///{tmp_path / 'empty.db'}") as store, \
            Builder(space.kernel, arch=space.arch, cache_dir=build_cache_dir, jobs=1) as builder:
        store.create_study("e", problem, space, "tpe", 0, source_hash=builder.source_hash(),
                           nvcc_version=builder.nvcc_version())
        with pytest.raises(Exception) as info:
            bench_study(store, "e", builder=builder, measure=ScaffoldMeasure(), top=3)
    assert "has no COMPLETE trial" in str(info.value) and "evotuner search --study e" in str(info.value)


def test_ratios_are_sdpa_over_ours():
    assert ratios({"a": 200.0, "b": None, "c": 50.0}, 100.0) == {"a": 2.0, "b": None, "c": 0.5}
    assert ratios({"a": 200.0}, None) == {"a": None}


def test_bench_result_json_is_serialisable_and_names_the_best(studied, build_cache_dir):
    space = load_space(TINY)
    with StudyStore(f"sqlite:///{studied}") as store, \
            Builder(space.kernel, arch=space.arch, cache_dir=build_cache_dir, jobs=1) as builder:
        result = bench_study(store, "s", builder=builder, measure=ScaffoldMeasure(), top=10,
                             record_baselines=False)
    assert isinstance(result, BenchResult)
    configs = [r.config for r in result.rows]
    assert len(configs) == len(set(configs)) >= 2          # duplicates of a config are listed once
    medians = [r.recorded_us for r in result.rows]
    assert medians == sorted(medians)
    assert result.best is not None and result.best.median_us == min(r.median_us for r in result.rows)
    json.dumps(result.as_json())


# -- scripts/bench_tuner.py -----------------------------------------------------------------


def _load_script():
    spec = importlib.util.spec_from_file_location("bench_tuner_under_test", ROOT / "scripts" / "bench_tuner.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


class PhasedScaffold(ScaffoldMeasure):
    """The scaffold, reporting per-phase durations the way the GPU worker does."""

    PHASES = {"load_s": 0.001, "check_s": 0.002, "time_s": 0.003}

    def measure(self, artifact, problem):
        outcome = super().measure(artifact, problem)
        self.last_detail = {"phases": dict(self.PHASES)}
        return outcome


def test_bench_tuner_cold_then_warm(tmp_path, capsys):
    script = _load_script()
    made: list[PhasedScaffold] = []

    def factory():
        made.append(PhasedScaffold())
        return made[-1]

    output = tmp_path / "out" / "bench.json"
    workdir = tmp_path / "work"
    code = script.main(["--trials", "4", "--space", str(TINY), "--shape", SHAPE, "--jobs", "2",
                        "--output", str(output), "--workdir", str(workdir), "--keep"], measure_factory=factory)
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "trials/min" in out and "share: gpu_idle" in out and f"wrote {output}" in out
    assert "start-up / first measure" in out and "per trial: check" in out and "measures/min" in out
    data = json.loads(output.read_text())
    cold, warm = data["phases"]["cold"], data["phases"]["warm"]
    assert data["shape"] == SHAPE and data["jobs"] == 2 and data["trials"] == 4
    assert len(made) == 2 and all(m.closed for m in made)        # one measure stage per phase, closed
    for phase in (cold, warm):
        assert phase["trials"] == 4 and phase["outcome"] == "done"
        assert phase["wall_s"] > 0 and phase["trials_per_min"] == pytest.approx(4 / (phase["wall_s"] / 60), rel=0.01)
        assert phase["phases_reported"] is True
        n = phase["measured"]
        assert n >= 1
        assert phase["worker_s"]["check_s"] == pytest.approx(0.002 * n)
        assert phase["worker_s"]["time_s"] == pytest.approx(0.003 * n)
        assert phase["shares"]["correctness"] == pytest.approx(0.002 * n / phase["wall_s"], abs=1e-4)
        for key, value in phase["shares"].items():
            assert value is not None and 0.0 <= value <= 1.0, (key, value)
        assert set(phase["loop_s"]) >= {"build_wait", "gate", "measure", "record", "ask", "baselines"}
        # issue 28's figures: start-up, time to the first measurement, per-trial split, racing
        assert 0 <= phase["startup_s"] <= phase["first_measure_s"] <= phase["wall_s"]
        assert phase["measures_per_min"] is None or phase["measures_per_min"] > 0
        split = phase["per_trial_s"]
        assert split["check"] == pytest.approx(0.002, abs=1e-4) and split["timing"] == pytest.approx(0.003, abs=1e-4)
        assert split["load"] == pytest.approx(0.001, abs=1e-4)
        assert split["build_wait"] == pytest.approx(phase["loop_s"]["build_wait"] / n, abs=1e-3)
        assert phase["racing"] == {"stopped_early": 0, "reps_timed": 10 * n, "reps_planned": 10 * n, "saved": 0.0}
    assert cold["builds"] >= 1 and cold["cached_builds"] == 0 and cold["build_cpu_s"] > 0   # empty cache
    assert warm["builds"] == cold["builds"] and warm["cached_builds"] == warm["builds"]     # all hits
    assert warm["best_config"] == cold["best_config"] and warm["best_us"] == cold["best_us"]  # same seed
    assert data["targets"]["applies"] is False and "met" in data["targets"]["cold"]
    assert sorted(p.name for p in workdir.iterdir()) == ["build-cache", "cold.db", "warm.db"]


class RacingPhased(PhasedScaffold):
    """A racing stage: stops every config over the incumbent's threshold at 16 of 400 reps;
    every config after the first is timed 2x slower (the scaffold's times lie within 2x of each
    other, racing's margin is 15%: so some are stopped)."""

    races = True

    def __init__(self):
        super().__init__()
        self.races_seen = []

    def measure(self, artifact, problem, race=None):
        from evotuner.measure.base import Measurement

        import dataclasses

        outcome = super().measure(artifact, problem)
        if self.races_seen:
            outcome = dataclasses.replace(outcome, median_us=outcome.median_us * 2, p20_us=outcome.p20_us * 2,
                                          p80_us=outcome.p80_us * 2)
        self.races_seen.append(race)
        if race is not None and outcome.median_us > race.rule.threshold(race.incumbent_us):
            return Measurement(outcome.median_us, outcome.p20_us, outcome.p80_us, outcome.tflops,
                               outcome.max_error, outcome.tolerance, 16, stopped_early=True,
                               planned_repetitions=400, incumbent_us=race.incumbent_us)
        return Measurement(outcome.median_us, outcome.p20_us, outcome.p80_us, outcome.tflops, outcome.max_error,
                           outcome.tolerance, 400)


@pytest.mark.parametrize("full", [False, True])
def test_bench_tuner_reports_racing_and_full_timing_turns_it_off(tmp_path, capsys, full):
    script = _load_script()
    made: list[RacingPhased] = []

    def factory():
        made.append(RacingPhased())
        return made[-1]

    output = tmp_path / "bench.json"
    argv = ["--trials", "6", "--space", str(TINY), "--shape", SHAPE, "--jobs", "2", "--phases", "cold",
            "--output", str(output), "--workdir", str(tmp_path / "work")] + (["--full-timing"] if full else [])
    assert script.main(argv, measure_factory=factory) == 0, capsys.readouterr().err
    data = json.loads(output.read_text())
    cold = data["phases"]["cold"]
    racing = cold["racing"]
    races = made[0].races_seen
    assert data["racing"] is (not full)
    if full:
        assert all(r is None for r in races) and racing["stopped_early"] == 0 and racing["saved"] == 0.0
    else:
        stopped = racing["stopped_early"]
        assert races[0] is None and all(r is not None for r in races[1:])
        assert stopped >= 1 and racing["reps_planned"] == 400 * cold["measured"]
        assert racing["reps_timed"] == 400 * (cold["measured"] - stopped) + 16 * stopped
        assert racing["saved"] == pytest.approx(1 - racing["reps_timed"] / racing["reps_planned"], abs=1e-4)
    assert "stopped early (reps saved)" in capsys.readouterr().out


def test_bench_tuner_refuses_a_used_cache_and_no_gpu(tmp_path, capsys, monkeypatch):
    script = _load_script()
    cache = tmp_path / "work" / "build-cache"
    cache.mkdir(parents=True)
    (cache / "something").write_text("x")
    code = script.main(["--trials", "1", "--space", str(TINY), "--shape", SHAPE, "--workdir", str(tmp_path / "work"),
                        "--output", str(tmp_path / "o.json")], measure_factory=PhasedScaffold)
    err = capsys.readouterr().err
    assert code == 1 and "is not empty" in err and "Traceback" not in err
    assert not (tmp_path / "o.json").exists()

    import evotuner.measure

    monkeypatch.setattr(evotuner.measure, "gpu_available", lambda *a, **k: False)
    code = script.main(["--trials", "1", "--output", str(tmp_path / "o.json")])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("error: no CUDA GPU on this machine")
