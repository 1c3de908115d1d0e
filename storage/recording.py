"""Records of a study's runs: builds (and their gate verdicts), measurements, devices and
SDPA baselines."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Iterable

from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from evotuner.config import KernelConfig
from evotuner.errors import StorageError
from evotuner.numbers import finite_or_none
from evotuner.problem import Problem
from evotuner.storage import damage as _damage
from evotuner.storage import schema
from evotuner.storage.bridge import OptunaBridge
from evotuner.storage.identity import device_identity, setup_identity
from evotuner.storage.inputs import BuildFacts, Failure, GateVerdict, PtxasFigures, Timing
from evotuner.storage.opening import utcnow
from evotuner.storage.records import GATE_ATTR, TFLOPS_ATTR, RecordedOutcome
from evotuner.vocabulary import MEASURED_ATTRS, measure_failure_reason

#: The ptxas figures recorded per build (columns of evotuner_builds, keys of the ``gate`` attr):
#: the fields of :class:`~evotuner.storage.inputs.PtxasFigures`.
PTXAS_FIGURES: tuple[str, ...] = ("registers", "spill_stores", "spill_loads", "stack", "smem", "barriers")
#: How much of a compile log is kept per build.
LOG_TAIL_CHARS = 4000


def fit_key(key: str, length: int | None = schema.builds.c.build_key.type.length) -> str:
    """``key`` as the ``build_key`` column holds it: unchanged when it fits; else its head and a
    hash of the whole, so it still tells builds apart. A server database enforces the column's
    length (SQLite does not), and a replayed build's key (``replay:<sweep>:<config>``) is longer."""
    if length is None or len(key) <= length:
        return key
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{key[:length - len(digest) - 1]}~{digest}"


def ptxas_figures(report: PtxasFigures | None) -> dict[str, int | None]:
    """The :data:`PTXAS_FIGURES` of a ptxas report (None: no report, every figure None)."""
    if report is None:
        return {k: None for k in PTXAS_FIGURES}
    return {k: int(getattr(report, k)) for k in PTXAS_FIGURES}



