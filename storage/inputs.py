"""What the store is given: small protocols the stages' frozen values satisfy.

The record stage depends on value types only (:mod:`evotuner.config`,
:mod:`evotuner.problem`, :mod:`evotuner.vocabulary`, ...), never on the space
parser, the compiler, the gate or the measure stage. These protocols name the
fields the store reads of their values, so the real types are passed as they are
(``SearchSpace``, ``BuildResult``, ``GateResult``, ``Measurement`` /
``MeasureFailure``) and a test passes its own frozen records of the same shape.
The store reads these fields and nothing else: no attribute is guessed.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from evotuner.config import KernelConfig


class StoredSpace(Protocol):
    """A search space as a study records it (``evotuner.space.SearchSpace``)."""

    @property
    def name(self) -> str: ...          # the space file's [space] name
    @property
    def kernel(self) -> str: ...        # the kernel family it tunes
    @property
    def text(self) -> str: ...          # the file text, kept to rebuild the space on resume
    def fingerprint(self) -> str: ...   # what a resume must match


class ArtifactFacts(Protocol):
    """A built cubin (``evotuner.compiler.result.Artifact``)."""

    @property
    def sha256(self) -> str: ...


class BuildFacts(Protocol):
    """One build (``evotuner.compiler.result.BuildResult``)."""

    @property
    def config(self) -> KernelConfig: ...
    @property
    def key(self) -> str: ...
    @property
    def ok(self) -> bool: ...
    @property
    def artifact(self) -> ArtifactFacts | None: ...
    @property
    def ptxas_log(self) -> str: ...
    @property
    def seconds(self) -> float: ...
    @property
    def cached(self) -> bool: ...
    @property
    def error(self) -> str | None: ...


class PtxasFigures(Protocol):
    """The ptxas figures of one entry (``evotuner.gate.PtxasReport``); the store's
    ``evotuner_builds`` columns and the ``gate`` trial attribute are these names."""

    @property
    def registers(self) -> int: ...
    @property
    def spill_stores(self) -> int: ...
    @property
    def spill_loads(self) -> int: ...
    @property
    def stack(self) -> int: ...
    @property
    def smem(self) -> int: ...          # static + dynamic shared memory per block
    @property
    def barriers(self) -> int: ...


class GateVerdict(Protocol):
    """The gate's decision on a build (``evotuner.gate.GateResult``)."""

    @property
    def passed(self) -> bool: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def report(self) -> PtxasFigures: ...


class Timing(Protocol):
    """A measured config (``evotuner.measure.base.Measurement``)."""

    @property
    def median_us(self) -> float: ...
    @property
    def p20_us(self) -> float: ...
    @property
    def p80_us(self) -> float: ...
    @property
    def tflops(self) -> float: ...
    @property
    def max_error(self) -> float: ...
    @property
    def tolerance(self) -> float: ...
    @property
    def repetitions(self) -> int: ...


@runtime_checkable
class Failure(Protocol):
    """A failed measurement (``evotuner.measure.base.MeasureFailure``): its kind (one of
    ``FAILURE_KINDS``) and one-line reason. An outcome is a :class:`Timing` or a Failure;
    the store tells them apart by this protocol (a Timing has no ``kind``)."""

    @property
    def kind(self) -> str: ...
    @property
    def reason(self) -> str: ...
