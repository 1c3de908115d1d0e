"""Racing through the loop, the worker protocol and the timing loop, without a GPU: the
incumbent reaches the measure stage with each request, a stopped config is a COMPLETE
trial that says so, ``racing=None`` (``--full-timing``) and non-racing stages get no race;
the real GpuMeasure client carries the race to a fake worker and starts it in the
background; ``time_cuda``'s looks run on a fake CUDA clock."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import textwrap
import time
from pathlib import Path

import pytest

from evotuner import events as ev
from evotuner.compiler import Builder
from evotuner.compiler.result import Artifact
from evotuner.config import KernelConfig
from evotuner.loop import run_search
from evotuner.measure import GpuMeasure, Measurement, PendingMeasure
from evotuner.measure.protocol import ProtocolError, Reply, Request, artifact_wire, measurement_from_wire
from evotuner.measure.racing import DEFAULT_RULE, Race, RaceRule
from evotuner.measure.worker import Worker
from evotuner.problem import Problem, Shape
from evotuner.propose import make_sampler, params_for
from evotuner.space import load_space
from evotuner.storage import StudyStore
from evotuner.vocabulary import PAIRED_ATTR, STOPPED_ATTR

from scaffold import ScaffoldMeasure, scaffold_median_us

DATA = Path(__file__).parent / "data"
TINY = DATA / "loop_tiny.toml"
PROBLEM = Problem(Shape.parse("B=1,H=2,S=256,D=32"))
CONFIGS = [KernelConfig.parse(c) for c in (
    "BLOCK_M=64,BLOCK_N=32,NUM_WARPS=4,STAGES=1,MIN_BLOCKS=1",
    "BLOCK_M=64,BLOCK_N=32,NUM_WARPS=4,STAGES=1,MIN_BLOCKS=2",
    "BLOCK_M=128,BLOCK_N=32,NUM_WARPS=4,STAGES=1,MIN_BLOCKS=1",
)]


class RacingScaffold(ScaffoldMeasure):
    """The scaffold as a racing stage: records each request's race and stops a config whose
    fixed time is over the rule's threshold (as the worker would, at 16 of 500 reps)."""

    races = True

    def __init__(self, name: str | None = None, slower_after_first: float = 1.0) -> None:
        super().__init__()
        self.races_seen: list[Race | None] = []
        self.name = name
        self.slower_after_first = slower_after_first     # every config after the first this much slower

    def measure(self, artifact, problem, race=None):
        outcome = super().measure(artifact, problem)
        if self.races_seen and self.slower_after_first != 1.0 and isinstance(outcome, Measurement):
            f = self.slower_after_first
            outcome = dataclasses.replace(outcome, median_us=outcome.median_us * f, p20_us=outcome.p20_us * f,
                                          p80_us=outcome.p80_us * f)
        self.races_seen.append(race)
        if race is not None and outcome.median_us > race.rule.threshold(race.incumbent_us):
            return Measurement(outcome.median_us, outcome.p20_us, outcome.p80_us, outcome.tflops, outcome.max_error,
                               outcome.tolerance, 16, stopped_early=True, planned_repetitions=500,
                               incumbent_us=race.incumbent_us, pairs=16,
                               pair_ratio=outcome.median_us / race.incumbent_us)
        return outcome

    def device(self):
        found = super().device()
        return {**found, "name": self.name} if self.name else found


@pytest.fixture(scope="module")
def space():
    return load_space(TINY)


@pytest.fixture(scope="module")
def builder(space, build_cache_dir):
    with Builder(space.kernel, arch=space.arch, cache_dir=build_cache_dir, jobs=2) as b:
        yield b


@pytest.fixture
def store(tmp_path):
    with StudyStore(f"sqlite:///{tmp_path / 'study.db'}") as s:
        yield s


def _study(store, space, builder, name="r"):
    store.create_study(name, PROBLEM, space, "tpe", 0, source_hash=builder.source_hash(),
                       nvcc_version=builder.nvcc_version())
    study = store.load_study(name)
    for c in CONFIGS:
        study.enqueue_trial(params_for(c, space))


def _run(store, space, builder, measure, trials, name="r", events=None, batch=1, **kw):
    on_event = events if callable(events) else (events.append if events is not None else None)
    return run_search(store=store, study_name=name, problem=PROBLEM, space=space,
                      sampler=make_sampler("tpe", space, 0), seed=0, trials=trials, builder=builder,
                      measure=measure, on_event=on_event, batch=batch, **kw)


