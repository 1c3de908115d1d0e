"""Frozen values the store hands out (read side): trials, zombies, study summaries.

These are plain data: they hold no session, no engine and no Optuna object, so
the CLI and the exporter can keep them after the store is closed.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any

from optuna.trial import FrozenTrial

from evotuner.config import KernelConfig, config_string
from evotuner.errors import EvotunerError
from evotuner.problem import Problem

# The trial-attribute names and the "interrupted" rule live in evotuner.vocabulary.
from evotuner.vocabulary import (  # noqa: E402,F401 (re-exported: the record stage's names)
    DUPLICATE_ATTR,
    FINISHED_STATES,
    GATE_ATTR,
    INTERRUPTED_PREFIX,
    INTERRUPTED_REASON,
    REASON_ATTR,
    TFLOPS_ATTR,
    TRANSFER_ATTR,
    is_interrupted,
)


def is_finished(t: FrozenTrial) -> bool:
    """True for an Optuna trial that finished (COMPLETE, PRUNED, or FAIL other than interrupted):
    its config counts as tried."""
    return t.state.name in FINISHED_STATES and not is_interrupted(t.state, t.user_attrs.get(REASON_ATTR))


def _iso(value: _dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


@dataclass(frozen=True)
class TrialRecord:
    """One Optuna trial as evotuner reads it.

    ``state`` is Optuna's state name (COMPLETE, PRUNED, FAIL, RUNNING, WAITING);
    ``value`` the median µs of a COMPLETE trial (None otherwise); ``error`` the
    trial's ``reason`` user attribute; ``gate`` its ``gate`` user attribute (or
    the figures of its build row); ``datetime`` when it finished, or started
    when it has not.
    """

    number: int
    state: str
    value: float | None
    params: dict[str, int] = field(hash=False)
    tflops: float | None = None
    gate: dict[str, Any] | None = field(default=None, hash=False)
    error: str | None = None
    duplicate_of: int | None = None
    datetime: _dt.datetime | None = None
    attrs: dict[str, Any] = field(default_factory=dict, hash=False)  # all user attrs

    @property
    def config(self) -> str:
        """The config string of the params ("" for a trial that never got any)."""
        return config_string(self.params)

    @property
    def kernel_config(self) -> KernelConfig | None:
        """The params as a KernelConfig (None: no params, or params that are not integers)."""
        try:
            return KernelConfig.of(self.params) if self.params else None
        except (ValueError, TypeError, EvotunerError):
            return None

    def as_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "state": self.state,
            "value": self.value,
            "config": self.config,
            "params": dict(self.params),
            "tflops": self.tflops,
            "gate": self.gate,
            "error": self.error,
            "duplicate_of": self.duplicate_of,
            "datetime": _iso(self.datetime),
        }


@dataclass(frozen=True)
class RecordedOutcome:
    """A trial's row in ``evotuner_measurements``: what its measurer would have told it.

    :func:`evotuner.storage.liveness.reap` tells a dead worker's RUNNING trial from it, so
    a measurement that was recorded is never lost nor taken again."""

    number: int
    config: str
    state: str                          # COMPLETE (measured) or FAIL (the measurement failed)
    value: float | None                 # the median (µs) of a COMPLETE one
    attrs: dict[str, Any] = field(hash=False)   # MEASURED_ATTRS of a COMPLETE one
    reason: str | None = None           # why a FAIL one failed


@dataclass(frozen=True)
class Zombie:
    """A trial a dead process left RUNNING, now FAIL with :data:`INTERRUPTED_REASON`.

    ``requeue`` is True when its config is queued again (a WAITING trial): the trial
    had params, its config has not finished elsewhere in the study (nor is it already
    waiting in the queue, nor another zombie's), and a budget slot was there for it
    (:func:`evotuner.storage.liveness.reap`, which queues it).
    """

    number: int
    params: dict[str, int] = field(hash=False)
    requeue: bool = True

    @property
    def config(self) -> str:
        return config_string(self.params)


@dataclass(frozen=True)
class StudyRecord:
    """What a study was created with (``StudyStore.study_info``); ``space_text`` is the
    space file text stored at creation (``evotuner.session.study_space`` rebuilds it)."""

    name: str
    problem: Problem
    space_name: str
    space_fingerprint: str
    space_text: str
    kernel_family: str
    sampler: str
    seed: int | None
    source_hash: str
    nvcc_version: str
    evotuner_version: str
    created: _dt.datetime


@dataclass(frozen=True)
class StudyInfo:
    """One line of ``list_studies()``."""

    name: str
    problem: Problem
    space_name: str
    sampler: str
    created: _dt.datetime
    n_trials: int
    best_value: float | None


@dataclass(frozen=True)
class StudySummary:
    """Everything ``evotuner show`` needs about one study, read in one go."""

    study: str
    problem: Problem
    space_name: str
    space_fingerprint: str
    kernel_family: str
    sampler: str
    seed: int | None
    created: _dt.datetime
    source_hash: str
    nvcc_version: str
    evotuner_version: str
    device: dict[str, Any] | None = field(hash=False)   # the latest fingerprint, None if never measured
    devices: tuple[dict[str, Any], ...] = field(hash=False)  # every device seen: fingerprint, first/last seen
    baselines: dict[str, float | None] = field(hash=False)  # backend -> µs on the latest device
    best: TrialRecord | None = None
    trials: tuple[TrialRecord, ...] = ()

    def counts(self) -> dict[str, int]:
        """Number of trials per state name."""
        out: dict[str, int] = {}
        for t in self.trials:
            out[t.state] = out.get(t.state, 0) + 1
        return out

    def as_json(self) -> dict[str, Any]:
        """The dict ``evotuner show --json`` prints (JSON-serialisable)."""
        p = self.problem
        return {
            "study": self.study,
            "shape": str(p.shape),
            "dtype": p.dtype,
            "causal": p.causal,
            "problem": p.as_dict(),
            "space": {"name": self.space_name, "fingerprint": self.space_fingerprint},
            "kernel_family": self.kernel_family,
            "sampler": self.sampler,
            "seed": self.seed,
            "created": _iso(self.created),
            "source_hash": self.source_hash,
            "nvcc_version": self.nvcc_version,
            "evotuner_version": self.evotuner_version,
            "device": self.device,
            "devices": [dict(d) for d in self.devices],
            "baselines": dict(self.baselines),
            "counts": self.counts(),
            "best": self.best.as_dict() if self.best is not None else None,
            "trials": [t.as_dict() for t in self.trials],
        }
