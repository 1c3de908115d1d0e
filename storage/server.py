"""What is particular to a database server (PostgreSQL through psycopg): its failures that have
a remedy of their own, a URL whose password would be misread, and a bound on how long a statement
waits for a server that does not answer. :mod:`evotuner.storage.connect` applies them."""

from __future__ import annotations

import functools
import re
from inspect import signature
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, Engine

from evotuner.errors import StorageError
from evotuner.storage.urlmask import MASK, mask_url

#: A server (psycopg 3) that sends no answer to a statement for this many seconds (frozen, its
#: host gone, a lock held by a frozen client) is given up on: the connection is closed and the
#: command ends with the one line, instead of waiting for ever (:func:`bound_waits`). Evotuner's
#: statements take milliseconds; a server paused for less than this is waited out.
SERVER_ANSWER_S = 60.0

#: How a user name or password in a URL writes the characters a URL reserves.
ENCODED = "@ / : % # ? as %40 %2F %3A %25 %23 %3F"


#: ``scheme://user:password@`` as SQLAlchemy reads it: the password ends at the first ``@``.
_USER_PASSWORD = re.compile(r"^(?P<head>[\w+]+://[^:/]*):[^@]*@")


#: Where a URL's query starts: a ``?`` before a ``name=`` (one in a password is followed by other text).
_QUERY = re.compile(r"\?(?=[A-Za-z_][\w.-]*=)")


def refuse_raw_at(raw: str) -> None:
    """A password holding a bare ``@`` (``user:p@ss@host/db``) is cut at its first ``@`` and the
    rest taken for the host and database, which every message would then show: refuse it, naming
    only what follows the last ``@``. An ``@`` in the query (``?sslrootcert=/certs/a@b.pem``) is
    not the password's."""
    found = _USER_PASSWORD.match(raw)
    if found is None or "@" not in _QUERY.split(raw[found.end():], maxsplit=1)[0]:
        return
    shown = mask_url(f"{found.group('head')}:{MASK}@{raw.rsplit('@', 1)[1]}")
    raise StorageError(
        f"storage URL {shown!r}: its password holds an '@' that is not percent-encoded, so part of the "
        "password would be read as the host", f"percent-encode the password in the URL: write {ENCODED}")


#: What a server says when the connection broke or could not be made (libpq, psycopg).
_CONNECTION_LOST = ("no answer for", "connection failed", "connection refused", "server closed the connection",
                    "terminating connection", "connection is closed", "connection is lost", "could not receive data",
                    "could not send data", "consuming input failed", "connection already closed",
                    "connection not open", "timeout expired")


def server_failure(low: str, detail: str, url: URL, where: str, doing: str, named_by: str) -> StorageError | None:
    """The server failures that have a remedy of their own (None: the generic one)."""
    user = url.username or "this user"
    if "read-only transaction" in low:
        return StorageError(f"database {where} is read-only ({detail}) while {doing}",
                            f"point {named_by} at a server and user that may write (default_transaction_read_only "
                            "off, not a standby); show, export and report read it as it is")
    if "permission denied" in low or "must be owner" in low:
        return StorageError(
            f"database {where}: {detail} while {'opening it' if doing == 'connecting' else doing}",
            f"have the database's owner grant {user} its rights (GRANT CREATE, USAGE ON SCHEMA public; GRANT "
            "SELECT, INSERT, UPDATE, DELETE ON ALL TABLES and USAGE ON ALL SEQUENCES IN SCHEMA public), or run as "
            "the owner; show, export and report need SELECT only")
    if "password authentication failed" in low or "no password supplied" in low:
        return StorageError(f"cannot connect to {where}: {detail}",
                            f"check the user and password in the URL; write {ENCODED} in them")
    if "does not exist" in low and "database" in low and doing == "connecting":
        return StorageError(f"cannot connect to {where}: {detail}",
                            f"create it (createdb -h {url.host or 'HOST'} -U {user} {url.database or 'NAME'}, or "
                            "CREATE DATABASE) or fix the database name in the URL")
    if doing != "connecting" and any(word in low for word in _CONNECTION_LOST):
        return StorageError(f"lost the connection to {where} while {doing}: {detail}",
                            "check that the server is up; once it answers, run the command again: a search keeps "
                            "its finished trials and `evotuner resume` continues it")
    return None


def bound_waits(engine: Engine) -> None:
    """Give up on a psycopg 3 server that does not answer within :data:`SERVER_ANSWER_S`.

    libpq has no client-side statement timeout and a stopped server's kernel still acknowledges
    the TCP traffic, so without this a search (and its Ctrl-C, which writes the interrupted
    trials) waited as long as the server stood still. Connections made from now on are
    :func:`_bounded_connection`'s; the pool is emptied of older ones. Other drivers, and a
    psycopg without wait timeouts (before 3.2), are left as they are."""
    if engine.dialect.driver != "psycopg":
        return
    factory = _bounded_connection()
    if factory is None:
        return

    @event.listens_for(engine, "do_connect")
    def _connect(_dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:
        return factory.connect(*cargs, **cparams)

    engine.dispose()


@functools.cache
def _bounded_connection() -> Any:
    """A psycopg.Connection whose waits on the server end after :data:`SERVER_ANSWER_S` (the
    connection is closed then: its statement's fate is unknown), or None where psycopg's
    ``Connection.wait`` takes no timeout."""
    import psycopg

    if "interval" not in signature(psycopg.Connection.wait).parameters:
        return None

    class BoundedConnection(psycopg.Connection):  # type: ignore[type-arg]
        def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:
            if len(args) >= 2 or kwargs.get("timeout") is not None:
                return super().wait(gen, *args, **kwargs)
            kwargs["timeout"] = SERVER_ANSWER_S
            try:
                return super().wait(gen, *args, **kwargs)
            except psycopg.OperationalError as exc:
                if type(exc).__name__ != "_WaitTimeout":
                    raise
                self.pgconn.finish()
                raise psycopg.OperationalError(
                    f"the server sent no answer for {SERVER_ANSWER_S:g} s (it is stopped or unreachable, or "
                    "another client holds a lock this statement needs); the connection was closed") from None

    return BoundedConnection