def test_each_request_carries_the_best_so_far_and_a_stopped_trial_says_so(store, space, builder):
    _study(store, space, builder)
    measure = RacingScaffold()
    events: list[object] = []
    result = _run(store, space, builder, measure, 3, events=events)
    times = [scaffold_median_us(c) for c in measure.calls]
    assert len(times) == 3 and measure.races_seen[0] is None       # nothing known: the whole budget
    for i in range(1, len(times)):
        race = measure.races_seen[i]
        assert race is not None and race.rule == DEFAULT_RULE
        assert race.incumbent_us == pytest.approx(min(times[:i]))    # the best so far, each time
    trials = store.summary("r").trials
    stopped = [t for t in trials if STOPPED_ATTR in t.attrs]
    expected = [i for i in range(1, 3) if times[i] > 1.01 * min(times[:i])]
    assert len(stopped) == len(expected) == result.stopped_early and result.measured == 3
    for t in stopped:
        attr = t.attrs[STOPPED_ATTR]
        assert t.state == "COMPLETE" and t.value == pytest.approx(attr["median_us"])
        assert attr["reps"] == 16 and attr["planned_reps"] == 500 and attr["incumbent_us"] < t.value
        assert "alpha" in attr["rule"]
        # the pairs timed beside the incumbent and their ratio: the recorded median, audited
        assert t.attrs[PAIRED_ATTR] == {"pairs": 16, "ratio": pytest.approx(t.value / attr["incumbent_us"])}
    assert all(PAIRED_ATTR not in t.attrs for t in trials if STOPPED_ATTR not in t.attrs)   # none paired
    finished = [e for e in events if isinstance(e, ev.TrialFinished)]
    assert sum(e.stopped_early == (16, 500) for e in finished) == len(stopped)
    assert result.best.median_us == pytest.approx(min(times))


def test_full_timing_and_stages_that_do_not_race_get_no_race(store, space, builder):
    _study(store, space, builder)
    measure = RacingScaffold()
    result = _run(store, space, builder, measure, 3, racing=None)
    assert measure.races_seen == [None, None, None] and result.stopped_early == 0
    _study(store, space, builder, name="plain")
    plain = ScaffoldMeasure()                      # races = False: measure(artifact, problem) only
    result = _run(store, space, builder, plain, 3, name="plain")
    assert result.counts["COMPLETE"] == 3


def test_a_resume_races_against_the_study_best_of_the_same_gpu_model_only(store, space, builder):
    _study(store, space, builder)
    _run(store, space, builder, RacingScaffold(), 3)
    best = min(t.value for t in store.summary("r").trials if t.state == "COMPLETE")
    study = store.load_study("r")
    for extra in ("BLOCK_M=128,BLOCK_N=32,NUM_WARPS=4,STAGES=1,MIN_BLOCKS=2",
                  "BLOCK_M=64,BLOCK_N=64,NUM_WARPS=4,STAGES=1,MIN_BLOCKS=1"):
        study.enqueue_trial(params_for(KernelConfig.parse(extra), space))     # a new config for each resume
    again = RacingScaffold()
    _run(store, space, builder, again, 4)
    assert again.races_seen[0] is not None and again.races_seen[0].incumbent_us == pytest.approx(best)
    other = RacingScaffold(name="another GPU (test only)")
    _run(store, space, builder, other, 5)
    assert len(other.races_seen) == 1
    assert other.races_seen[0] is None             # the recorded best was measured on another model


def test_the_first_builds_start_before_the_device_and_the_baselines(store, space, builder):
    _study(store, space, builder)
    order: list[str] = []

    class Ordered(RacingScaffold):
        def device(self):
            order.append("device")
            return super().device()

        def baselines(self, problem):
            order.append("baselines")
            return super().baselines(problem)

        def measure(self, artifact, problem, race=None):
            order.append("measure")
            return super().measure(artifact, problem, race)

    events: list[object] = []

    def on_event(e):
        events.append(e)
        if isinstance(e, ev.BuildStarted):
            order.append("build")

    _run(store, space, builder, Ordered(), 3, events=on_event, batch=2)
    assert order.index("build") < order.index("device") < order.index("measure")
    assert order.count("baselines") == 1
    measures = [i for i, o in enumerate(order) if o == "measure"]
    assert measures[0] < order.index("baselines") < measures[1]   # right after the first, never in front of it
    assert any(isinstance(e, ev.BaselinesMeasured) for e in events)
    assert store.baselines("r", RacingScaffold().device())


