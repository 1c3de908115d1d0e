"""Creating a study whole, across evotuner's table and Optuna's, which share no transaction.

The protocol (several ``evotuner search`` processes may start one study at once, and any of
them may be killed or stall at any point):

1. **Take the name.** Insert the ``evotuner_studies`` row with ``optuna_study_id =``
   :data:`~evotuner.storage.schema.CREATING` (the unique name refuses a second creator).
   Readers treat such a row as not there yet; ``study_exists`` counts it.
2. **Make Optuna's study.** Only the row's owner makes it. An Optuna study of that name
   already there can only be a dead or stalled earlier creator's (it held the row before):
   with no trial it is adopted; with trials it is another application's and the creation
   fails.
3. **Complete the row** with the Optuna id, by compare-and-set on the owner's ``created_at``
   stamp (read back from the database, so its own rounding is compared). Then the study's
   Optuna user attributes, for Optuna's own tools.

A creation that shows no progress for ``STUDY_ROW_WAIT_S`` is **taken over**, never deleted:
the next creator compare-and-sets the row's facts and stamp to its own
(``create_study(..., replacing=stamp)``) and goes on from step 2. The name stays taken all
along, so nobody but earlier creators of the name makes an Optuna study of it; a stalled
creator that wakes finds its stamp gone, fails with one line and removes nothing (what it
made, the taker adopted or will adopt); a creator that fails while it still owns the row
removes its Optuna study, then the row. No other process removes anything, so no id is
ever removed from under another (SQLite reuses a removed study's id).
"""

from __future__ import annotations

import json
from typing import Any

import optuna
from optuna.exceptions import DuplicatedStudyError
from optuna.study import StudyDirection
from sqlalchemy import delete, insert, select, update

from evotuner.errors import StorageError
from evotuner.problem import Problem
from evotuner.storage import schema
from evotuner.storage.inputs import StoredSpace
from evotuner.storage.opening import StoreOpening, utcnow
from evotuner.version import evotuner_version

S = schema.studies


def space_facts(space: StoredSpace) -> dict[str, str]:
    """The ``evotuner_studies`` columns that record a study's space."""
    return {
        "space_name": space.name,
        "space_fingerprint": space.fingerprint(),
        "kernel_family": space.kernel,
        "space_text": space.text,
    }


