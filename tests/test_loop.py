"""The search loop end to end: real nvcc builds (tiny space, shared cache), real SQLite
studies, and the deterministic scaffold measure stage (tests/scaffold.py) in place of a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evotuner import events as ev
from evotuner.compiler import Builder
from evotuner.config import KernelConfig
from evotuner.loop import INTERRUPTED, run_search
from evotuner.problem import Problem, Shape
from evotuner.propose import make_sampler, params_for
from evotuner.space import load_space, parse_space
from evotuner.storage import INTERRUPTED_REASON, StudyStore

from scaffold import DEVICE, ScaffoldMeasure, scaffold_median_us

DATA = Path(__file__).parent / "data"
TINY = DATA / "loop_tiny.toml"
PROBLEM = Problem(Shape.parse("B=1,H=2,S=256,D=32"))

SMALL = KernelConfig.parse("BLOCK_M=64,BLOCK_N=32,NUM_WARPS=4,STAGES=1,MIN_BLOCKS=1")
OTHER = KernelConfig.parse("BLOCK_M=64,BLOCK_N=32,NUM_WARPS=4,STAGES=1,MIN_BLOCKS=2")
THIRD = KernelConfig.parse("BLOCK_M=128,BLOCK_N=32,NUM_WARPS=4,STAGES=1,MIN_BLOCKS=1")
#: Breaks loop_tiny.toml's constraint test_tile_budget (BLOCK_M x BLOCK_N > 4096).
TOO_BIG = KernelConfig.parse("BLOCK_M=128,BLOCK_N=64,NUM_WARPS=4,STAGES=1,MIN_BLOCKS=1")


class CountingBuilder:
    """The real Builder, with a record of every config submitted to it."""

    def __init__(self, inner: Builder) -> None:
        self.inner = inner
        self.jobs = inner.jobs
        self.submitted: list[KernelConfig] = []

    def submit(self, config, problem):
        self.submitted.append(config)
        return self.inner.submit(config, problem)


@pytest.fixture(scope="module")
def space():
    return load_space(TINY)


@pytest.fixture(scope="module")
def real_builder(space, build_cache_dir):
    with Builder(space.kernel, arch=space.arch, cache_dir=build_cache_dir, jobs=2) as builder:
        yield builder


@pytest.fixture
def builder(real_builder):
    return CountingBuilder(real_builder)


@pytest.fixture
def store(tmp_path):
    with StudyStore(f"sqlite:///{tmp_path / 'study.db'}") as s:
        yield s


def create(store, name, space, builder, sampler="tpe", seed=0):
    store.create_study(name, PROBLEM, space, sampler, seed,
                       source_hash=builder.inner.source_hash(), nvcc_version=builder.inner.nvcc_version())


def enqueue(store, name, space, *configs):
    study = store.load_study(name)
    for c in configs:
        study.enqueue_trial(params_for(c, space))


def search(store, name, space, builder, measure, trials, *, sampler="tpe", seed=0, batch=None, events=None):
    return run_search(
        store=store, study_name=name, problem=PROBLEM, space=space, sampler=make_sampler(sampler, space, seed),
        seed=seed, trials=trials, builder=builder, measure=measure,
        on_event=events.append if events is not None else None, batch=batch,
    )


def trials_of(store, name):
    return {t.number: t for t in store.summary(name).trials}


def test_runs_to_n_finished_trials_and_a_second_run_does_nothing(store, space, builder):
    create(store, "s", space, builder)
    measure, events = ScaffoldMeasure(), []
    result = search(store, "s", space, builder, measure, 5, events=events)

    assert result.outcome == "done"
    assert result.finished == result.new_trials == store.count_finished("s") == 5
    assert sum(result.counts.values()) == 5
    complete = [t for t in trials_of(store, "s").values() if t.state == "COMPLETE"]
    assert complete, "the tiny space has feasible configs; some trial must complete"
    for t in complete:
        config = KernelConfig.parse(",".join(f"{k}={v}" for k, v in store_config(store, "s", t.number).items()))
        assert t.value == pytest.approx(scaffold_median_us(config))
        assert t.tflops == pytest.approx(PROBLEM.tflops(t.value))
    assert result.best is not None and result.best.median_us == min(t.value for t in complete)
    assert measure.baseline_calls == 1 and result.baselines == store.summary("s").baselines != {}
    kinds = [type(e) for e in events]
    assert kinds[0] is ev.SearchStarted and kinds[-1] is ev.SearchFinished
    assert ev.BaselinesMeasured in kinds and ev.BuildStarted in kinds and ev.BuildFinished in kinds
    assert sum(k is ev.TrialFinished for k in kinds) == 5
    progress = [e for e in events if isinstance(e, ev.Progress)]
    assert [p.finished for p in progress] == [1, 2, 3, 4, 5]

    calls, submitted = len(measure.calls), len(builder.submitted)
    again = search(store, "s", space, builder, measure, 5)
    assert again.outcome == "already_done" and again.new_trials == 0
    assert len(measure.calls) == calls and len(builder.submitted) == submitted
    assert measure.baseline_calls == 1
    assert len(store.summary("s").trials) == 5

    more = search(store, "s", space, builder, measure, 6)
    assert more.new_trials == 1 and store.count_finished("s") == 6
    assert measure.baseline_calls == 1, "baselines are measured once per study and device"


def store_config(store, name, number):
    """The config values the loop records on every trial (user attr ``config``)."""
    study = store.load_study(name)
    return study.trials[number].user_attrs["config"]


def test_a_constraint_violation_is_pruned_with_its_reason_and_never_compiled(store, space, builder):
    create(store, "s", space, builder)
    enqueue(store, "s", space, TOO_BIG)
    measure = ScaffoldMeasure()
    search(store, "s", space, builder, measure, 1)

    t = trials_of(store, "s")[0]
    assert t.state == "PRUNED"
    assert t.error == "BLOCK_M=128 x BLOCK_N=64 > 4096: test budget for tiles"
    assert builder.submitted == [] and measure.calls == []


def test_duplicates_are_never_rebuilt_or_measured(store, space, builder):
    create(store, "s", space, builder)
    # 0 and 1 are asked together (1 follows 0's build in flight); 2 and 3 repeat a finished config.
    enqueue(store, "s", space, SMALL, SMALL, SMALL, SMALL)
    measure = ScaffoldMeasure()
    search(store, "s", space, builder, measure, 4, batch=2)

    assert builder.submitted == [SMALL] and measure.calls == [SMALL]
    trials = trials_of(store, "s")
    assert [trials[n].state for n in range(4)] == ["COMPLETE"] * 4
    assert {trials[n].value for n in range(4)} == {scaffold_median_us(SMALL)}
    assert [trials[n].duplicate_of for n in range(4)] == [None, 0, 0, 0]


def test_a_resumed_run_copies_results_from_the_study_not_from_memory(store, space, builder):
    create(store, "s", space, builder)
    enqueue(store, "s", space, SMALL)
    search(store, "s", space, builder, ScaffoldMeasure(), 1)
    enqueue(store, "s", space, SMALL)
    fresh = ScaffoldMeasure()
    search(store, "s", space, builder, fresh, 2)
    assert fresh.calls == []
    assert trials_of(store, "s")[1].duplicate_of == 0


def test_a_gated_config_is_pruned_with_the_ptxas_reason(store, space, builder):
    # Every real attention kernel uses more than 16 registers per thread.
    strict = parse_space(space.text.replace("max_registers = 255", "max_registers = 16"), "strict gate")
    create(store, "s", strict, builder)
    enqueue(store, "s", strict, SMALL)
    measure = ScaffoldMeasure()
    search(store, "s", strict, builder, measure, 1)

    t = trials_of(store, "s")[0]
    assert t.state == "PRUNED"
    assert t.error.startswith("registers ") and "max_registers=16" in t.error
    assert t.gate is not None and t.gate["passed"] is False and t.gate["registers"] > 16
    assert builder.submitted == [SMALL] and measure.calls == []


class RaisingMeasure(ScaffoldMeasure):
    """Raises for some configs (a bug in a stage), like nothing a MeasureStage should do."""

    def __init__(self, raise_for, exc=RuntimeError("worker protocol confused")):
        super().__init__()
        self.raise_for = set(raise_for)
        self.exc = exc

    def measure(self, artifact, problem):
        outcome = super().measure(artifact, problem)
        if self.calls[-1] in self.raise_for:
            raise self.exc
        return outcome


def test_a_measure_failure_fails_the_trial_and_the_search_goes_on(store, space, builder):
    create(store, "s", space, builder)
    enqueue(store, "s", space, SMALL, OTHER, THIRD)
    measure = RaisingMeasure({THIRD})
    measure.fail = {SMALL}
    result = search(store, "s", space, builder, measure, 3, batch=1)

    trials = trials_of(store, "s")
    assert trials[0].state == "FAIL"
    assert trials[0].error == "wrong_result: max error 1.0 over tolerance 0.01 (scaffold)"
    assert trials[1].state == "COMPLETE" and trials[1].value == pytest.approx(scaffold_median_us(OTHER))
    assert trials[2].state == "FAIL" and trials[2].error.startswith("RuntimeError: worker protocol confused")
    assert result.counts == {"COMPLETE": 1, "PRUNED": 0, "FAIL": 2}
    assert result.finished == 3


def test_zombies_are_failed_and_their_configs_run_again(store, space, builder):
    create(store, "s", space, builder)
    enqueue(store, "s", space, OTHER)
    study = store.load_study("s")
    zombie = study.ask()                      # a process asked for this trial, then was killed
    from evotuner.propose import suggest

    assert suggest(zombie, space) == OTHER
    measure = ScaffoldMeasure()
    result = search(store, "s", space, builder, measure, 1)

    assert result.zombies == (0,)
    trials = trials_of(store, "s")
    assert trials[0].state == "FAIL" and trials[0].error == INTERRUPTED_REASON
    assert trials[1].state == "COMPLETE" and measure.calls == [OTHER]
    assert store.count_finished("s") == 1 and result.finished == 1


def test_keyboard_interrupt_fails_trials_in_flight_and_they_do_not_count(store, space, builder):
    create(store, "s", space, builder)
    enqueue(store, "s", space, SMALL, OTHER)
    with pytest.raises(KeyboardInterrupt):
        search(store, "s", space, builder, RaisingMeasure({SMALL}, KeyboardInterrupt()), 2, batch=2)
    trials = trials_of(store, "s")
    assert [trials[n].state for n in (0, 1)] == ["FAIL", "FAIL"]
    assert {trials[n].error for n in (0, 1)} == {INTERRUPTED}

    result = search(store, "s", space, builder, ScaffoldMeasure(), 2)
    assert result.finished == 2 and result.new_trials == 2


class _LostInterrupt:
    """What SQLAlchemy's InstanceState._cleanup did in CI: a finaliser that the SIGTERM
    handler interrupted, whose KeyboardInterrupt Python prints as "Exception ignored" and drops."""

    def __del__(self):
        from evotuner.stopping import _on_sigint
        _on_sigint(2, None)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_an_interrupt_a_finaliser_swallowed_still_stops_the_search(store, space, builder):
    from evotuner import events as ev
    from evotuner import stopping

    create(store, "s", space, builder)
    seen = []

    def on_event(event):
        seen.append(event)
        if isinstance(event, ev.TrialFinished) and len([e for e in seen if isinstance(e, ev.TrialFinished)]) == 2:
            _LostInterrupt()   # created and collected at once: its KeyboardInterrupt is lost

    try:
        with pytest.raises(KeyboardInterrupt):
            run_search(store=store, study_name="s", problem=PROBLEM, space=space,
                       sampler=make_sampler("tpe", space, 0), seed=0, trials=40, builder=builder,
                       measure=ScaffoldMeasure(), on_event=on_event, batch=2)
    finally:
        stopping.clear()
    trials = trials_of(store, "s").values()
    assert 2 <= store.count_finished("s") < 40
    assert all(t.state != "RUNNING" for t in trials), [(t.number, t.state) for t in trials]
    assert any(t.error == INTERRUPTED for t in trials)


def test_the_same_seed_reproduces_the_study(tmp_path, space, builder):
    histories = []
    for i in range(2):
        with StudyStore(f"sqlite:///{tmp_path / f'repro{i}.db'}") as store:
            create(store, "s", space, builder, seed=7)
            search(store, "s", space, builder, ScaffoldMeasure(), 6, seed=7, batch=2)
            study = store.load_study("s")
            histories.append([(t.number, t.state.name, t.value, t.user_attrs.get("config")) for t in study.trials])
    assert histories[0] == histories[1]
    assert len(histories[0]) == 6


def test_an_exhausted_space_stops_instead_of_spinning(store, space, builder):
    create(store, "s", space, builder, sampler="grid")
    measure = ScaffoldMeasure()
    result = search(store, "s", space, builder, measure, 50, sampler="grid")

    assert result.outcome == "exhausted"
    assert result.finished == space.size == 8
    feasible = [c for c in space.configs() if space.violated(c, PROBLEM) is None]
    assert sorted(map(str, measure.calls)) == sorted(map(str, feasible))
    assert result.counts["PRUNED"] == space.size - len(feasible)



def test_a_failed_build_fails_the_trial_with_the_compiler_error(store, space, builder):
    # BLOCK_N=40 is in this space but not a multiple of 16: the kernel's traits static_assert.
    loose = parse_space(space.text.replace("values = [32, 64]", "values = [32, 40]"), "loose")
    create(store, "s", loose, builder)
    bad = KernelConfig.parse("BLOCK_M=64,BLOCK_N=40,NUM_WARPS=4,STAGES=1,MIN_BLOCKS=1")
    enqueue(store, "s", loose, bad, SMALL)
    measure = ScaffoldMeasure()
    result = search(store, "s", loose, builder, measure, 2, batch=1)

    trials = trials_of(store, "s")
    assert trials[0].state == "FAIL"
    assert trials[0].error.startswith("build failed: ") and "BLOCK_N" in trials[0].error
    assert trials[1].state == "COMPLETE" and measure.calls == [SMALL]
    assert result.counts == {"COMPLETE": 1, "PRUNED": 0, "FAIL": 1}


class _OtherGpu(ScaffoldMeasure):
    """The scaffold on 'another GPU': same stage, a different device fingerprint."""

    def device(self):
        return {**super().device(), "name": "another GPU (test only)", "sm_count": 114}


def test_a_resume_on_another_device_warns_and_measures_its_own_baselines(store, space, builder):
    create(store, "dev", space, builder)
    first = ScaffoldMeasure()
    search(store, "dev", space, builder, first, 3)
    assert first.baseline_calls == 1
    events = []
    again = ScaffoldMeasure()
    search(store, "dev", space, builder, again, 4, events=events)          # same device: nothing new
    assert again.baseline_calls == 0 and not any(isinstance(e, ev.DeviceChanged) for e in events)
    other = _OtherGpu()
    search(store, "dev", space, builder, other, 5, events=events)
    assert other.baseline_calls == 1
    changed = [e for e in events if isinstance(e, ev.DeviceChanged)]
    assert [e.device for e in changed] == ["another GPU (test only)"]
    devices = json.dumps(store.summary("dev").as_json()["devices"])
    assert DEVICE["name"] in devices and "another GPU (test only)" in devices     # both recorded
