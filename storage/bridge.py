"""The Optuna bridge: evotuner's study rows beside Optuna's studies and trials (creating,
loading and listing studies, reading trials, setting a trial's attributes, the studies that
seeded one)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Sequence

import optuna
from optuna.exceptions import DuplicatedStudyError, UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import delete, insert, select, update
from sqlalchemy.orm import Session

from evotuner.config import KernelConfig
from evotuner.errors import StorageError, StudyMismatchError
from evotuner.numbers import finite_or_none
from evotuner.problem import Problem
from evotuner.storage import damage as _damage
from evotuner.storage import schema
from evotuner.storage.start import STUDY_ROW_WAIT_S
from evotuner.storage.inputs import StoredSpace
from evotuner.storage.opening import StoreOpening, utcnow
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
from evotuner.version import evotuner_version


def space_fingerprint(space: StoredSpace | str) -> str:
    """A space's fingerprint; a string is one already."""
    return space if isinstance(space, str) else space.fingerprint()


def space_facts(space: StoredSpace) -> dict[str, str]:
    """The ``evotuner_studies`` columns that record a study's space."""
    return {
        "space_name": space.name,
        "space_fingerprint": space.fingerprint(),
        "kernel_family": space.kernel,
        "space_text": space.text,
    }


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


class OptunaBridge(StoreOpening):
    """Studies and trials: evotuner's ``evotuner_studies`` rows and Optuna's study they name."""

    def _find_row(self, s: Session, name: str) -> Any:
        """Study ``name``'s row once created (None while its creation is under way)."""
        return s.execute(select(schema.studies).where(schema.studies.c.name == name,
                                                      schema.studies.c.optuna_study_id != schema.CREATING)).first()

    def creation_under_way(self, name: str) -> Any:
        """The ``created_at`` stamp of study ``name``'s row while its creation is under way
        (the row taken, Optuna's study or the id not yet written), else None. Passed to
        :meth:`abandon_creation` when that stamp stays the same too long."""
        with self.session() as s:
            return s.execute(select(schema.studies.c.created_at).where(
                schema.studies.c.name == name, schema.studies.c.optuna_study_id == schema.CREATING)).scalar()

    def _optuna_names(self) -> list[str]:
        with self._optuna_call("listing studies"):
            return sorted(st.study_name for st in self.optuna_storage.get_all_studies())

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
                f"run the command again: a creation left unfinished for {STUDY_ROW_WAIT_S:.0f} s is cleared and redone",
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

    def study_exists(self, name: str) -> bool:
        """True when an evotuner study (one being created included), or any Optuna study,
        already has this name."""
        with self.session() as s:
            if s.execute(select(schema.studies.c.id).where(schema.studies.c.name == name)).first() is not None:
                return True
        return name in self._optuna_names()

    def create_study(
        self,
        name: str,
        problem: Problem,
        space: StoredSpace,
        sampler_name: str,
        seed: int | None = None,
        *,
        source_hash: str,
        nvcc_version: str,
        sampler: optuna.samplers.BaseSampler | None = None,
    ) -> optuna.Study:
        """Create study ``name`` (direction minimize: the value is the median µs) and its
        evotuner row (problem, space name/fingerprint/file text, kernel family, sampler,
        seed, kernel source hash, nvcc and evotuner versions).

        ``space`` is the SearchSpace (:class:`~evotuner.storage.inputs.StoredSpace`: its name,
        kernel family, text and fingerprint are recorded). ``sampler`` is the Optuna sampler
        object to attach (``sampler_name``/``seed`` are what is recorded).
        Raises StorageError if the name is taken (by an evotuner or a plain Optuna study).
        """
        if not sampler_name:
            raise StorageError(f"study '{name}': no sampler name to record", "pass sampler_name, e.g. 'tpe'")
        if not name or not name.strip():
            raise StorageError("study name is empty", "pass --study NAME")
        facts = space_facts(space)
        if self.study_exists(name):
            raise StorageError(
                f"study '{name}' already exists in {self.display_url}",
                "continue it with `evotuner resume`, or choose another --study name",
            )
        # The two schemas share no transaction. The row comes first: it takes the name (the
        # unique column refuses a second creator) and marks the creation under way, so a
        # process killed half way leaves a row the next creator recognises and clears
        # (abandon_creation), never an Optuna study nobody may use.
        stamp = utcnow()
        try:
            with self.session() as s:
                s.execute(insert(schema.studies).values(
                    name=name, optuna_study_id=schema.CREATING, problem_json=json.dumps(problem.as_dict(), sort_keys=True),
                    sampler=sampler_name, seed=seed, created_at=stamp, evotuner_version=evotuner_version(),
                    source_hash=source_hash, nvcc_version=nvcc_version, **facts,
                ))
        except StorageError:
            if self.study_exists(name):   # another creator took the name first
                raise StorageError(f"study '{name}' already exists in {self.display_url}",
                                   "continue it with `evotuner resume`, or choose another --study name") from None
            raise
        study = None
        try:
            try:
                with self._optuna_call("creating the study"):
                    study = optuna.create_study(
                        study_name=name, storage=self.optuna_storage, sampler=sampler, direction="minimize"
                    )
            except DuplicatedStudyError:
                raise StorageError(f"study '{name}' already exists in {self.display_url}", "choose another --study name") from None
            with self.session() as s:
                done = s.execute(update(schema.studies).where(
                    schema.studies.c.name == name, schema.studies.c.optuna_study_id == schema.CREATING,
                    schema.studies.c.created_at == stamp,
                ).values(optuna_study_id=study._study_id)).rowcount
            if done != 1:   # stalled past STUDY_ROW_WAIT_S: another process cleared this creation
                raise StorageError(f"study '{name}': another process took over its creation in {self.display_url}",
                                   "run the command again")
        except BaseException:
            self._undo_creation(name, stamp, None if study is None else study._study_id)
            raise
        # For Optuna's own tools (optuna-dashboard); evotuner reads its row. Written once the
        # study is complete: before, the id may already name another creator's study.
        with self._optuna_call("describing the study"):
            study.set_user_attr("problem", problem.as_dict())
            study.set_user_attr("space", {"name": facts["space_name"], "fingerprint": facts["space_fingerprint"]})
            study.set_user_attr("sampler", sampler_name)
        return study

    def _undo_creation(self, name: str, stamp: Any, optuna_id: int | None) -> None:
        """Remove what a creation that failed wrote: its row while still marked under way,
        and its Optuna study while it holds no trial and either that row was still there or
        no row names the study at all. A row gone means another process cleared this
        creation: it removed the Optuna study made before, whose id SQLite may since have
        given to that process's new one."""
        try:
            with self.session() as s:
                owned = s.execute(delete(schema.studies).where(
                    schema.studies.c.name == name, schema.studies.c.optuna_study_id == schema.CREATING,
                    schema.studies.c.created_at == stamp)).rowcount == 1
            if optuna_id is None:
                return
            if not owned:   # cleared while this process stalled before making Optuna's study?
                with self.session() as s:   # then no row names it: nobody else may make one
                    if s.execute(select(schema.studies.c.id).where(schema.studies.c.name == name)).first() is not None:
                        return
            with self._optuna_call("removing a study whose creation failed"):
                try:
                    if (self.optuna_storage.get_study_id_from_name(name) == optuna_id
                            and not self.optuna_storage.get_all_trials(optuna_id, deepcopy=False)):
                        self.optuna_storage.delete_study(optuna_id)
                except KeyError:
                    pass
        except Exception:  # noqa: BLE001 - the creation's own error is the one to report
            pass

    def abandon_creation(self, name: str, stamp: Any) -> bool:
        """Clear study ``name``'s creation that has been under way since ``stamp`` (see
        :meth:`creation_under_way`) because its creator died or stalled: its row and its
        Optuna study, which holds no trial (trials are only asked once the row is complete).
        Only one process clears a given creation (the row's delete decides); True when this
        call did. A creator that stalled and wakes finds its row gone and fails, removing
        nothing (:meth:`_undo_creation`)."""
        with self._optuna_call("clearing an unfinished study creation"):
            try:   # read before the row goes: once it has, the name is free for a new creator
                optuna_id: int | None = self.optuna_storage.get_study_id_from_name(name)
            except KeyError:
                optuna_id = None
        with self.session() as s:
            taken = s.execute(delete(schema.studies).where(
                schema.studies.c.name == name, schema.studies.c.optuna_study_id == schema.CREATING,
                schema.studies.c.created_at == stamp)).rowcount == 1
        if taken and optuna_id is not None:
            with self._optuna_call("clearing an unfinished study creation"):
                try:
                    if not self.optuna_storage.get_all_trials(optuna_id, deepcopy=False):
                        self.optuna_storage.delete_study(optuna_id)
                except KeyError:
                    pass
        return taken

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
                    f"study '{name}' was created for {created}; this run asks for {problem}",
                    "use another --study name",
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

