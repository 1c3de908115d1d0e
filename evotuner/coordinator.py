"""The coordinator: everything one search must agree on with the other searches of its study.

The search loop (:mod:`evotuner.loop`) is a pipeline: space -> propose -> build -> gate ->
measure -> record. Several searches -- processes, hosts, or ``--gpus`` threads -- may run one
study at once; whatever they must agree on (the budget, who builds a config, who does a
once-per-study thing, what becomes of the trials of a search that died) goes through one
:class:`Coordinator`, as an Optuna study goes through its ``BaseStorage``. The loop calls it
and assumes what each method of :class:`Coordinator` promises, nothing more; it never reads
the claims or workers tables itself.

Two implementations:

* :class:`StudyCoordinator` -- the database's, over a :class:`~evotuner.workers.StudyWorker`
  (``evotuner_workers`` and ``evotuner_claims``). Every search made by ``run_search`` or the
  CLI uses it: a plain ``search`` may share its study with other processes at any time, and
  cannot know that it is alone.
* :class:`LocalCoordinator` -- one search alone on its study, in memory: every claim is won,
  nothing is ever taken from it, it never waits. For a caller that knows nothing else opens
  the study (a benchmark on a fresh file, the tests): ``run_search(worker=LocalCoordinator(...))``.

A lone :class:`StudyCoordinator` answers as a :class:`LocalCoordinator` does, but that it
queues the configs of a killed run's trials again (tests/test_coordinator.py runs the same
contract tests on both).
"""

from __future__ import annotations

import contextlib
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

from evotuner.storage import liveness
from evotuner.storage.claims import DONE, HELD, baselines_key  # noqa: F401 (baselines_key re-exported)
from evotuner.workers import POLL_S, StudyWorker

#: The once-key of a study's start (its start configs enqueued).
START = "start"


@dataclass(frozen=True)
class Follow:
    """:meth:`Coordinator.follow`'s answer for a config another search owned."""

    build: bool = False             # its owner gave it up: this search owns it now
    copy_of: int | None = None      # the trial that finished it: copy its result


