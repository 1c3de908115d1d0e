"""What one built config comes to: gated, timed and recorded -- the state its trial is told.

The loop hands over each config's build in proposal order; :class:`Judge` waits for it,
applies the ptxas gate, times the artifact on the measure stage (racing the incumbent,
evotuner/measure/racing.py), records the build and the measurement in the study, and answers
with what the trial is to be told. In two steps where the loop has work for the wait:
:meth:`Judge.begin` submits the measurement (:class:`Submitted`) and :meth:`Judge.end` reads
it. It tells nothing itself and catches nothing: an exception is the loop's to turn into a FAIL.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from evotuner import events as ev
from evotuner.config import KernelConfig
from evotuner.coordinator import Coordinator
from evotuner.gate import apply_gate
from evotuner.measure.base import MeasureFailure, Measurement, MeasureStage, PendingMeasure
from evotuner.measure.protocol import artifact_wire
from evotuner.measure.racing import Race, RaceRule
from evotuner.problem import Problem
from evotuner.startup import DeviceStart
from evotuner.tally import Stopwatch, Tally
from evotuner.vocabulary import DEVICE_ATTR, MEASURED_ATTRS, PAIRED_ATTR, STOPPED_ATTR, measure_failure_reason

#: Failures of a paired race's timing that the incumbent timed beside the config may have
#: caused (the correctness checks run before the timing, on the config alone).
PAIRED_FAULTS = frozenset({"illegal_access", "timeout", "crash"})

#: (state, value, reason, attrs): what a trial is told.
Verdict = tuple[str, float | None, str | None, dict[str, Any]]


@dataclass(frozen=True)
class Submitted:
    """A config whose measurement :meth:`Judge.begin` submitted: ``pending`` (the stage's
    :class:`~evotuner.measure.base.PendingMeasure`) is timed while the loop goes on."""

    number: int
    config: KernelConfig
    race: Race | None
    pending: PendingMeasure
    artifact: Any = None          # what was timed (a paired race's next incumbent, if it wins)


class Fastest:
    """The fastest config measured in full (median µs and artifact) by the searches that share
    this object, for racing: each search's own, or, with ``--gpus``, the one of every GPU of
    the process (GPUs of one model: racing is off for mixed ones). Shared, a GPU thread races
    against what the others measured: with one each, four H100s timed 3.3x the repetitions of
    one GPU for the same 256 trials (docs/measurements/gpus/coordinator_h100x4_1128t/).
    Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._best: tuple[float, Any] | None = None

    def get(self) -> tuple[float, Any] | None:
        with self._lock:
            return self._best

    def offer(self, median_us: float, artifact: Any) -> None:
        with self._lock:
            if self._best is None or median_us < self._best[0]:
                self._best = (median_us, artifact)