def test_a_device_that_fails_after_the_first_builds_leaves_no_trial_running(store, space, builder):
    from evotuner.errors import NoGpuError

    _study(store, space, builder)

    class NoDevice(RacingScaffold):
        def device(self):
            raise NoGpuError("GPU worker could not fingerprint device 0: test", "check nvidia-smi")

    with pytest.raises(NoGpuError):
        _run(store, space, builder, NoDevice(), 3, batch=2)
    trials = [t for t in store.summary("r").trials if t.state != "WAITING"]    # WAITING: enqueued, never asked
    assert len(trials) == 2 and all(t.state == "FAIL" for t in trials)  # asked, then failed: none left RUNNING
    assert all(t.error.startswith("interrupted: the run stopped before measuring (NoGpuError") for t in trials)
    assert store.count_finished("r") == 0                            # they do not count; a resume runs them
    result = _run(store, space, builder, RacingScaffold(), 3)
    assert result.finished == 3 and result.counts["FAIL"] == 0


# -- the wire ------------------------------------------------------------------------------

FAKE = textwrap.dedent(r'''
    import os, sys, time
    from pathlib import Path
    from evotuner.measure.protocol import read_message_blocking, write_message, PipeClosed

    inp = os.fdopen(os.dup(0), "rb", buffering=0)
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    if os.environ.get("FAKE_STARTED"):
        Path(os.environ["FAKE_STARTED"]).write_text(str(time.monotonic()))
    while True:
        try:
            msg = read_message_blocking(inp)
        except PipeClosed:
            sys.exit(0)
        op = msg["op"]
        if op == "init":
            time.sleep(float(os.environ.get("FAKE_INIT_S", "0")))
            write_message(out, {"ok": True, "value": {"pid": os.getpid()}})
        elif op == "shutdown":
            write_message(out, {"ok": True, "value": {}})
            sys.exit(0)
        elif op == "measure":
            race = msg.get("race")
            m = {"median_us": 120.0, "p20_us": 119.0, "p80_us": 121.0, "tflops": 1.0, "max_error": 1e-3,
                 "tolerance": 2e-3, "repetitions": 16 if race else 500}
            if race:
                m.update(stopped_early=True, planned_repetitions=500, incumbent_us=race["incumbent_us"])
            write_message(out, {"ok": True, "value": {"measurement": m, "detail": {"race": race}}})
        else:
            write_message(out, {"ok": True, "value": {}})
''')


@pytest.fixture
def fake(tmp_path):
    script = tmp_path / "fake.py"
    script.write_text(FAKE)
    return [sys.executable, str(script)]


def _artifact(tmp_path):
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(b"\x7fELF fake")
    return Artifact(cubin=cubin, key="k", sha256="0" * 64, meta={"head_dim": 32, "is_causal": 0, "dtype": 0})


def test_the_race_reaches_the_worker_and_a_stopped_measurement_comes_back(tmp_path, fake):
    with GpuMeasure(worker_cmd=fake, timeout_s=10.0, start_timeout_s=20.0) as gm:
        assert gm.races is True
        race = Race(100.0, RaceRule(alpha=0.01, margin=0.02, min_reps=32))
        out = gm.measure(_artifact(tmp_path), PROBLEM, race=race)
        assert gm.last_detail["race"] == race.to_wire()
        assert out.stopped_early and out.repetitions == 16 and out.planned_repetitions == 500
        assert out.incumbent_us == 100.0
        full = gm.measure(_artifact(tmp_path), PROBLEM)
        assert gm.last_detail["race"] is None and not full.stopped_early and full.repetitions == 500