class Coordinator(ABC):
    """What a search may assume of the other searches of its study; one instance per search.

    A search calls, in this order: :meth:`join`, :meth:`seed_for`, :meth:`take_over`,
    :meth:`start`, then per trial :meth:`claim_slot`, :meth:`bind`, :meth:`claim_config` (or
    :meth:`follow`), :meth:`holds`, :meth:`finish`, and :meth:`leave` at the end. Any method
    may block on the database and raise what it raises (a
    :class:`~evotuner.errors.StorageError`); none is thread-safe (``--gpus`` gives each
    thread its own). Any answer may be the one that finds this search was taken over
    (:attr:`reaped`); until the caller has called :meth:`rejoin`, the other answers are
    those of a search that holds nothing (no slot, no config, no once-key).
    """

    @contextlib.contextmanager
    def joined(self) -> Iterator["Coordinator"]:
        """:meth:`join`, then :meth:`leave` with why the block ended (``done``, ``interrupted
        by user``, ``ended by <exception>``)."""
        self.join()
        reason = "done"
        try:
            yield self
        except KeyboardInterrupt:
            reason = "interrupted by user"
            raise
        except BaseException as exc:
            reason = f"ended by {type(exc).__name__}"
            raise
        finally:
            self.leave(reason)

    # -- membership ------------------------------------------------------------------------

    @abstractmethod
    def join(self) -> None:
        """Become one of the study's searches. Called once, by whoever made the coordinator,
        before any other method."""

    @abstractmethod
    def leave(self, reason: str = "done") -> None:
        """Stop being one (``reason`` is recorded). Never raises; whatever this search held
        and did not finish passes to the others. Called once, by whoever joined."""

    @abstractmethod
    def seed_for(self, seed: int | None) -> int | None:
        """This search's sampler seed: ``seed`` for the study's first search, one derived
        from it for each other (recorded with the search)."""

    @property
    @abstractmethod
    def reaped(self) -> bool:
        """True once the other searches took this one's place (it stalled past its heartbeat
        window): every slot, config and trial it held is theirs. The caller drops everything
        it has in flight, untold, and calls :meth:`rejoin` before it asks again."""

    @abstractmethod
    def rejoin(self) -> None:
        """Go on as a new search of the study, holding nothing; :attr:`reaped` is False after."""

    @abstractmethod
    def take_over(self, target: int, *, lazily: bool = False) -> list[int]:
        """Fail the RUNNING trials no live search will finish (their search died, or none
        holds them) -- their configs may be queued again where the budget ``target`` has
        room -- and return their numbers. ``lazily``: do it at most once per the
        coordinator's own interval (else return []), so the caller may call it every turn."""

    @abstractmethod
    def pause(self) -> None:
        """Wait one polling interval (the caller then looks at the study again)."""

    @abstractmethod
    def alone(self) -> bool:
        """True when no other live search runs the study: every RUNNING trial is this one's."""

    @abstractmethod
    def measure_on(self, device: dict[str, Any]) -> set[str]:
        """Record the GPU this search measures on (``name``, ``device_index``); returns the
        GPU models the study's other live searches measure on."""

    # -- once per study --------------------------------------------------------------------

    @abstractmethod
    def start(self, *, is_new: Callable[[], bool], enqueue: Callable[[], None],
              wait: Callable[[], None]) -> None:
        """Called once, before the first ask. ``enqueue()`` (the start configs) runs in
        exactly one search of the study, and only while ``is_new()`` (it has no trial); every
        search returns only once that is done -- calling ``wait()`` between looks -- or at
        once for a study that is not new. No search asks before: the start trials cannot be
        left WAITING behind a budget the others claimed first. If ``enqueue()`` raises, the
        error propagates and another search may start the study."""

    @abstractmethod
    def once(self, key: str, run: Callable[[], None], *, ready: Callable[[], bool],
             wait: Callable[[], None] | None) -> bool:
        """``run()`` happens in one search of the study per ``key``, unless ``ready()`` (its
        result is there already). True once it has: here, or elsewhere and ``ready()`` says
        so (``wait()`` between looks); False only when ``wait`` is None and another search is
        running it now (ask again later). If ``run()`` raises, the error propagates and the
        key is free again."""

    # -- the budget ------------------------------------------------------------------------

    @abstractmethod
    def spent(self) -> int:
        """The study's finished trials that fill its budget (every search's)."""

    @abstractmethod
    def claim_slot(self, target: int) -> str | None:
        """A slot of the study's budget of ``target`` finished trials, for the next ask; None
        when every slot is done or held by a live search (or this search was taken over).
        Slots done and held never exceed ``target``, however many searches claim."""

    @abstractmethod
    def bind(self, slot: str, trial_number: int) -> None:
        """Tie the trial just asked to ``slot``. The slot counts towards :meth:`spent` once
        :meth:`finish` tells the trial; if this search dies first, the slot and the trial
        are taken over."""

    # -- configs and trials ----------------------------------------------------------------

    @abstractmethod
    def claim_config(self, config: Any, trial_number: int) -> bool:
        """True: this search now owns ``config`` -- it builds and measures it, for trial
        ``trial_number``, and no other search does. False: another search owns it (or this
        one was taken over); the caller :meth:`follow`s it instead of building it."""

    @abstractmethod
    def follow(self, config: Any, trial_number: int) -> Follow:
        """Where a config another search owned stands now: ``copy_of`` -- that search
        finished it with trial ``copy_of`` (copy that trial's result once it can be read);
        ``build`` -- its owner gave it up and this search owns it now, for trial
        ``trial_number``; neither -- still in hand (look again after a :meth:`pause`)."""

    @abstractmethod
    def holds(self, config: Any) -> bool:
        """Asked only of a config this search owns and has not finished (:meth:`claim_config`
        True, or :meth:`follow` ``build``): True while it still owns it. False: it was taken
        from this search -- whose :attr:`reaped` is True from then on -- and the caller
        neither measures nor records it: its new owner does."""

    @abstractmethod
    def finish(self, trial: Any, tell: Callable[[], None], *, built: Any = None) -> bool:
        """Tell ``trial`` (an Optuna trial this search asked): calls ``tell()`` -- the
        caller's write of its attributes and final state -- then counts its slot done and,
        given ``built`` (the config this trial built and measured), that config done with
        this trial's number, for the searches that follow it. True: told. False: another
        search had finished the trial first (taken over): nothing is counted, its slot and
        ``built`` go back, and the caller drops it. Raises what ``tell()`` raised when the
        trial is still running (the write failed for another reason)."""