class Judge:
    """Judges the configs of study ``study``. ``coordinator`` says whether a config is still
    this search's; ``tally`` knows the incumbent; ``device`` tags each measurement with its GPU;
    ``racing``: the rule a racing stage stops a clearly slower config by (None: off);
    ``building()``: builds in flight, for the events; ``fastest``: the :class:`Fastest` this
    search shares with the others of its process (None: its own)."""

    def __init__(self, *, store: Any, study: str, problem: Problem, space: Any, measure: MeasureStage,
                 coordinator: Coordinator, tally: Tally, device: DeviceStart, racing: RaceRule | None,
                 clock: Stopwatch, emit: Callable[[object], None], building: Callable[[], int],
                 fastest: Fastest | None = None) -> None:
        self.store = store
        self.study = study
        self.space = space
        self.problem = problem
        self.measure = measure
        self.coordinator = coordinator
        self.tally = tally
        self.device = device
        self.racing = racing
        self.clock = clock
        self.emit = emit
        self.building = building
        self.measured = 0                    # measure calls this run made
        self.stopped = 0                     # of them, stopped early by racing
        #: the fastest measurement of this run (and of the searches sharing it): a race's incumbent
        self.fastest = fastest if fastest is not None else Fastest()
        #: artifact keys a paired race failed beside: never paired with again
        self.unpairable: set[str] = set()

    def __call__(self, number: int, config: KernelConfig, future: Any) -> Verdict | None:
        """Trial ``number``'s verdict on ``config``, built by ``future``; None when the config is
        no longer this search's (taken over while it was built or timed: its new owner records
        and tells it)."""
        step = self.begin(number, config, future)
        return self.end(step) if isinstance(step, Submitted) else step

    def begin(self, number: int, config: KernelConfig, future: Any) -> Verdict | Submitted | None:
        """Wait for the build, gate it and submit its measurement: a :class:`Submitted` whose
        :meth:`end` gives the verdict (the GPU times it meanwhile), or the verdict at once (a
        failed build, a gated one, or None: no longer this search's)."""
        lap = self.clock.lap
        t = time.perf_counter()
        build = future.result()   # the Builder never raises for a compile error
        t = lap("build_wait", t)
        self.emit(ev.BuildFinished(number, config, build.ok, build.cached, build.seconds, self.building()))
        if not build.ok or build.artifact is None:
            self.store.record_build(self.study, number, build, None)
            lap("record", t)
            return "FAIL", None, f"build failed: {build.error or 'no artifact'}", {}
        t = time.perf_counter()
        gate = apply_gate(build, self.space.gate)
        t = lap("gate", t)
        if not gate.passed or self.coordinator.reaped:
            self.store.record_build(self.study, number, build, gate)
            lap("record", t)
            if not gate.passed:
                return "PRUNED", None, gate.reason, {}
            return None                  # known taken over already: time nothing for the new owner
        race = self.race()
        pending = self.measure.submit(build.artifact, self.problem, race=race)   # race: None unless the stage races
        t = lap("measure", t)
        self.store.record_build(self.study, number, build, gate)   # while the GPU times it
        lap("record", t)
        return Submitted(number, config, race, pending, build.artifact)

    def end(self, submitted: Submitted) -> Verdict | None:
        """The verdict of a measurement :meth:`begin` submitted (waits for it)."""
        lap = self.clock.lap
        t = time.perf_counter()
        outcome = submitted.pending.result()
        self.measured += 1
        number, config, race = submitted.number, submitted.config, submitted.race
        if race is not None and race.paired and isinstance(outcome, MeasureFailure) \
                and outcome.kind in PAIRED_FAULTS:
            # A fault in the timing may be the incumbent's (a sticky error surfaces at a
            # synchronize, a hang at the timeout): time the config alone, and pair with that
            # incumbent no more.
            self.unpairable.add(str(race.incumbent_artifact.get("key")))
            race = dataclasses.replace(race, incumbent_artifact=None, incumbent_artifact_us=None)
            outcome = self.measure.measure(submitted.artifact, self.problem, race=race)
        t = lap("measure", t)
        if not self.coordinator.holds(config):
            return None                  # taken over while it was built or timed: its new owner records it
        self.store.record_measurement(self.study, number, config, outcome)
        lap("record", t)
        if isinstance(outcome, MeasureFailure):
            return "FAIL", None, measure_failure_reason(outcome.kind, outcome.reason), {}
        if not isinstance(outcome, Measurement):
            raise TypeError(f"measure stage returned {type(outcome).__name__}, not a Measurement")
        attrs: dict[str, Any] = {k: getattr(outcome, k) for k in MEASURED_ATTRS}
        self.tally.timed(outcome.median_us)
        if submitted.artifact is not None and not outcome.stopped_early:
            self.fastest.offer(outcome.median_us, submitted.artifact)
        if outcome.stopped_early:
            self.stopped += 1
            attrs[STOPPED_ATTR] = {"reps": outcome.repetitions, "planned_reps": outcome.planned_repetitions,
                                   "median_us": outcome.median_us, "incumbent_us": outcome.incumbent_us,
                                   "rule": race.rule.describe() if race is not None else None}
        if outcome.pairs and outcome.pair_ratio is not None:
            attrs[PAIRED_ATTR] = {"pairs": outcome.pairs, "ratio": outcome.pair_ratio}
        if self.device.tag:
            attrs[DEVICE_ATTR] = dict(self.device.tag)   # which GPU measured it (several searches, --gpus)
        return "COMPLETE", outcome.median_us, None, attrs

    def race(self) -> Race | None:
        """What a measure request races against: the best median measured on this GPU model
        (this run's, the searches' sharing :attr:`fastest`, or the study's earlier trials');
        None when racing is off, the stage does not race, or nothing is known yet (the first
        config gets the whole budget). A rule that pairs also names the artifact of the
        fastest config measured in this process, timed beside it."""
        if self.racing is None or not getattr(self.measure, "races", False):
            return None
        fastest = self.fastest.get()
        known = [v for v in (self.tally.incumbent(self.device.model), fastest[0] if fastest else None)
                 if v is not None]
        if not known:
            return None
        incumbent = min(known)
        if self.racing.paired_margin is not None and fastest is not None \
                and fastest[1].key not in self.unpairable:
            return Race(incumbent, self.racing, artifact_wire(fastest[1]), fastest[0])
        return Race(incumbent, self.racing)
