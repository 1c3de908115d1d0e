"""The search loop: the pipeline, and the one place that knows the stage order.

    ask ─► suggest ─► duplicates ─► constraints ─► build (pool) ─► gate ─► measure (serial) ─► tell

and the one place where exceptions become trial states:

* a config already finished in this study is never built or measured again:
  the new trial is finished with the earlier result (same state, value and
  ``reason``) and user attr ``duplicate_of`` = the earlier trial's number. The
  same holds for a config proposed while its first trial is still in flight;
  it is finished when that one is. (Samplers propose repeats, TPE on a
  categorical space especially; copying keeps the study honest about what
  was tried and costs nothing.) The search stops with ``exhausted`` once
  every feasible config of the space is known, and with ``stalled`` after
  ``DUPLICATE_STREAK`` repeats in a row. The streak is counted from the
  study's recorded trials, so the rule is the same on every run: a study that
  stalled stops again at once instead of adding another streak of repeats;
* a config that breaks a static constraint of the space is told PRUNED at once
  with the constraint's message as user attr ``reason``; it never reaches nvcc;
* a failed build is FAIL (reason: the compiler's error), a build the ptxas
  gate rejects is PRUNED (reason: the gate's), a measure failure is FAIL with
  reason ``"<kind>: <reason>"``, a measurement is COMPLETE with value = median µs;
* racing (``racing``, on by default; evotuner/measure/racing.py): each measure request
  carries the study's best median so far on this GPU model (the incumbent), and a stage
  that races stops timing a config once it is clearly slower; such a trial is COMPLETE
  with its median so far and user attr ``stopped_early`` (reps, planned reps, median,
  incumbent, rule). Off with ``racing=None`` and under ``allow_mixed_gpus``;
* any unexpected exception while one trial is processed fails that trial with
  the exception's text, and the search goes on; KeyboardInterrupt fails every
  trial in flight with reason ``"interrupted by user"`` and is re-raised.

``trials`` is the number of *finished* trials (COMPLETE + PRUNED + FAIL) the
study should hold in total: the loop runs until the study has that many, so a
second run with the same number does nothing and ``resume`` extends a study.

Several searches (processes, hosts, or ``--gpus`` threads) may run one study at once.
Whatever they must agree on -- the budget (the target is the study's), which search builds
a config (a config another search owns is copied as ``duplicate_of`` once it is done), the
start configs and a device's baselines (once each), the trials of a search that died -- is
the coordinator's (:mod:`evotuner.coordinator`, whose contract the pipeline relies on); the
pipeline calls it at those points and nowhere else. A search with nothing left to ask waits
until the study's budget is spent, taking over what dead searches left.

Start-up: the first builds are submitted before the device is fingerprinted (the
measure stage starts in the background meanwhile, ``MeasureStage.start``), and
the SDPA baselines are measured at the first moment the loop would otherwise wait for a
build, or after the first measurement, whichever comes first: nothing the first
measurement does not need waits in front of it.

Reproducibility: builds run in parallel and complete in any order, but their
results are told in proposal order and new trials are asked only at those
points, so a seed reproduces the study (timings aside). The measure queue
waits on the oldest build; builds keep compiling meanwhile and the GPU is
rarely the stage that waits (a compile takes seconds, a measurement less).
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import optuna
from optuna.trial import TrialState

from evotuner import events as ev
from evotuner.config import KernelConfig
from evotuner.coordinator import Coordinator, StudyCoordinator, baselines_key
from evotuner.errors import EvotunerError, StudyMismatchError
from evotuner.gate import apply_gate
from evotuner.measure.base import MeasureFailure, Measurement, MeasureStage
from evotuner.measure.racing import DEFAULT_RULE, Race, RaceRule
from evotuner.problem import Problem
from evotuner.propose import params_for, suggest
from evotuner.vocabulary import (CONFIG_ATTR, DEVICE_ATTR, DUPLICATE_ATTR, MEASURED_ATTRS, REASON_ATTR,
                                 STOPPED_ATTR, TFLOPS_ATTR, measure_failure_reason)
from evotuner.vocabulary import config_of  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    from evotuner.workers import StudyWorker

#: How a search ended: ``done`` (the study has ``trials`` finished trials),
#: ``already_done`` (it had them before this run started; nothing was asked),
#: ``exhausted`` (every feasible config of the space is known: more trials would only
#: repeat results), ``stalled`` (the study's last ``DUPLICATE_STREAK`` trials were all
#: repeats of known configs: the sampler keeps proposing what was tried, though
#: ``SearchResult.untried`` configs may remain).
OUTCOMES = ("done", "already_done", "exhausted", "stalled")

#: Consecutive proposals of already-known configs after which the loop stops
#: with ``exhausted`` instead of spinning (a sampler stuck on a small space).
DUPLICATE_STREAK = 64

#: Spaces up to this many configs are checked for full coverage before each ask.
COVERAGE_LIMIT = 100_000

#: Reason recorded for trials in flight when the user interrupts the search.
INTERRUPTED = "interrupted by user"

_STATES = {"COMPLETE": TrialState.COMPLETE, "PRUNED": TrialState.PRUNED, "FAIL": TrialState.FAIL}


@dataclass(frozen=True)
class SearchResult:
    study: str
    outcome: str                        # one of OUTCOMES
    target: int
    finished: int                       # finished trials in the study at the end
    new_trials: int                     # trials this run finished (zombies not counted)
    counts: dict[str, int] = field(hash=False)
    best: ev.Best | None = None
    baselines: dict[str, float | None] | None = field(default=None, hash=False)
    zombies: tuple[int, ...] = ()
    #: Statically feasible configs of the space, and how many of them no trial has tried
    #: (None when the space is larger than ``COVERAGE_LIMIT``).
    feasible: int | None = None
    untried: int | None = None
    #: Repeats of known configs at the end of the study (the ``stalled`` rule's count).
    duplicate_streak: int = 0
    #: Wall seconds this run spent in each part of the loop's thread (see ``TIMING_KEYS``);
    #: builds run in a pool, so ``build_wait`` is only the time the loop was blocked on one.
    timings: dict[str, float] = field(default_factory=dict, hash=False, compare=False)
    #: Measurements this run made, and how many of them racing stopped early.
    measured: int = 0
    stopped_early: int = 0
    #: Search threads whose ``timings`` are summed (one per GPU with ``--gpus``).
    threads: int = 1


#: Keys of ``SearchResult.timings``: ``baselines`` (device fingerprint + SDPA baselines,
#: measured once the first builds are under way), ``ask`` (sampler ask + suggest), ``build_wait`` (blocked on the oldest build),
#: ``gate`` (ptxas gate), ``measure`` (the measure stage's call), ``record`` (study writes:
#: build/measurement rows and Optuna's tell).
TIMING_KEYS = ("baselines", "ask", "build_wait", "gate", "measure", "record")


@dataclass(frozen=True)
class _Result:
    """What a finished trial says; what a duplicate copies."""

    number: int
    state: str
    value: float | None
    reason: str | None
    attrs: dict[str, Any] = field(default_factory=dict, hash=False)


@dataclass
class _InFlight:
    trial: optuna.trial.Trial
    config: KernelConfig
    future: Any                         # concurrent.futures.Future[BuildResult]
    followers: list[optuna.trial.Trial] = field(default_factory=list)


@dataclass
class _Followed:
    """A trial whose config another search owns: finished with its result when done."""

    trial: optuna.trial.Trial
    config: KernelConfig


def run_search(
    *,
    store: Any,
    study_name: str,
    problem: Problem,
    space: Any,
    sampler: optuna.samplers.BaseSampler,
    seed: int | None,
    trials: int,
    builder: Any,
    measure: MeasureStage,
    on_event: Callable[[object], None] | None = None,
    batch: int | None = None,
    start: Sequence[KernelConfig] | Callable[[], Sequence[KernelConfig]] = (),
    worker: StudyWorker | Coordinator | None = None,
    stale_after: float | None = None,
    allow_mixed_gpus: bool = False,
    ask_lock: Any = None,
    racing: RaceRule | None = DEFAULT_RULE,
) -> SearchResult:
    """Run the study ``study_name`` (already created) until it has ``trials`` finished trials.

    ``store`` is an :class:`evotuner.storage.StudyStore`; ``space`` the study's
    :class:`evotuner.space.SearchSpace`; ``builder`` an
    :class:`evotuner.compiler.Builder`; ``measure`` any :class:`MeasureStage`.
    ``seed`` is recorded only (the sampler already carries it). ``start`` lists
    configs a NEW study tries first (the CLI passes the kernel's recommended
    config: a warm start, as Triton's autotuner starts from its user configs);
    those outside the space or breaking a static constraint are skipped. It may be a
    callable, called only when this search enqueues a new study's start (the session's
    transfer plan reads the database and reports where its configs came from then).

    ``sampler`` may also be a callable ``seed -> sampler``: it is called with this
    search's seed (the study's ``seed`` for the first live search, a derived one for
    each other: :meth:`~evotuner.coordinator.Coordinator.seed_for`). ``worker`` is this run's membership of
    the study: a :class:`~evotuner.workers.StudyWorker` (``--gpus`` joins one per GPU) or any
    :class:`~evotuner.coordinator.Coordinator`, joined and left by the caller; when None, a
    :class:`~evotuner.coordinator.StudyCoordinator` joined and left here (``stale_after`` is
    its heartbeat window).
    ``ask_lock``: a lock held around each ask and suggest, when several searches in one
    process share ``sampler`` (``--gpus``): a sampler is not thread-safe, and a config
    proposed by one search is known to the next ask only once its suggest stored it.
    ``racing``: the rule a racing measure stage stops clearly slower configs by (None: every
    config gets the whole timing budget; ``--full-timing``).
    """
    if trials < 1:
        raise EvotunerError(f"--trials: {trials} is not a positive number of trials", "e.g. --trials 64")
    store.study_info(study_name, problem=problem, space=space)   # refuses a mismatch before joining
    if isinstance(worker, Coordinator):
        coordinator = worker
    else:
        coordinator = StudyCoordinator(store, study_name, worker=worker, stale_after=stale_after)
    search = _Search(
        store=store, study_name=study_name, problem=problem, space=space, sampler=sampler,
        trials=trials, builder=builder, measure=measure, on_event=on_event, batch=batch, start=start,
        seed=seed, coordinator=coordinator, allow_mixed_gpus=allow_mixed_gpus, ask_lock=ask_lock,
        racing=racing,
    )
    with coordinator.joined() if worker is None else contextlib.nullcontext():
        return search.run()


class _Search:
    def __init__(self, *, store, study_name, problem, space, sampler, trials, builder, measure, on_event, batch,
                 start, seed, coordinator, allow_mixed_gpus, ask_lock, racing):
        self.store = store
        self.ask_lock = ask_lock if ask_lock is not None else contextlib.nullcontext()
        self.start = start if callable(start) else tuple(start)
        self.name = study_name
        self.problem = problem
        self.space = space
        self.builder = builder
        self.measure = measure
        self.target = trials
        self.on_event = on_event or (lambda event: None)
        jobs = getattr(builder, "jobs", None) or os.cpu_count() or 1
        self.batch = max(1, int(batch if batch is not None else jobs))
        self.sampler = sampler
        self.seed = seed
        self.coordinator: Coordinator = coordinator
        self.study: optuna.Study | None = None
        self.followed: list[_Followed] = []
        self.lost = 0                        # trials taken from this search (it stalled)
        self.device_tag: dict[str, Any] = {}
        self.allow_mixed_gpus = bool(allow_mixed_gpus)
        self.pending: deque[_InFlight] = deque()
        self.by_config: dict[KernelConfig, _InFlight] = {}
        self.known: dict[KernelConfig, _Result] = {}
        self.counts = {state: 0 for state in ev.STATES}
        self.finished = 0
        self.new_trials = 0
        self.best: ev.Best | None = None
        self.baselines: dict[str, float | None] | None = None
        self.dup_streak = 0
        self.current: optuna.trial.Trial | None = None   # asked, not yet placed anywhere
        self._unseen: set[KernelConfig] | None = None
        self._feasible: int | None = None
        self.timings = {key: 0.0 for key in TIMING_KEYS}
        # Racing: the rule (None: off), the best median measured by this run, and the best of
        # the study's earlier trials per GPU model (the incumbent must come from this model).
        self.racing: RaceRule | None = racing if not allow_mixed_gpus else None
        self.race_best: float | None = None
        self.history_best: dict[str, float] = {}
        self.stopped = 0                     # trials this run's racing stopped early
        self.baselines_pending = False       # device known, SDPA baselines not measured yet
        self.device: dict[str, Any] | None = None
        self.measured = 0                    # measure calls this run made

    def _tally(self, key: str, since: float) -> float:
        """Add the wall seconds since ``since`` to ``timings[key]``; returns now."""
        now = time.perf_counter()
        self.timings[key] += now - since
        return now

    # -- the run ---------------------------------------------------------------------

    def run(self) -> SearchResult:
        sampler = self.sampler
        if sampler is not None and not isinstance(sampler, optuna.samplers.BaseSampler) and callable(sampler):
            sampler = sampler(self.coordinator.seed_for(self.seed))
        else:
            self.coordinator.seed_for(self.seed)
        self.study = self.store.optuna_study(self.name, sampler=sampler)
        zombies = tuple(self.coordinator.take_over(self.target))   # trials a dead search left RUNNING
        self.coordinator.start(is_new=lambda: not self.study.get_trials(deepcopy=False),
                               enqueue=self._enqueue_start, wait=self._wait)
        self._load_history()
        self.emit(ev.SearchStarted(self.name, self.target, self.finished, zombies, self.batch))
        if self.coordinator.spent() >= self.target:
            self.emit(ev.SearchFinished("already_done", self.finished, self.target))
            return self._result("already_done", zombies)
        stop = self._stop_reason()
        if stop is not None:       # nothing new can come of asking: say so before measuring anything
            self.emit(ev.SearchFinished(stop, self.finished, self.target))
            return self._result(stop, zombies)
        outcome = "done"
        device_known = False
        try:
            while True:
                if self.coordinator.reaped:
                    self._start_over()
                self.coordinator.take_over(self.target, lazily=True)
                stop = self._fill()
                if not device_known:      # the first builds compile while the measure stage starts
                    try:
                        self._device()
                    except Exception as exc:   # no device, or refused on it: nothing asked was judged
                        self._interrupt(f"interrupted: the run stopped before measuring ({_describe(exc)})")
                        raise
                    device_known = True
                self._poll_followed()
                if self.pending:
                    # the baselines go where the GPU would idle: while the oldest build compiles,
                    # else right after the first measurement
                    self._baselines_if_due(idle=not self.pending[0].future.done())
                    self._collect(self.pending.popleft())
                    continue
                self._baselines_if_due(idle=True)
                if self.followed:
                    self._wait()
                    continue
                if stop is not None:
                    outcome = stop
                    break
                if self.coordinator.spent() >= self.target:
                    break
                self._wait()   # the rest of the budget is in other searches' hands: wait, take over the dead
            if self.baselines_pending:
                self._baselines(wait=True)
        except KeyboardInterrupt:
            self._interrupt()
            raise
        # A search that died holding nothing was never waited for: take it over now (a killed
        # process on this host at once, others once stale) so the study does not show it live.
        self.coordinator.take_over(self.target)
        self.finished = self.store.count_finished(self.name)
        if outcome in ("exhausted", "stalled") and self.finished >= self.target:
            outcome = "done"
        self.emit(ev.SearchFinished(outcome, self.finished, self.target))
        return self._result(outcome, zombies)

    # -- other searches ----------------------------------------------------------------

    def _wait(self) -> None:
        """Let the other searches work: pause, take over dead ones, look at followed configs."""
        self.coordinator.pause()
        self.coordinator.take_over(self.target, lazily=True)
        self._poll_followed()

    def _start_over(self) -> None:
        """This search's place was taken (it stalled past its heartbeat window): everything it
        had in flight was failed and handed to others; drop it and go on as a new search."""
        for flight in self.pending:
            flight.future.cancel()
            self.lost += 1 + len(flight.followers)
        self.lost += len(self.followed)
        self.pending.clear()
        self.by_config.clear()
        self.followed.clear()
        self.coordinator.rejoin()

    def _poll_followed(self) -> None:
        """Finish trials whose config another search has finished; build the config here
        when its owner gave it up (died or was interrupted)."""
        if not self.followed:
            return
        records = None
        for f in list(self.followed):
            where = self.coordinator.follow(f.config, f.trial.number)
            if where.build:
                self.followed.remove(f)
                self._build(f.trial, f.config)
                continue
            if where.copy_of is None:
                continue
            if records is None:
                records = {rec.number: rec for rec in self.store.finished_trials(self.name)}
            rec = records.get(where.copy_of)
            if rec is None:
                continue
            self.followed.remove(f)
            attrs = {TFLOPS_ATTR: rec.tflops} if rec.tflops is not None else {}
            self._finish(f.trial, f.config, rec.state, rec.value, rec.error, attrs, duplicate_of=rec.number)

    def _enqueue_start(self) -> None:
        start = self.start() if callable(self.start) else self.start
        admitted = [c for c in dict.fromkeys(start) if self.space.admits(c, self.problem)]
        for config in admitted[:self.target]:       # past the budget a WAITING trial would never run
            self.study.enqueue_trial(params_for(config, self.space))

    def _result(self, outcome: str, zombies: tuple[int, ...]) -> SearchResult:
        feasible = untried = None
        if self.space.size <= COVERAGE_LIMIT:
            self._space_exhausted()
            assert self._unseen is not None and self._feasible is not None
            feasible, untried = self._feasible, len(self._unseen)
        return SearchResult(
            study=self.name, outcome=outcome, target=self.target, finished=self.finished,
            new_trials=self.new_trials, counts=dict(self.counts), best=self.best,
            baselines=self.baselines, zombies=zombies, timings=dict(self.timings),
            feasible=feasible, untried=untried, duplicate_streak=self.dup_streak,
            measured=self.measured, stopped_early=self.stopped,
        )

    def emit(self, event: object) -> None:
        self.on_event(event)

    def _load_history(self) -> None:
        """Finished trials so far: counts, best, and the configs a duplicate copies.

        A trial failed because its run was interrupted (a killed process, or the
        user) is not finished: it does not count towards ``trials`` and its
        config may be proposed and built again.
        """
        for rec in sorted(self.store.finished_trials(self.name), key=lambda r: r.number):
            self.finished += 1
            self.counts[rec.state] = self.counts.get(rec.state, 0) + 1
            # the stall rule's streak, as the loop counts it: repeats in a row, reset by a new config
            self.dup_streak = self.dup_streak + 1 if rec.duplicate_of is not None else 0
            config = config_of(rec.params, self.space)
            if config is None:
                continue
            if rec.duplicate_of is None and config not in self.known:
                attrs = {TFLOPS_ATTR: rec.tflops} if rec.tflops is not None else {}
                self.known[config] = _Result(rec.number, rec.state, rec.value, rec.error, attrs)
            if rec.state == "COMPLETE" and rec.value is not None:
                self._offer_best(rec.number, config, rec.value, rec.tflops)
                device = rec.attrs.get(DEVICE_ATTR)
                name = device.get("name") if isinstance(device, dict) else None
                if isinstance(name, str) and rec.value < self.history_best.get(name, float("inf")):
                    self.history_best[name] = rec.value      # an incumbent for racing on this model

    def _device(self) -> None:
        """Record this run's device (waits for the measure stage to be up); the SDPA
        baselines are then due (:meth:`_baselines_if_due`)."""
        started = time.perf_counter()
        device = self.measure.device()
        self.device = device
        if device is not None:
            self.device_tag = {k: device[k] for k in ("name", "device_index") if device.get(k) is not None}
            self._refuse_mixed_models()
        if device is not None and self.store.record_device(self.name, device):
            self.emit(ev.DeviceChanged(str(device.get("name", "unknown device"))))
        self.baselines_pending = True
        self._tally("baselines", started)

    def _baselines_if_due(self, *, idle: bool) -> None:
        """Measure the baselines now if they are pending and the GPU would otherwise idle
        (``idle``) or the first measurement is done."""
        if self.baselines_pending and (idle or self.measured > 0):
            self._baselines(wait=False)

    def _baselines(self, *, wait: bool) -> None:
        """SDPA baselines once per study and device. Baselines belong to a device: a resume
        on another GPU measures its own, and of several searches on one device only one
        measures them; the others read them (``wait``: until they are there; else they try
        again later)."""
        started = time.perf_counter()
        device = self.device
        recorded: dict[str, float | None] = {}

        def ready() -> bool:
            nonlocal recorded
            recorded = self.store.baselines(self.name, device)
            return bool(recorded)

        def run() -> None:
            nonlocal recorded
            recorded = dict(self.measure.baselines(self.problem))
            self.store.record_baselines(self.name, device, self.problem, recorded)

        if not self.coordinator.once(baselines_key(device), run, ready=ready, wait=self._wait if wait else None):
            self._tally("baselines", started)
            return
        self.baselines = recorded
        self.baselines_pending = False
        self._tally("baselines", started)
        self.emit(ev.BaselinesMeasured(dict(recorded)))

    def _refuse_mixed_models(self) -> None:
        """Timings of one study must come from one GPU model: refuse to join searches that
        measure on another (unless ``allow_mixed_gpus``)."""
        others = self.coordinator.measure_on(self.device_tag)
        name = self.device_tag.get("name")
        if name and others - {name} and not self.allow_mixed_gpus:
            raise StudyMismatchError(
                f"study {self.name!r} is being measured on {', '.join(sorted(others))} by other workers; "
                f"this one measures on {name}, and one study's timings must not mix GPU models",
                "run this worker on a GPU of the same model, or pass --mixed-gpus to all workers",
            )

    # -- asking --------------------------------------------------------------------------

    def _builds_in_flight(self) -> int:
        """nvcc builds queued or compiling now (the Builder's count when it keeps one)."""
        count = getattr(self.builder, "in_flight", None)
        return count if isinstance(count, int) else sum(1 for p in self.pending if not p.future.done())

    def _in_flight_trials(self) -> int:
        return sum(1 + len(p.followers) for p in self.pending)

    def _fill(self) -> str | None:
        """Ask trials until ``batch`` builds are in flight or the study's budget is all
        taken (each ask first takes a slot of the study's ``trials``), or until the
        oldest build is done: the GPU never waits on asks it does not need yet.

        Returns ``exhausted`` or ``stalled`` when it stopped asking for that reason.
        """
        while len(self.pending) < self.batch:
            if self.pending and self.pending[0].future.done():
                return None     # the oldest build is ready: measure it first, ask the rest after
            stop = self._stop_reason()
            if stop is not None:
                return stop
            slot = self.coordinator.claim_slot(self.target)
            if slot is None:
                return None
            self._ask_one(slot)
        return None

    def _stop_reason(self) -> str | None:
        """``exhausted`` when every feasible config is known or in flight; ``stalled`` after
        ``DUPLICATE_STREAK`` repeats in a row; else None."""
        if self._space_exhausted():
            return "exhausted"
        if self.dup_streak >= DUPLICATE_STREAK:
            return "stalled"
        return None

    def _space_exhausted(self) -> bool:
        """True when every statically feasible config is finished or in flight (spaces up to
        ``COVERAGE_LIMIT`` configs; larger ones rely on ``DUPLICATE_STREAK``)."""
        if self.space.size > COVERAGE_LIMIT:
            return False
        if self._unseen is None:   # the configs that can run: static violations never will
            self._unseen = {c for c in self.space.configs() if self.space.violated(c, self.problem) is None}
            self._feasible = len(self._unseen)
        self._unseen -= self.known.keys()
        self._unseen -= self.by_config.keys()
        self._unseen -= {f.config for f in self.followed}
        return not self._unseen

    def _ask_one(self, slot: str) -> None:
        started = time.perf_counter()
        config: KernelConfig | None = None
        failed: Exception | None = None
        with self.ask_lock:
            trial = self.current = self.study.ask()
            try:
                config = suggest(trial, self.space)
            except Exception as exc:  # noqa: BLE001 -- a proposal error fails this trial only
                failed = exc
        self.coordinator.bind(slot, trial.number)
        if failed is not None:
            self._finish(trial, config, "FAIL", None, _describe(failed), {})
            return
        try:
            self._tally("ask", started)
            self.emit(ev.TrialStarted(trial.number, config))
            earlier = self.known.get(config)
            if earlier is not None:
                self.dup_streak += 1
                self._finish(trial, config, earlier.state, earlier.value, earlier.reason,
                             dict(earlier.attrs), duplicate_of=earlier.number)
                return
            running = self.by_config.get(config)
            if running is not None:
                self.dup_streak += 1
                running.followers.append(trial)
                self.current = None
                return
            if not self.coordinator.claim_config(config, trial.number):
                self.dup_streak += 1        # another search builds it: copy its result when done
                self.followed.append(_Followed(trial, config))
                self.current = None
                return
            self.dup_streak = 0
            constraint = self.space.violated(config, self.problem)
            if constraint is not None:
                self._finish(trial, config, "PRUNED", None, _message(constraint), {})
                return
            self._build(trial, config)
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # noqa: BLE001 -- any stage error fails this trial only
            if self.current is trial:
                self._finish(trial, config, "FAIL", None, _describe(exc), {})

    def _build(self, trial: optuna.trial.Trial, config: KernelConfig) -> None:
        future = self.builder.submit(config, self.problem)
        flight = _InFlight(trial, config, future)
        self.pending.append(flight)
        self.by_config[config] = flight
        if self.current is trial:
            self.current = None
        self.emit(ev.BuildStarted(trial.number, config, self._builds_in_flight()))

    # -- collecting ----------------------------------------------------------------------

    def _collect(self, flight: _InFlight) -> None:
        """Wait for the oldest build, then gate, measure and tell it (and its followers)."""
        try:
            told = self._process(flight)
        except KeyboardInterrupt:
            self.pending.appendleft(flight)   # still in flight: _interrupt() fails it
            raise
        except Exception as exc:  # noqa: BLE001 -- any stage error fails this trial only
            told = "FAIL", None, _describe(exc), {}
        self.by_config.pop(flight.config, None)
        if told is None:                      # taken from this search: its new owner tells it
            self.lost += 1 + len(flight.followers)
            return
        state, value, reason, attrs = told
        self._finish(flight.trial, flight.config, state, value, reason, attrs)
        for follower in flight.followers:
            self._finish(follower, flight.config, state, value, reason, dict(attrs),
                         duplicate_of=flight.trial.number)

    def _process(self, flight: _InFlight) -> tuple[str, float | None, str | None, dict[str, Any]] | None:
        """Build, gate and measure one config: (state, value, reason, attrs) to tell, or None
        when the config is no longer this search's (taken over while it was built or timed)."""
        number = flight.trial.number
        t = time.perf_counter()
        build = flight.future.result()   # the Builder never raises for a compile error
        t = self._tally("build_wait", t)
        self.emit(ev.BuildFinished(number, flight.config, build.ok, build.cached, build.seconds,
                                   self._builds_in_flight()))
        if not build.ok or build.artifact is None:
            self.store.record_build(self.name, number, build, None)
            self._tally("record", t)
            return "FAIL", None, f"build failed: {build.error or 'no artifact'}", {}
        t = time.perf_counter()
        gate = apply_gate(build, self.space.gate)
        t = self._tally("gate", t)
        self.store.record_build(self.name, number, build, gate)
        t = self._tally("record", t)
        if not gate.passed:
            return "PRUNED", None, gate.reason, {}
        if self.coordinator.reaped:      # known taken over already: time nothing for the new owner
            return None
        race = self._race()
        if race is not None:
            outcome = self.measure.measure(build.artifact, self.problem, race=race)
        else:
            outcome = self.measure.measure(build.artifact, self.problem)
        self.measured += 1
        t = self._tally("measure", t)
        if not self.coordinator.holds(flight.config):
            return None                  # taken over while it was built or timed: its new owner records it
        self.store.record_measurement(self.name, number, flight.config, outcome)
        self._tally("record", t)
        if isinstance(outcome, MeasureFailure):
            return "FAIL", None, measure_failure_reason(outcome.kind, outcome.reason), {}
        if not isinstance(outcome, Measurement):
            raise TypeError(f"measure stage returned {type(outcome).__name__}, not a Measurement")
        attrs: dict[str, Any] = {k: getattr(outcome, k) for k in MEASURED_ATTRS}
        if self.race_best is None or outcome.median_us < self.race_best:
            self.race_best = outcome.median_us
        if outcome.stopped_early:
            self.stopped += 1
            attrs[STOPPED_ATTR] = {"reps": outcome.repetitions, "planned_reps": outcome.planned_repetitions,
                                   "median_us": outcome.median_us, "incumbent_us": outcome.incumbent_us,
                                   "rule": race.rule.describe() if race is not None else None}
        if self.device_tag:
            attrs[DEVICE_ATTR] = dict(self.device_tag)   # which GPU measured it (several searches, --gpus)
        return "COMPLETE", outcome.median_us, None, attrs

    def _race(self) -> Race | None:
        """What this measure request races against: the best median measured on this GPU model
        (this run's, or the study's earlier trials'); None when racing is off, the stage does
        not race, or nothing is known yet (the first config gets the whole budget)."""
        if self.racing is None or not getattr(self.measure, "races", False):
            return None
        name = self.device_tag.get("name")
        known = [v for v in (self.race_best, self.history_best.get(name) if name else None) if v is not None]
        return Race(min(known), self.racing) if known else None

    # -- telling -------------------------------------------------------------------------

    def _finish(self, trial, config, state, value, reason, attrs, duplicate_of=None) -> None:
        attrs = dict(attrs)
        if config is not None:
            attrs[CONFIG_ATTR] = config.as_dict()  # the values; Optuna's params are the sampler's encoding
        if reason is not None:
            attrs[REASON_ATTR] = reason
        if duplicate_of is not None:
            attrs[DUPLICATE_ATTR] = duplicate_of
        started = time.perf_counter()

        def tell() -> None:
            for key, val in attrs.items():
                trial.set_user_attr(key, val)
            if state == "COMPLETE":
                self.study.tell(trial, value)
            else:
                self.study.tell(trial, state=_STATES[state])

        told = self.coordinator.finish(trial, tell, built=config if duplicate_of is None else None)
        if self.current is trial:
            self.current = None
        if not told:
            self.lost += 1                  # taken from this search: another one finishes it
            return
        self._tally("record", started)
        self.finished += 1
        self.new_trials += 1
        self.counts[state] = self.counts.get(state, 0) + 1
        if config is not None and duplicate_of is None and config not in self.known:
            copied = {TFLOPS_ATTR: attrs[TFLOPS_ATTR]} if TFLOPS_ATTR in attrs else {}
            self.known[config] = _Result(trial.number, state, value, reason, copied)
        tflops = attrs.get(TFLOPS_ATTR)
        stopped = attrs.get(STOPPED_ATTR)
        early = (int(stopped["reps"]), int(stopped["planned_reps"])) if isinstance(stopped, dict) else None
        self.emit(ev.TrialFinished(trial.number, config, state, value, reason, tflops, duplicate_of, early))
        if state == "COMPLETE" and value is not None:
            self._offer_best(trial.number, config, value, tflops)
        self.emit(ev.Progress(self.finished, self.target, dict(self.counts),
                              self._builds_in_flight(), self.best))

    def _offer_best(self, number: int, config: KernelConfig, value: float, tflops: float | None) -> None:
        if self.best is None or value < self.best.median_us:
            self.best = ev.Best(number, config, value, tflops)

    def _interrupt(self, reason: str = INTERRUPTED) -> None:
        """Fail everything in flight with ``reason`` (an "interrupted" one: such trials do not
        count and their configs run again), cancel queued builds; the caller re-raises."""
        stranded: list[tuple[optuna.trial.Trial, KernelConfig | None]] = []
        if self.current is not None:
            stranded.append((self.current, None))
        for flight in self.pending:
            flight.future.cancel()
            stranded.append((flight.trial, flight.config))
            stranded.extend((f, flight.config) for f in flight.followers)
        stranded.extend((f.trial, f.config) for f in self.followed)
        self.followed.clear()
        self.pending.clear()
        self.by_config.clear()
        for trial, _config in stranded:
            try:
                trial.set_user_attr(REASON_ATTR, reason)
                self.study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
            except Exception:  # noqa: BLE001 -- best effort; the next run takes over the rest
                pass
        self.current = None
        # The interrupt may have struck inside Optuna's ask (the trial row made, not yet handed
        # back) or between a tell's writes: a trial no list above holds. Alone on the study,
        # every RUNNING trial is this process's, so none is left RUNNING for the next resume.
        try:
            alone = self.coordinator.alone()
            left = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)) if alone else []
        except Exception:  # noqa: BLE001 -- best effort; the next run takes over the rest
            left = []
        storage = self.store.optuna_storage
        for t in left:
            try:
                storage.set_trial_user_attr(t._trial_id, REASON_ATTR, reason)
                storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
            except Exception:  # noqa: BLE001 -- finished meanwhile, or a busy database: the next run's
                pass


def _message(constraint: object) -> str:
    return str(getattr(constraint, "message", None) or constraint)


def _describe(exc: BaseException) -> str:
    """One line for a trial's ``reason``: the exception type and text, and where it was raised."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {text}{where}" if text else f"{type(exc).__name__}{where}"

