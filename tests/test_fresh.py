"""FreshSampler (evotuner.fresh): proposals new to the study and statically feasible;
and the loop's warm start from the kernel's recommended config."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from evotuner.defaults import default_config
from evotuner.fresh import FreshSampler
from evotuner.loop import run_search
from evotuner.measure.replay import ReplayMeasure, read_sweep
from evotuner.problem import Problem, Shape
from evotuner.propose import make_sampler, suggest
from evotuner.space import load_space
from evotuner.storage import StudyStore

D64 = Path(__file__).parent / "data" / "sweep_h100_d64.csv"
optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="module")
def space():
    return load_space(None)


def _walk(sampler, space, n, *, batch=1):
    study = optuna.create_study(sampler=sampler)
    configs = []
    while len(configs) < n:
        trials = [study.ask() for _ in range(min(batch, n - len(configs)))]
        for t in trials:
            configs.append(suggest(t, space))
        for t, c in zip(trials, configs[-len(trials):]):
            study.tell(t, float(c["BLOCK_M"] * 7 + c["BLOCK_N"] + c["STAGES"]))
    return configs


def _fresh(name, space, seed, problem=None):
    base = make_sampler(name, space, seed, problem, fresh=False)
    return FreshSampler(base, space, problem, seed)


@pytest.mark.parametrize("name", ["tpe", "random"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_every_proposal_is_new_and_feasible_until_the_space_is_used_up(space, name, head_dim):
    problem = Problem(Shape(1, 1, 256, 256, head_dim))
    feasible = {c for c in space.configs() if space.violated(c, problem) is None}
    sampler = _fresh(name, space, 3, problem)
    configs = _walk(sampler, space, len(feasible), batch=4)   # pending trials are avoided too
    assert len(set(configs)) == len(configs) == len(feasible)
    assert set(configs) == feasible


def test_without_a_problem_only_repeats_are_avoided(space):
    assert isinstance(make_sampler("random", space, 0), FreshSampler)
    configs = _walk(make_sampler("random", space, 0), space, 40)
    assert len(set(configs)) == 40
    problem = Problem(Shape(1, 1, 256, 256, 128))
    assert any(space.violated(c, problem) for c in configs)   # infeasible ones may be proposed


def test_same_seed_same_proposals(space):
    problem = Problem(Shape(1, 1, 256, 256, 64))
    a = _walk(_fresh("tpe", space, 11, problem), space, 30)
    b = _walk(_fresh("tpe", space, 11, problem), space, 30)
    assert a == b


def test_which_samplers_are_wrapped(space):
    from evotuner.fresh import MaskedTPESampler

    problem = Problem(Shape(1, 1, 256, 256, 64))
    for name in ("tpe", "nsga2", "cmaes", "grid"):   # measured: TPE does better unwrapped
        assert not isinstance(make_sampler(name, space, 0, problem), FreshSampler)
    masked = make_sampler("tpe-masked", space, 0, problem)
    assert isinstance(masked, FreshSampler) and isinstance(masked.base, MaskedTPESampler)
    assert isinstance(make_sampler("tpe-masked", space, 0, problem, fresh=False), MaskedTPESampler)
    assert not isinstance(make_sampler("random", space, 0, problem, fresh=False), FreshSampler)


def test_a_new_study_tries_the_recommended_config_first_and_only_once(space, tmp_path):
    table = read_sweep(D64)
    problem = table.problem
    start = default_config(problem.shape.head_dim, problem.dtype, problem.causal)
    replay = ReplayMeasure(D64, problem, space)
    with StudyStore(f"sqlite:///{tmp_path / 'w.db'}") as store:
        store.create_study("w", problem, space, sampler_name="tpe", seed=0, source_hash="replay",
                           nvcc_version="replay")
        for target in (5, 10):   # the second run resumes: no second warm start
            run_search(store=store, study_name="w", problem=problem, space=space,
                       sampler=make_sampler("tpe", space, 0, problem), seed=0, trials=target,
                       builder=replay.builder(), measure=replay, start=(start,))
        trials = store.summary("w").trials
    assert len(trials) == 10
    assert trials[0].kernel_config == start and trials[0].state == "COMPLETE"
    own = [t for t in trials if t.duplicate_of is None]      # repeats copy, never re-measure
    assert sum(1 for t in own if t.kernel_config == start) == 1
    assert len({t.kernel_config for t in own}) == len(own)


def test_start_configs_past_the_budget_are_not_queued(space, tmp_path):
    """More start configs (recommended + a transfer plan's) than --trials: only the first
    ``trials`` are enqueued; the rest would stay WAITING in a finished study."""
    problem = read_sweep(D64).problem
    replay = ReplayMeasure(D64, problem, space)
    ok = [c for c, row in replay.table.rows.items() if row.status == "ok" and space.admits(c, problem)]
    start = tuple(ok[:5])
    with StudyStore(f"sqlite:///{tmp_path / 'w.db'}") as store:
        store.create_study("w", problem, space, sampler_name="tpe", seed=0, source_hash="replay",
                           nvcc_version="replay")
        result = run_search(store=store, study_name="w", problem=problem, space=space,
                            sampler=make_sampler("tpe", space, 0, problem), seed=0, trials=2,
                            builder=replay.builder(), measure=replay, start=start)
        states = [t.state.name for t in store.optuna_study("w").get_trials(deepcopy=False)]
        configs = [t.kernel_config for t in store.summary("w").trials]
    assert result.finished == 2
    assert states == ["COMPLETE", "COMPLETE"]
    assert configs == list(start[:2])


def test_masked_tpe_screens_its_candidates_where_plain_tpe_proposes_infeasible_configs():
    """On the Hopper grid about 4 in 5 configs break a static constraint (the register pool):
    after its random startup, plain TPE keeps proposing them; MaskedTPESampler (unwrapped
    here, so its own draws are counted) proposes new, feasible configs."""
    from optuna.trial import TrialState

    from evotuner.fresh import MaskedTPESampler
    from evotuner.propose import startup_trials

    grid = load_space(Path(__file__).parents[1] / "search_spaces" / "hopper_grid.toml")
    problem = Problem(Shape(16, 16, 2048, 2048, 64))
    startup = startup_trials(grid)

    def after_startup(sampler, n=40):
        study = optuna.create_study(sampler=sampler)
        bad, seen = 0, set()
        for i in range(startup + n):
            trial = study.ask()
            config = suggest(trial, grid)
            infeasible = grid.violated(config, problem) is not None
            if i >= startup:
                bad += infeasible or config in seen
            seen.add(config)
            if infeasible:
                study.tell(trial, state=TrialState.PRUNED)     # as the loop tells a static prune
            else:
                study.tell(trial, float(config["BLOCK_N"] + 50 * config["STAGES"] + 7 * config["SCHED"]))
        return bad

    kwargs = dict(seed=5, n_startup_trials=startup, multivariate=True, constant_liar=True)
    plain = after_startup(optuna.samplers.TPESampler(**kwargs))
    masked = after_startup(MaskedTPESampler(grid, problem, n_ei_candidates=64, **kwargs))
    assert plain >= 10, plain                # the problem is real
    assert masked <= 2, masked               # and screened away


def test_the_family_picks_the_default_sampler():
    from evotuner.session import sampler_name

    hopper = load_space(Path(__file__).parents[1] / "search_spaces" / "hopper.toml")
    assert sampler_name(None, hopper) == "guided"
    assert sampler_name(None, load_space(None)) == "tpe"
    assert sampler_name("random", hopper) == "random"
