"""Progress events the search loop emits (frozen values, never printed here).

``evotuner.loop.run_search`` calls ``on_event(event)`` with one of these at
every step; the CLI renders them (rich Live), tests collect them. An event
handler must not raise: the loop treats an exception from it like any other
unexpected error of the trial being processed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from evotuner.config import KernelConfig

#: Trial states as the loop reports them (Optuna's names).
STATES = ("COMPLETE", "PRUNED", "FAIL")


@dataclass(frozen=True)
class Best:
    """The best COMPLETE trial so far (lowest median µs)."""

    number: int
    config: KernelConfig
    median_us: float
    tflops: float | None


@dataclass(frozen=True)
class SearchStarted:
    study: str
    target: int                 # finished trials wanted in total
    finished: int               # finished trials already in the study
    zombies: tuple[int, ...]    # RUNNING trials of a killed process, now FAIL and re-enqueued
    batch: int                  # trials asked ahead (≈ build jobs)


@dataclass(frozen=True)
class Seeded:
    """A new study starts from the nearest studies in its database (:mod:`evotuner.transfer`):
    ``sources`` = (study, problem text, configs enqueued, measurements given to the sampler)
    each; ``configs`` enqueued in all; ``related``: the sampler takes the measurements
    (nothing enqueued) rather than their best configs."""

    sources: tuple[tuple[str, str, int, int], ...]
    configs: int
    related: bool = False


@dataclass(frozen=True)
class DeviceChanged:
    """This run measures on another device than the study's last (both are recorded; the
    study's earlier timings came from the other one)."""

    device: str


@dataclass(frozen=True)
class BaselinesMeasured:
    """SDPA backends at the study's shape on this device (µs; None: cannot run)."""

    baselines: dict[str, float | None] = field(hash=False)


@dataclass(frozen=True)
class TrialStarted:
    number: int
    config: KernelConfig


@dataclass(frozen=True)
class BuildStarted:
    number: int
    config: KernelConfig
    in_flight: int              # builds submitted and not yet collected, this one included


@dataclass(frozen=True)
class BuildFinished:
    number: int
    config: KernelConfig
    ok: bool
    cached: bool
    seconds: float
    in_flight: int              # builds still in flight after this one


@dataclass(frozen=True)
class TrialFinished:
    number: int
    config: KernelConfig
    state: str                  # one of STATES
    value: float | None         # median µs for COMPLETE
    reason: str | None          # why PRUNED / FAIL (constraint, gate, build error, measure failure)
    tflops: float | None = None
    duplicate_of: int | None = None  # finished with the result of this earlier trial
    #: Racing stopped its timing early: (repetitions timed, repetitions planned).
    stopped_early: tuple[int, int] | None = None


@dataclass(frozen=True)
class Progress:
    """Sent after every finished trial: the numbers a progress bar shows."""

    finished: int
    target: int
    counts: dict[str, int] = field(hash=False)   # finished trials per state, whole study
    in_flight: int = 0
    best: Best | None = None


@dataclass(frozen=True)
class SearchFinished:
    outcome: str                # see evotuner.loop.OUTCOMES
    finished: int
    target: int


Event = (
    SearchStarted | BaselinesMeasured | TrialStarted | BuildStarted | BuildFinished
    | TrialFinished | Progress | SearchFinished
)
