"""Opening the study database: resolve the URL, validate, and only then write.

Every way opening can fail becomes a one-line :class:`StorageError` with a
remedy, and the checks run in an order that writes nothing until all of them
passed:

1. the URL parses and names a dialect SQLAlchemy knows, whose driver imports;
2. (SQLite) the file is a regular file with the SQLite magic header, and it and
   its directory are writable (the journal/WAL files live next to it); a new
   file's directory exists and is writable;
3. a connection opens within :data:`CONNECT_TIMEOUT_S` (servers) and the
   database reads back: ``PRAGMA quick_check`` for SQLite;
4. evotuner's schema version, if the tables exist, is not newer than ours.

A new SQLite database is built whole under a private name and only then given its
name (:func:`evotuner.storage.start.publish_new`); a build that fails is removed, so a
failed open never leaves a half-made file behind.
"""

from __future__ import annotations

import os
import random
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from sqlalchemy import create_engine, event, inspect, select, text
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError, SQLAlchemyError

from evotuner.errors import StorageError
from evotuner.storage import schema
from evotuner.storage.readonly import readonly_url, refuse_foreign
from evotuner.storage.server import bound_waits, refuse_raw_at, server_failure
from evotuner.storage.urlmask import mask_url

#: Environment variable that overrides the default database URL.
ENV_VAR = "EVOTUNER_STORAGE"
#: What named the database, as the remedies say it unless the opener says otherwise (the
#: CLI's option and variable; ``evotuner.use_tuned`` names itself: :data:`evotuner.tuned.TUNED_SOURCES`).
NAMED_BY = f"--storage / ${ENV_VAR}"
#: Used when neither an explicit URL nor $EVOTUNER_STORAGE is given (file in the current directory).
DEFAULT_URL = "sqlite:///evotuner.db"
#: A server that does not answer within this many seconds is reported, not waited on.
CONNECT_TIMEOUT_S = 5
#: How long a SQLite writer waits for another's lock before "database is locked".
SQLITE_BUSY_TIMEOUT_S = 30

_SQLITE_MAGIC = b"SQLite format 3\x00"
_URL_REMEDY = "use a SQLAlchemy URL such as sqlite:///evotuner.db or postgresql://user@host/dbname"

# Driver-specific spelling of "give up connecting after N seconds" (module name -> connect arg).
_CONNECT_TIMEOUT_ARG = {
    "psycopg2": "connect_timeout",
    "psycopg": "connect_timeout",
    "pymysql": "connect_timeout",
    "MySQLdb": "connect_timeout",
    "mysql.connector": "connection_timeout",
    "pg8000": "timeout",
}
# What to pip install for a missing driver module.
_DRIVER_PIP = {
    "psycopg": "'psycopg[binary]' (or use postgresql+psycopg2:// with psycopg2-binary)",
    "psycopg2": "psycopg2-binary (or use postgresql+psycopg:// with psycopg[binary])",
    "MySQLdb": "mysqlclient (or use mysql+pymysql:// with pymysql)",
    "pymysql": "pymysql",
    "pg8000": "pg8000",
}


#: SQLite's own URI parameters (https://sqlite.org/uri.html) a --storage URL may carry; they
#: are read here and never handed on, so no file is ever named ``x.db?mode=ro``.
SQLITE_URI_PARAMS = ("mode", "immutable", "uri", "cache", "nolock", "vfs", "psow", "modeof")
#: Query options SQLAlchemy's pysqlite dialect itself takes.
SQLITE_DRIVER_PARAMS = ("timeout", "isolation_level", "detect_types", "check_same_thread", "cached_statements")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Resolved:
    """A storage URL as evotuner opens it: ``url`` (SQLite: an absolute path, no URI
    parameters) and whether the URL itself asks for read-only access (``?mode=ro``,
    ``?immutable=1``), and by which option."""

    url: URL
    read_only_option: str | None = None


def resolve_url(url: str | None) -> URL:
    """``url``, else ``$EVOTUNER_STORAGE``, else ``sqlite:///evotuner.db``, parsed
    (:func:`resolve`; the URL's read-only option is not returned)."""
    return resolve(url).url


