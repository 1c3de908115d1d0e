"""Liveness: workers register, heartbeat, and are reaped only when they are dead.

Each process (or, with ``--gpus``, each measure thread) working on a study has a row in
``evotuner_workers`` with a heartbeat written in the **database's** clock (epoch
seconds), so hosts whose clocks disagree still judge staleness alike. A worker is dead
when

* its heartbeat is older than the ``stale_after`` seconds it declared itself, or
* it runs on this very machine (same boot id and pid namespace) and its process is gone
  (no such pid, or a pid reused by a process that started at another time): a killed
  process is taken over at once instead of after ``stale_after``.

Reaping is a conditional update (``state = 'dead' WHERE state = 'live' AND <still
stale>``): of several reapers exactly one wins, and a worker that heartbeats in time
is never reaped. The winner tells the dead worker's RUNNING trials whose measurement it
recorded (it died before the tell) from that record, fails its other RUNNING trials
(Optuna's own conditional update: a trial told meanwhile stays as told), marks claims of
trials now told as done, queues the failed configs again and passes the worker's other
slots on (claims.hand_on), and deletes its other claims, so its slots and configs go
to the living. A RUNNING trial bound to no slot (its process died between the ask and
the bind, or an evotuner before claims left it) is failed once no live worker is in
the middle of an ask.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState
from sqlalchemy import insert, literal_column, select, update
from sqlalchemy.orm import Session

from evotuner.config import KernelConfig, config_string
from evotuner.storage import claims, schema
from evotuner.storage.dbclock import db_now, epoch_sql as _epoch_sql  # noqa: F401 (db_now re-exported)
from evotuner.storage.records import INTERRUPTED_REASON, REASON_ATTR, Zombie, is_finished
from evotuner.vocabulary import CONFIG_ATTR, DEVICE_ATTR, RECOVERED_ATTR

W = schema.workers
LIVE, DONE, DEAD = "live", "done", "dead"


@lru_cache(maxsize=1)
def host_key() -> str:
    """This machine and pid namespace: processes with equal keys can see each other's pids."""
    try:
        boot = open("/proc/sys/kernel/random/boot_id", encoding="ascii").read().strip()
    except OSError:
        boot = socket.gethostname()
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        ns = "?"
    return f"{boot}/{ns}"


def proc_start(pid: int) -> str:
    """The process's start time in clock ticks since boot ('' when unknown)."""
    try:
        stat = open(f"/proc/{pid}/stat", encoding="ascii", errors="replace").read()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def process_gone(pid: int, started: str) -> bool:
    """True only when the process ``pid`` that started at ``started`` surely no longer runs."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    now = proc_start(pid)
    return bool(started) and bool(now) and now != started


@dataclass(frozen=True)
class WorkerRow:
    id: int
    host: str
    host_key: str
    pid: int
    proc_start: str
    seat: int | None
    seed: int | None
    device: str | None
    state: str
    stale_after: float
    heartbeat: float
    age: float           # seconds since its last heartbeat, by the database's clock
    reason: str | None = None   # why it ended


def register(store: Any, study: str, *, stale_after: float, device: Any = None) -> int:
    """A new live worker row for this process; returns its id."""
    with store.session() as s:
        sid = claims.study_id(s, study)
        now = db_now(s)
        return int(s.execute(insert(W).values(
            study_id=sid, host=socket.gethostname(), host_key=host_key(), pid=os.getpid(),
            proc_start=proc_start(os.getpid()), device=json.dumps(device, sort_keys=True, default=str) if device else None,
            state=LIVE, stale_after=float(stale_after), started=now, heartbeat=now,
        )).inserted_primary_key[0])


def set_seat(store: Any, worker_id: int, seat: int, seed: int | None) -> None:
    with store.session() as s:
        s.execute(update(W).where(W.c.id == worker_id).values(seat=seat, seed=seed))


def set_device(store: Any, worker_id: int, device: Any) -> None:
    """Record the device this worker measures on (name, index)."""
    with store.session() as s:
        s.execute(update(W).where(W.c.id == worker_id).values(device=json.dumps(device, sort_keys=True, default=str)))


def heartbeat(store: Any, worker_id: int) -> bool:
    """Touch this worker's heartbeat; False when it was reaped (it must not go on as itself)."""
    with store.session() as s:
        result = s.execute(update(W).where(W.c.id == worker_id, W.c.state == LIVE)
                           .values(heartbeat=_epoch_sql(s.get_bind().dialect.name)))
    return result.rowcount == 1


