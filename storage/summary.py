"""Reading a study whole: its summary (creation record, devices, baselines, trials, the
best), its space text and its latest diagnostics."""

from __future__ import annotations

import math

from sqlalchemy import select, text

from evotuner.errors import StorageError
from evotuner.numbers import finite_or_none
from evotuner.storage import damage as _damage
from evotuner.storage import diagnostics as _diagnostics
from evotuner.storage import schema
from evotuner.storage.bridge import OptunaBridge, trial_record
from evotuner.storage.records import StudySummary
from evotuner.storage.recording import PTXAS_FIGURES


class Summaries(OptunaBridge):
    """What a study holds, read back whole."""

    def summary(self, study_name: str) -> StudySummary:
        """Everything about one study: its creation record, devices, baselines, trials and
        the best COMPLETE trial (lowest value). StorageError if the study is not found."""
        with self._reading():
            return self._summary(study_name)

    def _summary(self, study_name: str) -> StudySummary:
        with self.session() as s:
            row = self.study_row(s, study_name)
            build_rows = s.execute(
                select(schema.builds).where(schema.builds.c.study_id == row.id)
            ).all()
            device_rows = s.execute(
                select(schema.devices)
                .where(schema.devices.c.study_id == row.id)
                .order_by(schema.devices.c.last_seen, schema.devices.c.id)
            ).all()
            latest_device = device_rows[-1].id if device_rows else None
            base_rows = s.execute(
                select(schema.baselines)
                .where(
                    schema.baselines.c.study_id == row.id,
                    schema.baselines.c.device_id.is_(None)
                    if latest_device is None
                    else schema.baselines.c.device_id == latest_device,
                )
                .order_by(schema.baselines.c.measured_at, schema.baselines.c.id)
            ).all()
        gate_by_trial = {
            b.trial_number: {"passed": b.gate_passed, "reason": b.gate_reason, **{k: getattr(b, k) for k in PTXAS_FIGURES}}
            for b in build_rows
            if b.gate_passed is not None
        }
        with self._optuna_call("reading trials"):
            trials = self.optuna_storage.get_all_trials(row.optuna_study_id, deepcopy=False)
        for t in trials:     # SQLite hands back what a cell holds: text where a number belongs (_reading names it)
            if isinstance(t.number, bool) or not isinstance(t.number, int) or \
                    any(isinstance(v, (str, bytes)) for v in t.values or ()):
                raise TypeError(f"trial {t.number!r}: a number or value that is text")
        records = tuple(trial_record(t, gate_by_trial.get(t.number)) for t in trials)
        complete = [r for r in records if r.state == "COMPLETE" and r.value is not None]
        devices = tuple(
            {
                "fingerprint": _damage.json_object(self._where, schema.devices.name, d.id, "fingerprint_json",
                                                   d.fingerprint_json),
                "first_seen": d.first_seen.isoformat(),
                "last_seen": d.last_seen.isoformat(),
            }
            for d in device_rows
        )
        return StudySummary(
            study=row.name,
            problem=self._problem(row),
            space_name=row.space_name,
            space_fingerprint=row.space_fingerprint,
            kernel_family=row.kernel_family,
            sampler=row.sampler,
            seed=row.seed,
            created=row.created_at,
            source_hash=row.source_hash,
            nvcc_version=row.nvcc_version,
            evotuner_version=row.evotuner_version,
            device=devices[-1]["fingerprint"] if devices else None,
            devices=devices,
            baselines={b.backend: finite_or_none(b.median_us) for b in base_rows},
            best=min(complete, key=lambda r: (r.value, r.number)) if complete else None,
            trials=records,
        )

    def latest_checks(self, study: str) -> dict[str, dict[str, _diagnostics.CheckRecord]]:
        """config -> tool -> the latest ``evotuner check`` verdict of ``study``
        (:func:`evotuner.storage.diagnostics.latest_checks`)."""
        return _diagnostics.latest_checks(self, study)

    def space_text(self, study_name: str) -> str:
        """The space file text the study was created with (to rebuild its SearchSpace)."""
        with self.session() as s:
            return self.study_row(s, study_name).space_text

    def value_damage(self, study_name: str, number: int) -> StorageError | None:
        """Why COMPLETE trial ``number`` of the study has no median to use, as the one-line
        damage error naming the cell (:mod:`evotuner.storage.damage`): its ``trial_values``
        value is not a number, not finite, or not positive (a median in µs is none of these),
        or it has no value row; None when its value is a positive finite number."""
        with self.session() as s:
            study_id = self.study_row(s, study_name).optuna_study_id
            found = s.execute(text(
                "SELECT t.trial_id, v.trial_value_id, v.value, v.value_type FROM trials t LEFT JOIN trial_values v "
                "ON v.trial_id = t.trial_id AND v.objective = 0 WHERE t.study_id = :study AND t.number = :number"),
                {"study": study_id, "number": number}).first()
        if found is None:
            return None
        trial_id, row, value, kind = found
        if row is None:
            return _damage.damaged(self._where, "trials", trial_id, "state", "COMPLETE",
                                   "a COMPLETE trial without a row in trial_values")
        if kind != "FINITE":
            return _damage.damaged(self._where, "trial_values", row, "value_type", kind,
                                   "an infinite value is no median")
        why = ("no number though value_type is FINITE" if value is None else
               "not a number" if isinstance(value, bool) or not isinstance(value, (int, float)) else
               "not a finite number" if not math.isfinite(value) else
               "not a positive number (a median in µs)" if value <= 0 else None)
        return None if why is None else _damage.damaged(self._where, "trial_values", row, "value", value, why)