def test_start_spawns_the_worker_at_once_and_the_first_call_reads_its_init(tmp_path, fake):
    started = tmp_path / "started"
    env = {**os.environ, "FAKE_STARTED": str(started), "FAKE_INIT_S": "1.0"}
    gm = GpuMeasure(worker_cmd=fake, timeout_s=10.0, start_timeout_s=20.0, env=env)
    try:
        before = time.monotonic()
        gm.start()
        assert time.monotonic() - before < 0.9           # did not wait for the slow init
        assert gm.worker_pid is not None and gm.spawns == 1
        deadline = time.monotonic() + 20
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists()                          # the worker runs before any request
        gm.start()                                       # a second start changes nothing
        assert gm.spawns == 1
        assert gm.ping() and gm.spawns == 1              # the init reply was read, then the ping's
        assert isinstance(gm.measure(_artifact(tmp_path), PROBLEM), Measurement)
    finally:
        gm.close()
    assert gm.worker_pid is None


def test_a_worker_started_in_the_background_that_dies_is_reported(tmp_path):
    gm = GpuMeasure(worker_cmd=[sys.executable, "-c", "import sys; sys.exit(5)"], timeout_s=5.0,
                    start_timeout_s=5.0)
    try:
        gm.start()
        out = gm.measure(_artifact(tmp_path), PROBLEM)
        assert out.kind == "crash" and "failed to start" in out.reason
    finally:
        gm.close()


def test_a_stopped_measurement_on_the_wire_must_be_consistent():
    base = {"median_us": 120.0, "p20_us": 119.0, "p80_us": 121.0, "tflops": 1.0, "max_error": 1e-3,
            "tolerance": 2e-3, "repetitions": 16}
    assert measurement_from_wire(base).stopped_early is False
    ok = measurement_from_wire({**base, "stopped_early": True, "planned_repetitions": 500, "incumbent_us": 100.0})
    assert ok.stopped_early and ok.planned_repetitions == 500
    for bad in ({"stopped_early": True}, {"stopped_early": "yes"},
                {"stopped_early": True, "planned_repetitions": 16, "incumbent_us": 100.0}):
        with pytest.raises(ProtocolError):
            measurement_from_wire({**base, **bad})
    paired = measurement_from_wire({**base, "pairs": 16, "pair_ratio": 1.08})
    assert (paired.pairs, paired.pair_ratio) == (16, 1.08) and measurement_from_wire(base).pairs == 0
    for bad in ({"pairs": -1}, {"pairs": True}, {"pairs": 2.5}, {"pairs": 16, "pair_ratio": 0.0},
                {"pairs": 0, "pair_ratio": 1.0}, {"pairs": 16, "pair_ratio": float("nan")}):
        with pytest.raises(ProtocolError):
            measurement_from_wire({**base, **bad})


def test_the_real_worker_refuses_a_bad_race_in_one_line():
    reply = Worker().handle(Request("measure", {"cubin": "/nonexistent.cubin", "problem": PROBLEM.as_dict(),
                                                "race": {"incumbent_us": -1}}))
    assert isinstance(reply, Reply) and not reply.ok and reply.failure.kind == "crash"
    assert "bad race" in reply.failure.reason


# -- time_cuda's looks on a fake CUDA clock ------------------------------------------------


class _FakeCuda:
    """Just enough of torch.cuda for time_cuda: a clock the launched callable advances,
    events that read it, and a count of synchronizes."""

    def __init__(self):
        self.now_ms = 0.0
        self.syncs = 0
        outer = self

        class Event:
            def __init__(self, enable_timing=False):
                self.t = None

            def record(self):
                self.t = outer.now_ms

            def elapsed_time(self, other):
                return other.t - self.t

        self.Event = Event

    def synchronize(self, dev=None):
        self.syncs += 1

    def current_device(self):
        return 0

    def device(self, dev):
        return contextlib.nullcontext()


def _fake_timing(monkeypatch, durations_us):
    from evotuner.runtime import timing

    cuda = _FakeCuda()
    monkeypatch.setattr(timing.torch, "cuda", cuda)
    it = iter(durations_us)

    def kernel():
        cuda.now_ms += next(it) / 1000.0

    return timing, cuda, kernel


def test_time_cuda_stops_at_a_look_and_reports_what_it_timed(monkeypatch):
    import random

    noise = random.Random(0)
    timing, cuda, kernel = _fake_timing(monkeypatch, [120.0 + noise.gauss(0.0, 0.3) for _ in range(5000)])
    race = Race(100.0)
    t = timing.time_cuda(kernel, warmup=2, reps=400, flush_l2=False, looks=race.rule.looks(), stop=race.stops)
    assert t.stopped_early and t.repetitions == 16 and t.planned_repetitions == 400
    assert len(t.samples_us) == 16 and t.median_us == pytest.approx(120.0, rel=3e-3)