class Recording(OptunaBridge):
    """Writing (and reading back) a study's builds, measurements, devices and baselines."""

    def record_build(self, study_name: str, trial_number: int, build_result: BuildFacts,
                     gate_result: GateVerdict | None = None) -> None:
        """Record one build (a ``BuildResult``) and its gate verdict (a ``GateResult``; None
        when the gate did not run).

        Writes an ``evotuner_builds`` row (replacing an earlier one for the same trial) and,
        while the trial is unfinished, its user attr ``gate`` = {passed, reason, registers,
        spill_stores, spill_loads, stack, smem, barriers}. Call before telling the trial's state.
        """
        figures = ptxas_figures(gate_result.report if gate_result is not None else None)
        passed = bool(gate_result.passed) if gate_result is not None else None
        reason = gate_result.reason if gate_result is not None else None
        log = build_result.ptxas_log or ""
        artifact = build_result.artifact
        with self.session() as s:
            row = self.study_row(s, study_name)
            s.execute(
                delete(schema.builds).where(
                    schema.builds.c.study_id == row.id, schema.builds.c.trial_number == trial_number
                )
            )
            s.execute(
                insert(schema.builds).values(
                    study_id=row.id,
                    trial_number=trial_number,
                    config=str(build_result.config),
                    build_key=fit_key(str(build_result.key)),
                    artifact_sha256=artifact.sha256 if artifact is not None else None,
                    ok=bool(build_result.ok),
                    cached=bool(build_result.cached),
                    seconds=float(build_result.seconds),
                    gate_passed=passed,
                    gate_reason=reason,
                    error=build_result.error,
                    log_tail=log[-LOG_TAIL_CHARS:],
                    recorded_at=utcnow(),
                    **figures,
                )
            )
        if gate_result is not None:
            self._set_trial_attr(row.optuna_study_id, trial_number, GATE_ATTR, {"passed": passed, "reason": reason, **figures})

    def record_measurement(self, study_name: str, trial_number: int, config: KernelConfig,
                           outcome: Timing | Failure) -> None:
        """Record a trial's timing (a ``Measurement``) or failure (a ``MeasureFailure``) of
        ``config`` in ``evotuner_measurements`` (replacing an earlier row for that trial). For a
        Measurement, also sets the unfinished trial's user attr ``tflops``."""
        values: dict[str, Any] = {"config": str(config), "measured_at": utcnow()}
        if isinstance(outcome, Failure):
            ok = False
            values.update(ok=False, failure_kind=str(outcome.kind), failure_reason=str(outcome.reason))
        else:
            ok = True
            values.update(ok=True, median_us=float(outcome.median_us), p20_us=float(outcome.p20_us),
                          p80_us=float(outcome.p80_us), tflops=float(outcome.tflops),
                          max_error=float(outcome.max_error), tolerance=float(outcome.tolerance),
                          repetitions=int(outcome.repetitions))
        with self.session() as s:
            row = self.study_row(s, study_name)
            s.execute(
                delete(schema.measurements).where(
                    schema.measurements.c.study_id == row.id, schema.measurements.c.trial_number == trial_number
                )
            )
            s.execute(insert(schema.measurements).values(study_id=row.id, trial_number=trial_number, **values))
        if ok:
            self._set_trial_attr(row.optuna_study_id, trial_number, TFLOPS_ATTR, values["tflops"])

    def recorded_outcomes(self, study_name: str, numbers: Iterable[int]) -> dict[int, RecordedOutcome]:
        """The ``evotuner_measurements`` rows of trials ``numbers`` that have one, by number."""
        numbers = list(numbers)
        if not numbers:
            return {}
        m = schema.measurements
        with self.session() as s:
            row = self.study_row(s, study_name)
            rows = s.execute(select(m).where(m.c.study_id == row.id, m.c.trial_number.in_(numbers))).all()
        out = {}
        for r in rows:
            if r.ok:
                out[r.trial_number] = RecordedOutcome(r.trial_number, r.config, "COMPLETE", float(r.median_us),
                                                      {k: getattr(r, k) for k in MEASURED_ATTRS})
            else:
                out[r.trial_number] = RecordedOutcome(r.trial_number, r.config, "FAIL", None, {},
                                                      measure_failure_reason(r.failure_kind, r.failure_reason))
        return out

    def _device_id(self, s: Session, study_id: int, fingerprint: Mapping[str, Any]) -> tuple[int, bool]:
        """(device row id, changed) for this fingerprint, inserting or touching its row;
        changed: the study last saw another model or setup, not merely another card of it."""
        identity = device_identity(fingerprint)
        latest = s.execute(
            select(schema.devices.c.id, schema.devices.c.fingerprint_json)
            .where(schema.devices.c.study_id == study_id)
            .order_by(schema.devices.c.last_seen.desc(), schema.devices.c.id.desc())
            .limit(1)
        ).first()
        now = utcnow()
        blob = json.dumps(dict(fingerprint), sort_keys=True, default=str)
        existing = s.execute(
            select(schema.devices.c.id).where(schema.devices.c.study_id == study_id, schema.devices.c.identity == identity)
        ).scalar()
        if existing is None:
            existing = s.execute(
                insert(schema.devices).values(
                    study_id=study_id, identity=identity, fingerprint_json=blob, first_seen=now, last_seen=now
                )
            ).inserted_primary_key[0]
        else:
            s.execute(update(schema.devices).where(schema.devices.c.id == existing).values(fingerprint_json=blob, last_seen=now))
        changed = latest is not None and setup_identity(_damage.json_object(
            self._where, schema.devices.name, latest.id, "fingerprint_json", latest.fingerprint_json)) \
            != setup_identity(fingerprint)
        return int(existing), changed

    def _write(self, fn: Any) -> Any:
        """Run ``fn(session)`` in one transaction; retried when a concurrent writer inserted
        the same unique row first (two threads recording the same new device)."""
        for attempt in range(3):
            try:
                with self.session() as s:
                    return fn(s)
            except StorageError as err:
                if attempt == 2 or not isinstance(err.__cause__, IntegrityError):
                    raise
        raise AssertionError("unreachable")

    def record_device(self, study_name: str, fingerprint: Mapping[str, Any]) -> bool:
        """Record the device a run measures on (GPU name, SM count, clocks at start, driver,
        torch, CUDA, nvcc). Returns True when it differs from the device the study last saw
        (a resume on another GPU model or setup; another card of the same model and setup, as
        with ``--gpus``, is no change: their timings compare); both are kept, each with first_seen/last_seen. The first
        device of a study returns False. Keys naming clocks or temperature are stored but do
        not make a device "different"."""
        def write(s: Session) -> bool:
            row = self.study_row(s, study_name)
            return self._device_id(s, row.id, fingerprint)[1]

        return self._write(write)

    def record_baselines(
        self,
        study_name: str,
        fingerprint: Mapping[str, Any] | None,
        problem: Problem,
        results: Mapping[str, float | None],
    ) -> None:
        """Record SDPA baseline timings ``{backend: µs or None}`` measured on ``fingerprint``'s
        device (None: no device) for ``problem``. Rows are appended; the summary shows the
        latest per backend on the latest device."""
        now = utcnow()
        pj = json.dumps(problem.as_dict(), sort_keys=True)

        def write(s: Session) -> None:
            row = self.study_row(s, study_name)
            device_id = self._device_id(s, row.id, fingerprint)[0] if fingerprint is not None else None
            for backend, us in results.items():
                s.execute(
                    insert(schema.baselines).values(
                        study_id=row.id,
                        device_id=device_id,
                        problem_json=pj,
                        backend=str(backend),
                        median_us=us if (us := finite_or_none(us)) is not None and us > 0 else None,
                        measured_at=now,
                    )
                )

        self._write(write)

    def baselines(self, study_name: str, fingerprint: Mapping[str, Any] | None) -> dict[str, float | None] | None:
        """The latest baselines recorded for this study on this device (same identity as
        record_device), ``{backend: µs}``; None when none were recorded there (measure them)."""
        with self.session() as s:
            row = self.study_row(s, study_name)
            if fingerprint is None:
                cond = schema.baselines.c.device_id.is_(None)
            else:
                device = s.execute(
                    select(schema.devices.c.id).where(
                        schema.devices.c.study_id == row.id,
                        schema.devices.c.identity == device_identity(fingerprint),
                    )
                ).scalar()
                if device is None:
                    return None
                cond = schema.baselines.c.device_id == device
            rows = s.execute(
                select(schema.baselines.c.backend, schema.baselines.c.median_us)
                .where(schema.baselines.c.study_id == row.id, cond)
                .order_by(schema.baselines.c.measured_at, schema.baselines.c.id)
            ).all()
        return {b: finite_or_none(us) for b, us in rows} if rows else None

