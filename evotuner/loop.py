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
measurement does not need waits in front of it (:mod:`evotuner.startup`).

Reproducibility: builds run in parallel and complete in any order, but their
results are told in proposal order and new trials are asked only at those
points, so a seed reproduces the study (timings aside). The measure queue
waits on the oldest build; builds keep compiling meanwhile and the GPU is
rarely the stage that waits (a compile takes seconds, a measurement less).
While the GPU worker times a config, the loop asks the next trials (``_ask_ahead``): the
sampler proposes without that result, as it does without those of the builds in flight. A
stage that measures in-process (replay) is not asked ahead.
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from typing import TYPE_CHECKING, Any, Callable, Sequence

import optuna
from optuna.trial import TrialState

from evotuner import events as ev
from evotuner import stopping
from evotuner.asking import ask
from evotuner.config import KernelConfig
from evotuner.coordinator import Coordinator, StudyCoordinator
from evotuner.errors import EvotunerError
from evotuner.inflight import Flight, Followed, InFlight, fail_stranded
from evotuner.judge import Fastest, Judge, Submitted
from evotuner.measure.base import MeasureStage
from evotuner.measure.racing import DEFAULT_RULE, RaceRule
from evotuner.problem import Problem
from evotuner.propose import params_for, suggest
from evotuner.startup import DeviceStart
from evotuner.tally import COVERAGE_LIMIT, DUPLICATE_STREAK, OUTCOMES, TIMING_KEYS  # noqa: F401 (re-exported)
from evotuner.tally import SearchResult, Stopwatch, Tally
from evotuner.vocabulary import CONFIG_ATTR, DUPLICATE_ATTR, REASON_ATTR, STOPPED_ATTR, TFLOPS_ATTR
from evotuner.vocabulary import config_of  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    from evotuner.workers import StudyWorker

#: Reason recorded for trials in flight when the user interrupts the search.
INTERRUPTED = "interrupted by user"

