"""Opening a study database: the checks, the race of concurrent creators, the writes of
opening, and the one session context all of storage's SQL runs in (:meth:`StoreOpening.session`).

:class:`StoreOpening` is the base of :class:`~evotuner.storage.store.StudyStore`.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FunctionType
from typing import Any, Callable, TypeVar

from optuna.exceptions import StorageInternalError
from optuna.storages import RDBStorage as OptunaRDBStorage
from sqlalchemy import insert, inspect, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from evotuner.errors import EvotunerError, StorageError
from evotuner.problem import Problem
from evotuner.storage import connect as _connect
from evotuner.storage import damage as _damage
from evotuner.storage import diagnostics as _diagnostics  # noqa: F401  (registers its tables)
from evotuner.storage import schema
from evotuner.storage import start as _start
from evotuner.storage.readonly import readonly_url
from evotuner.version import evotuner_version


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def utcnow() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None)


_Opened = TypeVar("_Opened", bound="StoreOpening")


class RDBStorage(OptunaRDBStorage):
    """Optuna's RDBStorage whose database failures are evotuner's one-line :class:`StorageError`
    (``on_failure``, set by the store once it is open).

    The loop asks and tells through the Optuna study (``study.tell``, ``trial.set_user_attr``),
    not through the store's sessions: without this, a server gone in the middle of a search
    surfaced as Optuna's StorageInternalError ("invalid data in the commit, e.g. exceeding max
    length") and was reported as a bug."""

    on_failure: Callable[[BaseException, str], StorageError] | None = None

    def __getstate__(self) -> dict[Any, Any]:
        state = super().__getstate__()
        state.pop("on_failure", None)     # the store's method: not for another process
        return state


