"""The Optuna bridge: evotuner's study rows beside Optuna's studies and trials (creating,
loading and listing studies, reading trials, setting a trial's attributes, the studies that
seeded one)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Sequence

import optuna
from optuna.distributions import BaseDistribution
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import Table, delete, insert, select
from sqlalchemy.orm import Session

from evotuner.config import KernelConfig
from evotuner.errors import StorageError, StudyMismatchError
from evotuner.numbers import finite_or_none
from evotuner.problem import Problem
from evotuner.storage import damage as _damage
from evotuner.storage import schema
from evotuner.storage.creation import StudyCreation
from evotuner.storage.inputs import StoredSpace
from evotuner.storage.records import (
    DUPLICATE_ATTR,
    GATE_ATTR,
    REASON_ATTR,
    TFLOPS_ATTR,
    TRANSFER_ATTR,
    StudyInfo,
    StudyRecord,
    TrialRecord,
    is_finished,
)
from evotuner.storage.start import STUDY_ROW_WAIT_S


def space_fingerprint(space: StoredSpace | str) -> str:
    """A space's fingerprint; a string is one already."""
    return space if isinstance(space, str) else space.fingerprint()


def trial_record(t: FrozenTrial, gate_from_build: dict[str, Any] | None = None) -> TrialRecord:
    attrs = t.user_attrs
    dup = attrs.get(DUPLICATE_ATTR)
    tflops = attrs.get(TFLOPS_ATTR)
    gate = attrs.get(GATE_ATTR)
    return TrialRecord(
        number=t.number,
        state=t.state.name,
        value=finite_or_none(t.value) if t.state == TrialState.COMPLETE else None,
        # The loop records the config's values as user attr "config" (Optuna's params hold
        # the sampler's encoding, e.g. BLOCK_M_index); trials without it keep their params.
        params=dict(attrs["config"]) if isinstance(attrs.get("config"), Mapping) else dict(t.params),
        tflops=finite_or_none(tflops),
        gate=dict(gate) if isinstance(gate, Mapping) else gate_from_build,
        error=attrs.get(REASON_ATTR),
        duplicate_of=int(dup) if isinstance(dup, int) else None,
        datetime=t.datetime_complete or t.datetime_start,
        attrs=dict(attrs),
    )


