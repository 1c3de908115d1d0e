"""Safe start: several processes may open, create and initialise one database at once.

What goes wrong without it (all seen with two `evotuner search` started together on a
fresh SQLite file): both create Optuna's and evotuner's tables ("table ... already
exists", "UNIQUE constraint failed: alembic_version"), both create the study (one
fails), and a process whose open failed removed database files another one had
created and was using. Creating the file in place with ``O_EXCL`` is not enough: the
others open it at once and see it half made. Optuna creates its tables one
autocommitted ``CREATE TABLE`` at a time, so an opener finds ``studies`` alone and
refuses the file as another application's; the creator's switch to WAL fails at once
with "database is locked" when an opener holds a lock (no busy handler for that lock
upgrade); and the creator, failing, deleted the file under openers already using it.
The rules here:

* a new SQLite database is built complete (WAL mode, Optuna's tables and stamp,
  evotuner's tables and version row) under a private name in the same folder, closed,
  and only then hard-linked to its name, which fails if another process got there
  first (then that one's database is used): nobody ever opens a half-made database,
  and a failed build removes only its private file (:func:`publish_new`); where the
  filesystem has no hard links the file is created in place with ``O_CREAT | O_EXCL``
  as before, and only the process that made it may remove it again after a failed
  open (:func:`create_exclusively`);
* table creation and version stamping are retried when they lose a race
  (:func:`retry_race`): the loser finds the winner's tables and goes on;
* a study is created if absent; the loser of a creation race waits for the winner to
  complete its ``evotuner_studies`` row and loads the study (:func:`ensure_study`); a
  creation left half done by a creator that died (its row still under way after
  :data:`STUDY_ROW_WAIT_S`) is taken over and completed (storage/creation.py);
* Optuna's own SQLite engine starts every transaction with ``BEGIN IMMEDIATE`` as
  evotuner's does (:func:`immediate_sqlite`), so writers from several processes queue
  on the busy timeout instead of failing at once with "database is locked".
"""

from __future__ import annotations

import errno
import os
import random
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from evotuner.errors import StorageError
from evotuner.storage import connect as _connect

T = TypeVar("T")

#: How long a study's creation may stand still before the next creator takes it over (its
#: creator died or stalled; a creator takes milliseconds): longer than SQLite's busy
#: timeout (storage/connect.py), so a live creator queued on the lock is never taken over.
STUDY_ROW_WAIT_S = _connect.SQLITE_BUSY_TIMEOUT_S + 10.0
#: Creations one ensure_study tries before it gives up (each cleared by another process).
CREATE_ATTEMPTS = 4
#: Attempts at initialising the schema when concurrent creators collide.
INIT_ATTEMPTS = 8

_RACE_WORDS = ("already exists", "unique constraint", "duplicate key", "integrityerror", "locked", "busy",
               "pg_type_typname_nsp_index", "could not serialize", "deadlock",
               # Optuna read its alembic table while another opener was still stamping it
               # (a real version mismatch is reported after the retries, a few seconds later)
               "no longer compatible")


