"""The coordinator on its own (evotuner/coordinator.py): its contract, answered alike by the
database's StudyCoordinator and the in-memory LocalCoordinator, and the database's failure
paths -- a search taken over while it held trials and a config (reaped), a config whose
owner gave it up, a key whose holder failed. Real SQLite files; no build, no GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import optuna
import pytest
from sqlalchemy import update

from evotuner.coordinator import Coordinator, Follow, LocalCoordinator, StudyCoordinator
from evotuner.measure.replay import ReplayMeasure, read_sweep
from evotuner.space import load_space
from evotuner.storage import StudyStore, claims, liveness, schema
from evotuner.vocabulary import params_for
from evotuner.workers import StudyWorker

SWEEP = Path(__file__).parent / "data" / "replay" / "synthetic_d64.csv"
STUDY = "c"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StudyStore]:
    with StudyStore(f"sqlite:///{tmp_path / 'coord.db'}") as s:
        s.create_study(STUDY, read_sweep(SWEEP).problem, load_space(None), sampler_name="tpe", seed=7,
                       source_hash="replay", nvcc_version="none")
        yield s


def make(kind: str, store: StudyStore, **kw: object) -> Coordinator:
    if kind == "local":
        return LocalCoordinator(store, STUDY)
    return StudyCoordinator(store, STUDY, **kw)


@pytest.fixture(params=["study", "local"])
def coord(request: pytest.FixtureRequest, store: StudyStore) -> Iterator[Coordinator]:
    c = make(request.param, store)
    with c.joined():
        yield c


def configs(n: int) -> list:
    return list(load_space(None).configs())[:n]


def ask(store: StudyStore) -> optuna.trial.Trial:
    return store.optuna_study(STUDY).ask()


def teller(store: StudyStore, trial: optuna.trial.Trial, value: float = 1.0):
    return lambda: trial.study.tell(trial, value)


def running_trial_states(store: StudyStore) -> dict[int, str]:
    return {t.number: t.state.name for t in store.optuna_study(STUDY).get_trials(deepcopy=False)}


# -- the contract, on both implementations -------------------------------------------------------


def test_a_lone_search_gets_the_study_seed_and_is_never_taken_over(coord: Coordinator) -> None:
    assert coord.seed_for(7) == 7 and coord.seed_for(None) is None
    assert not coord.reaped and coord.alone()
    assert coord.measure_on({"name": "NVIDIA H100", "device_index": 0}) == set()


def test_the_budget_counts_held_and_done_slots(coord: Coordinator, store: StudyStore) -> None:
    a, b = coord.claim_slot(2), coord.claim_slot(2)
    assert a is not None and b is not None and a != b
    assert coord.claim_slot(2) is None                        # both held: the target is reached
    trial = ask(store)
    coord.bind(a, trial.number)
    assert coord.spent() == 0
    assert coord.finish(trial, teller(store, trial)) is True
    assert coord.spent() == 1
    assert coord.claim_slot(2) is None                        # one done, one held
    assert coord.claim_slot(3) is not None


def test_a_config_is_built_once_and_its_followers_copy_it(coord: Coordinator, store: StudyStore) -> None:
    config, other = configs(2)
    slot = coord.claim_slot(5)
    trial = ask(store)
    coord.bind(slot, trial.number)
    assert coord.claim_config(config, trial.number) is True
    assert coord.holds(config)
    assert coord.claim_config(other, trial.number + 2) is True
    assert coord.claim_config(config, trial.number + 1) is False     # owned: follow it instead
    assert coord.follow(config, trial.number + 1) == Follow()        # still in hand
    assert coord.finish(trial, teller(store, trial, 2.5), built=config) is True
    assert coord.follow(config, trial.number + 1) == Follow(copy_of=trial.number)
    assert coord.holds(other) and not coord.reaped


def test_finish_reraises_a_failed_tell_of_a_running_trial(coord: Coordinator, store: StudyStore) -> None:
    slot = coord.claim_slot(5)
    trial = ask(store)
    coord.bind(slot, trial.number)

    def broken() -> None:
        raise ValueError("not a value")

    with pytest.raises(ValueError, match="not a value"):
        coord.finish(trial, broken)
    assert running_trial_states(store)[trial.number] == "RUNNING" and coord.spent() == 0
    assert coord.finish(trial, teller(store, trial)) is True        # the slot is still this search's


def test_the_start_runs_once_and_only_for_a_new_study(coord: Coordinator, store: StudyStore) -> None:
    study = store.optuna_study(STUDY)
    config = configs(1)[0]
    calls: list[str] = []

    def enqueue() -> None:
        calls.append("enqueue")
        study.enqueue_trial(params_for(config, load_space(None)))

    def never() -> None:
        raise AssertionError("a lone search never waits for the start")

    def is_new() -> bool:
        return not study.get_trials(deepcopy=False)

    coord.start(is_new=is_new, enqueue=enqueue, wait=never)
    coord.start(is_new=is_new, enqueue=enqueue, wait=never)          # not new any more: nothing
    assert calls == ["enqueue"]
    assert [t.state.name for t in study.get_trials(deepcopy=False)] == ["WAITING"]


def test_once_runs_unless_ready_and_a_failed_run_frees_its_key(coord: Coordinator) -> None:
    done: list[int] = []

    def fail() -> None:
        raise RuntimeError("no GPU")

    with pytest.raises(RuntimeError, match="no GPU"):
        coord.once("baselines:x", fail, ready=lambda: False, wait=None)
    assert coord.once("baselines:x", lambda: done.append(1), ready=lambda: bool(done), wait=None) is True
    assert coord.once("baselines:x", lambda: done.append(2), ready=lambda: bool(done), wait=None) is True
    assert done == [1]


def test_take_over_fails_what_a_killed_run_left_running(coord: Coordinator, store: StudyStore) -> None:
    zombie = ask(store)                       # asked by a process that was killed before binding it
    assert coord.take_over(5) == [zombie.number]
    assert running_trial_states(store)[zombie.number] == "FAIL"
    assert coord.take_over(5) == [] and coord.take_over(5, lazily=True) == []


def test_a_search_through_either_coordinator_tells_the_same_trials(tmp_path: Path) -> None:
    """The loop, seeded, over a replayed sweep: a LocalCoordinator and a lone StudyCoordinator
    lead it to the same study, trial by trial."""
    from evotuner.loop import run_search
    from evotuner.propose import make_sampler

    table = read_sweep(SWEEP)
    space = load_space(None)
    seen = {}
    for kind in ("study", "local"):
        with StudyStore(f"sqlite:///{tmp_path / f'{kind}.db'}") as store:
            replay = ReplayMeasure(SWEEP, table.problem, space)
            store.create_study(STUDY, table.problem, space, sampler_name="tpe", seed=3, source_hash="replay",
                               nvcc_version="none")
            worker = LocalCoordinator(store, STUDY) if kind == "local" else None
            result = run_search(store=store, study_name=STUDY, problem=table.problem, space=space,
                                sampler=make_sampler("tpe", space, 3), seed=3, trials=12,
                                builder=replay.builder(), measure=replay, worker=worker, batch=2)
            assert result.outcome == "done" and result.finished == 12
            seen[kind] = [(t.number, t.state, t.value, t.config) for t in store.summary(STUDY).trials]
    assert seen["study"] == seen["local"]


# -- the database's failure paths -----------------------------------------------------------------


def _stall(store: StudyStore, worker: StudyWorker) -> None:
    """Make ``worker`` look as if it stopped heartbeating long ago (a frozen process)."""
    with store.session() as s:
        s.execute(update(schema.workers).where(schema.workers.c.id == worker.id)
                  .values(heartbeat=schema.workers.c.heartbeat - 10_000))


def test_a_reaped_search_learns_it_from_its_answers_and_rejoins_empty_handed(store: StudyStore) -> None:
    stalled = StudyCoordinator(store, STUDY, stale_after=600)     # its first heartbeat 100 s away
    other = StudyCoordinator(store, STUDY, stale_after=60)
    config = configs(1)[0]
    with stalled.joined(), other.joined():
        assert not stalled.alone()
        slot = stalled.claim_slot(4)
        trial = ask(store)
        stalled.bind(slot, trial.number)
        assert stalled.claim_config(config, trial.number) and stalled.holds(config)
        assert other.claim_config(config, trial.number + 1) is False          # stalled's, for now
        _stall(store, stalled.worker)
        assert other.take_over(4) == [trial.number]                            # failed, its config queued
        assert running_trial_states(store)[trial.number] == "FAIL"
        # the stalled search finds out, and none of its answers holds anything
        assert not stalled.holds(config) and stalled.reaped
        assert stalled.finish(trial, teller(store, trial), built=config) is False
        assert stalled.spent() == 0 and stalled.claim_slot(4) is None
        assert stalled.claim_config(config, 99) is False
        assert stalled.once("baselines:x", lambda: None, ready=lambda: False, wait=None) is False
        # the config went back: whoever follows it now builds it
        assert other.follow(config, trial.number + 1) == Follow(build=True)
        assert other.holds(config)
        stalled.rejoin()
        assert not stalled.reaped
        assert stalled.claim_slot(4) is not None                               # a new search of the study
        assert stalled.claim_config(config, 100) is False                      # the config is other's now


def test_a_config_whose_owner_left_is_built_by_its_follower(store: StudyStore) -> None:
    owner = StudyCoordinator(store, STUDY)
    follower = StudyCoordinator(store, STUDY)
    config = configs(1)[0]
    with follower.joined():
        with owner.joined():
            assert owner.claim_config(config, 0)
            assert not follower.claim_config(config, 1)
            assert follower.follow(config, 1) == Follow()
        # the owner left (interrupted) without finishing it: its claim went back
        assert follower.follow(config, 1) == Follow(build=True)
        assert follower.holds(config) and not follower.reaped


def test_a_taken_config_is_not_this_searchs_to_record(store: StudyStore) -> None:
    """A search whose config claim was deleted under it (its reaper deleted it) hears so from
    ``holds`` -- the answer the loop asks before it records a measurement."""
    search = StudyCoordinator(store, STUDY)
    config = configs(1)[0]
    with search.joined():
        assert search.claim_config(config, 0) and search.holds(config)
        claims.release(store, STUDY, claims.config_key(config), search.worker.id)
        assert search.holds(config) is False and search.reaped


def test_once_waits_for_its_holder_and_takes_over_a_failed_one(store: StudyStore) -> None:
    first = StudyCoordinator(store, STUDY)
    second = StudyCoordinator(store, STUDY)
    recorded: list[str] = []
    with first.joined(), second.joined():
        assert first.worker.once("baselines:x")                      # first is measuring them
        assert second.once("baselines:x", lambda: recorded.append("second"), ready=lambda: bool(recorded),
                           wait=None) is False                         # not now: ask again later
        looks: list[int] = []

        def wait() -> None:                                            # meanwhile first records them
            looks.append(1)
            recorded.append("first")
            first.worker.finish_once("baselines:x")

        assert second.once("baselines:x", lambda: recorded.append("second"), ready=lambda: bool(recorded),
                           wait=wait) is True
        assert recorded == ["first"] and looks == [1]


def test_start_waits_while_another_search_enqueues(store: StudyStore) -> None:
    first = StudyCoordinator(store, STUDY)
    second = StudyCoordinator(store, STUDY)
    study = store.optuna_study(STUDY)
    with first.joined(), second.joined():
        assert first.worker.once("start")                            # first is enqueueing the start

        def wait() -> None:
            study.enqueue_trial({})
            first.worker.finish_once("start")

        second.start(is_new=lambda: not study.get_trials(deepcopy=False),
                     enqueue=lambda: pytest.fail("the start is first's"), wait=wait)
        assert len(study.get_trials(deepcopy=False)) == 1


def test_other_searches_gpu_models_are_reported(store: StudyStore) -> None:
    a = StudyCoordinator(store, STUDY)
    b = StudyCoordinator(store, STUDY)
    with a.joined(), b.joined():
        assert a.measure_on({"name": "NVIDIA H200", "device_index": 0}) == set()
        assert b.measure_on({"name": "NVIDIA H100", "device_index": 1}) == {"NVIDIA H200"}


def test_leaving_hands_on_an_unfinished_slot(store: StudyStore) -> None:
    search = StudyCoordinator(store, STUDY)
    with search.joined():
        assert search.claim_slot(1) is not None
    assert claims.slot_counts(store, STUDY) == (0, 1)
    rows = liveness.workers(store, STUDY, live_only=False)
    assert [(w.state, w.reason) for w in rows] == [("done", "done")]