class OptunaBridge(StudyCreation):
    """Studies and trials: evotuner's ``evotuner_studies`` rows and Optuna's study they name."""

    def _find_row(self, s: Session, name: str) -> Any:
        """Study ``name``'s row once created (None while its creation is under way)."""
        return s.execute(select(schema.studies).where(schema.studies.c.name == name,
                                                      schema.studies.c.optuna_study_id != schema.CREATING)).first()

    def study_row(self, s: Session, name: str) -> Any:
        """Study ``name``'s ``evotuner_studies`` row, read in session ``s`` (the other record
        modules key their rows by its ``id``); StorageError naming the study when it is missing."""
        row = self._find_row(s, name)
        if row is not None:
            for column in ("seed", "optuna_study_id"):   # SQLite keeps whatever was written there
                value = getattr(row, column)
                if (value is not None or column != "seed") and (isinstance(value, bool) or not isinstance(value, int)):
                    raise _damage.damaged(self._where, schema.studies.name, row.id, column, value, "not an integer")
            return row
        names = [n for n in s.execute(select(schema.studies.c.name).where(
            schema.studies.c.optuna_study_id != schema.CREATING).order_by(schema.studies.c.name)).scalars()]
        creating = s.execute(select(schema.studies.c.id).where(schema.studies.c.name == name)).first() is not None
        s.commit()   # end this (write-locking) transaction before Optuna's engine reads
        if creating:
            raise StorageError(
                f"study '{name}' in {self.display_url} is still being created by another process",
                f"wait for it; if that process died, `evotuner search --study {name}` with the study's options "
                f"takes the creation over once it has stood still for {STUDY_ROW_WAIT_S:.0f} s",
            )
        if name in self._optuna_names():
            raise StorageError(
                f"study '{name}' in {self.display_url} was not created by evotuner (no evotuner_studies row)",
                "use another --study name",
            )
        listing = ", ".join(f"'{n}'" for n in names) if names else "there are none"
        raise StorageError(
            f"study '{name}' not found in {self.display_url}; existing studies: {listing}",
            "check --study and --storage, or start it with `evotuner search`",
        )

    def load_study(
        self,
        name: str,
        *,
        problem: Problem | None = None,
        space: StoredSpace | str | None = None,
        sampler: optuna.samplers.BaseSampler | None = None,
    ) -> optuna.Study:
        """Load study ``name``. Given ``problem`` / ``space`` (SearchSpace or fingerprint),
        refuse with :class:`StudyMismatchError` when they differ from what the study was
        created with. Not found: StorageError naming the study and listing existing ones."""
        self.study_info(name, problem=problem, space=space)
        return self.optuna_study(name, sampler=sampler)

    def optuna_study(self, name: str, *, sampler: optuna.samplers.BaseSampler | None = None) -> optuna.Study:
        """The Optuna study of evotuner study ``name`` (no problem/space checks: see load_study)."""
        with self.session() as s:
            self.study_row(s, name)
        with self._optuna_call("loading the study"):
            return optuna.load_study(study_name=name, storage=self.optuna_storage, sampler=sampler)

    def study_info(self, name: str, *, problem: Problem | None = None,
                   space: StoredSpace | str | None = None) -> StudyRecord:
        """What study ``name`` was created with (problem, space and its text, sampler name, seed,
        hashes); the same not-found and mismatch errors as :meth:`load_study`."""
        with self._reading():
            return self._study_info(name, problem, space)

    def _study_info(self, name: str, problem: Problem | None, space: StoredSpace | str | None) -> StudyRecord:
        with self.session() as s:
            row = self.study_row(s, name)
        if problem is not None:
            created = self._problem(row)
            if created != problem:
                raise StudyMismatchError(
                    f"study '{name}' was created for {created}; this run asks for {problem}"
                    + _where_lengths_differ(created, problem),
                    "use another --study name" + (" (`evotuner show --json` lists a packed study's lengths)"
                                                  if created.varlen or problem.varlen else ""),
                )
        if space is not None:
            fp = space_fingerprint(space)
            if fp != row.space_fingerprint:
                this = None if isinstance(space, str) else space.name
                raise StudyMismatchError(
                    f"study '{name}' was created with search space '{row.space_name}' (fingerprint {row.space_fingerprint[:12]}); "
                    f"this run uses {('space ' + repr(this)) if this else 'a space'} with fingerprint {fp[:12]}",
                    "use another --study name, or the study's original space file",
                )
        return StudyRecord(
            name=row.name,
            problem=self._problem(row),
            space_name=row.space_name,
            space_fingerprint=row.space_fingerprint,
            space_text=row.space_text,
            kernel_family=row.kernel_family,
            sampler=row.sampler,
            seed=row.seed,
            source_hash=row.source_hash,
            nvcc_version=row.nvcc_version,
            evotuner_version=row.evotuner_version,
            created=row.created_at,
        )

    def list_studies(self) -> list[StudyInfo]:
        """Every evotuner study in the database, oldest first."""
        with self.session() as s:
            rows = s.execute(select(schema.studies).where(schema.studies.c.optuna_study_id != schema.CREATING)
                             .order_by(schema.studies.c.created_at, schema.studies.c.id)).all()
        with self._optuna_call("listing studies"):
            summaries = {x.study_name: x for x in optuna.get_all_study_summaries(self.optuna_storage, include_best_trial=True)}
        out = []
        for r in rows:
            summ = summaries.get(r.name)
            best = summ.best_trial.value if summ is not None and summ.best_trial is not None else None
            out.append(
                StudyInfo(
                    name=r.name,
                    problem=self._problem(r),
                    space_name=r.space_name,
                    sampler=r.sampler,
                    created=r.created_at,
                    n_trials=summ.n_trials if summ is not None else 0,
                    best_value=best,
                )
            )
        return out

    # -- trials ------------------------------------------------------------------------------
    def optuna_trials(self, name: str) -> tuple[int, list[FrozenTrial]]:
        """(Optuna study id, every trial of study ``name``) as Optuna holds them."""
        with self.session() as s:
            row = self.study_row(s, name)
        with self._optuna_call("reading trials"):
            return row.optuna_study_id, self.optuna_storage.get_all_trials(row.optuna_study_id, deepcopy=False)

    def optuna_study_id(self, name: str) -> int:
        """The id of the Optuna study behind evotuner study ``name``."""
        with self.session() as s:
            return int(self.study_row(s, name).optuna_study_id)

    def begin_trial(self, optuna_study_id: int, params: Mapping[str, Any],
                    distributions: Mapping[str, BaseDistribution]) -> int:
        """A RUNNING trial of Optuna study ``optuna_study_id`` holding ``params`` (Optuna's
        internal values, as ``distributions`` encode them), written in one transaction; returns
        its trial id. ``study.ask()`` then ``suggest_*`` commits once for the trial and once per
        parameter, and reads the study's unfinished trials twice: a proposal's largest cost
        where many builds are in flight (docs/measurements/gpus/)."""
        template = optuna.trial.create_trial(state=TrialState.RUNNING, params=dict(params),
                                             distributions=dict(distributions))
        with self._optuna_call("asking a trial"):
            return int(self.optuna_storage.create_new_trial(optuna_study_id, template_trial=template))

    def set_user_attrs(self, trial_id: int, attrs: Mapping[str, Any]) -> None:
        """Set every user attr of ``attrs`` on RUNNING trial ``trial_id`` in one transaction
        (Optuna's ``set_trial_user_attr`` commits each on its own). Raises Optuna's
        ``UpdateFinishedTrialError``, writing nothing, when the trial is finished, as
        ``set_trial_user_attr`` does."""
        if not attrs:
            return
        trials, user = _optuna_table("trials"), _optuna_table("trial_user_attributes")
        with self.session() as s:
            state = s.execute(select(trials.c.state).where(trials.c.trial_id == trial_id).with_for_update()).scalar()
            if state is None:
                raise StorageError(f"no trial with id {trial_id}",
                                   "set attributes only on trials the loop asked for")
            if _state_name(state) != TrialState.RUNNING.name:
                raise UpdateFinishedTrialError(
                    f"trial {trial_id} is {_state_name(state)}: its attributes are frozen")
            s.execute(delete(user).where(user.c.trial_id == trial_id, user.c.key.in_(list(attrs))))
            s.execute(insert(user), [{"trial_id": trial_id, "key": key, "value_json": json.dumps(value)}
                                     for key, value in attrs.items()])

    def finished_trials(self, name: str) -> list[TrialRecord]:
        """Every finished trial (COMPLETE, PRUNED, FAIL other than interrupted), by number."""
        _, trials = self.optuna_trials(name)
        return [trial_record(t) for t in trials if is_finished(t)]

    def finished_configs(self, name: str) -> dict[KernelConfig, TrialRecord]:
        """``{KernelConfig: TrialRecord}`` of configs that finished in the study (COMPLETE,
        PRUNED, or FAIL other than interrupted), so the loop can skip them; ``str(key)`` is
        the config string. A trial that copied another's result (``duplicate_of``) is not a
        config's own record. Per config, the best COMPLETE trial wins, else the earliest
        finished one. Trials whose params are not a KernelConfig are left out."""
        _, trials = self.optuna_trials(name)
        out: dict[KernelConfig, TrialRecord] = {}
        for t in trials:
            if not t.params or not is_finished(t) or t.user_attrs.get(DUPLICATE_ATTR) is not None:
                continue
            rec = trial_record(t)
            cfg = rec.kernel_config
            if cfg is None:
                continue
            old = out.get(cfg)
            if old is None or (
                rec.state == "COMPLETE"
                and (old.state != "COMPLETE" or (rec.value is not None and (old.value is None or rec.value < old.value)))
            ):
                out[cfg] = rec
        return out

    def count_finished(self, name: str) -> int:
        """Number of finished trials (COMPLETE, PRUNED, FAIL other than interrupted)."""
        _, trials = self.optuna_trials(name)
        return sum(1 for t in trials if is_finished(t))

    def _set_trial_attr(self, optuna_study_id: int, number: int, key: str, value: Any) -> bool:
        """Set a user attr on an unfinished trial; False if the trial is finished (attrs are frozen)."""
        storage = self.optuna_storage
        with self._optuna_call("writing a trial attribute"):
            try:
                trial_id = storage.get_trial_id_from_study_id_trial_number(optuna_study_id, number)
            except KeyError:
                raise StorageError(f"study has no trial number {number}", "record results only for trials the loop asked for") from None
            try:
                storage.set_trial_user_attr(trial_id, key, value)
            except UpdateFinishedTrialError:
                return False
        return True

    def record_transfer(self, study_name: str, sources: Sequence[str]) -> None:
        """Record the studies that seeded ``study_name`` (evotuner/transfer.py): its sampler
        reloads their measurements whenever the study runs, resumed runs included."""
        with self.session() as s:
            study_id = self.study_row(s, study_name).optuna_study_id
        with self._optuna_call("recording the studies that seeded it"):
            self.optuna_storage.set_study_user_attr(study_id, TRANSFER_ATTR, list(sources))

    def transfer_sources(self, study_name: str) -> tuple[str, ...]:
        """The studies that seeded ``study_name`` (none for a study started cold)."""
        with self.session() as s:
            study_id = self.study_row(s, study_name).optuna_study_id
        with self._optuna_call("reading the studies that seeded it"):
            names = self.optuna_storage.get_study_user_attrs(study_id).get(TRANSFER_ATTR) or []
        return tuple(str(n) for n in names)


def _where_lengths_differ(created: Any, asked: Any) -> str:
    """Where two packed problems that read the same (their summaries show a count and a range)
    differ: the first sequence whose query, then key, length is not the study's ("": they read
    apart already)."""
    if str(created) != str(asked):
        return ""
    for which, mine, theirs in (("query", created.lengths_q, asked.lengths_q),
                                ("key", created.lengths_k, asked.lengths_k)):
        i = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), None)
        if i is not None:
            return f"; its {which} lengths differ at sequence {i}: {mine[i]} in the study, {theirs[i]} here"
    return ""


def _optuna_table(name: str) -> Table:
    """One of Optuna's own tables (:func:`evotuner.storage.damage.optuna_tables`)."""
    return next(t for t in _damage.optuna_tables() if t.name == name)


def _state_name(state: Any) -> str:
    """A ``trials.state`` cell as its name (an Enum column reads as TrialState, or its name)."""
    return state.name if isinstance(state, TrialState) else str(state)
