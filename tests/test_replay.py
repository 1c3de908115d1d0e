"""Replay: sweep files, ReplayMeasure/ReplayBuilder in the real loop, the sweep script, the benchmark core.

Fixtures: tests/data/replay/synthetic_d{64,128}.csv -- SYNTHETIC timings over real
nvcc 13 builds and gates of the packaged default space (see make_synthetic.py there).
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import math
import statistics
import sys
from collections import Counter
from pathlib import Path

import pytest

from evotuner.compiler.result import Artifact
from evotuner.config import KernelConfig
from evotuner.errors import StudyMismatchError
from evotuner.gate import apply_gate
from evotuner.loop import run_search
from evotuner.measure.base import MeasureFailure, Measurement, MeasureStage
from evotuner.measure.replay import (
    RESULT_COLUMNS,
    ReplayError,
    ReplayMeasure,
    SweepRow,
    read_sweep,
    sidecar_path,
    write_sweep,
)
from evotuner.problem import Problem, Shape
from evotuner.propose import make_sampler
from evotuner.space import load_space
from evotuner.storage import StudyStore

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
D64 = DATA / "replay" / "synthetic_d64.csv"
D128 = DATA / "replay" / "synthetic_d128.csv"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def space():
    return load_space(None)


# --------------------------------------------------------------------------- the files


@pytest.mark.parametrize("path", [D64, D128])
def test_fixture_sweeps_cover_the_default_space(path: Path, space) -> None:
    table = read_sweep(path)
    assert table.header["synthetic"] is True              # never mistaken for a measurement
    assert set(table.rows) == set(space.configs())
    assert tuple(table.names) == space.names
    counts = Counter(r.status for r in table.rows.values())
    assert counts["ok"] > 10 and counts["gated"] > 0
    problem = table.problem
    for config, row in table.rows.items():
        constraint = space.violated(config, problem)
        if constraint is not None:                          # statically pruned: the space's own message
            assert (row.status, row.failure_kind, row.reason) == ("gated", "", constraint.message)
            assert not row.compiled
        else:
            assert row.compiled, config


def test_replay_through_the_real_gate_reproduces_every_row(space) -> None:
    table = read_sweep(D64)
    replay = ReplayMeasure(D64, table.problem, space)
    builder = replay.builder()
    seen = Counter()
    for config in space.feasible(table.problem):
        build = builder.submit(config, table.problem).result()
        expected = replay.lookup(config)
        assert build.ok and build.artifact is not None and build.cached
        gate = apply_gate(build, space.gate)
        if expected.state == "PRUNED":
            assert not gate.passed and gate.reason == expected.reason
            seen["gated"] += 1
            continue
        assert gate.passed, (config, gate.reason)
        outcome = replay.measure(build.artifact, table.problem)
        assert outcome == expected.outcome
        if isinstance(outcome, Measurement):
            assert outcome.median_us == table.rows[config].median_us
            assert gate.report.registers == table.rows[config].registers
            assert gate.report.smem == table.rows[config].smem_bytes
        seen[type(outcome).__name__] += 1
    assert seen["gated"] > 0 and seen["Measurement"] > 0 and seen["MeasureFailure"] == 1
    assert replay.calls == seen["Measurement"] + seen["MeasureFailure"]
    failed = next(r for r in table.rows.values() if r.status == "failed")
    assert replay.lookup(failed.config).reason == f"wrong_result: {failed.reason}"


def test_mismatches_are_named(space, tmp_path: Path) -> None:
    table = read_sweep(D64)
    other = Problem(Shape.parse("B=16,H=16,S=1024,D=64"))
    with pytest.raises(StudyMismatchError, match="S=2048.*S=1024"):
        ReplayMeasure(D64, other, space)
    with pytest.raises(StudyMismatchError, match="causal"):
        ReplayMeasure(D64, Problem(table.problem.shape, causal=True), space)
    tiny = load_space(DATA / "loop_tiny.toml")
    with pytest.raises(ReplayError, match="fingerprint"):
        ReplayMeasure(D64, table.problem, tiny)
    replay = ReplayMeasure(D64, table.problem, space)
    stranger = Artifact(cubin=D64, key="0123abcd", sha256="0" * 64, meta={})
    with pytest.raises(ReplayError, match="not built by this replay"):
        replay.measure(stranger, table.problem)
    with pytest.raises(ReplayError, match="not found"):
        read_sweep(tmp_path / "none.csv")


def _copy(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.csv"
    path.write_text(text)
    sidecar_path(path).write_text(sidecar_path(D64).read_text())
    return path


def test_a_sweep_missing_a_config_of_the_space_is_refused(space, tmp_path: Path) -> None:
    # every config of the space has a row, or the replay would meet a proposal it cannot answer
    lines = D64.read_text().splitlines(keepends=True)
    header = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    path = _copy(tmp_path, "".join(lines[:header + 1] + lines[header + 2:]))
    with pytest.raises(ReplayError, match=r"no row for 1 config\(s\) of the space"):
        ReplayMeasure(path, read_sweep(D64).problem, space)


def test_malformed_files_name_file_line_and_column(tmp_path: Path) -> None:
    lines = D64.read_text().splitlines()
    bad = lines[:3] + [lines[3].replace(",ok,", ",great,", 1)] + lines[4:]
    with pytest.raises(ReplayError, match=r"s\.csv:4: column status: 'great'"):
        read_sweep(_copy(tmp_path, "\n".join(bad)))
    with pytest.raises(ReplayError, match=r"s\.csv:3: config .* appears twice"):
        read_sweep(_copy(tmp_path, "\n".join(lines[:2] + [lines[1]])))
    with pytest.raises(ReplayError, match="header must be"):
        read_sweep(_copy(tmp_path, "\n".join([lines[0].replace("median_us", "mean_us")] + lines[1:])))
    path = _copy(tmp_path, D64.read_text())
    sidecar_path(path).unlink()
    with pytest.raises(ReplayError, match="sidecar"):
        read_sweep(path)


@pytest.mark.parametrize("edit, says, remedy", [
    (lambda lines: [], "empty sweep file", "re-record the sweep with scripts/sweep.py"),
    (lambda lines: lines[:1] + [_cell(lines[0], lines[1], "median_us", "-5.0")],
     r"s\.csv:2: column median_us: -5\.0 is out of range", "fix line 2 of s.csv"),
    (lambda lines: lines[:1] + [_cell(lines[0], lines[1], "tflops", "nan")],
     r"column tflops: 'nan' is not a finite number", "fix line 2 of s.csv"),
    (lambda lines: lines[:1] + [_cell(lines[0], lines[1], "status", "weird")],
     r"status: 'weird' is not one of", "fix line 2 of s.csv"),
    (lambda lines: lines[:2] + [lines[1]], "appears twice", "fix line 3"),
])
def test_a_damaged_sweep_row_or_file_says_what_to_do(tmp_path: Path, edit, says, remedy) -> None:
    """Every replay-file error carries a remedy (re-record it, or fix the line named)."""
    path = _copy(tmp_path, "\n".join(edit(D64.read_text().splitlines())))
    with pytest.raises(ReplayError, match=says) as info:
        read_sweep(path)
    assert info.value.remedy and remedy in info.value.remedy


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"problem": {"shape": 7}, "space_fingerprint": "", '
                                  '"device": null, "baselines": {}}'])
def test_a_damaged_sidecar_says_what_to_do(tmp_path: Path, text: str) -> None:
    path = _copy(tmp_path, D64.read_text())
    sidecar_path(path).write_text(text)
    with pytest.raises(ReplayError, match="sidecar") as info:
        read_sweep(path)
    assert info.value.remedy and "scripts/sweep.py" in info.value.remedy


def test_a_replay_path_that_is_no_file_says_what_it_is(tmp_path: Path) -> None:
    with pytest.raises(ReplayError, match="is a folder, not a sweep file"):
        read_sweep(tmp_path)
    with pytest.raises(ReplayError, match="is not a regular file"):
        read_sweep("/dev/zero")


def _cell(header: str, line: str, column: str, value: str) -> str:
    """CSV ``line`` with its ``column`` cell set to ``value``."""
    import csv as csvlib
    import io

    cells = next(csvlib.reader([line]))
    cells[next(csvlib.reader([header])).index(column)] = value
    out = io.StringIO()
    csvlib.writer(out, lineterminator="").writerow(cells)
    return out.getvalue()


def test_write_read_round_trip(tmp_path: Path) -> None:
    config = KernelConfig.of({"A": 1, "B": 2})
    log = "ptxas info    : x\n    0 bytes stack frame, a\\nb"
    rows = [SweepRow(config=config, status="ok", median_us=12.5, p20_us=12.0, p80_us=13.0, tflops=1.5,
                     max_error=1e-4, tolerance=1e-3, repetitions=7, registers=96, spill_bytes=0, smem_bytes=4096,
                     meta={"threads": 128}, ptxas_log=log),
            SweepRow(config=KernelConfig.of({"A": 2, "B": 2}), status="gated", reason="too,big\nreally")]
    problem = Problem(Shape.parse("B=1,H=1,S=64,D=64"))
    header = {"problem": problem.as_dict(), "space_fingerprint": "f", "device": None, "baselines": {"x": None}}
    table = read_sweep(write_sweep(tmp_path / "rt.csv", ("A", "B"), rows, header))
    assert table.rows[config] == rows[0] and table.rows[config].ptxas_log == log
    assert table.rows[rows[1].config].reason == "too,big really"        # one line
    assert (tmp_path / "rt.csv").read_text().splitlines()[0].endswith(",".join(RESULT_COLUMNS))


# --------------------------------------------------------------------------- the loop


def test_replayed_search_runs_without_nvcc(space, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    table = read_sweep(D64)
    replay = ReplayMeasure(D64, table.problem, space)
    with StudyStore(f"sqlite:///{tmp_path / 'r.db'}") as store:
        store.create_study("r", table.problem, space, sampler_name="tpe", seed=1, source_hash="replay",
                           nvcc_version=replay.builder().nvcc_version())
        result = run_search(store=store, study_name="r", problem=table.problem, space=space,
                            sampler=make_sampler("tpe", space, 1), seed=1, trials=60,
                            builder=replay.builder(), measure=replay)
        summary = store.summary("r")
    assert result.outcome == "done" and result.finished == 60
    assert summary.baselines == table.header["baselines"]
    assert summary.device["replayed"] is True and summary.device["name"] == table.header["device"]["name"]
    own = [t for t in summary.trials if t.duplicate_of is None]
    assert replay.calls == sum(1 for t in own if t.state == "COMPLETE" or (t.error or "").startswith("wrong_result"))
    for t in summary.trials:
        expected = replay.lookup(t.kernel_config)
        assert t.state == expected.state, t
        assert t.value == expected.value
        if t.state != "COMPLETE":
            assert t.error == expected.reason
    assert summary.best.value == min(t.value for t in own if t.value is not None)


# --------------------------------------------------------------------------- the sweep script


class _FlakyMeasure(MeasureStage):
    """Times every config as 10 µs x BLOCK_M // 16; with MIN_BLOCKS=2 and BLOCK_N=32 it
    fails BLOCK_M=``fail`` and raises for BLOCK_M=``crash``."""

    def __init__(self, fail: int, crash: int) -> None:
        self.fail, self.crash, self.calls = fail, crash, 0

    def measure(self, artifact, problem):
        self.calls += 1
        bm, chosen = artifact.meta["block_m"], artifact.meta["min_blocks"] == 2 and artifact.meta["block_n"] == 32
        if chosen and bm == self.crash:
            raise RuntimeError("worker exploded")
        if chosen and bm == self.fail:
            return MeasureFailure("nan", "NaN in the output")
        us = 10.0 * bm / 16
        return Measurement(us, us, us, problem.tflops(us), 0.0, 1e-3, 3)

    def baselines(self, problem):
        return {"sdpa_flash": 99.0}

    def device(self):
        return {"name": "test"}


@contextlib.contextmanager
def _tiny_sweep(tmp_path: Path):
    """(the sweep script, loop_tiny.toml, its problem, the output CSV, a real Builder)."""
    from evotuner.compiler import Builder

    space = load_space(DATA / "loop_tiny.toml")
    with Builder(space.kernel, arch=space.arch, cache_dir=tmp_path / "cache", jobs=2) as builder:
        yield _script("sweep"), space, Problem(Shape.parse("B=1,H=2,S=128,D=64")), tmp_path / "tiny.csv", builder


def test_sweep_records_every_config_and_resumes(tmp_path: Path) -> None:
    with _tiny_sweep(tmp_path) as (sweep, space, problem, out, builder):
        first = sweep.run_sweep(space=space, problem=problem, builder=builder,
                                measure=_FlakyMeasure(fail=64, crash=128), output=out)
        table = read_sweep(out)
        assert [r.config for r in first.rows] == list(space.configs())
        assert set(table.rows) == set(space.configs())
        by = Counter((r.status, r.failure_kind) for r in table.rows.values())
        assert by[("gated", "")] == 2                                  # the space's constraint
        assert by[("failed", "nan")] == 1
        crashed = [r for r in table.rows.values() if "worker exploded" in r.reason]
        assert len(crashed) == 1 and crashed[0].status == "failed"
        assert by[("ok", "")] == 8 - 2 - 1 - 1
        assert table.header["baselines"] == {"sdpa_flash": 99.0} and table.header["complete"] is True
        replay = ReplayMeasure(out, problem, space)                   # what was written replays
        ok = next(r for r in table.rows.values() if r.status == "ok")
        assert replay.lookup(ok.config).value == ok.median_us and ok.registers and ok.smem_bytes

        lines = out.read_text().splitlines()                          # interrupted: 4 rows and a torn one
        out.write_text("\n".join(lines[:5]) + "\n" + lines[5][:20])
        counting = _FlakyMeasure(fail=0, crash=0)
        again = sweep.run_sweep(space=space, problem=problem, builder=builder, measure=counting, output=out)
    assert again.kept == 4
    measured_before = sum(1 for line in lines[1:5] if ",ok," in line or ",failed," in line)
    assert counting.calls == 6 - measured_before
    assert set(read_sweep(out).rows) == set(space.configs())


# --------------------------------------------------------------------------- the benchmark core


def test_random_expectation_is_exact() -> None:
    bench = _script("sampler_benchmark")
    values, n = [5.0, 3.0, 9.0, 4.0], 6                     # two configs without a latency (= worst, 9)
    pool = values + [9.0, 9.0]
    for b in (1, 2, 3, 6):
        brute = statistics.fmean(min(c) for c in itertools.combinations(pool, b))
        assert math.isclose(bench.random_expectation(values, n, b), brute)


def test_benchmark_counts_distinct_compiled_configs(space) -> None:
    bench = _script("sampler_benchmark")
    table = read_sweep(D128)
    replay = ReplayMeasure(D128, table.problem, space)
    feasible = sum(1 for c in space.configs() if replay.lookup(c).evaluated)
    optimum = table.optimum().median_us
    for spec in ("random", "tpe", "grid"):
        run = bench.simulate(str(D128), spec, seed=0, stop_at_budget=False)
        assert run.evals == len(run.trace) <= feasible
        assert run.asks >= run.evals
        assert run.evals_to_target is not None, spec            # a full run always gets there
        assert run.trace[run.evals_to_target - 1] <= 1.02 * optimum < (
            run.trace[run.evals_to_target - 2] if run.evals_to_target > 1 else math.inf)
        assert list(run.trace) == sorted(run.trace, reverse=True)
    summary = bench.summarize([bench.simulate(str(D128), "random", seed=s) for s in range(3)], str(D128), None)
    assert summary["feasible"] == feasible and summary["optimum_us"] == optimum


def test_random_exact_quantiles_match_enumeration() -> None:
    bench = _script("sampler_benchmark")
    n, good = 6, 2
    firsts = [next(i for i, x in enumerate(p, 1) if x < good) for p in itertools.permutations(range(n))]
    for q in (0.5, 0.9):
        brute = next(t for t in range(1, n + 1) if sum(f <= t for f in firsts) / len(firsts) >= q)
        assert bench.random_hits(n, good, q) == brute


def test_benchmark_runs_the_real_loop_and_writes_its_outputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """scripts/sampler_benchmark.py end to end on a tiny configuration: one seed of random
    search and of the CLI's warm-started one, each a real search over the replay in its own
    temporary SQLite study; the table, JSON and figure it documents."""
    import json

    import evotuner.loop as loop

    bench = _script("sampler_benchmark")
    calls = []
    real = loop.run_search
    monkeypatch.setattr(loop, "run_search", lambda **kw: calls.append(kw) or real(**kw))
    run = bench.simulate(str(D128), "random", seed=0)          # in this process: the loop's own run_search
    assert len(calls) == 1 and calls[0]["study_name"] == "bench" and calls[0]["batch"] == 1
    assert run.asks >= run.evals == len(run.trace) >= 1
    out = tmp_path / "bench"
    assert bench.main([str(D128), "--samplers", "random,random+start", "--seeds", "1", "--workers", "1",
                       "--output-dir", str(out)]) == 0
    md = (out / "samplers.md").read_text().splitlines()
    assert md[0].startswith("synthetic_d128.csv: ") and " feasible configs, optimum " in md[0]
    assert md[1] == "| sampler | evals to 2% (median) | p90 | censored | P@10% | P@25% | P@50% | s/run |"
    assert [line.split(" | ")[0] for line in md[3:6]] == ["| random-exact", "| random", "| random+start"]
    data = json.loads((out / "samplers.json").read_text())
    row = data["results"]["synthetic_d128.csv"]["random"]
    assert row["seeds"] == 1 and row["censored"] + sum(
        1 for r in data["runs"] if r["sampler"] == "random" and r["evals_to_target"] is not None) == 1
    assert all(r["asks"] >= r["evals"] >= 1 for r in data["runs"])
    assert (out / "samplers.png").read_bytes()[:4] == b"\x89PNG"


def test_sweep_stops_at_its_deadline_and_carries_on(tmp_path: Path) -> None:
    with _tiny_sweep(tmp_path) as (sweep, space, problem, out, builder):
        stopped = sweep.run_sweep(space=space, problem=problem, builder=builder,
                                  measure=_FlakyMeasure(fail=0, crash=0), output=out, deadline=0.0)
        assert not stopped.done and stopped.counts == {"gated": 2}     # only the static verdicts
        assert read_sweep_header(out)["complete"] is False
        counting = _FlakyMeasure(fail=0, crash=0)
        again = sweep.run_sweep(space=space, problem=problem, builder=builder, measure=counting, output=out)
    assert again.done and again.kept == 2 and counting.calls == 6
    assert set(read_sweep(out).rows) == set(space.configs())


def test_sweep_script_runs_several_sweeps_with_one_builder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:

    import evotuner.measure.gpu as gpu

    sweep = _script("sweep")
    stage = _FlakyMeasure(fail=0, crash=0)

    @contextlib.contextmanager
    def fake_gpu(budget_s: float):
        yield stage

    monkeypatch.setattr(gpu, "GpuMeasure", fake_gpu)
    monkeypatch.setenv("EVOTUNER_CACHE_DIR", str(tmp_path / "cache"))
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    rc = sweep.main(["--space", str(DATA / "loop_tiny.toml"), "--jobs", "2",
                     "--sweep", f"B=1,H=2,S=128,D=64:fp16:{a}", "--sweep", f"B=1,H=2,S=96,D=64:bf16:causal:{b}"])
    assert rc == 0 and stage.calls == 12
    assert read_sweep(b).problem == Problem(Shape.parse("B=1,H=2,S=96,D=64"), dtype="bf16", causal=True)
    with pytest.raises(SystemExit):                                   # argparse names the bad --sweep
        sweep.main(["--sweep", "B=1,H=2,S=96,D=64:fp32:x.csv"])


def read_sweep_header(path: Path) -> dict:
    import json

    return json.loads(sidecar_path(path).read_text())