class StudyCreation(StoreOpening):
    """``create_study`` and what the protocol of this module needs."""

    def study_exists(self, name: str) -> bool:
        """True when an evotuner study (one being created included), or any Optuna study,
        already has this name."""
        with self.session() as s:
            if s.execute(select(S.c.id).where(S.c.name == name)).first() is not None:
                return True
        return name in self._optuna_names()

    def _optuna_names(self) -> list[str]:
        with self._optuna_call("listing studies"):
            return sorted(st.study_name for st in self.optuna_storage.get_all_studies())

    def creation_under_way(self, name: str) -> Any:
        """The ``created_at`` stamp of study ``name``'s row while its creation is under way,
        else None; ``create_study(..., replacing=stamp)`` takes over a creation whose stamp
        stayed the same too long."""
        with self.session() as s:
            return s.execute(select(S.c.created_at).where(S.c.name == name, S.c.optuna_study_id == schema.CREATING)
                             ).scalar()

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
        replacing: Any = None,
    ) -> optuna.Study:
        """Create study ``name`` (direction minimize: the value is the median µs) and its
        evotuner row (problem, space name/fingerprint/file text, kernel family, sampler,
        seed, kernel source hash, nvcc and evotuner versions), by this module's protocol.

        ``space`` is the SearchSpace (:class:`~evotuner.storage.inputs.StoredSpace`: its name,
        kernel family, text and fingerprint are recorded). ``sampler`` is the Optuna sampler
        object to attach (``sampler_name``/``seed`` are what is recorded). ``replacing``: the
        stamp of an abandoned creation of ``name`` to take over (:meth:`creation_under_way`).
        Raises StorageError if the name is taken (by an evotuner or a plain Optuna study), or
        the creation it was to take over moved on.
        """
        if not sampler_name:
            raise StorageError(f"study '{name}': no sampler name to record", "pass sampler_name, e.g. 'tpe'")
        if not name or not name.strip():
            raise StorageError("study name is empty", "pass --study NAME")
        values = dict(problem_json=json.dumps(problem.as_dict(), sort_keys=True), sampler=sampler_name, seed=seed,
                      evotuner_version=evotuner_version(), source_hash=source_hash, nvcc_version=nvcc_version,
                      **space_facts(space))
        stamp = self._take_name(name, values) if replacing is None else self._take_over(name, replacing, values)
        optuna_id = None
        try:
            study = self._make_optuna_study(name, sampler, stamp)
            optuna_id = study._study_id
            with self.session() as s:
                done = s.execute(update(S).where(S.c.name == name, S.c.optuna_study_id == schema.CREATING,
                                                 S.c.created_at == stamp).values(optuna_study_id=optuna_id)).rowcount
            if done != 1:   # stalled past the wait: another process took this creation over
                raise self._taken_over(name)   # (and adopted this study, or will)
        except BaseException:
            self._undo_creation(name, stamp, optuna_id)
            raise
        # For Optuna's own tools (optuna-dashboard); evotuner reads its row.
        with self._optuna_call("describing the study"):
            study.set_user_attr("problem", problem.as_dict())
            study.set_user_attr("space", {"name": values["space_name"], "fingerprint": values["space_fingerprint"]})
            study.set_user_attr("sampler", sampler_name)
        return study

    def _exists_error(self, name: str) -> StorageError:
        return StorageError(f"study '{name}' already exists in {self.display_url}",
                            "continue it with `evotuner resume`, or choose another --study name")

    def _take_name(self, name: str, values: dict[str, Any]) -> Any:
        """Step 1: insert the row under way; its stamp as the database holds it."""
        if self.study_exists(name):
            raise self._exists_error(name)
        try:
            with self.session() as s:
                s.execute(insert(S).values(name=name, optuna_study_id=schema.CREATING, created_at=utcnow(), **values))
                return s.execute(select(S.c.created_at).where(S.c.name == name)).scalar()
        except StorageError:
            if self.study_exists(name):   # another creator took the name first
                raise self._exists_error(name) from None
            raise

    def _take_over(self, name: str, old_stamp: Any, values: dict[str, Any]) -> Any:
        """Take over the creation under way since ``old_stamp``: its row becomes this
        creation's (facts and a new stamp); StorageError when it moved on meanwhile."""
        with self.session() as s:
            moved = s.execute(update(S).where(S.c.name == name, S.c.optuna_study_id == schema.CREATING,
                                              S.c.created_at == old_stamp)
                              .values(created_at=utcnow(), **values)).rowcount != 1
            stamp = None if moved else s.execute(select(S.c.created_at).where(S.c.name == name)).scalar()
        if moved:
            raise StorageError(f"study '{name}': its unfinished creation moved on before this process could take "
                               f"it over in {self.display_url}", "run the command again")
        return stamp

    def _make_optuna_study(self, name: str, sampler: optuna.samplers.BaseSampler | None, stamp: Any) -> optuna.Study:
        """Step 2 (this process owns the row): Optuna's study. One of the name already there
        is adopted when it is an earlier creator's, i.e. has no trial and minimizes (never
        removed: a stalled creator that wakes may still be looking at it); with trials it is
        another application's, and the creation fails."""
        while True:
            try:
                with self._optuna_call("creating the study"):
                    return optuna.create_study(study_name=name, storage=self.optuna_storage, sampler=sampler,
                                               direction="minimize")
            except DuplicatedStudyError:
                pass
            if not self._owns(name, stamp):
                raise self._taken_over(name)
            with self._optuna_call("adopting an unfinished creation's study"):
                try:
                    optuna_id = self.optuna_storage.get_study_id_from_name(name)
                    empty = (not self.optuna_storage.get_all_trials(optuna_id, deepcopy=False)
                             and self.optuna_storage.get_study_directions(optuna_id) == [StudyDirection.MINIMIZE])
                except KeyError:     # gone again meanwhile (its creator undid it): make it
                    continue
                if not empty:
                    raise StorageError(f"study '{name}' in {self.display_url} is an Optuna study that evotuner did "
                                       "not create (it has trials or does not minimize)", "use another --study name")
                return optuna.load_study(study_name=name, storage=self.optuna_storage, sampler=sampler)

    def _owns(self, name: str, stamp: Any) -> bool:
        """This process's creation (under way since ``stamp``) still holds the row."""
        with self.session() as s:
            return s.execute(select(S.c.id).where(S.c.name == name, S.c.optuna_study_id == schema.CREATING,
                                                  S.c.created_at == stamp)).first() is not None

    def _taken_over(self, name: str) -> StorageError:
        return StorageError(f"study '{name}': another process took over its creation in {self.display_url}",
                            "run the command again: it joins the study that process created")

    def _undo_creation(self, name: str, stamp: Any, optuna_id: int | None) -> None:
        """A creation failed: while this process still owns the row, remove its Optuna study
        (by the id it made) and then the row; a row taken over is the taker's, and so is
        everything of the name."""
        try:
            if not self._owns(name, stamp):
                return
            if optuna_id is not None:
                with self._optuna_call("removing a study whose creation failed"):
                    try:
                        self.optuna_storage.delete_study(optuna_id)
                    except KeyError:
                        pass
            with self.session() as s:
                s.execute(delete(S).where(S.c.name == name, S.c.optuna_study_id == schema.CREATING,
                                          S.c.created_at == stamp))
        except Exception:  # noqa: BLE001 - the creation's own error is the one to report
            pass
