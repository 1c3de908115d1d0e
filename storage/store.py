"""StudyStore: the one place evotuner reads and writes its study database.

The Optuna study lives in Optuna's own schema (``optuna.storages.RDBStorage``)
in the same database as evotuner's ``evotuner_*`` tables, so
``optuna.load_study(study_name=..., storage=url)`` and optuna-dashboard read
what evotuner writes.

Threads: the loop is the one writer *process*. Builds finish in worker
threads and may call ``record_build`` from there: every method opens its own
short session from a pooled engine (SQLite connections are created with
``check_same_thread=False``; WAL mode and a busy timeout let SQLite serialise
the writes), so methods are safe to call from several threads at once.
Optuna's RDBStorage keeps a thread-local session of its own.

Trial state transitions (COMPLETE / PRUNED / FAIL) are the loop's, through the
``optuna.Study`` this store returns. The loop stores the one-line reason of a
PRUNED/FAIL trial as the user attribute ``reason`` (:data:`REASON_ATTR`);
``summary()`` reads it back as ``TrialRecord.error``.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Sequence

import optuna
from optuna.exceptions import DuplicatedStudyError, StorageInternalError, UpdateFinishedTrialError
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from evotuner.config import KernelConfig
from evotuner.errors import EvotunerError, StorageError, StudyMismatchError
from evotuner.numbers import finite_or_none
from evotuner.problem import Problem
from evotuner.storage import connect as _connect
from evotuner.storage import damage as _damage
from evotuner.storage import diagnostics as _diagnostics  # noqa: F401  (registers its tables)
from evotuner.storage import schema
from evotuner.storage import start as _start
from evotuner.storage.identity import device_identity, setup_identity
from evotuner.storage.inputs import BuildFacts, Failure, GateVerdict, PtxasFigures, StoredSpace, Timing
from evotuner.storage.readonly import readonly_url
from evotuner.storage.records import (
    DUPLICATE_ATTR,
    GATE_ATTR,
    REASON_ATTR,
    TFLOPS_ATTR,
    TRANSFER_ATTR,
    RecordedOutcome,
    StudyInfo,
    StudyRecord,
    StudySummary,
    TrialRecord,
    is_finished,
)
from evotuner.version import evotuner_version
from evotuner.vocabulary import MEASURED_ATTRS, measure_failure_reason

#: The ptxas figures recorded per build (columns of evotuner_builds, keys of the ``gate`` attr):
#: the fields of :class:`~evotuner.storage.inputs.PtxasFigures`.
PTXAS_FIGURES: tuple[str, ...] = ("registers", "spill_stores", "spill_loads", "stack", "smem", "barriers")
#: How much of a compile log is kept per build.
LOG_TAIL_CHARS = 4000


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None)


def _space_fingerprint(space: StoredSpace | str) -> str:
    """A space's fingerprint; a string is one already."""
    return space if isinstance(space, str) else space.fingerprint()


def _space_facts(space: StoredSpace) -> dict[str, str]:
    """The ``evotuner_studies`` columns that record a study's space."""
    return {
        "space_name": space.name,
        "space_fingerprint": space.fingerprint(),
        "kernel_family": space.kernel,
        "space_text": space.text,
    }


def ptxas_figures(report: PtxasFigures | None) -> dict[str, int | None]:
    """The :data:`PTXAS_FIGURES` of a ptxas report (None: no report, every figure None)."""
    if report is None:
        return {k: None for k in PTXAS_FIGURES}
    return {k: int(getattr(report, k)) for k in PTXAS_FIGURES}


def _trial_record(t: FrozenTrial, gate_from_build: dict[str, Any] | None = None) -> TrialRecord:
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