def test_time_cuda_runs_a_contender_to_the_end_with_a_look_per_chunk(monkeypatch):
    import random

    noise = random.Random(1)
    timing, cuda, kernel = _fake_timing(monkeypatch, [100.0 + noise.gauss(0.0, 0.5) for _ in range(5000)])
    race = Race(100.0)
    seen: list[int] = []

    def stop(samples):
        seen.append(len(samples))
        return race.stops(samples)

    t = timing.time_cuda(kernel, warmup=2, reps=400, flush_l2=False, looks=race.rule.looks(), stop=stop)
    assert not t.stopped_early and t.repetitions == 400 == t.planned_repetitions
    assert seen == [16, 32, 64, 128, 256]                 # every look below the planned count
    assert t.median_us == pytest.approx(100.0, abs=1.0)


def test_time_cuda_without_a_race_times_everything_in_one_chunk(monkeypatch):
    timing, cuda, kernel = _fake_timing(monkeypatch, [50.0] * 100)
    t = timing.time_cuda(kernel, warmup=0, reps=40, flush_l2=False)
    assert t.repetitions == 40 and not t.stopped_early and cuda.syncs == 2      # after warm-up, after the reps


# -- fast start: the availability check -----------------------------------------------------


def _fake_run(calls, smi_out="GPU 0: NVIDIA H100 80GB HBM3 (UUID: x)\n", smi_rc=0, torch_rc=0):
    import subprocess

    def run(cmd, **kw):
        calls.append(cmd[0] if cmd[0] == "nvidia-smi" else "torch-probe")
        if cmd[0] == "nvidia-smi":
            return subprocess.CompletedProcess(cmd, smi_rc, smi_out, "")
        return subprocess.CompletedProcess(cmd, torch_rc, b"", b"")
    return run


def test_a_listed_gpu_needs_no_torch_probe_unless_the_device_list_may_hide_it(monkeypatch):
    import evotuner.measure.gpu as gpu

    check = gpu.gpu_available.__wrapped__
    calls: list[str] = []
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(gpu.subprocess, "run", _fake_run(calls))
    assert check() is True and calls == ["nvidia-smi"]            # no torch import + CUDA init
    calls.clear()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(gpu.subprocess, "run", _fake_run(calls, torch_rc=3))
    assert check() is False and calls == ["nvidia-smi", "torch-probe"]
    calls.clear()
    monkeypatch.setattr(gpu.subprocess, "run", _fake_run(calls, smi_out="", smi_rc=9))
    assert check() is False and calls == ["nvidia-smi"]           # no driver: at once


# -- the command line ----------------------------------------------------------------------