class StudyCoordinator(Coordinator):
    """The database's coordinator (module docstring): claims and liveness through ``worker``,
    this search's membership of the study (a new :class:`StudyWorker` when None)."""

    def __init__(self, store: Any, study: str, *, worker: StudyWorker | None = None,
                 stale_after: float | None = None) -> None:
        self.store = store
        self.worker = worker if worker is not None else StudyWorker(store, study, stale_after=stale_after)

    def join(self) -> None:
        self.worker.join()

    def leave(self, reason: str = "done") -> None:
        self.worker.leave(reason)

    def seed_for(self, seed: int | None) -> int | None:
        return self.worker.seed_for(seed)

    @property
    def reaped(self) -> bool:
        return self.worker.reaped

    def rejoin(self) -> None:
        self.worker.rejoin()

    def take_over(self, target: int, *, lazily: bool = False) -> list[int]:
        every = self.worker.reap_every if lazily else None
        return [zombie.number for zombie in self.worker.reap(every=every, target=target)]

    def pause(self) -> None:
        time.sleep(POLL_S)

    def alone(self) -> bool:
        return self.worker.alone()

    def measure_on(self, device: dict[str, Any]) -> set[str]:
        self.worker.set_device(device)
        return {str(d["name"]) for d in self.worker.other_devices() if d.get("name")}

    def start(self, *, is_new: Callable[[], bool], enqueue: Callable[[], None],
              wait: Callable[[], None]) -> None:
        """The ``start`` key is held while ``enqueue`` runs (the transfer plan reads the
        database) and done after; the others wait while it is held. Asking meanwhile, they
        could claim the whole budget first, and the start trials, enqueued after, would stay
        WAITING (no search asks past the budget). A holder that dies is taken over (its key
        goes): a waiter then enqueues the start if the study still has no trial, and goes on
        without it if the holder had enqueued some."""
        while True:
            if is_new() and self.worker.once(START):
                self._run_held(START, enqueue)
                return
            if self.worker.reaped:
                self.worker.rejoin()
                continue
            state = self.worker.once_state(START)
            if state == DONE or (state is None and not is_new()):
                return      # started (or an older study, never given a start key)
            wait()

    def once(self, key: str, run: Callable[[], None], *, ready: Callable[[], bool],
             wait: Callable[[], None] | None) -> bool:
        while not ready():
            if self.worker.once(key):
                self._run_held(key, run)
                return True
            if wait is None:
                return False
            wait()
            if self.worker.reaped:
                self.worker.rejoin()
        return True

    def _run_held(self, key: str, run: Callable[[], None]) -> None:
        try:
            run()
        except BaseException:
            self.worker.release_once(key)
            raise
        self.worker.finish_once(key)

    def spent(self) -> int:
        return self.worker.slots()[0]

    def claim_slot(self, target: int) -> str | None:
        return self.worker.claim_slot(target)

    def bind(self, slot: str, trial_number: int) -> None:
        self.worker.bind(slot, trial_number)

    def claim_config(self, config: Any, trial_number: int) -> bool:
        return self.worker.claim_config(config, trial_number) is None

    def follow(self, config: Any, trial_number: int) -> Follow:
        owner = self.worker.config_owner(config)
        if owner is None:
            return Follow(build=self.worker.claim_config(config, trial_number) is None)
        if owner.state != DONE or owner.trial_number is None:
            return Follow()
        return Follow(copy_of=owner.trial_number)

    def holds(self, config: Any) -> bool:
        if self.worker.holds_config(config):
            return True
        self.worker.reaped = True   # certain: its claim is gone; the caller rejoins
        return False

    def finish(self, trial: Any, tell: Callable[[], None], *, built: Any = None) -> bool:
        try:
            tell()
        except (UpdateFinishedTrialError, ValueError):
            if self._state_of(trial) == TrialState.RUNNING:
                raise
            self.worker.drop_trial(trial.number, built)   # taken over: another search finishes it
            return False
        self.worker.finish_trial(trial.number)
        if built is not None:
            self.worker.finish_config(built, trial.number)
        return True

    def _state_of(self, trial: Any) -> TrialState:
        return self.store.optuna_storage.get_trial(trial._trial_id).state