class StudyStore:
    """The study database at ``url`` (default ``$EVOTUNER_STORAGE`` or ``sqlite:///evotuner.db``
    in the current directory).

    Opening validates everything first and raises :class:`StorageError` (nothing
    written, nothing lost) for an unreadable URL, unknown dialect, missing driver,
    unreachable server (connect timeout :data:`~evotuner.storage.connect.CONNECT_TIMEOUT_S`),
    a file that is not a database or is corrupt, a read-only file or directory, or
    an evotuner schema newer than this version. Then it creates Optuna's tables
    and evotuner's (``evotuner_*``) if missing. With ``create=False`` (``show``,
    ``export``) a SQLite file that does not exist is an error instead of a new
    database. With ``read_only=True`` (``show``, ``export``, ``report``; implies
    ``create=False``) nothing is written and the database may be read-only for this
    user (:mod:`evotuner.storage.readonly`); the record methods then fail. A
    database holding another application's tables is refused. Use as a context
    manager or call :meth:`close`.
    """

    def __init__(self, url: str | None = None, *, create: bool = True, read_only: bool = False) -> None:
        resolved = _connect.resolve(url)
        self._url = resolved.url
        if resolved.read_only_option is not None and not read_only:
            raise StorageError(
                f"storage URL {_connect.display(self._url)} asks for a read-only database "
                f"({resolved.read_only_option}), and this command writes to it",
                f"drop ?{resolved.read_only_option} from --storage to write, or read it with show, export or report",
            )
        self.read_only = read_only
        create = create and not read_only
        path = _connect.sqlite_path(self._url)
        created = None
        if path is not None and not create and not path.exists():
            raise StorageError(
                f"no study database at {path}",
                "pass --storage (or set $EVOTUNER_STORAGE) to the database `evotuner search` wrote",
            )
        if path is not None and not _connect.precheck_sqlite(path, read_only=read_only):
            # Built whole under a private name, then published: concurrent openers never see it
            # half made (storage/start.py). None: no hard links here, so it is made in place.
            if _start.publish_new(path, self._build_new) is None:
                created = _start.create_exclusively(path)   # None: another process made it first
        self._engine = None
        self._optuna: RDBStorage | None = None
        try:
            self._engine = _connect.connect(self._url, read_only=read_only)
            self._sessions = sessionmaker(bind=self._engine, expire_on_commit=False)
            _start.retry_race(self._initialise)   # concurrent creators: the loser loads
        except BaseException:
            self.close()
            if created is not None:
                created.remove()
            raise

    # -- opening ---------------------------------------------------------------------------
    def _build_new(self, private: Path) -> None:
        """Create and initialise a new SQLite database at ``private`` (an empty file nobody
        else knows of) and close it; :func:`~evotuner.storage.start.publish_new` links it."""
        StudyStore(self._url.set(database=str(private)).render_as_string(hide_password=False)).close()

    def _initialise(self) -> None:
        """The writes of opening (after every check passed); read-only: none of them."""
        if self.read_only:
            self._open_optuna_read_only()
            return
        try:
            if self._url.get_backend_name() == "sqlite":
                _connect.set_wal(self._engine)
            if self._optuna is None:
                self._optuna = RDBStorage(
                    self.url, engine_kwargs=_connect.engine_kwargs(self._url), skip_compatibility_check=False
                )
                _start.immediate_sqlite(self._optuna.engine)
            schema.metadata.create_all(self._engine)
        except RuntimeError as exc:  # Optuna: its table schema is older/newer than the library
            raise StorageError(
                f"database {self.display_url}: {str(exc).splitlines()[0]}",
                f"run `optuna storage upgrade --storage {self.display_url}` or install the matching optuna",
            ) from None
        except SQLAlchemyError as exc:
            raise _connect.translate(exc, self._url, "creating tables") from None
        with self.session() as s:
            found = s.execute(select(schema.schema_version.c.version)).scalar()
            if found is None:
                s.execute(
                    insert(schema.schema_version).values(
                        id=1, version=schema.SCHEMA_VERSION, evotuner_version=evotuner_version(), updated_at=_now()
                    )
                )
            elif int(found) < schema.SCHEMA_VERSION:   # older layout: create_all added the new tables
                s.execute(
                    update(schema.schema_version)
                    .where(schema.schema_version.c.version < schema.SCHEMA_VERSION)
                    .values(version=schema.SCHEMA_VERSION, evotuner_version=evotuner_version(), updated_at=_now())
                )

    def _open_optuna_read_only(self) -> None:
        try:
            self._optuna = RDBStorage(
                readonly_url(self._url).render_as_string(hide_password=False),
                engine_kwargs=_connect.engine_kwargs(self._url), skip_compatibility_check=False,
                skip_table_creation=True,
            )
        except RuntimeError as exc:
            raise StorageError(f"database {self.display_url}: {str(exc).splitlines()[0]}",
                               "install the optuna version that wrote it") from None
        except SQLAlchemyError as exc:
            raise _connect.translate(exc, self._url, "reading the study") from None

    @property
    def url(self) -> str:
        """The resolved URL (absolute path for SQLite), usable with ``optuna.load_study``."""
        return self._url.render_as_string(hide_password=False)

    @property
    def display_url(self) -> str:
        return _connect.display(self._url)

    def database_files(self) -> tuple[Path, ...]:
        """The files of a SQLite study database, its side files (``-wal``, ``-shm``,
        ``-journal``) included, which no output may replace; () for a server database."""
        path = _connect.sqlite_path(self._url)
        return _connect.protected_files(path) if path is not None else ()

    @property
    def optuna_storage(self) -> RDBStorage:
        assert self._optuna is not None
        return self._optuna

    def close(self) -> None:
        """Release connections (idempotent)."""
        if self._optuna is not None:
            self._optuna.remove_session()
            self._optuna.engine.dispose()
            self._optuna = None
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def __enter__(self) -> "StudyStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the one session -------------------------------------------------------------------
    @contextmanager
    def session(self) -> Iterator[Session]:
        """``with store.session() as s:`` one transaction: committed on success, rolled back
        on any exception; SQL failures surface as :class:`StorageError`."""
        if self._engine is None:
            raise StorageError(f"database {self.display_url} is closed", "open a new StudyStore")
        s = self._sessions()
        try:
            with self._reading():
                yield s
                s.commit()
        except SQLAlchemyError as exc:
            s.rollback()
            raise _connect.translate(exc, self._url, "writing the study") from exc
        except BaseException:
            s.rollback()
            raise
        finally:
            s.close()

    @contextmanager
    def _optuna_call(self, doing: str) -> Iterator[None]:
        try:
            with self._reading():
                yield
        except SQLAlchemyError as exc:
            raise _connect.translate(exc, self._url, doing) from None
        except StorageInternalError as exc:   # Optuna's wrapper of a failed commit (a full disk, ...)
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, SQLAlchemyError):
                raise _connect.translate(cause, self._url, doing) from None
            raise StorageError(f"database {self.display_url}: {_first_line(exc)} while {doing}",
                               "check the database (and the disk it is on); nothing was lost") from None

    @contextmanager
    def _reading(self) -> Iterator[None]:
        """A failure to decode what the database holds (a ValueError, LookupError or TypeError
        from SQLAlchemy, Optuna or a decoder here) becomes the one-line error naming the
        damaged table, row and column (:mod:`evotuner.storage.damage`); where no cell is
        damaged, the exception stands: it is a bug."""
        try:
            yield
        except EvotunerError:
            raise
        except _damage.DECODE_ERRORS:
            found = self._find_damage()
            if found is None:
                raise
            raise found.error(self._where) from None

    def _find_damage(self) -> _damage.Damage | None:
        if self._engine is None:
            return None
        try:
            with self._engine.connect() as conn:
                return _damage.locate(conn, [*schema.metadata.sorted_tables, *_damage.optuna_tables()])
        except SQLAlchemyError:
            return None

    @property
    def _where(self) -> str:
        path = _connect.sqlite_path(self._url)
        return str(path) if path is not None else self.display_url

    def _problem(self, row: Any) -> Problem:
        """A study row's problem, or the damage error naming the row."""
        try:
            data = json.loads(row.problem_json)
            return Problem.from_dict(data)
        except (EvotunerError, *_damage.DECODE_ERRORS) as exc:
            raise _damage.damaged(self._where, schema.studies.name, row.id, "problem_json", row.problem_json,
                                  getattr(exc, "message", None) or _first_line(exc)) from None

    # -- studies ---------------------------------------------------------------------------
    def _find_row(self, s: Session, name: str) -> Any:
        return s.execute(select(schema.studies).where(schema.studies.c.name == name)).first()

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
        names = [n for n in s.execute(select(schema.studies.c.name).order_by(schema.studies.c.name)).scalars()]
        s.commit()   # end this (write-locking) transaction before Optuna's engine reads
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
        """True when an evotuner study, or any Optuna study, already has this name."""
        with self.session() as s:
            if self._find_row(s, name) is not None:
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
        facts = _space_facts(space)
        if self.study_exists(name):
            raise StorageError(
                f"study '{name}' already exists in {self.display_url}",
                "continue it with `evotuner resume`, or choose another --study name",
            )
        try:
            with self._optuna_call("creating the study"):
                study = optuna.create_study(
                    study_name=name, storage=self.optuna_storage, sampler=sampler, direction="minimize"
                )
        except DuplicatedStudyError:
            raise StorageError(f"study '{name}' already exists in {self.display_url}", "choose another --study name") from None
        try:
            study.set_user_attr("problem", problem.as_dict())
            study.set_user_attr("space", {"name": facts["space_name"], "fingerprint": facts["space_fingerprint"]})
            study.set_user_attr("sampler", sampler_name)
            with self.session() as s:
                s.execute(
                    insert(schema.studies).values(
                        name=name,
                        optuna_study_id=study._study_id,
                        problem_json=json.dumps(problem.as_dict(), sort_keys=True),
                        sampler=sampler_name,
                        seed=seed,
                        created_at=_now(),
                        evotuner_version=evotuner_version(),
                        source_hash=source_hash,
                        nvcc_version=nvcc_version,
                        **facts,
                    )
                )
        except BaseException:
            # The two schemas share no transaction: undo the Optuna half.
            try:
                optuna.delete_study(study_name=name, storage=self.optuna_storage)
            except Exception:  # noqa: BLE001 - the original error is the one to report
                pass
            raise
        return study

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
            fp = _space_fingerprint(space)
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
            rows = s.execute(select(schema.studies).order_by(schema.studies.c.created_at, schema.studies.c.id)).all()
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
        return [_trial_record(t) for t in trials if is_finished(t)]

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
            rec = _trial_record(t)
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

    # -- records -----------------------------------------------------------------------------
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
                    build_key=build_result.key,
                    artifact_sha256=artifact.sha256 if artifact is not None else None,
                    ok=bool(build_result.ok),
                    cached=bool(build_result.cached),
                    seconds=float(build_result.seconds),
                    gate_passed=passed,
                    gate_reason=reason,
                    error=build_result.error,
                    log_tail=log[-LOG_TAIL_CHARS:],
                    recorded_at=_now(),
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
        values: dict[str, Any] = {"config": str(config), "measured_at": _now()}
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
            select(schema.devices.c.fingerprint_json)
            .where(schema.devices.c.study_id == study_id)
            .order_by(schema.devices.c.last_seen.desc(), schema.devices.c.id.desc())
            .limit(1)
        ).scalar()
        now = _now()
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
        changed = latest is not None and setup_identity(json.loads(latest)) != setup_identity(fingerprint)
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
        now = _now()
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

    # -- reading -----------------------------------------------------------------------------
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
        records = tuple(_trial_record(t, gate_by_trial.get(t.number)) for t in trials)
        complete = [r for r in records if r.state == "COMPLETE" and r.value is not None]
        devices = tuple(
            {
                "fingerprint": json.loads(d.fingerprint_json),
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

    def latest_checks(self, study: str) -> dict[str, dict[str, _diagnostics.CheckRecord]]:
        """config -> tool -> the latest ``evotuner check`` verdict of ``study``
        (:func:`evotuner.storage.diagnostics.latest_checks`)."""
        return _diagnostics.latest_checks(self, study)

    def space_text(self, study_name: str) -> str:
        """The space file text the study was created with (to rebuild its SearchSpace)."""
        with self.session() as s:
            return self.study_row(s, study_name).space_text
