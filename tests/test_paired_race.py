"""Paired racing (evotuner/measure/racing.py: ``RaceRule.paired_margin``, ``--paired-race``)
without a GPU: the rule on drifting repetitions, ``time_cuda``'s alternate timing on a fake
CUDA clock, the judge naming the run's fastest artifact, the worker keeping the incumbent
loaded, and the command line's options."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from evotuner.compiler.result import Artifact
from evotuner.measure.protocol import Reply, artifact_wire
from evotuner.measure.racing import DEFAULT_RULE, PAIRED_MARGIN, Race, RaceRule
from evotuner.measure.worker import Worker

from scaffold import scaffold_median_us
from test_racing_loop import PROBLEM, RacingScaffold, _fake_timing, _run, _study
from test_racing_loop import builder, space, store  # noqa: F401 -- the same fixtures

PAIRED = dataclasses.replace(DEFAULT_RULE, paired_margin=PAIRED_MARGIN)


# -- the rule ------------------------------------------------------------------------------

def _drifting(n: int, rng: random.Random, slower: float, noise: float = 0.01) -> tuple[list[float], list[float]]:
    """(config, incumbent) repetitions timed alternately (each pair's order a coin flip, as
    time_cuda orders them) while the clock drifts at every repetition: a slow swing of +-10% and a step
    of 8% at a random repetition, inside a pair as often as between two (the H100's windows
    moved that much); each repetition its own noise."""
    phase = rng.uniform(0, 2 * math.pi)
    step_at = rng.randrange(2 * n)
    order = random.Random(step_at)   # each pair's order, drawn apart from the drift and the noise

    def level(slot: int) -> float:
        return (1.0 + 0.10 * math.sin(phase + slot / 18.0)) * (1.08 if slot >= step_at else 1.0)

    config, incumbent = [], []
    for j in range(n):
        inc_slot, cfg_slot = (2 * j, 2 * j + 1) if order.random() < 0.5 else (2 * j + 1, 2 * j)
        config.append(1000.0 * slower * level(cfg_slot) * (1.0 + rng.gauss(0.0, noise)))
        incumbent.append(1000.0 * level(inc_slot) * (1.0 + rng.gauss(0.0, noise)))
    return config, incumbent


def test_the_paired_rule_sees_through_drift_that_hides_a_slower_config_from_the_unpaired_one():
    rng = random.Random(0)
    stopped_paired = stopped_plain = 0
    for _ in range(200):
        config, incumbent = _drifting(64, rng, slower=1.06)
        race = Race(1000.0, PAIRED)
        stopped_paired += any(race.stops(config[:n], incumbent[:n]) for n in race.rule.looks() if n <= 64)
        stopped_plain += any(Race(1000.0).stops(config[:n]) for n in DEFAULT_RULE.looks() if n <= 64)
    assert stopped_paired == 200 and stopped_plain == 0


def test_the_paired_rule_never_stops_a_config_within_its_margin_however_the_clock_drifts():
    """The paired rule alone: this drift (up to +19%) is past the unpaired rule's 15% margin,
    which is the GPU's measured drift, so that rule may stop such configs here."""
    rng = random.Random(1)
    for slower in (0.95, 1.0, 1.01, 1.02):
        for _ in range(300):
            config, incumbent = _drifting(64, rng, slower=slower)
            assert not any(PAIRED.stops_paired(config[:n], incumbent[:n]) for n in PAIRED.looks() if n <= 64)


def test_an_unpaired_stop_needs_the_windows_pairs_to_agree():
    """The H100 study of 1,8,1024,128 causal: trial 25's own 16 repetitions read 21.6 µs
    (the unpaired rule's bound past 1.15 x the 16.99 µs best) while the incumbent timed beside
    it read 26.6 µs (ratio 0.81); trial 8 read 15% over the best with a ratio of 1.00. Pairs
    saying "not clearly slower" veto the unpaired stop: the config gets its full budget."""
    rng = random.Random(7)
    race = Race(16.99, PAIRED, {"cubin": "k.cubin"}, 17.18)
    own = [21.6 * (1 + rng.gauss(0, 0.01)) for _ in range(16)]
    for pair_level in (26.6, 21.6, 21.6 / 1.02):            # ratios 0.81, 1.00, 1.02
        theirs = [pair_level * (1 + rng.gauss(0, 0.005)) for _ in range(16)]
        assert DEFAULT_RULE.stops(own, race.incumbent_us) and race.pairs_disagree(own, theirs)
        assert not race.stops(own, theirs)
    theirs = [17.2 * (1 + rng.gauss(0, 0.005)) for _ in range(16)]   # the same window agrees: stopped
    assert not race.pairs_disagree(own, theirs) and race.stops(own, theirs)
    assert Race(16.99).stops(own) and not Race(16.99).pairs_disagree(own, [])   # an unpaired race: no veto


