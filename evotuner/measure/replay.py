"""Replay: answer the build and measure stages from a recorded sweep, on any machine.

A *sweep* (``scripts/sweep.py``, read by :mod:`evotuner.measure.sweep`) records every config
of a space at one problem: one CSV row per config and a sidecar ``<csv>.json`` with the
problem, the space fingerprint, the device fingerprint and the SDPA baselines of the same run.

How a replayed search runs (no nvcc, no GPU, no change to the loop)::

    replay = ReplayMeasure(csv, problem, space)
    run_search(..., builder=replay.builder(), measure=replay)

:class:`ReplayBuilder` stands in for :class:`~evotuner.compiler.Builder`: its
futures are already done and hold the *recorded* build (the real ptxas report,
the real meta table, or the recorded compiler error), so the loop's real gate
(:func:`evotuner.gate.apply_gate`) re-judges the recorded report and reaches the
sweep's verdict. The artifact it hands on names no cubin that can be loaded: its
``cubin`` is the sweep CSV and its ``key`` is ``replay:<csv sha256[:16]>:<config>``,
from which :meth:`ReplayMeasure.measure` reads the config back. Code that wants a
config's recorded outcome without the loop (the sampler benchmark) calls
:meth:`ReplayMeasure.lookup`.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evotuner.compiler.result import Artifact, BuildResult
from evotuner.config import KernelConfig
from evotuner.errors import StudyMismatchError
from evotuner.measure.base import MeasureFailure, MeasureOutcome, Measurement, MeasureStage
from evotuner.measure.sweep import (  # noqa: F401 (the sweep format, re-exported)
    BUILD_KIND,
    GATE_KIND,
    RESULT_COLUMNS,
    SIDECAR_KEYS,
    STATUSES,
    ReplayError,
    SweepRow,
    SweepTable,
    one_line,
    parse_row,
    read_sweep,
    sidecar_path,
    write_sidecar,
    write_sweep,
)
from evotuner.problem import Problem

#: Prefix of a replayed artifact's key.
KEY_PREFIX = "replay:"


@dataclass(frozen=True)
class Replayed:
    """What the sweep says about one config, in the loop's terms.

    ``state`` is the trial state the loop would record (COMPLETE, PRUNED, FAIL);
    ``outcome`` the Measurement or MeasureFailure of a config that reached the
    GPU (None for pruned configs and failed builds); ``reason`` the one line.
    """

    config: KernelConfig
    state: str
    reason: str | None
    outcome: MeasureOutcome | None
    row: SweepRow = field(compare=False, repr=False)

    @property
    def value(self) -> float | None:
        return self.outcome.median_us if isinstance(self.outcome, Measurement) else None

    @property
    def evaluated(self) -> bool:
        """True when finding this out cost a compile (everything but static pruning)."""
        return not self.row.statically_pruned


# --------------------------------------------------------------------------- the stages


class ReplayMeasure(MeasureStage):
    """The measure stage answered from a sweep (see the module docstring).

    Construction checks that the sweep was recorded for ``problem`` (shape, dtype,
    causal) and, given ``space``, that it has the same parameters and fingerprint
    and a row for every config of the space; each mismatch is a ReplayError naming
    the file and what differs. ``calls`` counts :meth:`measure` calls.
    """

    def __init__(self, path: str | Path, problem: Problem, space: Any = None, *,
                 build_s: float = 0.0, measure_s: float = 0.0, device_index: int | None = None) -> None:
        self.table = read_sweep(path)
        self.problem = problem
        #: The kernel family of the space replayed ("" when no space is given).
        self.family = str(getattr(space, "kernel", "") or "") if space is not None else ""
        self.calls = 0
        #: Seconds each replayed build / measurement takes (0: answer at once). A delay makes a
        #: replayed run overlap like a real one: several workers, a build pool, GPU queues.
        if build_s < 0 or measure_s < 0:
            raise ValueError("replay delays must not be negative")
        self.build_s = float(build_s)
        self.measure_s = float(measure_s)
        #: Which GPU this replay stands for (``--gpus`` with ``--replay``); part of its device.
        self.device_index = device_index
        recorded = self.table.problem
        if recorded != problem:
            raise StudyMismatchError(
                f"--replay {self.table.path}: recorded for {recorded}; the study is {problem}",
                "replay a sweep of the same shape, dtype and causal flag (scripts/sweep.py --shape ...)",
            )
        if space is not None:
            self._check_space(space)

    def _check_space(self, space: Any) -> None:
        path = self.table.path
        if set(space.names) != set(self.table.names):
            raise ReplayError(
                f"--replay {path}: parameters {', '.join(self.table.names)} differ from the space's "
                f"{', '.join(space.names)}",
                self._space_remedy("replay a sweep of this search space"),
            )
        recorded = self.table.header.get("space_fingerprint")
        if recorded != space.fingerprint():
            raise ReplayError(
                f"--replay {path}: recorded with space fingerprint {str(recorded)[:12]}, this space is "
                f"{space.fingerprint()[:12]} ({space.path})",
                self._space_remedy("replay with the space file the sweep used, or sweep this space again"),
            )
        missing = [c for c in space.configs() if c not in self.table.rows]
        if missing:
            raise ReplayError(f"--replay {path}: no row for {len(missing)} config(s) of the space, e.g. {missing[0]}",
                              "sweep the whole space (scripts/sweep.py without --limit)")

    def _space_remedy(self, otherwise: str) -> str:
        """Names the space the sweep's sidecar records (``space_name``), as ``--space`` takes it."""
        name = self.table.header.get("space_name")
        if not isinstance(name, str) or not name:
            return otherwise
        return f"this sweep was recorded with space {name}: pass --space {name}, or sweep this space again"

    # -- lookups -------------------------------------------------------------------------

    def row(self, config: KernelConfig) -> SweepRow:
        try:
            return self.table.rows[config]
        except KeyError:
            raise ReplayError(f"--replay {self.table.path}: no row for config {config}",
                              "replay a sweep of this search space") from None

    def lookup(self, config: KernelConfig) -> Replayed:
        """The recorded outcome of ``config`` as the loop would record it."""
        row = self.row(config)
        if row.status == "ok":
            return Replayed(config, "COMPLETE", None, row.measurement(), row)
        if row.status == "gated":
            return Replayed(config, "PRUNED", row.reason, None, row)
        if row.failure_kind == BUILD_KIND:
            return Replayed(config, "FAIL", f"build failed: {row.reason}", None, row)
        failure = MeasureFailure(row.failure_kind, row.reason)
        return Replayed(config, "FAIL", f"{failure.kind}: {failure.reason}", failure, row)

    def artifact_key(self, config: KernelConfig) -> str:
        return f"{KEY_PREFIX}{self.table.sha256[:16]}:{config}"

    def config_of(self, artifact: Artifact) -> KernelConfig:
        prefix = f"{KEY_PREFIX}{self.table.sha256[:16]}:"
        if not artifact.key.startswith(prefix):
            raise ReplayError(f"replay: artifact {artifact.key!r} was not built by this replay ({self.table.path})",
                              "pass ReplayMeasure.builder() to the loop as its builder")
        return KernelConfig.parse(artifact.key[len(prefix):])

    def builder(self, jobs: int = 4) -> "ReplayBuilder":
        return ReplayBuilder(self, jobs=jobs)

    # -- MeasureStage -------------------------------------------------------------------

    def measure(self, artifact: Artifact, problem: Problem) -> MeasureOutcome:
        if problem != self.problem:
            raise ReplayError(f"replay: asked for {problem}, the sweep is {self.problem}")
        config = self.config_of(artifact)
        self.calls += 1
        if self.measure_s:
            time.sleep(self.measure_s)
        replayed = self.lookup(config)
        if replayed.outcome is None:
            raise ReplayError(
                f"--replay {self.table.path}: {config} passed the gate but the sweep did not measure it "
                f"(recorded {replayed.row.status}: {one_line(replayed.row.reason)})",
                "the gate thresholds differ from the sweep's; sweep again with this space",
            )
        return replayed.outcome

    def baselines(self, problem: Problem) -> dict[str, float | None]:
        return {str(k): (float(v) if v is not None else None) for k, v in dict(self.table.header["baselines"]).items()}

    def device(self) -> dict[str, object] | None:
        device = dict(self.table.header.get("device") or {})
        device["replayed"] = True
        device["replay_sha256"] = self.table.sha256
        if self.device_index is not None:
            device["device_index"] = self.device_index
        return device