def resolve(url: str | None) -> Resolved:
    """``url``, else ``$EVOTUNER_STORAGE``, else ``sqlite:///evotuner.db``, parsed and checked.

    A relative SQLite path is made absolute against the current directory now,
    so that threads or a later ``chdir`` never open a different file. SQLite's URI
    parameters are honoured, not passed on as part of a file name: ``mode=ro`` and
    ``immutable=1`` make the URL read-only (a writing command refuses it), ``mode=rw``
    and ``mode=rwc`` are what evotuner does anyway, ``uri=true`` and a ``file:`` path
    are accepted; anything else is refused by name. Drivers evotuner cannot drive
    (an async one, a SQLite driver other than Python's sqlite3) are refused here too.
    """
    raw = url or os.environ.get(ENV_VAR) or DEFAULT_URL
    refuse_raw_at(raw)
    try:
        parsed = make_url(raw)
    except (ArgumentError, ValueError) as exc:
        why = "its port is not a number" if "int()" in str(exc) else "it is not a SQLAlchemy URL"
        raise StorageError(f"storage URL {mask_url(raw)!r} cannot be read: {why}", _URL_REMEDY) from None
    if parsed.get_backend_name() != "sqlite":
        _refuse_async(parsed)
        return Resolved(parsed)
    if parsed.get_driver_name() not in ("pysqlite", "sqlite") and "+" in parsed.drivername:
        raise StorageError(
            f"storage URL {mask_url(raw)!r}: evotuner opens SQLite through Python's sqlite3 module, not "
            f"{parsed.get_driver_name()!r}", "write the URL as sqlite:///path/to/evotuner.db")
    query = {k: (v if isinstance(v, str) else v[-1]) for k, v in parsed.query.items()}
    unknown = sorted(k for k in query if k not in SQLITE_URI_PARAMS + SQLITE_DRIVER_PARAMS)
    if unknown:
        raise StorageError(
            f"storage URL {mask_url(raw)!r}: unknown SQLite option {unknown[0]!r}",
            f"SQLite URLs take {', '.join(SQLITE_URI_PARAMS[:3])} (e.g. sqlite:///evotuner.db?mode=ro)")
    mode = query.get("mode")
    db = parsed.database or ""
    if db.startswith("file:"):                    # SQLite's URI form: the path is percent-encoded
        db = unquote(db[len("file:"):])
        if db.startswith("//"):                   # file://[localhost]/path: only a local authority
            authority, _, rest = db[2:].partition("/")
            if authority not in ("", "localhost"):
                raise StorageError(f"storage URL {mask_url(raw)!r}: a file URI names host {authority!r}",
                                   "give a local path, e.g. sqlite:///evotuner.db")
            db = "/" + rest
    if db in ("", ":memory:") or mode == "memory":
        raise StorageError(
            f"storage URL {mask_url(raw)!r}: an in-memory SQLite database cannot hold a study",
            "give a file path, e.g. sqlite:///evotuner.db",
        )
    if mode not in (None, "ro", "rw", "rwc"):
        raise StorageError(f"storage URL {mask_url(raw)!r}: mode={mode!r} is not a SQLite open mode",
                           "use mode=ro (read only) or leave mode out")
    for flag in ("immutable", "uri", "nolock", "psow"):
        if flag in query and query[flag].lower() not in _TRUE + _FALSE:
            raise StorageError(f"storage URL {mask_url(raw)!r}: {flag}={query[flag]!r} is not a boolean",
                               f"use {flag}=1 or {flag}=0")
    for option in ("cache", "vfs", "modeof"):
        if option in query:
            raise StorageError(f"storage URL {mask_url(raw)!r}: the SQLite option {option!r} is not supported here",
                               f"drop ?{option}= from the storage URL")
    read_only = ("mode=ro" if mode == "ro" else
                 "immutable=1" if query.get("immutable", "0").lower() in _TRUE else None)
    path = Path(db).expanduser()
    if not path.is_absolute():
        path = Path.cwd() / path
    driver_query = {k: v for k, v in query.items() if k in SQLITE_DRIVER_PARAMS}
    return Resolved(parsed.set(database=str(path), query=driver_query), read_only)