class LocalCoordinator(Coordinator):
    """One search alone on study ``study`` of ``store``, in memory (module docstring).

    Its first :meth:`take_over` fails what an earlier, killed run left RUNNING (alone, every
    RUNNING trial is a dead run's) without queueing those configs again; the sampler may
    propose them anew."""

    def __init__(self, store: Any, study: str) -> None:
        self.store = store
        self.study = study
        self._slots: dict[str, int | None] = {}           # held slot -> its trial
        self._configs: dict[str, tuple[str, int]] = {}    # config -> (held | done, trial)
        self._swept = False
        self._count = 0

    def join(self) -> None:
        pass

    def leave(self, reason: str = "done") -> None:
        self._slots.clear()

    def seed_for(self, seed: int | None) -> int | None:
        return seed

    @property
    def reaped(self) -> bool:
        return False

    def rejoin(self) -> None:
        pass

    def take_over(self, target: int, *, lazily: bool = False) -> list[int]:
        if self._swept:
            return []
        self._swept = True
        return [zombie.number for zombie in liveness.reap(self.store, self.study)]

    def pause(self) -> None:
        time.sleep(POLL_S)

    def alone(self) -> bool:
        return True

    def measure_on(self, device: dict[str, Any]) -> set[str]:
        return set()

    def start(self, *, is_new: Callable[[], bool], enqueue: Callable[[], None],
              wait: Callable[[], None]) -> None:
        if is_new():
            enqueue()

    def once(self, key: str, run: Callable[[], None], *, ready: Callable[[], bool],
             wait: Callable[[], None] | None) -> bool:
        if not ready():
            run()
        return True

    def spent(self) -> int:
        return self.store.count_finished(self.study)

    def claim_slot(self, target: int) -> str | None:
        if self.spent() + len(self._slots) >= target:
            return None
        self._count += 1
        slot = f"slot:{self._count}"
        self._slots[slot] = None
        return slot

    def bind(self, slot: str, trial_number: int) -> None:
        self._slots[slot] = trial_number

    def claim_config(self, config: Any, trial_number: int) -> bool:
        key = str(config)
        if key in self._configs:
            return False
        self._configs[key] = (HELD, trial_number)
        return True

    def follow(self, config: Any, trial_number: int) -> Follow:
        found = self._configs.get(str(config))
        if found is None:
            return Follow(build=self.claim_config(config, trial_number))
        state, number = found
        return Follow(copy_of=number) if state == DONE else Follow()

    def holds(self, config: Any) -> bool:
        found = self._configs.get(str(config))
        return found is not None and found[0] == HELD

    def finish(self, trial: Any, tell: Callable[[], None], *, built: Any = None) -> bool:
        tell()
        for slot, number in list(self._slots.items()):
            if number == trial.number:
                del self._slots[slot]
        if built is not None:
            self._configs[str(built)] = (DONE, trial.number)
        return True
