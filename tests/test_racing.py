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
    DEFAULT_RULE, LOOKS, Race, RaceRule, binom_cdf_half, effective_size, lag1_autocorrelation, lower_rank,
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
        # the rank for n_eff (autocorrelation near 0 for independent draws) is never less conservative
        exact = binom_cdf_half(n, lower_rank(n, rule.level) - 1)
        assert exact <= rule.level
        assert above / trials <= rule.level + 3 * math.sqrt(rule.level / trials), (dist, n, above)


def test_autocorrelated_samples_count_as_fewer():
    rng = np.random.default_rng(2)
    iid = rng.standard_normal(256)
    assert effective_size(iid.tolist()) > 200
    drift = np.cumsum(rng.standard_normal(256))            # a random walk: one long drift
    assert lag1_autocorrelation(drift.tolist()) > 0.9
    assert effective_size(drift.tolist()) <= int(256 * 0.1 / 1.9) + 1
    assert lag1_autocorrelation([1.0, 1.0, 1.0]) == 0.0 and effective_size([5.0] * 20) == 20


def test_the_rule_stops_a_clearly_slower_config_and_never_a_contender():
    rule = DEFAULT_RULE
    rng = np.random.default_rng(4)

    def noisy(center, n):
        return (center + 0.3 * rng.standard_normal(n)).tolist()

    slower = noisy(110.0, 16)                                 # 10% slower, tight
    assert rule.stops(slower, 100.0)
    assert not rule.stops(slower[:15], 100.0)               # before the first look: never
    just = noisy(100.5, 64)                                   # within the 1% margin
    assert not rule.stops(just, 100.0)
    faster = noisy(95.0, 2048)
    assert not rule.stops(faster, 100.0)
    one_fast = noisy(120.0, 15) + [99.0]                      # one repetition as fast as the best
    assert not rule.stops(one_fast, 100.0)                  # at 16 reps the bound is the minimum
    assert rule.stops(noisy(120.0, 16), 100.0)
    drifting = (110.0 + np.cumsum(rng.standard_normal(16))).tolist()   # one drift, not 16 draws
    assert lag1_autocorrelation(drifting) > 0.3 and not rule.stops(drifting, 100.0)


def test_a_stopped_config_median_is_above_the_threshold():
    """Stopping means bound > threshold, and the bound is at or below the median so far: the
    honest median a stopped config records can never shadow the incumbent."""
    rule = DEFAULT_RULE
    rng = np.random.default_rng(3)
    for _ in range(500):
        samples = (100.0 * rng.uniform(0.98, 1.15) * (1 + 0.01 * rng.standard_normal(64))).tolist()
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
    assert "1.01" in DEFAULT_RULE.describe()


# -- on the recorded sweeps ----------------------------------------------------------------


def test_the_sweeps_are_there():
    assert len(SWEEPS) >= 10


def test_racing_on_recorded_sweeps_stops_no_contender_and_saves_most_repetitions():
    """A study over each sweep's 64 fastest configs (a guided study's neighbourhood: the
    hardest case for savings), 3 random orders each: below 1% of the contenders (configs
    truly within 1% of the incumbent they raced) are stopped, no stopped config would have
    beaten the study's best, and over half the repetitions are saved."""
    sim = _sim()
    rng = np.random.default_rng(0)
    contenders = false_stops = lost = full = raced = 0
    for path in SWEEPS:
        recorded = sim.top(sim.read_recorded(path), 64)
        for _ in range(3):
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


def test_false_stop_rate_at_the_edge_is_within_alpha():
    """Configs whose true median is exactly incumbent x 1.01 (the worst case), spreads of
    every recorded config in turn: the share stopped stays within alpha (0.1%) up to
    sampling noise (independent repetitions) and below 1% with strong drift (AR(1) 0.5)."""
    sim = _sim()
    every = [r for path in SWEEPS for r in sim.read_recorded(path)]
    rng = np.random.default_rng(5)
    stops, count = sim.boundary_rate(every, DEFAULT_RULE, rng, 6000)
    assert stops <= DEFAULT_RULE.alpha * count + 3 * math.sqrt(DEFAULT_RULE.alpha * count), stops
    stops, count = sim.boundary_rate(every, DEFAULT_RULE, rng, 1500, rho=0.5)
    assert stops < 0.01 * count, stops


def test_the_simulation_script_runs(tmp_path, capsys):
    import json

    sim = _sim()
    out = tmp_path / "race.json"
    assert sim.main(["--sweeps", str(ROOT / "tests" / "data" / "sweep_h100_d64.csv"), "--orders", "2",
                     "--boundary", "200", "--top", "32", "--output", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["sweeps"][0]["sweep"] == "sweep_h100_d64.csv" and data["boundary"]["count"] == 200
    assert "boundary" in capsys.readouterr().out
