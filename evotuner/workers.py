"""One worker on a study, among any number of others: budget, claims, heartbeat, seed.

The database's coordinator (:class:`evotuner.coordinator.StudyCoordinator`, the loop's one
way to the other searches of its study) asks a :class:`StudyWorker` before the loop does
anything that must happen once per study, and the worker answers from the database
(:mod:`evotuner.storage.claims`, :mod:`evotuner.storage.liveness`):

* **budget** -- :meth:`claim_slot` before each ask; ``None`` means the study's
  ``--trials`` are all done or held by workers that are alive;
* **claim before build** -- :meth:`claim_config` before a config is built: ``None``
  means this worker owns it, else the owner's claim (copy its result once done);
* **once** -- the start config and the SDPA baselines of a device (:meth:`once`);
* **liveness** -- a heartbeat thread; :meth:`reap` takes over dead workers' trials.
  A worker that finds it was reaped (it stalled longer than ``stale_after``) sets
  :attr:`reaped`; the loop drops what it had in flight and the coordinator calls :meth:`rejoin`;
* **seed** -- each live worker holds a seat; seat 0 runs the study's seed, seat k a
  seed derived from it (:func:`derive_seed`), recorded in ``evotuner_workers``.

A lone worker behaves exactly as before: seat 0, the study's seed, every claim won.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from typing import Any

from evotuner.storage import claims as _claims
from evotuner.storage import liveness as _live
from evotuner.storage.records import Zombie

#: Seconds without a heartbeat after which other workers take a worker's trials over.
DEFAULT_STALE_AFTER_S = 60.0
#: A worker heartbeats this many times per ``stale_after``.
BEATS_PER_WINDOW = 6
#: How often a waiting worker looks at the database again.
POLL_S = 0.05


def derive_seed(seed: int | None, seat: int) -> int | None:
    """The sampler seed of seat ``seat``: the study's own for seat 0, else a hash of both."""
    if seed is None or seat == 0:
        return seed
    digest = hashlib.sha256(f"evotuner-seat:{seed}:{seat}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


class StudyWorker:
    """This process's (or this measure thread's) membership of study ``study``.

    Use as a context manager, or call :meth:`join` and :meth:`leave`."""

    def __init__(self, store: Any, study: str, *, stale_after: float | None = None,
                 device: Any = None, seat: bool = True) -> None:
        self.store = store
        self.study = study
        self.stale_after = float(stale_after or DEFAULT_STALE_AFTER_S)
        if self.stale_after <= 0:
            raise ValueError("stale_after must be positive")
        self.device = device
        self.want_seat = seat
        self.id: int | None = None
        self.seat: int | None = None
        self.reaped = False
        self._slots: dict[int, str] = {}         # trial number -> slot key
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._last_reap = 0.0

    # -- membership ------------------------------------------------------------------------

    def join(self) -> "StudyWorker":
        self.id = _live.register(self.store, self.study, stale_after=self.stale_after, device=self.device)
        self.reaped = False
        self._slots.clear()
        if self.want_seat:
            self.seat = _claims.claim_seat(self.store, self.study, self.id)
        if self._beat is None:
            self._stop.clear()
            self._beat = threading.Thread(target=self._heartbeat, name=f"evotuner-heartbeat-{self.id}", daemon=True)
            self._beat.start()
        return self

    def seed_for(self, seed: int | None) -> int | None:
        """This worker's sampler seed (recorded with it)."""
        mine = derive_seed(seed, self.seat or 0)
        if self.id is not None:
            _live.set_seat(self.store, self.id, self.seat if self.seat is not None else -1, mine)
        return mine

    def rejoin(self) -> None:
        """Go on under a new identity after being reaped (the old one's claims are gone)."""
        self.join()

    def leave(self, reason: str = "done") -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
            self._beat = None
        if self.id is not None:
            try:
                _live.leave(self.store, self.id, reason)
            except Exception:  # noqa: BLE001 -- best effort at exit; a reaper cleans up otherwise
                pass

    def __enter__(self) -> "StudyWorker":
        return self.join()

    def __exit__(self, exc_type: Any, *rest: object) -> None:
        self.leave("done" if exc_type is None else f"ended by {exc_type.__name__}")

    def _heartbeat(self) -> None:
        interval = max(0.1, self.stale_after / BEATS_PER_WINDOW)
        while not self._stop.wait(interval):
            try:
                if self.id is not None and not _live.heartbeat(self.store, self.id):
                    self.reaped = True
            except Exception:  # noqa: BLE001 -- a busy database: beat again next time
                pass

    def set_device(self, device: dict[str, Any]) -> None:
        self.device = device
        _live.set_device(self.store, self._id(), device)

    def other_devices(self) -> list[dict[str, Any]]:
        """The devices the study's other live workers measure on (as they recorded them)."""
        out = []
        for w in _live.workers(self.store, self.study):
            if w.id != self.id and w.device:
                try:
                    out.append(dict(json.loads(w.device)))
                except (ValueError, TypeError):
                    continue
        return out

    def alone(self) -> bool:
        """True when no other live worker runs this study (then every RUNNING trial is this one's)."""
        return all(w.id == self.id for w in _live.workers(self.store, self.study))

    # -- reaping ---------------------------------------------------------------------------

    def reap(self, *, every: float | None = None, target: int | None = None) -> list[Zombie]:
        """Take over dead workers' trials (at most once per ``every`` seconds when given);
        ``target``: the study's trials, within which a trial nobody's slot held may be queued
        again (liveness.reap)."""
        now = time.monotonic()
        if every is not None and now - self._last_reap < every:
            return []
        self._last_reap = now
        return _live.reap(self.store, self.study, exclude=self.id, target=target)

    @property
    def reap_every(self) -> float:
        return max(0.2, min(2.0, self.stale_after / BEATS_PER_WINDOW))

    # -- budget ----------------------------------------------------------------------------

    def claim_slot(self, target: int) -> str | None:
        """A budget slot, or None (none free now, or this worker was reaped: see ``reaped``)."""
        try:
            return _claims.claim_slot(self.store, self.study, self._id(), target)
        except _claims.WorkerGone:
            self.reaped = True
            return None

    def bind(self, slot: str, trial_number: int) -> None:
        self._slots[trial_number] = slot
        _claims.bind_slot(self.store, self.study, slot, self._id(), trial_number)

    def finish_trial(self, trial_number: int) -> None:
        slot = self._slots.pop(trial_number, None)
        if slot is not None:
            _claims.finish(self.store, self.study, slot, self._id(), trial_number)

    def drop_trial(self, trial_number: int, config: Any = None) -> None:
        """A trial of this worker was failed by a reaper: give its slot (and its config, when
        this worker owned it) back, so the budget and the config go to whoever can finish them."""
        slot = self._slots.pop(trial_number, None)
        if slot is not None and self.id is not None:
            _claims.release(self.store, self.study, slot, self.id)
        if config is not None and self.id is not None:
            _claims.release(self.store, self.study, _claims.config_key(config), self.id)

    def slots(self) -> tuple[int, int]:
        """(done, held) slots of the study."""
        return _claims.slot_counts(self.store, self.study)

    def adopt(self, finished_numbers: Any) -> int:
        return _claims.adopt(self.store, self.study, finished_numbers)

    # -- configs and once-things -----------------------------------------------------------

    def claim_config(self, config: Any, trial_number: int) -> _claims.Claim | None:
        """None: this worker owns ``config`` now; else who does."""
        key = _claims.config_key(config)
        gone = _claims.Claim(key, _claims.CONFIG, None, None, _claims.HELD, None)
        try:
            if _claims.claim(self.store, self.study, key, _claims.CONFIG, self._id(), trial_number=trial_number):
                return None
            found = _claims.owner(self.store, self.study, key)
            if found is None:   # released between the insert and the read: try once more
                if _claims.claim(self.store, self.study, key, _claims.CONFIG, self._id(),
                                 trial_number=trial_number):
                    return None
                found = _claims.owner(self.store, self.study, key)
        except _claims.WorkerGone:
            self.reaped = True   # the loop drops this trial and rejoins
            return gone
        return found or gone

    def config_owner(self, config: Any) -> _claims.Claim | None:
        return _claims.owner(self.store, self.study, _claims.config_key(config))

    def holds_config(self, config: Any) -> bool:
        found = self.config_owner(config)
        return found is not None and found.worker_id == self.id and found.state == _claims.HELD

    def finish_config(self, config: Any, trial_number: int) -> None:
        _claims.finish(self.store, self.study, _claims.config_key(config), self._id(), trial_number)

    def once(self, key: str, *, done: bool = False) -> bool:
        """Claim once-key ``key`` (held, or straight away done); True when this worker got it."""
        try:
            return _claims.claim(self.store, self.study, key, _claims.ONCE, self._id(),
                                 state=_claims.DONE if done else _claims.HELD)
        except _claims.WorkerGone:
            self.reaped = True
            return False

    def once_state(self, key: str) -> str | None:
        """``held`` or ``done`` for once-key ``key``; None when nobody holds it (never claimed,
        released, or its holder was reaped)."""
        found = _claims.owner(self.store, self.study, key)
        return found.state if found is not None else None

    def finish_once(self, key: str) -> None:
        _claims.finish(self.store, self.study, key, self._id())

    def release_once(self, key: str) -> None:
        _claims.release(self.store, self.study, key, self._id())

    def _id(self) -> int:
        if self.id is None:
            raise RuntimeError("StudyWorker.join() first")
        return self.id
