"""The measure stage's contract: a built artifact + the study's problem in,
a Measurement or a MeasureFailure out.

The search process never touches CUDA: a MeasureStage implementation talks to
a separate GPU worker process (evotuner.measure.worker) or answers from
recorded data (replay). Every way a kernel can fail becomes a MeasureFailure
value with a ``kind`` and a human ``reason``; measure() itself raises only for
programming errors, never for a bad kernel.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import Callable, Union

from evotuner.compiler.result import Artifact
from evotuner.problem import Problem

#: Failure kinds (recorded in the study; the fault-injection suite plants each one).
FAILURE_KINDS = (
    "launch",          # launch failed (bad configuration, too many resources)
    "smem",            # more shared memory than the device allows
    "illegal_access",  # sticky CUDA error; the worker's context is lost and it is respawned
    "timeout",         # the kernel hung; the worker was killed and respawned
    "wrong_result",    # max error over the tolerance
    "nan",             # NaN or Inf in the output
    "crash",           # the worker process died for another reason
)


@dataclass(frozen=True)
class Measurement:
    """Timing of one config at the study's shape (after it passed the correctness gate)."""

    median_us: float
    p20_us: float
    p80_us: float
    tflops: float
    max_error: float   # max |out - ref| at the study's shape
    tolerance: float   # the bound it was checked against (FA2's rule)
    repetitions: int   # repetitions timed (the figures above are theirs)
    #: Racing (evotuner/measure/racing.py): the timing stopped after ``repetitions`` of the
    #: ``planned_repetitions`` the budget allowed, the config being clearly slower than
    #: ``incumbent_us``, the study's best so far that the request carried. The figures are
    #: those of the repetitions it had; after a paired race's stop, its ratios to the
    #: incumbent timed beside it times that incumbent's recorded median (racing.paired_figures).
    stopped_early: bool = False
    planned_repetitions: int | None = None
    incumbent_us: float | None = None
    #: A paired race: repetitions timed in adjacent pairs with the incumbent's artifact, and the
    #: median of their config/incumbent time ratios (0 and None when nothing was paired). A
    #: paired stop's figures are that ratio times ``incumbent_us``'s artifact's recorded median.
    pairs: int = 0
    pair_ratio: float | None = None

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


@dataclass(frozen=True)
class MeasureFailure:
    kind: str
    reason: str

    def __post_init__(self) -> None:
        if self.kind not in FAILURE_KINDS:
            raise ValueError(f"unknown failure kind {self.kind!r}")


MeasureOutcome = Union[Measurement, MeasureFailure]


class PendingMeasure:
    """A measurement a stage has taken on (:meth:`MeasureStage.submit`).

    ``result()`` waits for its outcome, once (later calls return the same value);
    ``in_progress`` is True while the outcome is being produced elsewhere (a GPU worker
    process timing the kernel), so the caller may do other work before ``result()``.
    """

    __slots__ = ("_collect", "_outcome")

    def __init__(self, collect: Callable[[], MeasureOutcome]) -> None:
        self._collect: Callable[[], MeasureOutcome] | None = collect
        self._outcome: MeasureOutcome | None = None

    @classmethod
    def ready(cls, outcome: MeasureOutcome) -> "PendingMeasure":
        """A measurement whose outcome is already known."""
        pending = cls(lambda: outcome)
        pending.settle(outcome)
        return pending

    @property
    def in_progress(self) -> bool:
        return self._outcome is None

    def settle(self, outcome: MeasureOutcome) -> None:
        """Fix the outcome (the stage does, once it has read it or knows it is lost)."""
        if self._outcome is None:
            self._outcome, self._collect = outcome, None

    def result(self) -> MeasureOutcome:
        if self._outcome is None:
            assert self._collect is not None
            self.settle(self._collect())
        assert self._outcome is not None
        return self._outcome


class MeasureStage(ABC):
    """Contract:

    * ``measure`` is called from one thread, one artifact at a time (timing is
      strictly serial, one process per GPU); it returns a Measurement or a
      MeasureFailure and survives any kernel fault. A stage whose ``races`` is True
      takes ``race`` (a :class:`~evotuner.measure.racing.Race`: the study's best so far
      and the stopping rule) and may stop timing a clearly slower config early
      (``Measurement.stopped_early``); the loop passes ``race`` to no other stage.
    * ``submit`` takes the same arguments as ``measure`` and returns a
      :class:`PendingMeasure`; a stage that measures in another process sends the request
      and returns at once (its ``in_progress`` is True), so the loop asks the sampler while
      the GPU times. At most one submitted measurement is outstanding: any other call on the
      stage first collects it (its outcome stays with its PendingMeasure). The default
      measures at once (``in_progress`` False).
    * ``start`` begins whatever is slow to start (the GPU worker's torch import and CUDA
      context) without waiting for it; the first call that needs it waits.
    * ``baselines`` measures SDPA's backends at the problem's shape on the same
      device: ``{"sdpa_default": µs, "sdpa_flash": µs, "sdpa_efficient": µs}``
      (None for a backend that cannot run the shape).
    * ``device`` returns the device fingerprint (GPU name, SM count, clocks,
      driver, torch, CUDA, nvcc) or None when there is no device (replay).
    * ``model_name`` is the fingerprint's ``name`` (None without a device), where a stage can
      tell it cheaply without waiting for its slow start (``--gpus`` checks the GPUs are one
      model before any build).
    * ``close`` releases the worker; the stage is a context manager.
    """

    #: Whether ``measure`` takes a ``race`` (the loop races only such stages).
    races: bool = False

    @abstractmethod
    def measure(self, artifact: Artifact, problem: Problem) -> MeasureOutcome: ...

    def submit(self, artifact: Artifact, problem: Problem, race: object = None) -> PendingMeasure:
        """Take on one measurement (default: measure now; ``race`` is given only to a stage that races)."""
        if race is None:
            return PendingMeasure.ready(self.measure(artifact, problem))
        return PendingMeasure.ready(self.measure(artifact, problem, race=race))  # type: ignore[call-arg]

    def start(self) -> None:
        """Begin starting up in the background (no-op unless the stage has a slow start)."""

    @abstractmethod
    def baselines(self, problem: Problem) -> dict[str, float | None]: ...

    @abstractmethod
    def device(self) -> dict[str, object] | None: ...

    def model_name(self) -> str | None:
        """The device's model name (default: from ``device``, which may wait for the start)."""
        fingerprint = self.device()
        return None if fingerprint is None or fingerprint.get("name") is None else str(fingerprint["name"])

    def close(self) -> None:
        pass

    def __enter__(self) -> "MeasureStage":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