def _refuse_async(url: URL) -> None:
    """An asyncio driver (postgresql+asyncpg, ...) cannot serve evotuner's synchronous store."""
    try:
        dialect = url.get_dialect()
    except Exception:   # noqa: BLE001 -- unknown dialects are reported where the driver is imported
        return
    if getattr(dialect, "is_async", False):
        raise StorageError(
            f"storage URL {mask_url(url)!r}: {url.drivername!r} is an asyncio driver, which evotuner cannot use",
            "use the synchronous driver, e.g. postgresql:// (psycopg2) or postgresql+psycopg://")


def display(url: URL) -> str:
    """The URL as it may appear in a message (password and secret query values hidden)."""
    return mask_url(url)


def sqlite_path(url: URL) -> Path | None:
    return Path(url.database) if url.get_backend_name() == "sqlite" and url.database else None


#: The files SQLite keeps next to a database (a database's "side files"), the database first.
SQLITE_SIDE_SUFFIXES = ("", "-wal", "-shm", "-journal")


def protected_files(database: Path) -> tuple[Path, ...]:
    """A SQLite database's path with its side files (``-wal``, ``-shm``, ``-journal``): the
    files no output of evotuner may replace (:mod:`evotuner.atomicfile`)."""
    return tuple(Path(f"{database}{suffix}") for suffix in SQLITE_SIDE_SUFFIXES)


def engine_kwargs(url: URL) -> dict[str, Any]:
    """Engine options for this URL: connect timeout for servers; for SQLite a busy
    timeout and ``check_same_thread=False`` (builds finish in worker threads and
    the store is used from them; SQLAlchemy's pool hands each thread its own
    connection and SQLite serialises the writes)."""
    if url.get_backend_name() == "sqlite":
        return {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False}}
    dbapi = _import_driver(url)
    arg = _CONNECT_TIMEOUT_ARG.get(getattr(dbapi, "__name__", ""))
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if arg:
        kwargs["connect_args"] = {arg: CONNECT_TIMEOUT_S}
    return kwargs


def _import_driver(url: URL) -> Any:
    try:
        dialect = url.get_dialect()
    except NoSuchModuleError:
        backend = url.drivername.partition("+")[0]
        remedy = (_URL_REMEDY if backend not in ("postgres", "postgresql", "pgsql", "psql") else
                  "write a PostgreSQL URL as postgresql+psycopg://user@host/dbname (psycopg 3) or "
                  "postgresql+psycopg2://... (psycopg2)")
        raise StorageError(
            f"storage URL {display(url)!r}: unknown database dialect or driver {url.drivername!r}", remedy
        ) from None
    try:
        return dialect.import_dbapi()
    except ImportError as exc:
        missing = (getattr(exc, "name", None) or "").split(".")[0]
        pip = _DRIVER_PIP.get(missing, missing or "the driver")
        raise StorageError(
            f"storage URL {display(url)!r}: the database driver for {url.drivername!r} is not installed ({exc})",
            f"pip install {pip}, or use a sqlite:/// URL",
        ) from None