def _cli(capsys, monkeypatch, tmp_path, build_cache_dir, factory, *extra):
    from evotuner import cli
    from cli_helpers import scaffold_env

    scaffold_env(monkeypatch, build_cache_dir, tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    code = cli.main(["search", "--study", "s", "--shape", "B=1,H=2,S=256,D=32", "--space", str(TINY),
                     "--trials", "6", "--jobs", "2", "--storage", f"sqlite:///{tmp_path / 'c.db'}", *extra],
                    measure_factory=factory)
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_search_says_which_timings_stopped_early_and_full_timing_stops_none(capsys, monkeypatch, tmp_path,
                                                                             build_cache_dir):
    made: list[RacingScaffold] = []

    def factory():
        made.append(RacingScaffold(slower_after_first=2.0))
        return made[-1]

    out = _cli(capsys, monkeypatch, tmp_path, build_cache_dir, factory)
    stopped = sum(1 for r in made[0].races_seen if r is not None)   # raced requests
    lines = [line for line in out.splitlines() if "stopped early at 16 of 500 reps: clearly slower" in line]
    assert stopped >= 1 and lines, out
    assert f"racing: {len(lines)} of {len(made[0].calls)} timings stopped early" in out
    (tmp_path / "full").mkdir()
    out = _cli(capsys, monkeypatch, tmp_path / "full", build_cache_dir, factory, "--full-timing")
    assert all(r is None for r in made[1].races_seen) and "stopped early" not in out and "racing:" not in out


def test_resume_takes_full_timing(capsys, monkeypatch, tmp_path, build_cache_dir):
    from evotuner import cli

    made: list[RacingScaffold] = []

    def factory():
        made.append(RacingScaffold())
        return made[-1]

    _cli(capsys, monkeypatch, tmp_path, build_cache_dir, factory, "--full-timing")
    code = cli.main(["resume", "--study", "s", "--trials", "7", "--full-timing",
                     "--storage", f"sqlite:///{tmp_path / 'c.db'}"], measure_factory=factory)
    assert code == 0, capsys.readouterr().err
    assert len(made) == 2 and all(r is None for m in made for r in m.races_seen)


class LateScaffold(ScaffoldMeasure):
    """The scaffold as a stage that measures in another process: ``submit`` returns at once
    and the outcome is made when the loop reads it; ``log`` has the order of submits, reads
    and (through the loop's events) asks."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[str] = []

    def submit(self, artifact, problem, race=None):
        self.log.append("submit")

        def collect():
            self.log.append("result")
            return self.measure(artifact, problem)

        return PendingMeasure(collect)


def test_the_sampler_proposes_while_the_gpu_times_and_an_in_process_stage_is_not_asked_ahead(
        store, space, builder):
    _study(store, space, builder)
    late = LateScaffold()
    order: list[str] = []

    def on_event(event):
        if isinstance(event, ev.TrialStarted):
            late.log.append("ask")
            order.append("S")
        elif isinstance(event, ev.TrialFinished):
            order.append("F")

    result = _run(store, space, builder, late, 6, events=on_event)
    assert result.finished == 6 and result.measured == len(late.calls) >= 4
    assert len(store.finished_trials("r")) == 6
    windows = "".join({"submit": "s", "result": "r", "ask": "a"}[x] for x in late.log)
    # every measurement but the last has an ask while it is timed (batch=1: the freed slot)
    assert len(re.findall("sa+r", windows)) >= result.measured - 1, windows
    assert "".join(order).startswith("SS"), order      # trial 1 is asked before trial 0 is told

    # an in-process stage (replay): asked only after each tell, as before
    sync_order: list[str] = []
    _study(store, space, builder, name="s")
    _run(store, space, builder, ScaffoldMeasure(), 6, name="s",
         events=lambda e: sync_order.append("S" if isinstance(e, ev.TrialStarted) else "F")
         if isinstance(e, (ev.TrialStarted, ev.TrialFinished)) else None)
    assert "".join(sync_order) == "SF" * 6, sync_order


def test_search_starts_the_measure_stage_before_it_opens_the_study(capsys, monkeypatch, tmp_path, build_cache_dir):
    """The GPU worker's start (a torch import and a CUDA context: seconds) overlaps the
    command's own start: `search` starts the measure stage before it opens the database."""
    from evotuner import cli

    order: list[str] = []

    class Started(RacingScaffold):
        def start(self):
            order.append("measure started")

    real_open = cli.open_store

    def open_store(*args, **kwargs):
        order.append("store opened")
        return real_open(*args, **kwargs)

    monkeypatch.setattr(cli, "open_store", open_store)
    _cli(capsys, monkeypatch, tmp_path, build_cache_dir, Started)
    assert order[:2] == ["measure started", "store opened"], order



def test_searches_sharing_a_fastest_pair_against_each_others_best(store, space, builder):
    """``--gpus`` gives its GPU threads one Fastest: a thread's first race is paired with the
    fastest config another measured, where alone it would have no artifact to pair with
    until it measured one itself (four H100s timed 3.3x one GPU's repetitions before)."""
    from evotuner.judge import Fastest
    from evotuner.measure.racing import PAIRED_MARGIN

    paired = RaceRule(paired_margin=PAIRED_MARGIN)
    _study(store, space, builder)
    shared = Fastest()
    first, second = RacingScaffold(), RacingScaffold()
    _run(store, space, builder, first, 2, racing=paired, fastest=shared)
    assert shared.get() is not None
    _run(store, space, builder, second, 4, racing=paired, fastest=shared)
    race = second.races_seen[0]
    assert race is not None and race.incumbent_artifact is not None
    assert race.incumbent_artifact["key"] == shared.get()[1].key

    alone = RacingScaffold()                    # its own Fastest: the study's best median, no artifact
    _run(store, space, builder, alone, 6, racing=paired)
    assert alone.races_seen[0] is not None and alone.races_seen[0].incumbent_artifact is None