def _translating(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    doing = "reading the study" if name.startswith(("get_", "check_")) else "writing the study"

    @functools.wraps(method)
    def call(self: RDBStorage, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except (SQLAlchemyError, StorageInternalError) as exc:
            if self.on_failure is None:
                raise
            raise self.on_failure(exc, doing) from (exc.__cause__ if isinstance(exc, StorageInternalError) else exc)
    return call


for _name, _method in vars(OptunaRDBStorage).items():
    if not _name.startswith("_") and _name != "remove_session" and isinstance(_method, FunctionType):
        setattr(RDBStorage, _name, _translating(_name, _method))


class StoreOpening:
    """The opened database of a :class:`~evotuner.storage.store.StudyStore` (see its docstring)."""

    def __init__(self, url: str | None = None, *, create: bool = True, read_only: bool = False,
                 named_by: str = _connect.NAMED_BY) -> None:
        resolved = _connect.resolve(url)
        self._url = resolved.url
        self._named_by = named_by     # what named the database (the CLI's option, use_tuned), for remedies
        if resolved.read_only_option is not None and not read_only:
            raise StorageError(
                f"storage URL {_connect.display(self._url)} asks for a read-only database "
                f"({resolved.read_only_option}), and this command writes to it",
                f"drop ?{resolved.read_only_option} from {named_by} to write, or read it with show, export or report",
            )
        self.read_only = read_only
        create = create and not read_only
        path = _connect.sqlite_path(self._url)
        created = None
        if path is not None and not create and not path.exists():
            raise StorageError(
                f"no study database at {path}",
                f"point {named_by} at the database `evotuner search` wrote",
            )
        if path is not None and not _connect.precheck_sqlite(path, read_only=read_only, named_by=named_by):
            # Built whole under a private name, then published: concurrent openers never see it
            # half made (storage/start.py). None: no hard links here, so it is made in place.
            if _start.publish_new(path, self._build_new) is None:
                created = _start.create_exclusively(path)   # None: another process made it first
        self._engine = None
        self._optuna: RDBStorage | None = None
        self._doing = threading.local()     # what the Optuna call under way is doing (_optuna_call)
        try:
            self._engine = _connect.connect(self._url, read_only=read_only, named_by=named_by)
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
        type(self)(self._url.set(database=str(private)).render_as_string(hide_password=False),
                   named_by=self._named_by).close()

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
                self._optuna.on_failure = self._failed
                _start.immediate_sqlite(self._optuna.engine)
                _connect.bound_waits(self._optuna.engine)
            schema.metadata.create_all(self._engine)
        except RuntimeError as exc:  # Optuna: its table schema is older/newer than the library
            raise StorageError(
                f"database {self.display_url}: {str(exc).splitlines()[0]}",
                f"run `optuna storage upgrade --storage {self.display_url}` or install the matching optuna",
            ) from None
        except SQLAlchemyError as exc:
            raise _connect.translate(exc, self._url, "creating tables", self._named_by) from None
        with self.session() as s:
            found = s.execute(select(schema.schema_version.c.version)).scalar()
            if found is None:
                s.execute(
                    insert(schema.schema_version).values(
                        id=1, version=schema.SCHEMA_VERSION, evotuner_version=evotuner_version(), updated_at=utcnow()
                    )
                )
            elif int(found) < schema.SCHEMA_VERSION:   # older layout: create_all added the new tables
                s.execute(
                    update(schema.schema_version)
                    .where(schema.schema_version.c.version < schema.SCHEMA_VERSION)
                    .values(version=schema.SCHEMA_VERSION, evotuner_version=evotuner_version(), updated_at=utcnow())
                )

    def _open_optuna_read_only(self) -> None:
        self._refuse_studyless()
        try:
            self._optuna = RDBStorage(
                readonly_url(self._url).render_as_string(hide_password=False),
                engine_kwargs=_connect.engine_kwargs(self._url), skip_compatibility_check=False,
                skip_table_creation=True,
            )
            self._optuna.on_failure = self._failed
            _connect.bound_waits(self._optuna.engine)
        except RuntimeError as exc:
            raise StorageError(f"database {self.display_url}: {str(exc).splitlines()[0]}",
                               "install the optuna version that wrote it") from None
        except SQLAlchemyError as exc:
            raise _connect.translate(exc, self._url, "reading the study", self._named_by) from None

    def _refuse_studyless(self) -> None:
        """Read-only: a database without evotuner's study table (an empty file, an Optuna-only
        database) holds no evotuner study; say so, rather than fail reading tables not there."""
        try:
            with self._engine.connect() as conn:
                tables = {t for t in inspect(conn).get_table_names() if not t.startswith("sqlite_")}
        except SQLAlchemyError as exc:
            raise _connect.translate(exc, self._url, "reading the study", self._named_by) from None
        if schema.studies.name in tables and "version_info" in tables:
            return
        remedy = f"run `evotuner search` first, or point {self._named_by} at the study database"
        if not tables:
            raise StorageError(f"database {self._where} is empty: it holds no study", remedy)
        raise StorageError(f"database {self._where} holds no evotuner study (it has no "
                           f"{schema.studies.name if schema.studies.name not in tables else 'version_info'} table)",
                           remedy)

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

    def __enter__(self: _Opened) -> _Opened:
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
            doing = "reading the study" if self.read_only else "writing the study"
            raise _connect.translate(exc, self._url, doing, self._named_by) from exc
        except BaseException:
            s.rollback()
            raise
        finally:
            s.close()

    @contextmanager
    def _optuna_call(self, doing: str) -> Iterator[None]:
        outer = getattr(self._doing, "what", None)
        self._doing.what = doing     # what the Optuna storage's failures say in here (_failed)
        try:
            with self._reading():
                yield
        except (SQLAlchemyError, StorageInternalError) as exc:
            raise self._failed(exc, doing) from None
        finally:
            self._doing.what = outer

    def _failed(self, exc: BaseException, doing: str) -> StorageError:
        """A failed SQL statement or Optuna commit (``StorageInternalError``: a full disk, a server
        gone, ...) as the one line, saying what was being done (the innermost enclosing
        ``_optuna_call``'s words where there is one, else ``doing``)."""
        doing = getattr(self._doing, "what", None) or doing
        cause = exc if isinstance(exc, SQLAlchemyError) else (exc.__cause__ or exc.__context__)
        if isinstance(cause, SQLAlchemyError):
            return _connect.translate(cause, self._url, doing, self._named_by)
        return StorageError(f"database {self.display_url}: {_first_line(exc)} while {doing}",
                            "check the database (and the disk it is on); nothing was lost")

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