def test_a_stopped_config_is_never_recorded_below_the_incumbent_it_was_stopped_against():
    """Whatever its window did to either kernel: the recorded figure of a stop (own figures
    for the unpaired rule's, pair ratios on the incumbent's scale for the paired rule's)."""
    from evotuner.measure.worker import recorded_figures
    from evotuner.runtime.timing import Timing

    rng = random.Random(3)
    stops = 0
    for _ in range(3000):
        incumbent_us = 100.0
        artifact_us = incumbent_us * rng.uniform(1.0, 1.1)       # this run's fastest: never below the study's best
        race = Race(incumbent_us, PAIRED, {"cubin": "k.cubin"}, artifact_us)
        n = rng.choice([16, 32, 64])
        own_level, pair_level = rng.uniform(80, 160), rng.uniform(70, 180)
        own = [own_level * (1 + abs(rng.gauss(0, 0.05))) for _ in range(n)]
        theirs = [pair_level * (1 + abs(rng.gauss(0, 0.05))) for _ in range(n)]
        if not race.stops(own, theirs):
            continue
        stops += 1
        ordered = sorted(own)
        t = Timing(median_us=ordered[n // 2], p20_us=ordered[n // 5], p80_us=ordered[4 * n // 5], repetitions=n,
                   samples_us=tuple(own), planned_repetitions=2000, stopped_early=True, pair_samples_us=tuple(theirs))
        assert recorded_figures(t, race)[0] > incumbent_us, (own_level, pair_level)
    assert stops > 500


def test_a_rule_that_does_not_pair_ignores_the_incumbents_repetitions():
    assert not DEFAULT_RULE.stops_paired([2000.0] * 64, [1000.0] * 64)
    assert PAIRED.stops_paired([2000.0] * 64, [1000.0] * 64)
    assert not PAIRED.stops_paired([2000.0] * 8, [1000.0] * 8)          # too few for a bound


def test_the_paired_rule_travels_on_the_wire_and_is_checked():
    wire = {"cubin": "/c/k.cubin", "entry": "e", "family": "hopper", "key": "k", "sha256": "s", "meta": {"abi": 3}}
    race = Race(512.5, PAIRED, wire, 520.0)
    again = Race.from_wire(race.to_wire())
    assert again == race and again.incumbent_artifact == wire and again.paired and again.incumbent_artifact_us == 520.0
    assert RaceRule.from_wire(PAIRED.to_wire()) == PAIRED and RaceRule.from_wire({}) == DEFAULT_RULE
    assert "alternately" in PAIRED.describe() and "alternately" not in DEFAULT_RULE.describe()
    with pytest.raises(ValueError, match="paired_margin"):
        RaceRule(paired_margin=1.5)
    with pytest.raises(ValueError, match="paired_reps"):
        RaceRule(paired_margin=0.03, paired_reps=50)
    with pytest.raises(ValueError, match="cubin"):
        Race(1.0, PAIRED, {"entry": "e"}, 1.0)
    for us in (None, 0.0, float("nan")):          # a paired race needs the incumbent's recorded median
        with pytest.raises(ValueError, match="incumbent_artifact_us"):
            Race(1.0, PAIRED, wire, us)
    with pytest.raises(ValueError, match="incumbent_artifact_us"):
        Race(1.0, PAIRED, None, 1.0)
    with pytest.raises(ValueError, match="not a number"):
        Race.from_wire({**race.to_wire(), "incumbent_artifact_us": "fast"})
    with pytest.raises(ValueError, match="incumbent_artifact"):
        Race.from_wire({"incumbent_us": 1.0, "incumbent_artifact": "k.cubin"})
    assert not Race(1.0, PAIRED).paired and not Race(1.0, DEFAULT_RULE, wire, 1.0).paired


# -- time_cuda's alternate timing on a fake CUDA clock ------------------------------------------

def _pair_kernels(cuda, order, config_us, incumbent_us):
    def config():
        order.append("c")
        cuda.now_ms += config_us / 1000.0

    def incumbent():
        order.append("i")
        cuda.now_ms += incumbent_us / 1000.0

    return config, incumbent


def test_time_cuda_alternates_with_the_incumbent_up_to_the_paired_reps_then_times_alone(monkeypatch):
    timing, cuda, _ = _fake_timing(monkeypatch, [])
    order: list[str] = []
    config, incumbent = _pair_kernels(cuda, order, 100.0, 100.0)
    seen: list[tuple[int, int]] = []

    def stop(samples, pair_samples):
        seen.append((len(samples), len(pair_samples)))
        return False

    t = timing.time_cuda(config, warmup=0, reps=200, flush_l2=False, looks=PAIRED.looks(), stop=stop,
                         pair=incumbent, pair_reps=PAIRED.paired_reps)
    assert not t.stopped_early and t.repetitions == 200 and len(t.pair_samples_us) == 64
    assert seen == [(16, 16), (32, 32), (64, 64), (128, 64)]
    pairs = [order[k:k + 2] for k in range(0, 128, 2)]
    assert all(sorted(p) == ["c", "i"] for p in pairs)                   # each pair: one of each
    firsts = [p[0] for p in pairs]                                        # which goes first: a coin flip
    assert 20 <= firsts.count("i") <= 44, firsts                         # about half each way
    assert order.count("i") == 64 and order[128:] == ["c"] * (200 - 64)   # alone after the paired reps
    again: list[str] = []
    config2, incumbent2 = _pair_kernels(cuda, again, 100.0, 100.0)
    timing.time_cuda(config2, warmup=0, reps=200, flush_l2=False, looks=PAIRED.looks(), stop=lambda a, b: False,
                     pair=incumbent2, pair_reps=PAIRED.paired_reps)
    assert again == order                                                # the same order every call
    assert t.median_us == pytest.approx(100.0) and t.pair_samples_us == pytest.approx([100.0] * 64)


def test_a_contenders_figures_come_from_its_repetitions_timed_alone(monkeypatch):
    timing, cuda, _ = _fake_timing(monkeypatch, [])
    order: list[str] = []

    def config():         # reads slower beside the incumbent: the figures must not
        cuda.now_ms += (0.150 if "i" in order[-2:] else 0.100)
        order.append("c")

    def incumbent():
        order.append("i")
        cuda.now_ms += 0.100

    t = timing.time_cuda(config, warmup=0, reps=200, flush_l2=False, looks=PAIRED.looks(), stop=lambda a, b: False,
                         pair=incumbent, pair_reps=64)
    assert t.median_us == pytest.approx(100.0) and t.p80_us == pytest.approx(100.0)
    assert sorted(t.samples_us)[-1] == pytest.approx(150.0) and t.repetitions == 200


def test_a_budget_below_the_first_look_pairs_nothing(monkeypatch):
    timing, cuda, _ = _fake_timing(monkeypatch, [])
    order: list[str] = []
    config, incumbent = _pair_kernels(cuda, order, 100.0, 100.0)
    t = timing.time_cuda(config, warmup=0, reps=12, flush_l2=False, looks=PAIRED.looks(), stop=lambda a, b: False,
                         pair=incumbent, pair_reps=64)
    assert t.repetitions == 12 and "i" not in order and t.pair_samples_us == ()


def test_time_cuda_stops_a_paired_config_that_is_clearly_slower(monkeypatch):
    timing, cuda, _ = _fake_timing(monkeypatch, [])
    order: list[str] = []
    config, incumbent = _pair_kernels(cuda, order, 110.0, 100.0)
    race = Race(100.0 / 1.2, PAIRED, {"cubin": "k"}, 100.0)          # so the unpaired rule alone would stop nothing
    t = timing.time_cuda(config, warmup=0, reps=400, flush_l2=False, looks=race.rule.looks(), stop=race.stops,
                         pair=incumbent, pair_reps=race.rule.paired_reps)
    assert t.stopped_early and t.repetitions == 16 == len(t.pair_samples_us)
    assert t.median_us == pytest.approx(110.0)


# -- the judge and the worker ------------------------------------------------------------------

def test_a_paired_rule_names_the_runs_fastest_unstopped_artifact(store, space, builder):
    _study(store, space, builder)
    measure = RacingScaffold()
    artifacts: list[Artifact] = []
    plain = measure.measure

    def spy(artifact, problem, race=None):
        artifacts.append(artifact)
        return plain(artifact, problem, race)

    measure.measure = spy
    rule = dataclasses.replace(DEFAULT_RULE, paired_margin=0.03)
    _run(store, space, builder, measure, 3, racing=rule)
    times = [scaffold_median_us(c) for c in measure.calls]
    assert len(times) == 3 and measure.races_seen[0] is None
    timed_in_full: list[int] = []
    for i, race in enumerate(measure.races_seen):
        if i:
            fastest = min(timed_in_full, key=lambda j: times[j])
            assert race is not None and race.rule == rule and race.paired
            assert race.incumbent_artifact == artifact_wire(artifacts[fastest])
            assert race.incumbent_artifact_us == pytest.approx(times[fastest])   # the scale of a paired stop
        if race is None or times[i] <= race.rule.threshold(race.incumbent_us):
            timed_in_full.append(i)           # a stopped config never becomes the one paired with


def test_an_unpaired_rule_sends_no_artifact(store, space, builder):
    _study(store, space, builder)
    measure = RacingScaffold()
    _run(store, space, builder, measure, 3)
    assert all(r is None or (r.incumbent_artifact is None and not r.paired) for r in measure.races_seen)


def test_the_worker_keeps_the_incumbent_loaded_and_races_unpaired_when_it_cannot_load(monkeypatch):
    from evotuner.measure import worker as worker_module

    worker = Worker()
    loads: list[str] = []
    unloaded: list[str] = []

    def load(args):
        loads.append(args["cubin"])
        assert args["problem"] == PROBLEM.as_dict()
        if args["cubin"] == "missing":
            raise FileNotFoundError("missing: no such file")
        if args["cubin"] == "broken":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        if args["cubin"] == "foreign":
            return Reply.fail("launch", "foreign: built for D=64; cannot run this study's problem")
        return f"module {args['cubin']}", PROBLEM

    monkeypatch.setattr(worker, "_module", load)
    monkeypatch.setattr(worker_module, "unload_if_healthy", lambda module, cuda: unloaded.append(module))
    paired = dataclasses.replace(DEFAULT_RULE, paired_margin=0.03)

    def race(cubin, rule=paired):
        return Race(100.0, rule, {"cubin": cubin, "entry": "e", "family": "f", "key": cubin, "sha256": cubin, "meta": {}},
                    100.0)

    assert worker._pair(None, PROBLEM.as_dict()) == (None, {})
    assert worker._pair(race("a", DEFAULT_RULE), PROBLEM.as_dict()) == (None, {})     # the rule does not pair
    assert worker._pair(race("a"), PROBLEM.as_dict()) == ("module a", {"incumbent": "a"})
    assert worker._pair(race("a"), PROBLEM.as_dict()) == ("module a", {"incumbent": "a"}) and loads == ["a"]
    assert worker._pair(race("b"), PROBLEM.as_dict()) == ("module b", {"incumbent": "b"})
    assert unloaded == ["module a"]                                   # a new incumbent replaces the old
    module, info = worker._pair(race("missing"), PROBLEM.as_dict())
    assert module is None and "did not load" in info["unpaired"] and unloaded == ["module a", "module b"]
    module, info = worker._pair(race("foreign"), PROBLEM.as_dict())
    assert module is None and "built for D=64" in info["unpaired"]
    with pytest.raises(RuntimeError, match="illegal memory access"):   # a broken context is never hidden
        worker._pair(race("broken"), PROBLEM.as_dict())


def test_paired_figures_say_how_the_alternate_timing_went():
    from evotuner.measure.worker import _paired_figures
    from evotuner.runtime.timing import Timing

    timing = Timing(110.0, 105.0, 115.0, 4, (110.0, 111.0, 109.0, 120.0), 500, True, (100.0, 100.0, 100.0))
    figures = _paired_figures(timing)
    assert figures["pairs"] == 3 and figures["incumbent_median_us"] == 100.0
    assert figures["ratio_median"] == pytest.approx(1.10)
    assert _paired_figures(dataclasses.replace(timing, pair_samples_us=())) == {"pairs": 0}


# -- the command line ----------------------------------------------------------------------

@pytest.mark.parametrize("flag", [None, "--paired-race", "--no-paired-race"])
def test_search_races_paired_by_default_and_unpaired_on_request(capsys, monkeypatch, tmp_path, build_cache_dir, flag):
    from test_racing_loop import _cli

    made: list[RacingScaffold] = []

    def factory():
        made.append(RacingScaffold())
        return made[-1]

    _cli(capsys, monkeypatch, tmp_path, build_cache_dir, factory, *([flag] if flag else []))
    races = [r for r in made[0].races_seen if r is not None]
    if flag == "--no-paired-race":
        assert races and all(r.rule == DEFAULT_RULE and not r.paired for r in races)
    else:
        assert races and all(r.rule.paired_margin == PAIRED_MARGIN and r.paired for r in races)


def test_full_timing_alone_races_nothing():
    from evotuner.session import race_rule

    assert race_rule(full_timing=True) is None and race_rule(full_timing=True, paired=False) is None
    assert race_rule().paired_margin == PAIRED_MARGIN and race_rule(paired=False) == DEFAULT_RULE


def test_full_timing_and_paired_race_together_are_refused_in_one_line(capsys, monkeypatch, tmp_path):
    from cli_helpers import assert_one_line_error, run, scaffold_env

    scaffold_env(monkeypatch, tmp_path / "cache", tmp_path)
    for command in (["search", "--shape", "B=1,H=2,S=256,D=32"], ["resume"]):
        code, out, err = run(capsys, *command, "--study", "s", "--full-timing", "--paired-race",
                             "--storage", f"sqlite:///{tmp_path / 'c.db'}")
        assert_one_line_error(code, out, err, "--full-timing", "--paired-race", "drop one")
    assert not (tmp_path / "c.db").exists()


def test_a_fault_in_a_paired_race_retimes_the_config_alone_and_drops_that_incumbent(store, space, builder):
    from evotuner.measure import MeasureFailure

    class FaultsBesideTheIncumbent(RacingScaffold):
        """A sticky error whenever the incumbent is timed beside the config (the worker
        cannot tell whose it was)."""

        def measure(self, artifact, problem, race=None):
            if race is not None and race.paired:
                self.races_seen.append(race)
                return MeasureFailure("illegal_access", "an illegal memory access was encountered")
            return super().measure(artifact, problem, race)

    _study(store, space, builder)
    measure = FaultsBesideTheIncumbent()
    _run(store, space, builder, measure, 3, racing=PAIRED)
    trials = store.summary("r").trials
    assert [t.state for t in trials] == ["COMPLETE"] * 3                  # no config failed for it
    paired = [r for r in measure.races_seen if r is not None and r.paired]
    assert paired, "no race was paired"
    keys = [r.incumbent_artifact["key"] for r in paired]
    assert len(keys) == len(set(keys))                                     # each incumbent failed beside once
    for i, race in enumerate(measure.races_seen):
        if race is not None and race.paired:                               # then the same config, alone
            again = measure.races_seen[i + 1]
            assert again is not None and not again.paired and again.incumbent_us == race.incumbent_us


def test_a_paired_stop_is_recorded_on_the_incumbents_scale_not_its_windows_level(monkeypatch):
    """Two H100 studies recorded 927 and 941 µs as their best for configs that re-timed at 1011
    and 1040 µs beside the 958 µs best of a full-timing study: a paired stop's 16-64 repetitions
    came in a window that read fast, and the raw figure shadowed the incumbent. Here the window
    reads 10% fast for both kernels; the config is 6% slower than the incumbent, whose
    full-budget median is 100 µs: its raw median (95.4) would read below the incumbent, the
    recorded one is its ratio times 100."""
    from evotuner.measure.worker import recorded_figures

    timing, cuda, _ = _fake_timing(monkeypatch, [])
    order: list[str] = []
    config, incumbent = _pair_kernels(cuda, order, 106.0 * 0.9, 100.0 * 0.9)
    race = Race(100.0, PAIRED, {"cubin": "k"}, 100.0)
    t = timing.time_cuda(config, warmup=0, reps=500, flush_l2=False, looks=race.rule.looks(), stop=race.stops,
                         pair=incumbent, pair_reps=race.rule.paired_reps)
    assert t.stopped_early and t.median_us == pytest.approx(95.4)
    median, p20, p80 = recorded_figures(t, race)
    assert median == pytest.approx(106.0) and p20 == pytest.approx(106.0) and p80 == pytest.approx(106.0)
    assert median > (1 + PAIRED_MARGIN) * race.incumbent_artifact_us
    # a contender (not stopped) and an unpaired stop keep their own figures
    assert recorded_figures(dataclasses.replace(t, stopped_early=False), race) == (t.median_us, t.p20_us, t.p80_us)
    assert recorded_figures(t, Race(100.0, DEFAULT_RULE)) == (t.median_us, t.p20_us, t.p80_us)