def precheck_sqlite(path: Path, *, read_only: bool = False, named_by: str = NAMED_BY) -> bool:
    """Check a SQLite path without touching it; return whether the file exists already.
    ``read_only``: the file must exist and be a database; it need not be writable.
    ``named_by``: what named the database (:data:`NAMED_BY`), for the remedies."""
    if path.exists():
        if not path.is_file():
            raise StorageError(f"database {path} is not a file", f"point {named_by} at a file, e.g. sqlite:///evotuner.db")
        try:
            with open(path, "rb") as f:
                head = f.read(len(_SQLITE_MAGIC))
        except OSError as exc:
            raise StorageError(f"database {path} cannot be read ({exc.strerror})", "check the file's permissions") from None
        if head and head != _SQLITE_MAGIC:
            raise StorageError(
                f"database {path}: file is not a database (no SQLite header)",
                f"point {named_by} at the study database, or move this file away",
            )
        if read_only:
            return True
        if not os.access(path, os.W_OK):
            raise StorageError(f"database {path} is read-only",
                               "make it writable (chmod u+w) or work on a copy; show, export and report read it as it is")
        if not os.access(path.parent, os.W_OK | os.X_OK):
            raise StorageError(
                f"database {path}: directory {path.parent} is read-only and SQLite must write its journal there",
                "make the directory writable or copy the database to a writable one; "
                "show, export and report read it as it is",
            )
        return True
    parent = path.parent
    for ancestor in (parent, *parent.parents):
        if ancestor.exists():
            if not ancestor.is_dir():
                raise StorageError(
                    f"cannot create database {path}: {ancestor} is a file, not a directory",
                    f"point {named_by} at another path",
                )
            break
    if not parent.exists():
        raise StorageError(f"cannot create database {path}: directory {parent} does not exist", f"create it (mkdir -p {parent})")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise StorageError(
            f"cannot create database {path}: directory {parent} is read-only",
            f"point {named_by} at a writable location",
        )
    return False


def translate(exc: SQLAlchemyError, url: URL, doing: str, named_by: str = NAMED_BY) -> StorageError:
    """A SQLAlchemy/driver failure as a one-line StorageError with a remedy (``named_by``: what
    named the database)."""
    orig = getattr(exc, "orig", None) or exc
    detail = (str(orig).strip().splitlines() or [type(orig).__name__])[0]
    low = detail.lower()
    where = display(url)
    path = sqlite_path(url)
    if "disk is full" in low or "disk full" in low or "no space left" in low:
        return StorageError(f"database {path or where}: the disk is full while {doing} ({detail})",
                            "free some disk space and run the command again; what was written before is kept")
    if path is not None:
        if "not a database" in low or "malformed" in low or "corrupt" in low:
            return StorageError(
                f"database {path}: file is not a database or is corrupt ({detail})",
                f"restore it from a copy, or point {named_by} at another file",
            )
        if "locked" in low or "busy" in low:
            return StorageError(
                f"database {path} stayed locked by another process for {SQLITE_BUSY_TIMEOUT_S} s while {doing}",
                "wait for the other evotuner to finish, or use a server database for parallel runs",
            )
        if "readonly" in low or "read-only" in low or "unable to open" in low:
            return StorageError(
                f"database {path} cannot be written while {doing} ({detail})",
                "check that the file and its directory are writable",
            )
        return StorageError(f"database {path}: {detail} while {doing}", "check the file; restore it from a copy if it is damaged")
    server = server_failure(low, detail, url, where, doing, named_by)
    if server is not None:
        return server
    if doing == "connecting":
        return StorageError(
            f"cannot connect to {where}: {detail}",
            "check that the server is running and the URL's host, port, user and database are right",
        )
    return StorageError(f"database {where}: {detail} while {doing}", "check the database server and its logs")


def validate(conn: Connection, url: URL, named_by: str = NAMED_BY) -> None:
    """Read-only checks on an open connection (raises StorageError / SQLAlchemyError)."""
    if url.get_backend_name() == "sqlite":
        rows = [r[0] for r in conn.execute(text("PRAGMA quick_check"))]
        if rows != ["ok"]:
            raise StorageError(
                f"database {sqlite_path(url)} is corrupt: {rows[0] if rows else 'integrity check failed'}",
                f"restore it from a copy, or point {named_by} at another file",
            )
    tables = inspect(conn).get_table_names()
    if url.get_backend_name() == "sqlite":   # a server database may well be shared with other applications
        refuse_foreign(tables, url, named_by)
    if schema.schema_version.name in tables:
        row = conn.execute(select(schema.schema_version.c.version, schema.schema_version.c.evotuner_version)).first()
        if row is not None and row[0] is not None and (isinstance(row[0], bool) or not isinstance(row[0], int)):
            from evotuner.storage.damage import damaged

            raise damaged(str(sqlite_path(url) or display(url)), schema.schema_version.name, 1, "version", row[0],
                          "not an integer")
        if row is not None and row[0] is not None and int(row[0]) > schema.SCHEMA_VERSION:
            raise StorageError(
                f"database schema version {int(row[0])} (written by evotuner {row[1] or 'unknown'}) is newer "
                f"than this evotuner's ({schema.SCHEMA_VERSION})",
                "update the evotuner checkout that wrote it (git pull) and reinstall it from there "
                "(pip install -e .), or work on a copy made by this version",
            )


