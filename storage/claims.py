"""Claims: one row per (study, key) decides which worker does a thing, so several workers
on one study never do it twice (table ``evotuner_claims``).

Kinds and keys:

* ``slot:<id>`` -- one of the study's ``--trials`` finished trials. A worker claims a slot
  *before* it asks Optuna for a trial, binds the trial's number to it after the ask, and
  marks it ``done`` once the trial is told. Slots are claimed under a lock on the study's
  ``evotuner_studies`` row (``SELECT ... FOR UPDATE``; SQLite's ``BEGIN IMMEDIATE``
  serialises every writer anyway), so held + done slots never exceed the target: the
  budget is global, however many workers run. A slot whose worker died or left before
  its trial was told is not deleted but passed on (:func:`hand_on`): held by nobody (the
  *pool*), the next slot claimed is that one.
* ``config:<config>`` -- who builds and measures a config. The first worker to insert the
  row owns it; any other that proposes the config copies the owner's result
  (``duplicate_of``) once the claim is ``done``.
* ``seat:<k>`` -- a live worker's seat; seat k runs the seed derived for k (seat 0: the
  study's own seed). Released when the worker leaves.
* once-keys (``start``, ``baselines:<device identity>``) -- done at most once per study.

A held claim belongs to a worker (``evotuner_workers``); when that worker is found dead
(:func:`evotuner.storage.liveness.reap`) or leaves, its slots are passed on, marked done
for a trial it managed to tell, and its other held claims deleted. Claims never touch
Optuna's tables.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Iterable

from sqlalchemy import and_, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from evotuner.errors import StorageError
from evotuner.storage import schema
from evotuner.storage.dbclock import db_now
from evotuner.storage.identity import device_identity

SLOT, CONFIG, SEAT, ONCE = "slot", "config", "seat", "once"
HELD, DONE = "held", "done"

C = schema.claims


@dataclass(frozen=True)
class Claim:
    key: str
    kind: str
    worker_id: int | None
    trial_number: int | None
    state: str
    worker_state: str | None     # live | done | dead of the holder (None: no worker)


def config_key(config: object) -> str:
    return f"config:{config}"


def baselines_key(fingerprint: Any) -> str:
    """The once-key of the SDPA baselines on a device (its identity, as record_device's)."""
    return f"baselines:{device_identity(fingerprint) if fingerprint is not None else 'none'}"


def study_id(s: Session, name: str, *, lock: bool = False) -> int:
    query = select(schema.studies.c.id).where(schema.studies.c.name == name)
    if lock:
        query = query.with_for_update()
    found = s.execute(query).scalar()
    if found is None:
        raise StorageError(f"study '{name}' not found", "start it with `evotuner search`")
    return int(found)


class WorkerGone(StorageError):
    """The worker is no longer live (it was reaped, or left): it must not claim anything."""


def _require_live(s: Session, worker_id: int | None) -> None:
    """Refuse a claim by a worker that is not live. The row is read FOR SHARE (PostgreSQL),
    so a concurrent reaper's update waits for this claim to commit and then sees it;
    SQLite serialises every writer anyway."""
    if worker_id is None:
        return
    state = s.execute(select(schema.workers.c.state).where(schema.workers.c.id == worker_id)
                      .with_for_update(read=True)).scalar()
    if state != "live":
        raise WorkerGone(f"worker {worker_id} is {state or 'unknown'}", "join the study again")


def _is_conflict(err: StorageError) -> bool:
    return isinstance(err.__cause__, IntegrityError)


def claim(store: Any, study: str, key: str, kind: str, worker_id: int | None, *,
          trial_number: int | None = None, state: str = HELD) -> bool:
    """Insert the claim row; True when this call got it, False when someone holds it."""
    try:
        with store.session() as s:
            sid = study_id(s, study)
            _require_live(s, worker_id)
            s.execute(insert(C).values(study_id=sid, kind=kind, key=key, worker_id=worker_id,
                                       trial_number=trial_number, state=state, created=db_now(s)))
        return True
    except WorkerGone:
        raise
    except StorageError as err:
        if _is_conflict(err):
            return False
        raise


def owner(store: Any, study: str, key: str) -> Claim | None:
    """The claim on ``key`` and its holder's state; None when nobody holds it."""
    with store.session() as s:
        sid = study_id(s, study)
        row = s.execute(
            select(C.c.key, C.c.kind, C.c.worker_id, C.c.trial_number, C.c.state, schema.workers.c.state)
            .select_from(C.outerjoin(schema.workers, schema.workers.c.id == C.c.worker_id))
            .where(C.c.study_id == sid, C.c.key == key)
        ).first()
    return Claim(*row) if row is not None else None


def finish(store: Any, study: str, key: str, worker_id: int, trial_number: int | None = None) -> bool:
    """Mark this worker's held claim done; False when it no longer holds it (reaped)."""
    values: dict[str, Any] = {"state": DONE}
    if trial_number is not None:
        values["trial_number"] = trial_number
    with store.session() as s:
        sid = study_id(s, study)
        result = s.execute(update(C).where(C.c.study_id == sid, C.c.key == key, C.c.worker_id == worker_id,
                                           C.c.state == HELD).values(**values))
    return result.rowcount == 1


def release(store: Any, study: str, key: str, worker_id: int) -> bool:
    """Give up this worker's held claim (another worker may take it)."""
    with store.session() as s:
        sid = study_id(s, study)
        result = s.execute(delete(C).where(C.c.study_id == sid, C.c.key == key, C.c.worker_id == worker_id,
                                           C.c.state == HELD))
    return result.rowcount == 1


# -- slots: the global budget ----------------------------------------------------------------

def _slot_count(s: Session, sid: int) -> int:
    return int(s.execute(select(func.count()).select_from(C).where(C.c.study_id == sid, C.c.kind == SLOT)).scalar())


def _slot_key() -> str:
    return f"slot:{uuid.uuid4().hex}"


def _pooled(sid: int) -> Any:
    """A slot a worker gave up before filling it (it died or left): held by nobody."""
    return and_(C.c.study_id == sid, C.c.kind == SLOT, C.c.state == HELD, C.c.worker_id.is_(None))


def claim_slot(store: Any, study: str, worker_id: int, target: int, *, pooled: bool = True) -> str | None:
    """Claim one of the study's ``target`` slots for this worker -- a pooled one first (see
    :func:`hand_on`), else a new one; returns its key, or None when the slots that are done
    or held by workers already reach the target. ``pooled=False``: a new slot only, None
    when the pool fills the rest of the target (a slot to queue a trial in must not be one a
    queued trial already waits for)."""
    with store.session() as s:
        sid = study_id(s, study, lock=True)       # serialises slot claims on this study
        _require_live(s, worker_id)
        pool = s.execute(select(C.c.key).where(_pooled(sid)).order_by(C.c.id)).scalars().all()
        total = _slot_count(s, sid)
        if total - len(pool) >= target or (not pooled and total >= target):
            return None
        if pooled and pool:
            s.execute(update(C).where(C.c.study_id == sid, C.c.key == pool[0])
                      .values(worker_id=worker_id, trial_number=None, created=db_now(s)))
            return str(pool[0])
        key = _slot_key()
        s.execute(insert(C).values(study_id=sid, kind=SLOT, key=key, worker_id=worker_id,
                                   trial_number=None, state=HELD, created=db_now(s)))
    return key


def bind_slot(store: Any, study: str, slot: str, worker_id: int, trial_number: int) -> bool:
    """Record which trial fills this worker's held slot (right after the ask)."""
    with store.session() as s:
        sid = study_id(s, study)
        result = s.execute(update(C).where(C.c.study_id == sid, C.c.key == slot,
                                           C.c.worker_id == worker_id, C.c.state == HELD)
                           .values(trial_number=trial_number))
    return result.rowcount == 1


def slot_counts(store: Any, study: str) -> tuple[int, int]:
    """(done, held) slots of the study."""
    with store.session() as s:
        sid = study_id(s, study)
        rows = s.execute(select(C.c.state, func.count()).where(C.c.study_id == sid, C.c.kind == SLOT)
                         .group_by(C.c.state)).all()
    counts = {state: int(n) for state, n in rows}
    return counts.get(DONE, 0), counts.get(HELD, 0)


def adopt(store: Any, study: str, finished_numbers: Iterable[int]) -> int:
    """Give every finished trial that fills no slot yet (a study older than the claims, or
    one run by an older evotuner) a done slot, so the budget counts it. Returns how many."""
    numbers = set(finished_numbers)
    if not numbers:
        return 0
    with store.session() as s:
        sid = study_id(s, study, lock=True)
        bound = set(s.execute(select(C.c.trial_number).where(C.c.study_id == sid, C.c.kind == SLOT,
                                                             C.c.trial_number.is_not(None))).scalars())
        missing = sorted(numbers - bound)
        now = db_now(s)
        for number in missing:
            s.execute(insert(C).values(study_id=sid, kind=SLOT, key=_slot_key(), worker_id=None,
                                       trial_number=number, state=DONE, created=now))
    return len(missing)


def claim_seat(store: Any, study: str, worker_id: int) -> int:
    """The lowest seat no live worker holds, claimed for this worker."""
    with store.session() as s:
        sid = study_id(s, study, lock=True)
        _require_live(s, worker_id)
        keys = s.execute(select(C.c.key).where(C.c.study_id == sid, C.c.kind == SEAT)).scalars()
        taken = {int(k.split(":", 1)[1]) for k in keys}
        seat = next(n for n in range(len(taken) + 1) if n not in taken)
        s.execute(insert(C).values(study_id=sid, kind=SEAT, key=f"seat:{seat}", worker_id=worker_id,
                                   state=HELD, created=db_now(s)))
    return seat


def held_by(s: Session, worker_id: int) -> list[Any]:
    return s.execute(select(C).where(C.c.worker_id == worker_id, C.c.state == HELD)).all()


def hand_on(s: Session, worker_id: int, *, heir: int | None = None, keep_done: Iterable[int] = ()) -> list[str]:
    """A worker's held claims end (it died or left): those bound to ``keep_done`` trial
    numbers become done (it told them); its other slots pass, unbound, to worker ``heir``
    (None: to the pool, where the next :func:`claim_slot` takes them); every other claim it
    holds is deleted. Returns the keys of the slots passed on.

    Slots are passed on rather than deleted so that a trial queued again for a dead worker's
    config (:func:`evotuner.storage.liveness.reap`) always has a slot to be asked in: deleted,
    another worker could claim the freed budget and ask fresh trials first, and the queued
    trial would stay WAITING in a study whose budget is done."""
    keep = set(keep_done)
    if keep:
        s.execute(update(C).where(C.c.worker_id == worker_id, C.c.state == HELD,
                                  C.c.trial_number.in_(keep)).values(state=DONE))
    slots = list(s.execute(select(C.c.key).where(C.c.worker_id == worker_id, C.c.state == HELD,
                                                  C.c.kind == SLOT).order_by(C.c.id)).scalars())
    if slots:
        s.execute(update(C).where(C.c.worker_id == worker_id, C.c.state == HELD, C.c.kind == SLOT)
                  .values(worker_id=heir, trial_number=None))
    s.execute(delete(C).where(and_(C.c.worker_id == worker_id, C.c.state == HELD)))
    return slots


def pool(store: Any, study: str, keys: Iterable[str], worker_id: int) -> None:
    """Put this worker's unbound held slots ``keys`` in the pool (after it queued the trials
    they were passed on for)."""
    keys = list(keys)
    if not keys:
        return
    with store.session() as s:
        sid = study_id(s, study)
        s.execute(update(C).where(C.c.study_id == sid, C.c.key.in_(keys), C.c.worker_id == worker_id,
                                  C.c.state == HELD, C.c.trial_number.is_(None)).values(worker_id=None))