class ReplayBuilder:
    """Stands in for :class:`evotuner.compiler.Builder` in a replayed search: every
    future is already done and holds the sweep's recorded build. Never runs nvcc."""

    def __init__(self, replay: ReplayMeasure, jobs: int = 4) -> None:
        self.replay = replay
        self.jobs = max(1, int(jobs))
        self.submitted = 0
        self._pool: ThreadPoolExecutor | None = None

    def cache_key(self, config: KernelConfig, problem: Problem) -> str:
        return self.replay.artifact_key(config)

    def build(self, config: KernelConfig, problem: Problem) -> BuildResult:
        if problem != self.replay.problem:
            raise ReplayError(f"replay: asked to build for {problem}, "
                              f"the sweep is {self.replay.problem}")
        row = self.replay.row(config)
        key = self.cache_key(config, problem)
        if not row.compiled:
            why = row.reason if row.failure_kind == BUILD_KIND else f"the sweep never compiled it: {row.reason}"
            return BuildResult(config, key, False, None, row.ptxas_log, 0.0, True, error=why or "no build recorded")
        artifact = Artifact(cubin=self.replay.table.path, key=key, sha256=self.replay.table.sha256,
                            meta={k: int(v) for k, v in row.meta.items()}, family=self.replay.family)
        return BuildResult(config, key, True, artifact, row.ptxas_log, 0.0, True)

    def _slow_build(self, config: KernelConfig, problem: Problem) -> BuildResult:
        time.sleep(self.replay.build_s)
        return self.build(config, problem)

    def submit(self, config: KernelConfig, problem: Problem) -> "Future[BuildResult]":
        if self.replay.build_s:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.jobs, thread_name_prefix="evotuner-replay-build")
            self.submitted += 1
            return self._pool.submit(self._slow_build, config, problem)
        future: Future[BuildResult] = Future()
        self.submitted += 1
        try:
            future.set_result(self.build(config, problem))
        except Exception as exc:  # noqa: BLE001 -- a future carries its error, as the Builder's do
            future.set_exception(exc)
        return future

    def source_hash(self) -> str:
        return str(self.replay.table.header.get("source_hash") or f"replay:{self.replay.table.sha256}")

    def nvcc_version(self) -> str:
        return str(self.replay.table.header.get("nvcc_version") or "replay (no nvcc)")

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> "ReplayBuilder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