def create_exclusively(path: Path) -> _connect.CreatedFiles | None:
    """Create the (empty) SQLite file at ``path`` only if nobody has; return the files to
    remove if this open fails, or None when another process created the file first (then
    nothing is ever removed: that process may be using it)."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return None
    except OSError as exc:
        raise StorageError(f"cannot create database {path} ({exc.strerror})", "choose a writable --storage path") from None
    os.close(fd)
    return _connect.CreatedFiles(path)


#: link() errors that mean "this filesystem has no hard links" (then the file is created in place).
_NO_HARD_LINKS = frozenset(getattr(errno, name) for name in ("EPERM", "ENOTSUP", "EOPNOTSUPP", "EMLINK", "ENOSYS")
                           if hasattr(errno, name))


def publish_new(path: Path, build: Callable[[Path], None]) -> bool | None:
    """Create the SQLite database at ``path`` whole or not at all.

    ``build(private)`` creates and initialises a database at a private path in the same
    folder and closes it (its WAL written back into the file); it is then hard-linked to
    ``path``, which fails if the name exists. Returns True when this call published it,
    False when another process had published (or created) ``path`` first (use theirs),
    None when the folder's filesystem cannot hard-link (the caller creates the file in
    place). The private files are removed in every case, the published one never. A
    build that fails raises with ``path`` named in its message, not the private name.
    """
    while True:
        private = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.new")
        files = create_exclusively(private)
        if files is not None:
            break
    try:
        try:
            build(private)
        except StorageError as exc:
            raise type(exc)(exc.message.replace(str(private), str(path)),
                            exc.remedy.replace(str(private), str(path)) if exc.remedy else exc.remedy) from None
        left = [f"{private}{suffix}" for suffix in ("-wal", "-journal") if Path(f"{private}{suffix}").exists()]
        if left:   # the build's log was not written back: linking the file alone would lose it
            raise StorageError(f"cannot create database {path}: the new database kept its log {left[0]} after closing",
                               "check the folder's filesystem (SQLite needs working locks there) and try again")
        try:
            os.link(private, path)
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno in _NO_HARD_LINKS:
                return None
            raise StorageError(f"cannot create database {path} ({exc.strerror})",
                               "choose a writable --storage path") from None
        return True
    finally:
        files.remove()


def is_race(exc: BaseException) -> bool:
    """True for the errors a concurrent creator causes (the other process won)."""
    text = f"{type(exc).__name__} {exc} {getattr(exc, '__cause__', '')}".lower()
    return any(word in text for word in _RACE_WORDS)


def retry_race(fn: Callable[[], T], attempts: int = INIT_ATTEMPTS) -> T:
    """``fn()``, again after a short random pause when it lost a creation race."""
    for attempt in range(attempts):
        try:
            return fn()
        except (SQLAlchemyError, StorageError) as exc:
            if attempt == attempts - 1 or not is_race(exc):
                raise
            time.sleep(random.uniform(0.05, 0.25) * (attempt + 1))
    raise AssertionError("unreachable")


def immediate_sqlite(engine: Engine) -> None:
    """Make a SQLite engine (Optuna's) begin every transaction with BEGIN IMMEDIATE; the
    pool is emptied so that no connection opened before keeps the driver's own BEGIN."""
    if engine.dialect.name != "sqlite":
        return
    _connect._immediate_transactions(engine)
    engine.dispose()


@dataclass(frozen=True)
class Abandoned:
    """A creation of the study that stood still for the whole wait: its creator died or
    stalled; ``create_study(..., replacing=stamp)`` takes it over."""

    stamp: Any


#: (store URL, study name) -> (the stamp of a creation under way, when this process first
#: saw it): a process that waits again for the same creation does not start the wait over.
_watched: dict[tuple[str, str], tuple[Any, float]] = {}


def _since(store: Any, name: str, stamp: Any) -> float:
    key = (str(store.url), name)
    seen = _watched.get(key)
    if seen is None or seen[0] != stamp:
        seen = _watched[key] = (stamp, time.monotonic())
    return seen[1]


def ensure_study(store: Any, name: str, create: Callable[[Any], Any], wait_s: float | None = None,
                 on_wait: Callable[[str], None] | None = None) -> bool:
    """Create study ``name`` with ``create(replacing)`` unless it exists; True when this call
    created it.

    A concurrent creator may win between the check and the create: then this waits for its
    creation to complete (:func:`await_study`) and returns False, as if the study had
    existed. A creation that stood still for the whole wait (its creator died or stalled) is
    taken over: ``create(stamp)`` (storage/creation.py). A plain Optuna study of that name
    (never given an evotuner row) fails at once with the store's "not created by evotuner"
    error.
    """
    replacing = None
    for _ in range(CREATE_ATTEMPTS):
        if replacing is not None or not store.study_exists(name):
            try:
                create(replacing)
                return True
            except StorageError:
                if not store.study_exists(name):
                    raise
        state = await_study(store, name, wait_s, on_wait)
        if state is True:
            return False
        replacing = state.stamp if isinstance(state, Abandoned) else None
    raise StorageError(f"study '{name}': {CREATE_ATTEMPTS} attempts at creating it were each taken over or undone "
                       f"by another process in {store.display_url}", "run the command again")


#: A wait for another process's creation longer than this is announced (``on_wait``): a
#: creation takes milliseconds, so only a stalled or killed creator makes one wait this long.
WAIT_NOTICE_S = 1.0


def await_study(store: Any, name: str, wait_s: float | None = None,
                on_wait: Callable[[str], None] | None = None) -> bool | Abandoned:
    """Wait until study ``name`` is complete (a creator may be between its row and Optuna's
    study); True when it is, False when it turned out not to exist (its creator undid a
    failed creation: the caller may create it), :class:`Abandoned` when a creation stood
    still for ``wait_s`` (default :data:`STUDY_ROW_WAIT_S`, counted from when this process
    first saw that creation): the caller may take it over. The store's not-evotuner (or
    damaged-row) error at once when no creation is under way: the row comes first, so a name
    Optuna alone holds is another application's study. A wait past :data:`WAIT_NOTICE_S` is
    told once to ``on_wait`` (what the wait is for and its longest remaining length)."""
    wait_s = STUDY_ROW_WAIT_S if wait_s is None else wait_s
    pause = 0.02
    started, told = time.monotonic(), False
    while True:
        try:
            store.study_info(name)
            return True
        except StorageError:
            if not store.study_exists(name):
                return False
            under_way = store.creation_under_way(name)
            if under_way is None:
                store.study_info(name)   # completed just now; else the store's error
                return True
            deadline = _since(store, name, under_way) + wait_s
            now = time.monotonic()
            if deadline <= now:
                return Abandoned(under_way)
            if on_wait is not None and not told and now - started >= WAIT_NOTICE_S:
                told = True
                on_wait(f"study '{name}' is being created by another process, which has not finished: waiting up "
                        f"to {deadline - now:.0f} s more for it (a creation that stands still that long is taken over)")
        time.sleep(pause)
        pause = min(0.25, pause * 1.5)   # a creator takes milliseconds; a long wait need not hammer the lock
