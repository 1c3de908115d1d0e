"""A study's creation interrupted half way (its creator killed between evotuner's row and
Optuna's study, or stalled there): the next creator takes it over and completes the study;
nothing is ever removed from under another process. Real SQLite and PostgreSQL databases
and real killed processes, no GPU.

The creation writes evotuner's row first (marked under way), then Optuna's study, then the
row's Optuna id (storage/creation.py); storage/start.py: await_study reports a creation
that stood still for STUDY_ROW_WAIT_S, and ensure_study takes it over."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import optuna
import pytest

from cli_helpers import run
from evotuner import cli
from evotuner.errors import StorageError
from evotuner.problem import Problem, Shape
from evotuner.space import load_space
from evotuner.storage import StudyStore
from evotuner.storage import start as _start
from evotuner.storage.start import await_study, ensure_study

optuna.logging.set_verbosity(optuna.logging.WARNING)

PROBLEM = Problem(Shape(16, 16, 2048, 2048, 64), dtype="fp16", causal=False)
OTHER = Problem(Shape(2, 8, 512, 512, 64), dtype="fp16", causal=True)
SPACE = load_space(None)
SWEEP = Path(__file__).parent / "data" / "replay" / "synthetic_d64.csv"


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database: a SQLite file, or a database on tests/pg_server.py's server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 's.db'}"
    pg = request.getfixturevalue("pg_server")
    return pg.create_database(f"creation_{os.getpid()}_{random.randrange(10**9)}")  # type: ignore[attr-defined]


def _create(store: StudyStore, name: str, problem: Problem = PROBLEM, replacing=None):
    return store.create_study(name, problem, SPACE, "tpe", 7, source_hash="src", nvcc_version="cuda_13.0",
                              replacing=replacing)


def _killed_while_creating(url: str, name: str, where: str) -> None:
    """A process that dies (os._exit, as SIGKILL would leave it) inside create_study:
    ``where`` = "before" just before Optuna's study is made, "after" just after."""
    code = textwrap.dedent(f"""
        import os, optuna
        from evotuner.problem import Problem, Shape
        from evotuner.space import load_space
        from evotuner.storage import StudyStore
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        store = StudyStore({url!r})
        real = optuna.create_study
        def dies(*a, **k):
            if {where!r} == "after":
                real(*a, **k)
            os._exit(9)
        optuna.create_study = dies
        store.create_study({name!r}, Problem(Shape(16, 16, 2048, 2048, 64), dtype="fp16", causal=False),
                           load_space(None), "tpe", 7, source_hash="src", nvcc_version="cuda_13.0")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 9, done.stderr


def _optuna_names(store: StudyStore) -> list[str]:
    return sorted(s.study_name for s in store.optuna_storage.get_all_studies())


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_creation_killed_half_way_is_cleared_and_done_again(url: str, where: str) -> None:
    with StudyStore(url) as store:
        _create(store, "kept")
    _killed_while_creating(url, "w", where)
    with StudyStore(url, create=False) as store:
        assert store.study_exists("w")                       # the name stays taken ...
        assert [i.name for i in store.list_studies()] == ["kept"]   # ... but nobody lists or uses it
        with pytest.raises(StorageError, match="'w' .*is still being created by another process"):
            store.load_study("w")
        assert _optuna_names(store) == (["kept", "w"] if where == "after" else ["kept"])

        assert ensure_study(store, "w", lambda r: _create(store, "w", OTHER, r), wait_s=0.3) is True
        assert store.study_info("w").problem == OTHER       # created afresh, by this call
        study = store.load_study("w", problem=OTHER)
        study.tell(study.ask(), 1.0)
        assert [i.name for i in store.list_studies()] == ["kept", "w"]
        assert _optuna_names(store) == ["kept", "w"]
        assert store.summary("w").trials[0].value == 1.0


def test_the_search_command_clears_a_creation_killed_half_way(capsys, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv(cli.STORAGE_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools"))
    monkeypatch.setenv("EVOTUNER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(_start, "STUDY_ROW_WAIT_S", 0.5)
    url = f"sqlite:///{tmp_path / 's.db'}"
    _killed_while_creating(url, "w", "after")
    code, out, err = run(capsys, "search", "--study", "w", "--shape", "B=16,H=16,S=2048,D=64", "--trials", 4,
                         "--replay", SWEEP, "--storage", url)
    assert code == 0, err
    with StudyStore(url, create=False) as store:
        assert store.count_finished("w") == 4


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_stalled_creator_loses_cleanly_to_the_one_that_cleared_it(url: str, monkeypatch, where: str) -> None:
    """The creator stalls past the wait just before or after making Optuna's study: another
    takes the creation over (adopting the stalled one's Optuna study, if made) and completes
    it; the stalled one then fails with one error and removes nothing."""
    stalled, release = threading.Event(), threading.Event()
    real = optuna.create_study

    def stall(*args, **kwargs):
        made = real(*args, **kwargs) if where == "after" else None
        if threading.current_thread().name == "stalled":
            stalled.set()
            release.wait(30)
        return made if where == "after" else real(*args, **kwargs)

    monkeypatch.setattr(optuna, "create_study", stall)
    errors: list[BaseException] = []

    def creator() -> None:
        with StudyStore(url) as store:
            try:
                _create(store, "w")
            except BaseException as exc:  # noqa: BLE001 - checked below
                errors.append(exc)

    with StudyStore(url) as store:
        t = threading.Thread(target=creator, name="stalled")
        t.start()
        assert stalled.wait(30)
        assert ensure_study(store, "w", lambda r: _create(store, "w", OTHER, r), wait_s=0.3) is True
        release.set()
        t.join(30)
        assert len(errors) == 1 and isinstance(errors[0], StorageError)
        assert "another process took over its creation" in str(errors[0])
        assert store.study_info("w").problem == OTHER
        assert _optuna_names(store) == ["w"]
        study = store.load_study("w", problem=OTHER)
        assert study.user_attrs["problem"] == OTHER.as_dict()   # the stalled one wrote nothing there


def test_a_creation_that_completes_is_waited_for_not_cleared(url: str, monkeypatch) -> None:
    stalled, release = threading.Event(), threading.Event()
    real = optuna.create_study

    def slow(*args, **kwargs):
        made = real(*args, **kwargs)
        if threading.current_thread().name == "slow":
            stalled.set()
            release.wait(30)
        return made

    monkeypatch.setattr(optuna, "create_study", slow)

    def creator() -> None:
        with StudyStore(url) as store:
            _create(store, "w")

    with StudyStore(url) as store:
        t = threading.Thread(target=creator, name="slow")
        t.start()
        assert stalled.wait(30)
        threading.Timer(0.3, release.set).start()
        assert await_study(store, "w", wait_s=5.0) is True
        t.join(30)
        assert store.study_info("w").problem == PROBLEM


def test_a_plain_optuna_study_is_refused_at_once_and_never_removed(url: str) -> None:
    import time

    with StudyStore(url) as store:
        optuna.create_study(study_name="plain", storage=store.optuna_storage)
        t0 = time.monotonic()
        with pytest.raises(StorageError, match="'plain' .*was not created by evotuner"):
            ensure_study(store, "plain", lambda r: _create(store, "plain", PROBLEM, r), wait_s=30.0)
        assert time.monotonic() - t0 < 5.0                     # no creation under way: nothing to wait for
        assert _optuna_names(store) == ["plain"]
        assert not store.list_studies()


def test_of_two_processes_taking_over_one_creation_one_wins_and_the_other_joins(url: str) -> None:
    _killed_while_creating(url, "w", "after")
    with StudyStore(url) as a, StudyStore(url) as b:
        stamp = a.creation_under_way("w")
        assert stamp is not None and b.creation_under_way("w") == stamp
        _create(a, "w", OTHER, stamp)
        with pytest.raises(StorageError, match="moved on"):
            _create(b, "w", PROBLEM, stamp)
        assert b.study_info("w").problem == OTHER and _optuna_names(b) == ["w"]
        assert ensure_study(b, "w", lambda r: _create(b, "w", PROBLEM, r), wait_s=0.3) is False   # b joins


def test_a_second_wait_for_the_same_creation_does_not_start_over(url: str) -> None:
    from evotuner.storage.start import Abandoned

    _killed_while_creating(url, "w", "before")
    with StudyStore(url) as store:
        import time

        t0 = time.monotonic()
        first = await_study(store, "w", wait_s=0.5)
        again = await_study(store, "w", wait_s=0.5)
        assert isinstance(first, Abandoned) and again == first and time.monotonic() - t0 < 1.0


def test_a_long_wait_for_another_creation_is_told_once_and_a_short_one_not_at_all(url: str) -> None:
    """A creator killed mid-creation makes the next search wait up to STUDY_ROW_WAIT_S: that wait
    is announced once (what for, how long at most), a creation that completes at once is not."""
    import time

    from evotuner.storage.start import WAIT_NOTICE_S, Abandoned

    _killed_while_creating(url, "w", "before")
    told: list[str] = []
    with StudyStore(url) as store:
        t0 = time.monotonic()
        state = await_study(store, "w", wait_s=WAIT_NOTICE_S + 1.0, on_wait=told.append)
        assert isinstance(state, Abandoned) and time.monotonic() - t0 >= WAIT_NOTICE_S
        assert len(told) == 1 and "study 'w' is being created by another process" in told[0], told
        assert "waiting up to" in told[0] and "taken over" in told[0]
        _create(store, "x")
        assert await_study(store, "x", on_wait=told.append) is True and len(told) == 1