def leave(store: Any, worker_id: int, reason: str = "done") -> None:
    """This worker ends: its unfilled slots go to the pool, its other held claims back, its
    row says why."""
    with store.session() as s:
        claims.hand_on(s, worker_id)
        s.execute(update(W).where(W.c.id == worker_id, W.c.state == LIVE)
                  .values(state=DONE, ended=db_now(s), reason=reason))


def workers(store: Any, study: str, *, live_only: bool = True) -> list[WorkerRow]:
    with store.session() as s:
        sid = claims.study_id(s, study)
        now = db_now(s)
        query = select(W).where(W.c.study_id == sid)
        if live_only:
            query = query.where(W.c.state == LIVE)
        rows = s.execute(query.order_by(W.c.id)).all()
    return [WorkerRow(r.id, r.host, r.host_key, r.pid, r.proc_start, r.seat, r.seed, r.device, r.state,
                      r.stale_after, r.heartbeat, now - r.heartbeat, r.reason) for r in rows]


def _mark_dead(store: Any, w: WorkerRow, why: str, *, by_heartbeat: bool) -> bool:
    with store.session() as s:
        cond = [W.c.id == w.id, W.c.state == LIVE]
        if by_heartbeat:
            cond.append(W.c.heartbeat < _epoch_sql(s.get_bind().dialect.name) - W.c.stale_after)
        else:
            cond.append(W.c.heartbeat == w.heartbeat)
        result = s.execute(update(W).where(*cond).values(state=DEAD, ended=db_now(s), reason=why))
    return result.rowcount == 1


def reap(store: Any, study: str, *, exclude: int | None = None, target: int | None = None) -> list[Zombie]:
    """Reap every dead worker of ``study`` and the RUNNING trials nobody owns; returns the
    trials failed, oldest first (a dead worker's trial whose measurement it recorded is
    told from that record instead: :func:`_tell_recorded`).

    ``exclude`` is the reaping worker: the dead workers' unfilled slots pass to it, it queues
    the failed trials' configs again (``requeue``: a WAITING trial each) and only then puts
    those slots in the pool. Each queued trial takes one slot passed on, or -- for a trial
    nobody's slot held (its asker died before binding it) -- a new slot of the study's
    ``target`` claimed for it, and is not queued when neither is left: a queued trial thus
    always has a slot to be asked in, whoever asks first (claims.hand_on). Without
    ``exclude`` the slots go to the pool and nothing is queued."""
    dead: dict[int, str | None] = {}      # worker id -> the device it measured on
    for w in workers(store, study):
        if w.id == exclude:
            continue
        if w.age > w.stale_after:
            why, by_heartbeat = f"reaped: no heartbeat for {w.age:.1f} s (stale after {w.stale_after:g} s)", True
        elif w.host_key == host_key() and process_gone(w.pid, w.proc_start):
            why, by_heartbeat = f"reaped: process {w.pid} on this host is gone", False
        else:
            continue
        if _mark_dead(store, w, why, by_heartbeat=by_heartbeat):
            dead[w.id] = w.device

    failed: list[Any] = []
    told: dict[int, set[int]] = {}
    oid, trials = store.optuna_trials(study) if dead else (None, [])
    by_number = {t.number: t for t in trials}
    for worker_id in dead:
        with store.session() as s:
            held = claims.held_by(s, worker_id)
        told[worker_id] = set()
        bound = [by_number[c.trial_number] for c in held
                 if c.kind == claims.SLOT and c.trial_number in by_number]
        recorded = store.recorded_outcomes(study, [t.number for t in bound if t.state == TrialState.RUNNING])
        for t in bound:
            if t.state == TrialState.RUNNING:
                if t.number in recorded and _tell_recorded(store, t, recorded[t.number], dead[worker_id], exclude):
                    told[worker_id].add(t.number)
                    continue
                if _fail(store, t):
                    failed.append(t)
                    continue
            if _told(store, oid, t.number):
                told[worker_id].add(t.number)

    # RUNNING trials bound to no slot: their asker died before binding (or predates claims).
    with store.session() as s:
        oid = s.execute(select(schema.studies.c.optuna_study_id).where(schema.studies.c.name == study)).scalar()
    running = store.optuna_storage.get_all_trials(oid, deepcopy=False, states=(TrialState.RUNNING,))
    if running:
        with store.session() as s:
            sid = claims.study_id(s, study)
            # ONE statement, so bound and asking come from one snapshot (read separately, a bind
            # landing in between would make a live worker's fresh trial look like an orphan)
            slots = s.execute(
                select(claims.C.c.trial_number, claims.C.c.state, W.c.state)
                .select_from(claims.C.outerjoin(W, W.c.id == claims.C.c.worker_id))
                .where(claims.C.c.study_id == sid, claims.C.c.kind == claims.SLOT)).all()
        bound = {number for number, _, _ in slots if number is not None}
        asking = any(number is None and state == claims.HELD and holder == LIVE for number, state, holder in slots)
        if not asking:
            failed.extend(t for t in running if t.number not in bound and _fail(store, t))
    handed: list[str] = []          # after the orphans: the dead's unbound slots, passed on, are not "asking"
    for worker_id, numbers in told.items():
        with store.session() as s:
            handed += claims.hand_on(s, worker_id, heir=exclude, keep_done=numbers)
    zombies = _zombies(store, study, sorted(failed, key=lambda t: t.number))
    if exclude is None:
        return [replace(z, requeue=False) for z in zombies]
    slots, out, queued = list(handed), [], []
    for z in zombies:
        if z.requeue and len(queued) == len(slots):      # every slot in hand has its trial: one more
            extra = _new_slot(store, study, exclude, target)
            if extra is None:
                z = replace(z, requeue=False)
            else:
                slots.append(extra)
        if z.requeue:
            queued.append(z.params)
        out.append(z)
    if queued:
        optuna_study = store.optuna_study(study)
        for params in queued:
            optuna_study.enqueue_trial(params)
    claims.pool(store, study, slots, exclude)
    return out