def connect(url: URL, *, read_only: bool = False, named_by: str = NAMED_BY) -> Engine:
    """Create the engine and run :func:`validate`; writes nothing. ``read_only``: the
    engine cannot write either (SQLite opened ``mode=ro``, or ``immutable`` where the
    file or its folder is not writable; see :mod:`evotuner.storage.readonly`)."""
    kwargs = engine_kwargs(url)
    engine = create_engine(readonly_url(url) if read_only else url, **kwargs)
    if url.get_backend_name() == "sqlite" and not read_only:
        _immediate_transactions(engine)
    bound_waits(engine)
    try:
        with engine.connect() as conn:
            validate(conn, url, named_by)
    except StorageError:
        engine.dispose()
        raise
    except SQLAlchemyError as exc:
        engine.dispose()
        raise translate(exc, url, "connecting", named_by) from None
    return engine


def _immediate_transactions(engine: Engine) -> None:
    """Every transaction on this SQLite engine starts with BEGIN IMMEDIATE.

    A deferred transaction that reads and then writes, in WAL mode, fails at
    once with "database is locked" (SQLITE_BUSY_SNAPSHOT) when another thread
    committed in between; the busy timeout does not help. Taking the write lock
    at BEGIN makes writers queue on the busy timeout instead. (SQLAlchemy's
    documented recipe: the driver's own BEGIN handling is switched off.)
    """

    @event.listens_for(engine, "connect")
    def _autocommit_driver(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        # WAL (set_wal) with synchronous=NORMAL: a commit appends to the WAL without an fsync
        # (checkpoints still sync). The database stays consistent through any crash; only a
        # power loss or OS crash can drop the last commits, and a study resumes from what
        # remains. With FULL, each of a trial's ~30 commits (Optuna writes every param and
        # attribute in its own transaction) waited on an fsync: 40 ms a trial on an idle disk.
        dbapi_conn.execute("PRAGMA synchronous=NORMAL")

    @event.listens_for(engine, "begin")
    def _begin_immediate(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def set_wal(engine: Engine, wait_s: float = SQLITE_BUSY_TIMEOUT_S) -> None:
    """Switch a SQLite database to WAL (readers never block the writer); outside any transaction.

    Switching a rollback-journal database takes a read lock and then upgrades it to an
    exclusive one, and SQLite calls no busy handler for a lock upgrade: another
    connection's lock fails the PRAGMA at once with SQLITE_BUSY ("database is locked")
    whatever the busy timeout. So a busy switch is tried again here until ``wait_s`` (the
    busy timeout) has passed; then it fails as a SQLAlchemy OperationalError, which the
    opener reports as a locked database. A database already in WAL mode takes no lock.
    """
    deadline = time.monotonic() + wait_s
    raw = engine.raw_connection()
    try:
        while True:
            try:
                raw.driver_connection.execute("PRAGMA journal_mode=WAL").fetchall()
                return
            except sqlite3.OperationalError as exc:
                if not _sqlite_busy(exc) or time.monotonic() >= deadline:
                    raise OperationalError("PRAGMA journal_mode=WAL", None, exc) from exc
            time.sleep(random.uniform(0.01, 0.05))
    finally:
        raw.close()


def _sqlite_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)   # Python 3.11+
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc).lower()


@dataclass(frozen=True)
class CreatedFiles:
    """The SQLite files an open may have created (removed again if the open fails)."""

    path: Path

    def remove(self) -> None:
        for suffix in ("", "-journal", "-wal", "-shm"):
            try:
                Path(str(self.path) + suffix).unlink()
            except FileNotFoundError:
                pass
            except OSError:
                pass  # best effort: the open is failing anyway and says why
