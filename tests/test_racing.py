"""Racing (evotuner/measure/racing.py): the stopping rule, its false-stop rate and the
repetitions it saves on timings drawn like the recorded H100 sweeps (tests/data/), with
scripts/race_simulation.py's code (docs/measurement.md quotes its figures)."""

from __future__ import annotations

import glob
import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from evotuner.measure.racing import (
    DEFAULT_RULE, LOOKS, Race, RaceRule, binom_cdf_half, lower_rank,
)

ROOT = Path(__file__).parent.parent
SWEEPS = sorted(glob.glob(str(ROOT / "tests" / "data" / "sweep_h100_*.csv")))


def _sim():
    spec = importlib.util.spec_from_file_location("race_simulation_under_test", ROOT / "scripts" / "race_simulation.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# -- the order statistic -------------------------------------------------------------------


@pytest.mark.parametrize("n", LOOKS)
def test_the_rank_is_the_largest_within_the_level(n):
    level = DEFAULT_RULE.level
    k = lower_rank(n, level)
    assert k >= 1
    assert binom_cdf_half(n, k - 1) <= level < binom_cdf_half(n, k)
    assert k <= n // 2                      # the bound never passes the sample median


def test_binomial_cdf_is_exact_on_small_cases():
    assert binom_cdf_half(4, 0) == 1 / 16 and binom_cdf_half(4, 1) == 5 / 16 and binom_cdf_half(4, 4) == 1.0
    assert binom_cdf_half(3, -1) == 0.0
    assert lower_rank(5, 0.01) == 0 and lower_rank(16, 1e-4) == 1


@pytest.mark.parametrize("dist", ["exponential", "uniform", "lognormal"])
def test_the_bound_exceeds_the_true_median_at_most_at_its_level(dist):
    """Distribution free: P(bound > median) = P(Bin(n, 1/2) <= k - 1) for any continuous law."""
    rule = RaceRule(alpha=0.2, margin=0.0, min_reps=16)        # a level big enough to count
    rng = np.random.default_rng(1)
    draws = {"exponential": lambda n: rng.exponential(1.0, n), "uniform": lambda n: rng.uniform(0, 1, n),
             "lognormal": lambda n: rng.lognormal(0, 1, n)}[dist]
    median = {"exponential": math.log(2), "uniform": 0.5, "lognormal": 1.0}[dist]
    for n in (16, 32, 64):
        trials = 4000
        bounds = [rule.bound(draws(n).tolist()) for _ in range(trials)]
        above = sum(b is not None and b > median for b in bounds)
        exact = binom_cdf_half(n, lower_rank(n, rule.level) - 1)
        assert exact <= rule.level
        assert above / trials <= rule.level + 3 * math.sqrt(rule.level / trials), (dist, n, above)


def test_the_rule_stops_a_clearly_slower_config_and_never_a_contender():
    rule = DEFAULT_RULE
    rng = np.random.default_rng(4)

    def noisy(center, n):
        return (center + 0.3 * rng.standard_normal(n)).tolist()

    slower = noisy(120.0, 16)                                 # 20% slower, tight
    assert rule.stops(slower, 100.0)
    assert not rule.stops(slower[:15], 100.0)               # before the first look: never
    just = noisy(113.0, 2048)                                 # within the 15% drift margin: a contender
    assert not rule.stops(just, 100.0)
    faster = noisy(95.0, 2048)
    assert not rule.stops(faster, 100.0)
    one_fast = noisy(135.0, 15) + [99.0]                      # one repetition as fast as the best
    assert not rule.stops(one_fast, 100.0)                  # at 16 reps the bound is the minimum
    assert rule.stops(noisy(135.0, 16), 100.0)


def test_a_stopped_config_median_is_above_the_threshold():
    """Stopping means bound > threshold, and the bound is at or below the median so far: the
    honest median a stopped config records can never shadow the incumbent."""
    rule = DEFAULT_RULE
    rng = np.random.default_rng(3)
    for _ in range(500):
        samples = (100.0 * rng.uniform(0.98, 1.4) * (1 + 0.01 * rng.standard_normal(64))).tolist()
        if rule.stops(samples, 100.0):
            assert float(np.median(samples)) > rule.threshold(100.0)


def test_rule_and_race_travel_on_the_wire():
    race = Race(512.5, RaceRule(alpha=0.01, margin=0.02, min_reps=32))
    again = Race.from_wire(race.to_wire())
    assert again == race and Race.from_wire(None) is None
    assert RaceRule.from_wire({}) == DEFAULT_RULE
    with pytest.raises(ValueError):
        Race(0.0)
    with pytest.raises(ValueError):
        RaceRule(alpha=1.5)
    with pytest.raises(ValueError):
        Race.from_wire([1, 2])
    assert DEFAULT_RULE.looks() == LOOKS and RaceRule(min_reps=100).looks() == (128, 256, 512, 1024, 2048)
    assert "1.15" in DEFAULT_RULE.describe()


# -- on the recorded sweeps ----------------------------------------------------------------


def test_the_sweeps_are_there():
    assert len(SWEEPS) >= 10


def test_racing_on_recorded_sweeps_stops_no_contender_and_saves_most_repetitions():
    """Each sweep's configs in 2 random orders (a study that wanders the whole space): no
    contender (a config truly within the 15% margin of the incumbent it raced) is stopped,
    no stopped config would have beaten the study's best, and over half the repetitions are
    saved. Among the 64 fastest configs of a hopper sweep (a guided study's neighbourhood)
    almost every config is a contender: racing saves little there, by design."""
    sim = _sim()
    rng = np.random.default_rng(0)
    contenders = false_stops = lost = full = raced = 0
    for path in SWEEPS:
        recorded = sim.read_recorded(path)
        for _ in range(2):
            stats = sim.simulate_study(recorded, DEFAULT_RULE, rng)
            contenders += stats.contenders
            false_stops += stats.false_stops
            lost += stats.lost_winners
            full += stats.reps_full
            raced += stats.reps_raced
    assert contenders >= 100                         # the case the bound is about was exercised
    assert false_stops <= 0.01 * contenders, (false_stops, contenders)
    assert lost == 0
    assert 1.0 - raced / full > 0.5, raced / full


TRACES = sorted((ROOT / "docs" / "measurements" / "racing").glob("traces_h100_*.json"))


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_on_recorded_gpu_traces_no_config_that_could_win_is_stopped(path):
    """Whole timing traces of 32 configs recorded on the H100 (scripts/timing_traces.py), each
    config timed in several windows seconds apart under one timing condition (host lead and
    warm-up): raced against an incumbent 1% faster than the config's best window, or than the
    median of the very window being timed (so the config could win), no window is stopped at
    any look; the windows do read more than 1% apart (the drift the margin is for), and a
    config 30% slower than the incumbent is stopped well before its budget ends."""
    import json
    import statistics

    data = json.loads(path.read_text())
    assert len(data["configs"]) >= 30
    warmups = data.get("warmups") or [10] * len(data["leads"])
    groups: dict[tuple[str, int], list[int]] = {}
    for i, condition in enumerate(zip(data["leads"], warmups)):
        groups.setdefault(condition, []).append(i)
    groups = {c: idx for c, idx in groups.items() if len(idx) >= 2}
    assert groups, "the traces need one timing condition timed at least twice"
    windows_apart = []
    stopped_edge = 0
    for idx in groups.values():
        for config in data["configs"]:
            passes = [config["passes"][i] for i in idx]
            medians = [statistics.median(p) for p in passes]
            windows_apart.append(max(medians) / min(medians))
            for trace, median in zip(passes, medians):
                looks = [n for n in DEFAULT_RULE.looks() if n < len(trace)]
                for incumbent in (min(medians) / 1.01, median / 1.01):
                    stopped_edge += any(DEFAULT_RULE.stops(trace[:n], incumbent) for n in looks)
            slow = passes[0]
            assert any(DEFAULT_RULE.stops(slow[:n], statistics.median(slow) / 1.3) for n in (16, 32, 64, 128))
    assert stopped_edge == 0
    assert max(windows_apart) > 1.01          # the windows drift: a 1% margin would stop configs that could win


def test_false_stop_rate_at_the_edge_is_within_alpha():
    """Configs whose true median is exactly incumbent x 1.15 (the worst case), spreads of
    every recorded config in turn: the share stopped stays within alpha (0.1%) up to
    sampling noise (independent repetitions). With AR(1) 0.5 between repetitions the order
    statistic is less conservative (the rule counts every repetition; the drift between
    windows is what its margin is for): below 5% of such configs, each 15% slower than the
    incumbent, are stopped, and a stopped one could not have won."""
    sim = _sim()
    every = [r for path in SWEEPS for r in sim.read_recorded(path)]
    rng = np.random.default_rng(5)
    stops, count = sim.boundary_rate(every, DEFAULT_RULE, rng, 6000)
    assert stops <= DEFAULT_RULE.alpha * count + 3 * math.sqrt(DEFAULT_RULE.alpha * count), stops
    stops, count = sim.boundary_rate(every, DEFAULT_RULE, rng, 1500, rho=0.5)
    assert stops < 0.05 * count, stops


def test_the_simulation_script_runs(tmp_path, capsys):
    import json

    sim = _sim()
    out = tmp_path / "race.json"
    assert sim.main(["--sweeps", str(ROOT / "tests" / "data" / "sweep_h100_d64.csv"), "--orders", "2",
                     "--boundary", "200", "--top", "32", "--output", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["sweeps"][0]["sweep"] == "sweep_h100_d64.csv" and data["boundary"]["count"] == 200
    assert "boundary" in capsys.readouterr().out