def _new_slot(store: Any, study: str, worker_id: int, target: int | None) -> str | None:
    """A new slot of the study's ``target`` for the reaper to queue a trial in, or None."""
    if target is None:
        return None
    try:
        return claims.claim_slot(store, study, worker_id, target, pooled=False)
    except claims.WorkerGone:
        return None


def _told(store: Any, oid: int, number: int) -> bool:
    storage = store.optuna_storage
    t = storage.get_trial(storage.get_trial_id_from_study_id_trial_number(oid, number))
    return is_finished(t)


def _tell_recorded(store: Any, t: Any, outcome: Any, device: str | None, reaper: int | None) -> bool:
    """Tell a dead worker's RUNNING trial the outcome it recorded before it died (between the
    record and the tell): the measurement is neither lost nor taken again. False when the
    trial was told meanwhile."""
    attrs: dict[str, Any] = {CONFIG_ATTR: KernelConfig.parse(outcome.config).as_dict(), **outcome.attrs,
                             RECOVERED_ATTR: f"measured by a worker that died before telling it; told by worker {reaper}"}
    if outcome.reason is not None:
        attrs[REASON_ATTR] = outcome.reason
    tag = _device_tag(device)
    if tag:
        attrs[DEVICE_ATTR] = tag
    storage = store.optuna_storage
    try:
        for key, value in attrs.items():
            storage.set_trial_user_attr(t._trial_id, key, value)
        if outcome.state == "COMPLETE":
            return bool(storage.set_trial_state_values(t._trial_id, TrialState.COMPLETE, [outcome.value]))
        return bool(storage.set_trial_state_values(t._trial_id, TrialState.FAIL))
    except UpdateFinishedTrialError:
        return False


def _device_tag(device: str | None) -> dict[str, Any]:
    """The ``device`` attr the loop writes (name, index) from a worker row's device JSON."""
    try:
        found = json.loads(device) if device else {}
    except ValueError:
        return {}
    return {k: found[k] for k in ("name", "device_index") if isinstance(found, dict) and found.get(k) is not None}


def _fail(store: Any, t: Any) -> bool:
    """Fail a RUNNING trial as interrupted; False when it was told meanwhile."""
    storage = store.optuna_storage
    try:
        storage.set_trial_user_attr(t._trial_id, REASON_ATTR, INTERRUPTED_REASON)
        storage.set_trial_system_attr(t._trial_id, "fail_reason", INTERRUPTED_REASON)
        return bool(storage.set_trial_state_values(t._trial_id, TrialState.FAIL))
    except UpdateFinishedTrialError:
        return False


def _zombies(store: Any, study: str, failed: list[Any]) -> list[Zombie]:
    """The failed trials as zombies; ``requeue`` where their config may be queued again."""
    if not failed:
        return []
    _, trials = store.optuna_trials(study)
    done = {config_string(t.params) for t in trials if is_finished(t)}
    waiting = {config_string(t.params or t.system_attrs.get("fixed_params") or {})
               for t in trials if t.state == TrialState.WAITING}
    out, seen = [], set()
    for t in failed:
        params = dict(t.params) or dict(t.system_attrs.get("fixed_params") or {})
        cfg = config_string(params)
        requeue = bool(params) and cfg not in done and cfg not in waiting and cfg not in seen
        out.append(Zombie(number=t.number, params=params, requeue=requeue))
        seen.add(cfg)
    return out
