"""The hopper family's cost model (kernels/hopper/cost.py) and the guided sampler
(evotuner/guided.py): the model against every recorded H100 sweep, the sampler's
contract (feasible, new, seeded, learns the model's errors), and replayed searches."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import optuna
import pytest

from evotuner.errors import SpaceError
from evotuner.family import get_family
from evotuner.guided import GuidedSampler, Related
from evotuner.loop import run_search
from evotuner.measure.replay import ReplayMeasure, read_sweep
from evotuner.problem import Problem, Shape
from evotuner.propose import make_sampler, suggest
from evotuner.space import load_space
from evotuner.storage import StudyStore

ROOT = Path(__file__).resolve().parents[1]
GRID = ROOT / "search_spaces" / "hopper_grid.toml"
SWEEPS = sorted((ROOT / "tests" / "data").glob("sweep_h100_hopper_*.csv"))
HOPPER = get_family("hopper")
optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="module")
def grid():
    return load_space(GRID)


def _rows(path: Path, space):
    """(config, row) of every statically feasible config of the sweep."""
    table = read_sweep(path)
    problem = table.problem
    return problem, [(c, table.rows[c]) for c in space.configs() if space.violated(c, problem) is None]


def _ranks(values):
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0] * len(values)
    for rank, i in enumerate(order):
        ranks[i] = rank
    return ranks


def test_every_recorded_hopper_sweep_is_checked():
    assert len(SWEEPS) >= 10, [p.name for p in SWEEPS]


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_every_recorded_hopper_sweep_is_a_complete_h100_measurement(path, grid):
    replay = ReplayMeasure(path, read_sweep(path).problem, grid)   # every grid config has a row, same fingerprint
    header = replay.table.header
    assert header["complete"] is True and not header.get("synthetic")
    assert header["device"]["name"] == "NVIDIA H100 80GB HBM3"
    assert header["baselines"]["sdpa_default"] > 0
    best = replay.table.optimum()
    assert best.max_error <= best.tolerance


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_the_model_predicts_the_configs_whose_consumers_spill(path, grid):
    """Exact on the four sweeps the register figure was read off and on the later non-causal
    ones; on each later causal sweep the mask's registers tip two configs over (2 of 645-855)."""
    problem, rows = _rows(path, grid)
    wrong = []
    for config, row in rows:
        spills = row.status == "gated" and row.reason.startswith("spills")
        if math.isinf(HOPPER.estimate_us(config, problem)) != spills:
            wrong.append(f"{config}: {row.status} {row.reason[:40]}")
    assert len(wrong) <= len(rows) // 200, "\n".join(wrong[:10])


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_the_model_orders_the_measured_configs_and_is_near_their_time(path, grid):
    problem, rows = _rows(path, grid)
    pairs = [(HOPPER.estimate_us(c, problem), r.median_us) for c, r in rows if r.median_us is not None]
    pairs = [(e, m) for e, m in pairs if math.isfinite(e)]
    est, meas = [e for e, _ in pairs], [m for _, m in pairs]
    re, rm = _ranks(est), _ranks(meas)
    n = len(pairs)
    spearman = 1 - 6 * sum((a - b) ** 2 for a, b in zip(re, rm)) / (n * (n * n - 1))
    ratio = sorted(e / m for e, m in pairs)[n // 2]
    assert spearman >= 0.6, spearman             # 0.66-0.77 on the twelve recorded sweeps
    # The median estimate within a factor 1.5 of the measurement: 0.79-1.04 on eleven sweeps,
    # 0.73 on the smallest (16,8,1024,128 causal, 93 µs), where launch and tail latencies the
    # model leaves out weigh more. The guided sampler learns such a bias; only the order matters.
    assert 1 / 1.5 <= ratio <= 1.5, ratio


def _problem():
    return Problem(Shape(8, 16, 2048, 2048, 128), "bf16")


def _walk(sampler, space, problem, objective, n, *, batch=1):
    """Ask ``batch`` trials before telling any (as the loop does while builds run)."""
    study = optuna.create_study(sampler=sampler)
    configs = []
    while len(configs) < n:
        trials = [study.ask() for _ in range(min(batch, n - len(configs)))]
        proposed = [suggest(t, space) for t in trials]
        for t, c in zip(trials, proposed):
            value = objective(c)
            if math.isfinite(value):
                study.tell(t, value)
            else:
                study.tell(t, state=optuna.trial.TrialState.PRUNED)
        configs += proposed
    return configs


def test_first_the_best_estimate_then_only_new_feasible_configs(grid):
    problem = _problem()
    estimate = lambda c: HOPPER.estimate_us(c, problem)             # noqa: E731
    feasible = [c for c in grid.configs() if grid.violated(c, problem) is None]
    best = min(estimate(c) for c in feasible)
    configs = _walk(GuidedSampler(grid, problem, estimate, 0), grid, problem, estimate, 40, batch=4)
    assert estimate(configs[0]) == best                              # (several configs tie there)
    assert len(set(configs)) == len(configs)                         # pending trials are avoided too
    assert all(grid.violated(c, problem) is None for c in configs)


def test_same_seed_same_sequence(grid):
    problem = _problem()
    estimate = lambda c: HOPPER.estimate_us(c, problem)             # noqa: E731
    noisy = lambda c: estimate(c) * (1 + (hash(c) % 97) / 300)      # noqa: E731
    runs = [_walk(GuidedSampler(grid, problem, estimate, 7), grid, problem, noisy, 12) for _ in range(2)]
    assert runs[0] == runs[1]


def test_it_learns_a_structure_the_model_gets_wrong(grid):
    """In truth every config with the model's favourite number of consumer warpgroups is
    30 % slower than the model says (elsewhere it is right). Walking the model's order
    reaches the true optimum after 60-odd configs; the search must get there in 12."""
    problem = Problem(Shape(1, 16, 4096, 4096, 64), "bf16")
    estimate = lambda c: HOPPER.estimate_us(c, problem)             # noqa: E731
    feasible = sorted((c for c in grid.configs() if grid.violated(c, problem) is None), key=estimate)
    favourite = feasible[0]["CONSUMER_WGS"]
    truth = lambda c: estimate(c) * (1.3 if c["CONSUMER_WGS"] == favourite else 1.0)   # noqa: E731
    optimum = min(truth(c) for c in feasible)
    in_model_order = next(i for i, c in enumerate(feasible) if truth(c) == optimum) + 1
    assert in_model_order > 40
    configs = _walk(GuidedSampler(grid, problem, estimate, 0), grid, problem, truth, 12)
    assert min(truth(c) for c in configs) == optimum


def test_a_failed_config_is_not_proposed_again(grid):
    problem = _problem()
    estimate = lambda c: HOPPER.estimate_us(c, problem)             # noqa: E731
    first = []

    def fails_first(c):
        if not first:
            first.append(c)
            return math.inf                     # told PRUNED, as the gate's verdict is
        return estimate(c)

    configs = _walk(GuidedSampler(grid, problem, estimate, 0), grid, problem, fails_first, 10)
    assert configs.count(first[0]) == 1


def test_the_guided_sampler_needs_a_problem_and_a_family_with_a_model(grid):
    with pytest.raises(SpaceError, match=r"needs the problem.*--shape"):
        make_sampler("guided", grid, 0)
    with pytest.raises(SpaceError, match=r"needs a cost model, and the .* family has none.*tpe"):
        make_sampler("guided", load_space(), 0, Problem(Shape(1, 1, 256, 256, 64)))
    assert isinstance(make_sampler("guided", grid, 0, _problem()), GuidedSampler)


@pytest.mark.parametrize("stem,budget", [("sweep_h100_hopper_d64_mid_bf16", 12),
                                         ("sweep_h100_hopper_d128_bf16", 8)])
def test_a_replayed_guided_search_gets_within_2pc_of_the_sweeps_optimum(tmp_path, grid, stem, budget):
    """Through the real loop, cold (no recommended config, no transfer): within ``budget``
    trials, a quarter of random search's median evaluations (48 and 54) or less."""
    path = ROOT / "tests" / "data" / f"{stem}.csv"
    problem = read_sweep(path).problem
    replay = ReplayMeasure(path, problem, grid)
    with StudyStore(f"sqlite:///{tmp_path / 'g.db'}") as store:
        store.create_study("g", problem, grid, sampler_name="guided", seed=0, source_hash="replay",
                           nvcc_version="replay")
        run_search(store=store, study_name="g", problem=problem, space=grid,
                   sampler=make_sampler("guided", grid, 0, problem), seed=0, trials=budget,
                   builder=replay.builder(), measure=replay)
        trials = store.summary("g").trials
    assert len(trials) == budget
    best = min(t.value for t in trials if t.value is not None)
    assert best <= 1.02 * replay.table.optimum().median_us


def test_a_singular_covariance_falls_back_to_the_models_order(grid, monkeypatch):
    """A numerically singular GP covariance must not end the search: the sampler takes the
    model's best config not yet known."""
    import numpy as np

    from evotuner import guided

    problem = _problem()
    estimate = lambda c: HOPPER.estimate_us(c, problem)             # noqa: E731

    def singular(_):
        raise np.linalg.LinAlgError("not positive definite")

    monkeypatch.setattr(guided.np.linalg, "cholesky", singular)
    configs = _walk(GuidedSampler(grid, problem, estimate, 0), grid, problem, estimate, 5)
    feasible = sorted((c for c in grid.configs() if grid.violated(c, problem) is None), key=estimate)
    assert len(set(configs)) == 5
    assert sorted(estimate(c) for c in configs) == [estimate(c) for c in feasible[:5]]


# --------------------------------------------------------------------------- bounded cost


def _noisy(problem):
    estimate = lambda c: HOPPER.estimate_us(c, problem)             # noqa: E731
    return estimate, lambda c: estimate(c) * (1 + (hash(c) % 97) / 300)


def test_the_gp_conditions_on_at_most_gp_points_of_the_studys_configs(grid, monkeypatch):
    """The cap that bounds a proposal's cost: past GP_POINTS known configs (24 here) the GP's
    points stop growing, and the proposals stay new feasible configs."""
    from evotuner import guided

    monkeypatch.setattr(guided, "GP_POINTS", 24)
    monkeypatch.setattr(guided, "GP_BEST", 8)
    monkeypatch.setattr(guided, "GP_RECENT", 6)
    sizes = []
    posterior = GuidedSampler._posterior

    def spy(self, points, scales, x):
        sizes.append(len(points.y))
        return posterior(self, points, scales, x)

    monkeypatch.setattr(GuidedSampler, "_posterior", spy)
    problem = _problem()
    estimate, noisy = _noisy(problem)
    configs = _walk(GuidedSampler(grid, problem, estimate, 0), grid, problem, noisy, 60)
    assert len(set(configs)) == 60
    assert all(grid.violated(c, problem) is None for c in configs)
    assert sizes == [min(known, 24) for known in range(1, 60)]   # trial k knows k configs


def _full_gain(self, best, mean, sd_of, jitter):
    """The reference: every candidate's posterior sd, then the argmax."""
    import numpy as np

    from evotuner.gpmodel import expected_improvement

    return int(np.argmax(expected_improvement(best, mean, sd_of(np.arange(len(mean)))) + jitter))


def test_the_best_gain_is_the_argmax_over_all_while_computing_few_posterior_sds(grid):
    import numpy as np

    problem = _problem()
    sampler = GuidedSampler(grid, problem, lambda c: HOPPER.estimate_us(c, problem), 0)
    signal = sampler.settings.signal_sd
    rng = np.random.default_rng(1)
    computed_share = []
    for case in range(300):
        m = int(rng.integers(1, 4000))
        mean = rng.normal(0.0, 0.1, m)
        sd = rng.uniform(1e-4, signal, m)
        if case % 3 == 0:
            sd[:] = signal * 0.999                        # no sd far below the bound: little to skip
        jitter = rng.uniform(0.0, 1e-9, m)
        best = float(mean.min() + rng.normal(0.0, 0.05))
        asked = []

        def sd_of(idx):
            asked.append(len(idx))
            return sd[idx]

        assert sampler._best_gain(best, mean, sd_of, jitter) == _full_gain(sampler, best, mean, lambda i: sd[i], jitter)
        computed_share.append(sum(asked) / m)
    assert np.median(computed_share) < 0.5


def test_the_pruned_pick_proposes_what_the_full_pick_would(grid, monkeypatch):
    problem = _problem()
    estimate, noisy = _noisy(problem)
    related = (_related("d128", problem), _related("d128_causal", problem))
    walks = []
    for full in (False, True):
        if full:
            monkeypatch.setattr(GuidedSampler, "_best_gain", _full_gain)
        walks.append(_walk(GuidedSampler(grid, problem, estimate, 3, related=related), grid, problem, noisy, 40))
    assert walks[0] == walks[1]


def test_the_capped_points_are_the_fastest_the_newest_in_flight_first_and_a_spread():
    from evotuner.gpmodel import Observed as _Observed, conditioning as _conditioning

    seen = _Observed()
    for n in range(100):                          # measured row n as trial n; the fastest are 37, 74, ...
        seen.measured[n], seen.number[n] = float((n * 37 + 11) % 100), n
    for row, n in ((200, 5), (201, 6)):           # in flight since early on (a long build)
        seen.pending.add(row)
        seen.number[row] = n
    for n in range(100, 110):                     # the newest: failures
        seen.failed.add(300 + n)
        seen.number[300 + n] = n
    rows = _conditioning(seen, 30, 10, 8)
    assert rows == sorted(rows) and len(rows) == 30
    fastest = sorted(seen.measured, key=seen.measured.get)[:10]
    assert set(fastest) <= set(rows)
    assert {200, 201} <= set(rows)                # in flight: kept however old
    assert set(range(404, 410)) <= set(rows)      # the 6 newest besides them
    rest = sorted(set(seen.number) - set(fastest) - {200, 201} - set(range(404, 410)), key=seen.number.get)
    spread = [r for r in rows if r in rest]
    assert len(spread) == 12 and spread[0] == rest[0] and spread[-1] == rest[-1]
    assert max(np.diff([rest.index(r) for r in spread])) <= 2 * len(rest) / 12     # evenly, not clumped
    small = _Observed(measured={3: 1.0, 1: 2.0}, failed={7}, number={3: 0, 1: 1, 7: 2})
    assert _conditioning(small, 30, 10, 8) == [1, 3, 7]       # below the cap: every known config


def test_the_length_scales_are_fitted_ever_less_often_as_the_study_grows(grid, monkeypatch):
    """At every proposal until REFIT_EVERY_UNTIL configs are compiled (10 here), then once that
    count has grown by REFIT_GROWTH (25% here) since the last fit."""
    from evotuner import guided

    monkeypatch.setattr(guided, "REFIT_EVERY_UNTIL", 10)
    monkeypatch.setattr(guided, "REFIT_GROWTH", 0.25)
    proposals, fitted_at = [], []
    predict, fit = GuidedSampler._predict, GuidedSampler._fit_length_scales

    def count(self, seen, free):
        proposals.append(len(seen.measured) + len(seen.failed))
        return predict(self, seen, free)

    def record(self, points):
        fitted_at.append(proposals[-1])
        return fit(self, points)

    monkeypatch.setattr(GuidedSampler, "_predict", count)
    monkeypatch.setattr(GuidedSampler, "_fit_length_scales", record)
    problem = _problem()
    estimate, noisy = _noisy(problem)
    _walk(GuidedSampler(grid, problem, estimate, 0), grid, problem, noisy, 60)
    assert proposals == list(range(1, 60))
    assert fitted_at == [3, 4, 5, 6, 7, 8, 9, 12, 15, 19, 24, 30, 38, 48]


# --------------------------------------------------------------------------- related studies (transfer)


def _sweep(stem):
    table = read_sweep(ROOT / "tests" / "data" / f"sweep_h100_hopper_{stem}.csv")
    return table, table.problem


def _related(stem, target, *, best=64, similarity=None):
    """The sweep's ``best`` fastest measured configs and its compiled failures as a Related."""
    from evotuner.transfer import similarity as near

    table, problem = _sweep(stem)
    ok = sorted((r for r in table.rows.values() if r.status == "ok"), key=lambda r: r.median_us)[:best]
    failed = [r for r in table.rows.values() if r.status != "ok" and r.compiled][:32]
    points = tuple((r.config, r.median_us if r.status == "ok" else None, HOPPER.estimate_us(r.config, problem))
                   for r in ok + failed)
    return Related(stem, near(target, problem) if similarity is None else similarity, points)


def _truth(table):
    return lambda c: table.rows[c].median_us if table.rows[c].status == "ok" else math.inf


def _lead(related, problem, grid):
    """The lead by its rule: of each related study's LEAD_PER_STUDY fastest configs that are
    feasible here, the one the model rates best here (the first of equals)."""
    from evotuner.guided import LEAD_PER_STUDY

    options = []
    for r in related:
        fastest = sorted((p for p in r.points if p[1] is not None), key=lambda p: p[1])
        options += [c for c, _, _ in fastest if grid.violated(c, problem) is None][:LEAD_PER_STUDY]
    return min(options, key=lambda c: HOPPER.estimate_us(c, problem))


def test_with_related_studies_the_length_scales_are_fitted_as_the_evidence_grows(grid, monkeypatch):
    """The related studies' points count toward the refit rule: a fit at every proposal over
    them (each study brings up to 96) made a proposal 9x dearer (issue 28: 35-63 s of a
    64-trial study proposing on the H100 machine). Cold, the rule is unchanged (the test above)."""
    from evotuner import guided

    fitted, fit = [], GuidedSampler._fit_length_scales

    def record(self, points):
        fitted.append(len(points.y))
        return fit(self, points)

    monkeypatch.setattr(GuidedSampler, "_fit_length_scales", record)
    problem = _problem()
    estimate, noisy = _noisy(problem)
    related = (_related("d128", problem), _related("d128_causal", problem))
    known = sum(len(r.points) for r in related)
    assert known > guided.REFIT_EVERY_UNTIL
    configs = _walk(GuidedSampler(grid, problem, estimate, 0, related=related), grid, problem, noisy, 30)
    assert len(set(configs)) == 30
    # one fit, then one each time the known count (related points + this study's) grew by 10%
    assert 1 <= len(fitted) <= 3, fitted


def test_related_studies_leave_the_first_pick_and_put_their_lead_second(grid):
    """At 2,8,8192,64 causal the model's first pick is 11-14% off the optimum (cold needs 26
    evaluations, docs/samplers.md); the 1,16,4096,64 bf16 sweep's fastest configs include
    ones within 1% there. With that study related, the first pick stays the model's and the
    second is the lead (see _lead); then the GP goes on with both studies' measurements. At
    similarity 0 (or with nothing related) the sampler is the cold one."""
    table, problem = _sweep("d64_mid_causal")
    estimate = lambda c: HOPPER.estimate_us(c, problem)             # noqa: E731
    optimum = table.optimum().median_us
    truth = _truth(table)
    cold = _walk(GuidedSampler(grid, problem, estimate, 0), grid, problem, truth, 4)
    assert truth(cold[0]) > 1.1 * optimum and min(map(truth, cold)) > 1.02 * optimum
    related = _related("d64_mid_bf16", problem)
    assert 0.5 < related.similarity < 1
    warm = _walk(GuidedSampler(grid, problem, estimate, 0, related=[related]), grid, problem, truth, 4)
    assert warm[0] == cold[0] and warm[1] == _lead([related], problem, grid)
    assert truth(warm[1]) <= 1.02 * optimum and len(set(warm)) == 4
    unrelated = Related("other", 0.0, related.points)
    sampler = GuidedSampler(grid, problem, estimate, 0, related=lambda: [unrelated])
    assert _walk(sampler, grid, problem, truth, 4) == cold
    assert sampler.related == ()                                     # similarity 0: not related at all


def test_the_lead_is_the_models_pick_among_every_related_studys_fastest(grid):
    table, problem = _sweep("d64_causal")
    estimate = lambda c: HOPPER.estimate_us(c, problem)             # noqa: E731
    related = [_related("d64_mid_causal", problem), _related("d64", problem), _related("d64_mid_bf16", problem)]
    lead = _lead(related, problem, grid)
    configs = _walk(GuidedSampler(grid, problem, estimate, 0, related=related), grid, problem, _truth(table), 2)
    assert configs[1] == lead
    nearest_best = min((p for p in related[0].points if p[1] is not None), key=lambda p: p[1])[0]
    assert estimate(lead) <= estimate(nearest_best)


def test_no_lead_where_the_model_rates_the_related_studies_winners_far_slower(grid):
    """At 2,16,1024,64 (32768 query rows: about two waves of 128-row tiles on 132 SMs) the
    bigger problems' winners have three warpgroups (192-row tiles, one and a half waves). The
    model rates the best of them 41% slower than its own best there, and the sweep measured it
    17-20% slower; so the second proposal is the GP's, not that lead (LEAD_WITHIN_SD)."""
    from evotuner.guided import LEAD_WITHIN_SD, SIGNAL_SD

    table, problem = _sweep("d64_few")
    estimate = lambda c: HOPPER.estimate_us(c, problem)             # noqa: E731
    related = [_related("d64", problem), _related("d64_mid_bf16", problem)]
    lead = _lead(related, problem, grid)
    best_estimate = min(estimate(c) for c in grid.feasible(problem))
    assert math.log(estimate(lead) / best_estimate) > LEAD_WITHIN_SD * SIGNAL_SD
    assert table.rows[lead].median_us > 1.1 * table.optimum().median_us
    configs = _walk(GuidedSampler(grid, problem, estimate, 0, related=related), grid, problem, _truth(table), 3)
    assert lead not in configs and len(set(configs)) == 3


def test_with_related_studies_it_still_proposes_only_new_feasible_configs(grid):
    table, problem = _sweep("d64_causal")
    estimate = lambda c: HOPPER.estimate_us(c, problem)             # noqa: E731
    related = [_related("d64_mid_causal", problem), _related("d64", problem, best=16)]
    sampler = GuidedSampler(grid, problem, estimate, 3, related=related)
    configs = _walk(sampler, grid, problem, _truth(table), 16, batch=4)
    assert len(set(configs)) == 16 and all(grid.violated(c, problem) is None for c in configs)
    assert [r.name for r in sampler.related] == ["d64_mid_causal", "d64"]
    again = _walk(GuidedSampler(grid, problem, estimate, 3, related=related), grid, problem, _truth(table), 16,
                  batch=4)
    assert again == configs                                          # same seed, same sequence


def test_related_points_are_centred_per_study_and_failures_sit_above_their_worst():
    from evotuner.config import KernelConfig
    from evotuner.gpmodel import FAILURE_PENALTY, Tasks as _Tasks

    def cfg(n):
        return KernelConfig.of({"A": n})

    scaled = lambda c: [c["A"] / 10] if "A" in c.as_dict() else None   # noqa: E731
    one = Related("one", 0.8, ((cfg(1), 2.0, 1.0), (cfg(2), 8.0, 1.0), (cfg(3), None, 1.0),
                               (cfg(4), 5.0, math.inf), (KernelConfig.of({"B": 1}), 3.0, 1.0)))
    two = Related("two", 0.5, ((cfg(5), 1.0, 1.0),))
    tasks = _Tasks.of([one, two], scaled, 1)
    spread = math.log(8.0) - math.log(2.0)
    assert tasks.measured == 3 and len(tasks.points.y) == 4  # no finite estimate, no such parameter: out
    assert list(tasks.points.y) == pytest.approx([-spread / 2, spread / 2, spread / 2 + FAILURE_PENALTY, 0.0])
    assert list(tasks.points.task) == [1, 1, 1, 2] and list(tasks.points.weight) == [0.8, 0.8, 0.8, 0.5]
    points = tasks.after(np.zeros((1, 1)), np.array([0.1]))
    corr = points.correlation
    assert corr[0, 1] == pytest.approx(0.8) and corr[1, 2] == 1.0 and corr[1, 4] == pytest.approx(0.4)
    assert corr[0, 0] == corr[4, 4] == 1.0
