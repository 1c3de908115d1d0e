"""The proposal stage: samplers, the index representation, reproducibility, grid coverage."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import optuna
import pytest
from optuna.distributions import IntDistribution

from evotuner import propose
from evotuner.config import KernelConfig
from evotuner.errors import SpaceError
from evotuner.propose import MODEL_SAMPLERS, SAMPLERS, config_from_params, make_sampler, param_key, params_for, suggest
from evotuner.problem import Problem, Shape
from evotuner.space import load_space

SMALL = Path(__file__).parent / "data" / "spaces" / "small.toml"

optuna.logging.set_verbosity(optuna.logging.WARNING)


def objective(config: KernelConfig) -> float:
    """Deterministic, not separable, with a unique optimum."""
    d = config.as_dict()
    return abs(d["BLOCK_M"] - 128) + abs(d["BLOCK_N"] - 64) * 2 + (d["NUM_WARPS"] * d.get("STAGES", 1)) % 7


def run(sampler_name: str, space, seed: int | None, n_batches: int, batch: int = 3, storage=None, name=None):
    """Ask ``batch`` trials before telling any (as the loop does while builds run)."""
    study = optuna.create_study(sampler=make_sampler(sampler_name, space, seed), storage=storage,
                                study_name=name, load_if_exists=True)
    proposed = []
    for _ in range(n_batches):
        trials = [study.ask() for _ in range(batch)]
        configs = [suggest(t, space) for t in trials]
        for t, c in zip(trials, configs):
            t.set_user_attr("config", str(c))
            study.tell(t, objective(c))
        proposed += configs
    return study, proposed


def test_sampler_names():
    assert SAMPLERS[:6] == ("tpe", "nsga2", "cmaes", "random", "grid", "tpe-masked")


def test_unknown_sampler_names_the_choices():
    with pytest.raises(SpaceError, match=r"unknown sampler 'anneal'.*use one of tpe, nsga2, cmaes, random, grid"):
        make_sampler("anneal", load_space(), 0)


def test_cmaes_without_its_package_says_how_to_get_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(propose.importlib.util, "find_spec", lambda n, *a: None if n == "cmaes" else real(n, *a))
    with pytest.raises(SpaceError, match=r"needs the cmaes package.*pip install cmaes"):
        make_sampler("cmaes", load_space(), 0)


@pytest.mark.parametrize("name", SAMPLERS)
def test_same_seed_same_sequence(name):
    space = load_space()
    if name in MODEL_SAMPLERS:
        # FlashCore has no cost model: refused with a remedy (tests/test_guided.py runs it on hopper)
        with pytest.raises(SpaceError, match="pick another --sampler"):
            make_sampler(name, space, 1234, Problem(Shape(1, 1, 256, 256, 64)))
        return
    if name == "cmaes" and importlib.util.find_spec("cmaes") is None:
        # without the optional package the sampler is refused with a remedy instead
        with pytest.raises(SpaceError, match="pip install cmaes"):
            make_sampler(name, space, 1234)
        return
    # past the model-based samplers' startup trials so the model itself is exercised (GP fits are slow: fewer)
    n_batches = 4 if name == "gp" else 10
    _, first = run(name, space, 1234, n_batches)
    _, second = run(name, space, 1234, n_batches)
    assert first == second
    assert len(set(first)) > 5
    for c in first:
        space.validate(c)


@pytest.mark.parametrize("name", ["tpe", "random", "grid"])
def test_different_seeds_differ(name):
    space = load_space()
    _, a = run(name, space, 1, 4)
    _, b = run(name, space, 2, 4)
    assert a != b


@pytest.mark.parametrize("name", ["tpe", "nsga2", "random", "grid"])
def test_every_sampler_stores_the_same_distributions(name):
    space = load_space()
    study, _ = run(name, space, 0, 2)
    expected = {param_key(p.name): IntDistribution(0, len(p.values) - 1) for p in space.params}
    assert propose.distributions(space) == expected
    for t in study.trials:
        assert t.distributions == expected


def test_grid_covers_the_space_exactly_once():
    space = load_space(SMALL)
    study, proposed = run("grid", space, 5, space.size // 3)
    assert len(proposed) == space.size == 12
    assert set(proposed) == set(space.configs())
    assert len(set(proposed)) == len(proposed)
    assert propose.exhausted(study)
    # a non-grid study is never exhausted
    assert not propose.exhausted(run("random", space, 5, 1)[0])


def test_grid_is_not_exhausted_while_points_are_pending():
    space = load_space(SMALL)
    study = optuna.create_study(sampler=make_sampler("grid", space, 0))
    trials = [study.ask() for _ in range(space.size)]
    configs = [suggest(t, space) for t in trials]
    assert set(configs) == set(space.configs())
    for t in trials[:-1]:
        study.tell(t, 1.0)
    assert not propose.exhausted(study)
    study.tell(trials[-1], 1.0)
    assert propose.exhausted(study)


def test_grid_over_the_default_space_has_its_size():
    space = load_space()
    sampler = make_sampler("grid", space, 0)
    study = optuna.create_study(sampler=sampler)
    seen = set()
    while not propose.exhausted(study):
        t = study.ask()
        seen.add(suggest(t, space))
        study.tell(t, 0.0)
    assert len(study.trials) == space.size
    assert seen == set(space.configs())


def test_params_round_trip_for_every_config():
    space = load_space()
    for c in space.configs():
        params = params_for(c, space)
        assert set(params) == {"BLOCK_M_index", "BLOCK_N_index", "NUM_WARPS_index", "STAGES_index",
                               "MIN_BLOCKS_index"}
        assert config_from_params(params, space) == c
    assert params_for(KernelConfig.parse("BLOCK_M=192,BLOCK_N=32,NUM_WARPS=8,STAGES=3,MIN_BLOCKS=1"), space) == {
        "BLOCK_M_index": 2, "BLOCK_N_index": 0, "NUM_WARPS_index": 1, "STAGES_index": 2, "MIN_BLOCKS_index": 0}


def test_config_from_params_rejects_params_of_another_space():
    space = load_space()
    good = params_for(next(space.configs()), space)
    with pytest.raises(SpaceError, match="lack STAGES_index"):
        config_from_params({k: v for k, v in good.items() if k != "STAGES_index"}, space)
    with pytest.raises(SpaceError, match=r"BLOCK_M_index=4 is not an index into BLOCK_M's 4 values"):
        config_from_params({**good, "BLOCK_M_index": 4}, space)
    with pytest.raises(SpaceError, match="trial parameter TILE_K_index is not in the space"):
        config_from_params({**good, "TILE_K_index": 0}, space)


def test_enqueued_configs_are_proposed_first():
    space = load_space()
    fa2 = KernelConfig.parse("BLOCK_M=128,BLOCK_N=64,NUM_WARPS=4,STAGES=2,MIN_BLOCKS=1")
    study = optuna.create_study(sampler=make_sampler("tpe", space, 0))
    study.enqueue_trial(params_for(fa2, space))
    assert suggest(study.ask(), space) == fa2


def test_resume_from_sqlite_continues_the_study_and_maps_params_back(tmp_path):
    space = load_space()
    url = f"sqlite:///{tmp_path / 'study.db'}"
    _, first = run("tpe", space, 3, 3, storage=url, name="s")
    _, more = run("tpe", space, 3, 1, storage=url, name="s")
    study = optuna.load_study(study_name="s", storage=url)
    assert len(study.trials) == 12
    for t, c in zip(study.trials, first + more):
        assert config_from_params(t.params, space) == c
        assert t.user_attrs["config"] == str(c)
    best = config_from_params(study.best_trial.params, space)
    assert objective(best) == study.best_value