_STATES = {"COMPLETE": TrialState.COMPLETE, "PRUNED": TrialState.PRUNED, "FAIL": TrialState.FAIL}


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
    fastest: Fastest | None = None,
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
    each other: :meth:`~evotuner.coordinator.Coordinator.seed_for`). ``worker`` is this run's
    membership of the study: a :class:`~evotuner.workers.StudyWorker` (``--gpus`` joins one per GPU) or any
    :class:`~evotuner.coordinator.Coordinator`, joined and left by the caller; when None, a
    :class:`~evotuner.coordinator.StudyCoordinator` joined and left here (``stale_after`` is
    its heartbeat window).
    ``ask_lock``: a lock held around each ask and suggest, when several searches in one
    process share ``sampler`` (``--gpus``): a sampler is not thread-safe, and a config
    proposed by one search is known to the next ask only once its suggest stored it.
    ``racing``: the rule a racing measure stage stops clearly slower configs by (None: every
    config gets the whole timing budget; ``--full-timing``). ``fastest``: shared by the
    searches of one process (``--gpus``), each races against what any of them measured.
    """
    if trials < 1:
        raise EvotunerError(f"--trials: {trials} is not a positive number of trials", "e.g. --trials 64")
    store.study_info(study_name, problem=problem, space=space)   # refuses a mismatch before joining
    coordinator = worker if isinstance(worker, Coordinator) else StudyCoordinator(
        store, study_name, worker=worker, stale_after=stale_after)
    search = _Search(
        store=store, study_name=study_name, problem=problem, space=space, sampler=sampler,
        trials=trials, builder=builder, measure=measure, on_event=on_event, batch=batch, start=start,
        seed=seed, coordinator=coordinator, allow_mixed_gpus=allow_mixed_gpus, ask_lock=ask_lock,
        racing=racing, fastest=fastest,
    )
    with coordinator.joined() if worker is None else contextlib.nullcontext():
        return search.run()


class _Search:
    def __init__(self, *, store, study_name, problem, space, sampler, trials, builder, measure, on_event, batch,
                 start, seed, coordinator, allow_mixed_gpus, ask_lock, racing, fastest):
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
        self.tally = Tally(space, problem)
        self.flights = InFlight()
        self.lost = 0                        # trials taken from this search (it stalled)
        self.clock = Stopwatch()
        self.device = DeviceStart(store, study_name, problem, measure, coordinator, self.emit,
                                  allow_mixed_gpus=bool(allow_mixed_gpus))
        # racing is off for a study whose timings come from several GPU models
        self.judge = Judge(store=store, study=study_name, problem=problem, space=space, measure=measure,
                           coordinator=coordinator, tally=self.tally, device=self.device,
                           racing=racing if not allow_mixed_gpus else None, clock=self.clock, emit=self.emit,
                           building=self._builds_in_flight, fastest=fastest)

    def emit(self, event: object) -> None:
        self.on_event(event)

    # -- the run ---------------------------------------------------------------------

    def run(self) -> SearchResult:
        sampler = self.sampler
        if sampler is not None and not isinstance(sampler, optuna.samplers.BaseSampler) and callable(sampler):
            sampler = sampler(self.coordinator.seed_for(self.seed))
        else:
            self.coordinator.seed_for(self.seed)
        self.study = self.store.optuna_study(self.name, sampler=sampler)
        self.optuna_id = self.store.optuna_study_id(self.name)
        zombies = tuple(self.coordinator.take_over(self.target))   # trials a dead search left RUNNING
        self.coordinator.start(is_new=lambda: not self.study.get_trials(deepcopy=False),
                               enqueue=self._enqueue_start, wait=self._wait)
        self.tally.load(self.store.finished_trials(self.name))
        self.emit(ev.SearchStarted(self.name, self.target, self.tally.finished, zombies, self.batch))
        if self.coordinator.spent() >= self.target:
            self.emit(ev.SearchFinished("already_done", self.tally.finished, self.target))
            return self._result("already_done", zombies)
        stop = self.tally.stop_reason(self.flights.configs())
        if stop is not None:       # nothing new can come of asking: say so before measuring anything
            self.emit(ev.SearchFinished(stop, self.tally.finished, self.target))
            return self._result(stop, zombies)
        outcome = "done"
        device_known = False
        try:
            while True:
                stopping.check()   # a SIGTERM swallowed by a finaliser still ends the search
                if self.coordinator.reaped:
                    self._start_over()
                self.coordinator.take_over(self.target, lazily=True)
                stop = self._fill()
                if not device_known:      # the first builds compile while the measure stage starts
                    started = time.perf_counter()
                    try:
                        self.device.fingerprint()
                    except Exception as exc:   # no device, or refused on it: nothing asked was judged
                        self._interrupt(f"interrupted: the run stopped before measuring ({_describe(exc)})")
                        raise
                    device_known = True
                    self.clock.lap("baselines", started)
                self._poll_followed()
                pending = self.flights.pending
                if pending:
                    # the baselines come right after the first measurement, never in front of it: put
                    # where the first build compiles, they outlasted it and held the first measurement
                    # back (they take seconds: the SDPA backends, each timed for the budget)
                    self._baselines_if_due(idle=False)
                    self._collect(pending.popleft())
                    continue
                self._baselines_if_due(idle=True)
                if self.flights.followed:
                    self._wait()
                    continue
                if stop is not None:
                    outcome = stop
                    break
                if self.coordinator.spent() >= self.target:
                    break
                self._wait()   # the rest of the budget is in other searches' hands: wait, take over the dead
            if self.device.pending:
                self._baselines(wait=True)
        except KeyboardInterrupt:
            self._interrupt()
            raise
        # A search that died holding nothing was never waited for: take it over now (a killed
        # process on this host at once, others once stale) so the study does not show it live.
        self.coordinator.take_over(self.target)
        self.tally.finished = self.store.count_finished(self.name)
        if outcome in ("exhausted", "stalled") and self.tally.finished >= self.target:
            outcome = "done"
        self.emit(ev.SearchFinished(outcome, self.tally.finished, self.target))
        return self._result(outcome, zombies)

    def _wait(self) -> None:
        """Let the other searches work: pause, take over dead ones, look at followed configs."""
        self.coordinator.pause()
        self.coordinator.take_over(self.target, lazily=True)
        self._poll_followed()

    def _baselines_if_due(self, *, idle: bool) -> None:
        """Measure the baselines now if they are pending and the first measurement is done, or
        nothing is in flight (``idle``: no build or measurement for the GPU to wait on)."""
        if self.device.due(idle=idle, measured=self.judge.measured):
            self._baselines(wait=False)

    def _baselines(self, *, wait: bool) -> None:
        """The device's SDPA baselines (``wait``: until another search recorded them, when it
        measures them; else try again later)."""
        started = time.perf_counter()
        recorded = self.device.measure_baselines(self._wait if wait else None)
        self.clock.lap("baselines", started)
        if recorded is not None:
            self.emit(ev.BaselinesMeasured(dict(recorded)))

    def _start_over(self) -> None:
        """This search's place was taken (it stalled past its heartbeat window): everything it
        had in flight was failed and handed to others; drop it and go on as a new search."""
        self.lost += self.flights.drop()
        self.coordinator.rejoin()

    def _poll_followed(self) -> None:
        """Finish trials whose config another search has finished; build the config here
        when its owner gave it up (died or was interrupted)."""
        followed = self.flights.followed
        if not followed:
            return
        records = None
        for f in list(followed):
            where = self.coordinator.follow(f.config, f.trial.number)
            if where.build:
                followed.remove(f)
                self._build(f.trial, f.config)
                continue
            if where.copy_of is None:
                continue
            if records is None:
                records = {rec.number: rec for rec in self.store.finished_trials(self.name)}
            rec = records.get(where.copy_of)
            if rec is None:
                continue
            followed.remove(f)
            attrs = {TFLOPS_ATTR: rec.tflops} if rec.tflops is not None else {}
            self._finish(f.trial, f.config, rec.state, rec.value, rec.error, attrs, duplicate_of=rec.number)

    def _enqueue_start(self) -> None:
        start = self.start() if callable(self.start) else self.start
        admitted = [c for c in dict.fromkeys(start) if self.space.admits(c, self.problem)]
        for config in admitted[:self.target]:       # past the budget a WAITING trial would never run
            self.study.enqueue_trial(params_for(config, self.space))

    def _result(self, outcome: str, zombies: tuple[int, ...]) -> SearchResult:
        feasible, untried = self.tally.coverage(self.flights.configs())
        t = self.tally
        return SearchResult(
            study=self.name, outcome=outcome, target=self.target, finished=t.finished,
            new_trials=t.new_trials, counts=dict(t.counts), best=t.best,
            baselines=self.device.baselines, zombies=zombies, timings=dict(self.clock.timings),
            feasible=feasible, untried=untried, duplicate_streak=t.dup_streak,
            measured=self.judge.measured, stopped_early=self.judge.stopped,
        )

    # -- asking --------------------------------------------------------------------------

    def _builds_in_flight(self) -> int:
        """nvcc builds queued or compiling now (the Builder's count when it keeps one)."""
        count = getattr(self.builder, "in_flight", None)
        return count if isinstance(count, int) else self.flights.building()

    def _fill(self, ahead: bool = False) -> str | None:
        """Ask trials until ``batch`` builds are in flight or the study's budget is all
        taken (each ask first takes a slot of the study's ``trials``), or until the
        oldest build is done: the GPU never waits on asks it does not need yet
        (``ahead``: the GPU is busy timing, ask regardless). Returns ``exhausted`` or
        ``stalled`` when it stopped asking for that reason."""
        pending = self.flights.pending
        while len(pending) < self.batch:
            if not ahead and pending and pending[0].future.done():
                return None     # the oldest build is ready: measure it first, ask the rest after
            stop = self.tally.stop_reason(self.flights.configs())
            if stop is not None:
                return stop
            slot = self.coordinator.claim_slot(self.target)
            if slot is None:
                return None
            self._ask_one(slot)
        return None

    def _ask_one(self, slot: str) -> None:
        started = time.perf_counter()
        config: KernelConfig | None = None
        failed: Exception | None = None
        with self.ask_lock:
            trial = self.flights.current = ask(self.study, self.store, self.optuna_id, self.space)
            try:
                config = suggest(trial, self.space)
            except Exception as exc:  # noqa: BLE001 -- a proposal error fails this trial only
                failed = exc
        self.coordinator.bind(slot, trial.number)
        if failed is not None:
            self._finish(trial, config, "FAIL", None, _describe(failed), {})
            return
        try:
            self.clock.lap("ask", started)
            self.emit(ev.TrialStarted(trial.number, config))
            earlier = self.tally.known.get(config)
            if earlier is not None:
                self.tally.dup_streak += 1
                self._finish(trial, config, earlier.state, earlier.value, earlier.reason,
                             dict(earlier.attrs), duplicate_of=earlier.number)
                return
            running = self.flights.by_config.get(config)
            if running is not None:
                self.tally.dup_streak += 1
                running.followers.append(trial)
                self.flights.placed(trial)
                return
            if not self.coordinator.claim_config(config, trial.number):
                self.tally.dup_streak += 1    # another search builds it: copy its result when done
                self.flights.followed.append(Followed(trial, config))
                self.flights.placed(trial)
                return
            self.tally.dup_streak = 0
            constraint = self.space.violated(config, self.problem)
            if constraint is not None:
                self._finish(trial, config, "PRUNED", None, _message(constraint), {})
                return
            self._build(trial, config)
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # noqa: BLE001 -- any stage error fails this trial only
            if self.flights.current is trial:
                self._finish(trial, config, "FAIL", None, _describe(exc), {})

    def _build(self, trial: optuna.trial.Trial, config: KernelConfig) -> None:
        self.flights.build(trial, config, self.builder.submit(config, self.problem))
        self.emit(ev.BuildStarted(trial.number, config, self._builds_in_flight()))

    # -- collecting ----------------------------------------------------------------------

    def _collect(self, flight: Flight) -> None:
        """Wait for the oldest build, then gate, measure and tell it (and its followers). While
        a measure stage in another process times it, the sampler proposes the next trials."""
        deferred: Exception | None = None
        try:
            told = self.judge.begin(flight.trial.number, flight.config, flight.future)
            if isinstance(told, Submitted):
                deferred = self._ask_ahead() if told.pending.in_progress else None
                told = self.judge.end(told)
        except KeyboardInterrupt:
            self.flights.pending.appendleft(flight)   # still in flight: _interrupt() fails it
            raise
        except Exception as exc:  # noqa: BLE001 -- any stage error fails this trial only
            told = "FAIL", None, _describe(exc), {}
        self.flights.by_config.pop(flight.config, None)
        if told is None:                      # taken from this search: its new owner tells it
            self.lost += 1 + len(flight.followers)
        else:
            state, value, reason, attrs = told
            self._finish(flight.trial, flight.config, state, value, reason, attrs)
            for follower in flight.followers:
                self._finish(follower, flight.config, state, value, reason, dict(attrs),
                             duplicate_of=flight.trial.number)
        if deferred is not None:
            raise deferred        # what asking ahead raised, now that the measured trial is told

    def _ask_ahead(self) -> Exception | None:
        """Ask the next trials while the GPU times; what that raises is returned, to be raised
        once the measurement in flight is told."""
        try:
            self._fill(ahead=True)
        except Exception as exc:  # noqa: BLE001 -- re-raised by _collect after the tell
            return exc
        return None

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
            self.store.set_user_attrs(trial._trial_id, attrs)   # one transaction, not one per attr
            if state == "COMPLETE":
                self.study.tell(trial, value)
            else:
                self.study.tell(trial, state=_STATES[state])

        told = self.coordinator.finish(trial, tell, built=config if duplicate_of is None else None)
        self.flights.placed(trial)
        if not told:
            self.lost += 1                  # taken from this search: another one finishes it
            return
        self.clock.lap("record", started)
        self.tally.told(trial.number, config, state, value, reason, attrs, duplicate_of)
        tflops = attrs.get(TFLOPS_ATTR)
        stopped = attrs.get(STOPPED_ATTR)
        early = (int(stopped["reps"]), int(stopped["planned_reps"])) if isinstance(stopped, dict) else None
        self.emit(ev.TrialFinished(trial.number, config, state, value, reason, tflops, duplicate_of, early))
        if state == "COMPLETE" and value is not None:
            self.tally.offer_best(trial.number, config, value, tflops)
        self.emit(ev.Progress(self.tally.finished, self.target, dict(self.tally.counts),
                              self._builds_in_flight(), self.tally.best))

    def _interrupt(self, reason: str = INTERRUPTED) -> None:
        """Fail everything in flight with ``reason`` (an "interrupted" one: such trials do not
        count and their configs run again), cancel queued builds; the caller re-raises."""
        stranded = self.flights.strand()
        fail_stranded(self.study, self.store.optuna_storage, stranded, reason, self.coordinator.alone)


def _message(constraint: object) -> str:
    return str(getattr(constraint, "message", None) or constraint)


def _describe(exc: BaseException) -> str:
    """One line for a trial's ``reason``: the exception type and text, and where it was raised."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {text}{where}" if text else f"{type(exc).__name__}{where}"
