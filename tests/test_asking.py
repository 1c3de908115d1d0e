"""Asking a trial in one transaction (evotuner/asking.py, StudyStore.begin_trial and
set_user_attrs) and the guided sampler's picks from one read of the study (``picks``)."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState
from sqlalchemy import event

from evotuner.asking import Proposer, ask
from evotuner.family import get_family
from evotuner.guided import GuidedSampler
from evotuner.problem import Problem, Shape
from evotuner.propose import make_sampler, params_for, suggest
from evotuner.space import load_space
from evotuner.storage import StudyStore

ROOT = Path(__file__).resolve().parents[1]
HOPPER = get_family("hopper")
PROBLEM = Problem(Shape(8, 16, 2048, 2048, 128), "bf16")
optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="module")
def space():
    return load_space(ROOT / "search_spaces" / "hopper.toml")


@pytest.fixture
def store(tmp_path: Path):
    with StudyStore(f"sqlite:///{tmp_path / 'study.db'}") as s:
        yield s


def _estimate(config):
    return HOPPER.estimate_us(config, PROBLEM)


def _noisy(config):
    return _estimate(config) * (1 + (hash(config) % 97) / 300)


def _study(store, sampler, name="s"):
    study = optuna.create_study(storage=store.optuna_storage, study_name=name, sampler=sampler)
    return study, store.optuna_storage.get_study_id_from_name(name)


def _commits(engine):
    """A counter of the engine's transactions that wrote (Optuna commits its reads too)."""
    count, dirty = [0], [False]

    def statement(conn, cursor, sql, *args):
        if sql.lstrip().split(None, 1)[0].upper() in ("INSERT", "UPDATE", "DELETE"):
            dirty[0] = True

    def commit(conn):
        count[0] += dirty[0]
        dirty[0] = False

    event.listen(engine, "before_cursor_execute", statement)
    event.listen(engine, "commit", commit)
    return count


def _tell(study, trial, config):
    value = _noisy(config)
    if math.isfinite(value):
        study.tell(trial, value)
    else:
        study.tell(trial, state=TrialState.PRUNED)


def test_the_guided_sampler_is_a_proposer_and_tpe_is_not(space):
    assert isinstance(make_sampler("guided", space, 0, PROBLEM), Proposer)
    assert not isinstance(make_sampler("tpe", space, 0, PROBLEM), Proposer)


def test_a_proposed_trial_is_written_in_one_commit_instead_of_one_per_parameter(store, space):
    study, sid = _study(store, GuidedSampler(space, PROBLEM, _estimate, 0))
    commits = _commits(store.optuna_storage.engine)
    trial = ask(study, store, sid, space)
    config = suggest(trial, space)              # every parameter is there already: no write
    assert commits[0] == 1
    assert study.trials[0].state == TrialState.RUNNING
    assert study.trials[0].params == params_for(config, space)

    plain, _ = _study(store, make_sampler("tpe", space, 0, PROBLEM), "plain")
    commits[0] = 0
    suggest(ask(plain, store, store.optuna_storage.get_study_id_from_name("plain"), space), space)
    assert commits[0] == 1 + len(space.params)  # study.ask(), then one per parameter


def test_proposing_walks_the_same_configs_as_optunas_ask_with_the_same_seed(store, space):
    walks = []
    for i, through_ask in enumerate((True, False)):
        study, sid = _study(store, GuidedSampler(space, PROBLEM, _estimate, 5), f"s{i}")
        configs = []
        for _ in range(3):                      # three in flight before each tell, as builds run
            trials = [ask(study, store, sid, space) if through_ask else study.ask() for _ in range(3)]
            proposed = [suggest(t, space) for t in trials]
            for trial, config in zip(trials, proposed):
                _tell(study, trial, config)
            configs += proposed
        walks.append(configs)
    assert walks[0] == walks[1]
    assert len(set(walks[0])) == len(walks[0])


def test_enqueued_configs_are_asked_first(store, space):
    study, sid = _study(store, GuidedSampler(space, PROBLEM, _estimate, 0))
    feasible = [c for c in space.configs() if space.violated(c, PROBLEM) is None]
    queued = max(feasible, key=_estimate)       # one the model would propose last
    study.enqueue_trial(params_for(queued, space))
    assert suggest(ask(study, store, sid, space), space) == queued
    assert suggest(ask(study, store, sid, space), space) != queued


def test_picks_from_one_read_are_new_distinct_and_proposed_in_turn(store, space, monkeypatch):
    sampler = GuidedSampler(space, PROBLEM, _estimate, 0, picks=3)
    study, sid = _study(store, sampler)
    reads = [0]
    real = study.get_trials

    def counted(*args, **kwargs):
        reads[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(study, "get_trials", counted)
    first = [suggest(ask(study, store, sid, space), space) for _ in range(2)]
    for trial in real(deepcopy=False)[:2]:     # told while the third pick waits in the queue
        _tell(study, optuna.trial.Trial(study, trial._trial_id), first[trial.number])
    configs = first + [suggest(ask(study, store, sid, space), space) for _ in range(4)]
    assert reads[0] == 2                        # six proposals, two reads of the study
    assert len(set(configs)) == 6
    assert all(space.violated(c, PROBLEM) is None for c in configs)


def test_picks_stop_where_every_feasible_config_is_known(store, space, monkeypatch):
    sampler = GuidedSampler(space, PROBLEM, _estimate, 0, picks=8)
    sampler._enumerate()
    keep = 3                                    # the space as three feasible configs
    for name in ("_index", "_x", "_prior"):
        monkeypatch.setattr(sampler, name, getattr(sampler, name)[:keep])
    monkeypatch.setattr(sampler, "_rows", {tuple(int(i) for i in k): r for r, k in enumerate(sampler._index)})
    study, sid = _study(store, sampler)
    configs = [suggest(ask(study, store, sid, space), space) for _ in range(3)]
    assert len(set(configs)) == 3
    assert sampler._queued == []                # the fourth and later picks would repeat known configs


def test_user_attrs_go_in_one_commit_and_a_finished_trial_keeps_its_own(store, space):
    study, sid = _study(store, GuidedSampler(space, PROBLEM, _estimate, 0))
    trial = ask(study, store, sid, space)
    store.set_user_attrs(trial._trial_id, {"config": {"BLOCK_N": 64}, "tflops": 1.5})
    commits, ours = _commits(store.optuna_storage.engine), _commits(store._engine)
    store.set_user_attrs(trial._trial_id, {"tflops": 2.5, "reason": "x", "gate": {"passed": True}})
    assert ours[0] == 1 and commits[0] == 0
    study.tell(trial, 1.0)
    with pytest.raises(UpdateFinishedTrialError, match="COMPLETE"):
        store.set_user_attrs(trial._trial_id, {"tflops": 9.0, "late": 1})
    assert study.trials[0].user_attrs == {"config": {"BLOCK_N": 64}, "tflops": 2.5, "reason": "x",
                                          "gate": {"passed": True}}




def test_a_proposal_that_raises_fails_in_suggest_as_before(store, space, monkeypatch):
    """The loop fails the trial whose suggest raised and goes on; a proposal's error must come
    out there too, not out of the ask (that would end the search)."""
    study, sid = _study(store, GuidedSampler(space, PROBLEM, _estimate, 0))

    def broken(self, seen):
        raise RuntimeError("the pick broke")

    monkeypatch.setattr(GuidedSampler, "_pick", broken)
    trial = ask(study, store, sid, space)
    with pytest.raises(RuntimeError, match="the pick broke"):
        suggest(trial, space)
    assert study.trials[0].state == TrialState.RUNNING and study.trials[0].params == {}
