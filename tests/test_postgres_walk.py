"""A hostile user's walk of the PostgreSQL path: what each misuse or server failure shows.

Every case here once went wrong: a replayed search on PostgreSQL failed every trial (its build
key outgrew its column, which SQLite does not enforce); a server stopped in the middle of a
search ended it with "unexpected StorageInternalError: ... invalid data ... exceeding max
length"; a frozen server made a search wait for ever; a password holding a bare ``@`` was
shown in part as the host; a read-only server, a user without rights, a wrong password and a
missing database had remedies that did not fit (a user without rights to a table was told it
"cannot connect").

The shared server (conftest's ``pg_server``, tests/pg_server.py) serves the cases that leave it
as it was; stopping and freezing a server happen on one of this module's own, with password
authentication for every user but ``postgres``. Both skip where the PostgreSQL server binaries
or psycopg are missing, except under CI (``CI`` set), where that is a failure (conftest).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator
from urllib.parse import quote

import pytest

from evotuner.errors import StorageError
from evotuner.storage import StudyStore

SWEEP = Path(__file__).parent / "data" / "sweep_h100_hopper_d64.csv"   # hopper configs: long build keys
SHAPE = "B=16,H=16,S=2048,D=64"
PASSWORD = "p@ss/w%rd:x#?"       # every character a URL reserves in its user info
SECRETS = (PASSWORD, quote(PASSWORD, safe=""), "ss/w", "w%rd", "w%25rd")


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("EVOTUNER_STORAGE", None)
    return subprocess.run([sys.executable, "-m", "evotuner.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _search(url: str, study: str, trials: int, *extra: str) -> list[str]:
    return ["search", "--study", study, "--shape", SHAPE, "--trials", str(trials), "--replay", str(SWEEP),
            "--storage", url, *extra]


def _sql(pg: object, *statements: str, database: str = "postgres") -> None:
    import psycopg

    with psycopg.connect(f"host=127.0.0.1 port={pg.port} user=postgres dbname={database}",  # type: ignore[attr-defined]
                         autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def _new_database(pg: object, prefix: str) -> str:
    name = f"{prefix}_{os.getpid()}_{random.randrange(10**9)}"
    pg.create_database(name)  # type: ignore[attr-defined]
    return name


def _url(pg: object, database: str, user: str = "postgres", password: str | None = None) -> str:
    auth = user if password is None else f"{user}:{quote(password, safe='')}"
    return f"postgresql+psycopg://{auth}@127.0.0.1:{pg.port}/{database}"  # type: ignore[attr-defined]


def _one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1, proc.stderr[-2000:]
    # the CLI's boundary says "error: unexpected <Type>" for an error nobody translated; a
    # server's own words may say "closed the connection unexpectedly" (CI, 2026-11-28)
    assert "Traceback" not in proc.stderr and "error: unexpected " not in proc.stderr, proc.stderr[-2000:]
    return lines[-1]


# -- this module's own server: password authentication, stopped and frozen on purpose -----------

class _OwnServer:
    """A PgServer of this module's, which the tests may stop, start again and freeze."""

    def __init__(self) -> None:
        from pg_server import PgServer

        self.pg = PgServer().start()
        self.port = self.pg.port
        _sql(self, f"CREATE ROLE walker LOGIN PASSWORD '{PASSWORD}'", "CREATE DATABASE walk OWNER walker")
        hba = self.pg.data / "pg_hba.conf"
        hba.write_text("local all all trust\nhost all postgres 127.0.0.1/32 trust\n"
                       "host all all 127.0.0.1/32 scram-sha-256\n")
        _sql(self, "SELECT pg_reload_conf()")
        self.url = _url(self, "walk", "walker", PASSWORD)

    def create_database(self, name: str) -> str:
        return self.pg.create_database(name)

    def pg_ctl(self, *args: str) -> None:
        opts = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.pg.data} -c fsync=off "
                "-c max_connections=200")
        self.pg._run([self.pg.pg_ctl, "-D", str(self.pg.data), "-o", opts, "-l", str(self.pg.root / "server.log"),
                      "-w", "-t", "60", *args])

    def processes(self) -> list[int]:
        """The postmaster and every process it started (the backends serving connections)."""
        postmaster = int((self.pg.data / "postmaster.pid").read_text().split()[0])
        children = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _parent(p) == postmaster]
        return [postmaster, *children]


def _parent(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


@pytest.fixture(scope="module")
def own_server(pg_server: object) -> Iterator[_OwnServer]:
    """Needs ``pg_server`` for its skip rule (binaries, psycopg; a failure under CI)."""
    server = _OwnServer()
    try:
        yield server
    finally:
        server.pg.stop()


# -- a replayed search: the same study on PostgreSQL as on SQLite ------------------------------

def _shown(url: str, study: str) -> dict:
    proc = _cli("show", "--study", study, "--json", "--storage", url)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    for trial in doc["trials"]:
        trial.pop("datetime", None)
    return {"trials": doc["trials"], "best": {k: v for k, v in doc["best"].items() if k != "datetime"}}


def test_a_replayed_search_on_postgres_is_the_one_on_sqlite(pg_server: object, tmp_path: Path) -> None:
    """A hopper config's replayed build key (``replay:<sweep>:<config>``, 138 characters) outgrew
    evotuner_builds.build_key (128): PostgreSQL refused every build record, and every trial of
    the search FAILed, where SQLite (which does not enforce lengths) kept them COMPLETE."""
    pg_url = _url(pg_server, _new_database(pg_server, "walk_replay"))
    sqlite_url = f"sqlite:///{tmp_path / 'replay.db'}"
    for url in (pg_url, sqlite_url):
        proc = _cli(*_search(url, "r", 4))
        assert proc.returncode == 0, proc.stderr[-2000:]
    on_pg = _shown(pg_url, "r")
    assert [t["state"] for t in on_pg["trials"]] == ["COMPLETE"] * 4, on_pg["trials"]
    assert on_pg == _shown(sqlite_url, "r")


# -- URLs and users ----------------------------------------------------------------------------

def test_a_password_with_a_bare_at_is_refused_and_never_shown() -> None:
    """``user:p@ss/w%rd@host/db`` ends the password at its first ``@``: the rest was taken for the
    host and the database, and the message showed it (``...:***@ss/w%25rd...``)."""
    for raw in (f"postgresql+psycopg://walker:{PASSWORD}@127.0.0.1:1/walk",
                "postgresql+psycopg://walker:p@ss:x@127.0.0.1:1/walk"):   # cut into a port that is no number
        with pytest.raises(StorageError) as err:
            StudyStore(raw)
        shown = str(err.value)
        assert "not percent-encoded" in shown and "%40" in shown and "127.0.0.1:1/walk" in shown
        assert not any(secret in shown for secret in (*SECRETS, "ss:x")), shown


def test_an_at_in_the_query_is_not_taken_for_the_passwords() -> None:
    """``?sslrootcert=/certs/a@b.pem`` was refused as a password's bare ``@``."""
    from evotuner.storage.server import refuse_raw_at

    refuse_raw_at("postgresql+psycopg://walker:pw@127.0.0.1:1/walk?sslrootcert=/certs/a@b.pem")
    with pytest.raises(StorageError, match="not percent-encoded"):
        refuse_raw_at("postgresql+psycopg://walker:p@ss@127.0.0.1:1/walk?sslrootcert=/certs/a@b.pem")


def test_a_wrong_password_and_the_right_one_with_reserved_characters(own_server: _OwnServer) -> None:
    wrong = _url(own_server, "walk", "walker", "not-" + PASSWORD)
    proc = _cli("show", "--study", "x", "--storage", wrong)
    line = _one_line_error(proc)
    assert "password authentication failed" in line and "check the user and password" in line, line
    assert not any(secret in proc.stdout + proc.stderr for secret in SECRETS), proc.stderr
    with StudyStore(own_server.url) as store:   # percent-encoded, every reserved character works
        assert store.list_studies() == []
    import evotuner

    with pytest.raises(StorageError) as err:
        evotuner.use_tuned(wrong)
    assert "check the user and password" in str(err.value)


def test_a_database_that_does_not_exist(pg_server: object) -> None:
    with pytest.raises(StorageError) as err:
        StudyStore(_url(pg_server, f"walk_missing_{os.getpid()}"))
    assert "does not exist" in err.value.message and "createdb" in (err.value.remedy or ""), str(err.value)


def test_a_typo_in_the_driver_names_the_postgresql_spelling() -> None:
    for url in ("postgres://u@127.0.0.1:1/x", "postgresql+foo://u@127.0.0.1:1/x"):
        with pytest.raises(StorageError) as err:
            StudyStore(url)
        assert "unknown database dialect or driver" in err.value.message
        assert "postgresql+psycopg://" in (err.value.remedy or ""), str(err.value)


def test_a_user_without_rights_is_told_what_to_grant(pg_server: object) -> None:
    """PostgreSQL 15 lets no other user create tables in a database's public schema; a user who
    may not read the tables was told it "cannot connect" and to check that the server runs."""
    fresh = _new_database(pg_server, "walk_norights")
    user = f"walk_nr_{os.getpid()}"
    _sql(pg_server, f"CREATE ROLE {user} LOGIN")
    with pytest.raises(StorageError) as err:
        StudyStore(_url(pg_server, fresh, user))
    assert "permission denied" in err.value.message and "GRANT" in (err.value.remedy or ""), str(err.value)
    with StudyStore(_url(pg_server, fresh)) as store:    # the owner makes the tables ...
        assert store.list_studies() == []
    with pytest.raises(StorageError) as err:            # ... which this user may not read either
        StudyStore(_url(pg_server, fresh, user), read_only=True)
    assert not err.value.message.startswith("cannot connect"), str(err.value)
    assert "permission denied" in err.value.message and "GRANT" in (err.value.remedy or ""), str(err.value)


def test_a_read_only_server_reads_and_refuses_a_search_in_one_line(pg_server: object) -> None:
    database = _new_database(pg_server, "walk_ro")
    url = _url(pg_server, database)
    assert _cli(*_search(url, "ro", 2)).returncode == 0
    reader = f"walk_reader_{os.getpid()}"
    _sql(pg_server, f"CREATE ROLE {reader} LOGIN", f"ALTER ROLE {reader} SET default_transaction_read_only = on")
    _sql(pg_server, f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {reader}", database=database)
    read_only = _url(pg_server, database, reader)
    assert _cli("show", "--study", "ro", "--storage", read_only).returncode == 0
    line = _one_line_error(_cli(*_search(read_only, "ro", 4)))
    assert " is read-only " in line and "default_transaction_read_only" in line, line


# -- a server that goes away or stands still ----------------------------------------------------

def _finished(url: str, study: str) -> int:
    try:
        with StudyStore(url, read_only=True) as store:
            return sum(1 for t in store.optuna_trials(study)[1] if t.state.is_finished())
    except StorageError:
        return 0


def test_a_server_stopped_mid_search_ends_it_in_one_line_and_resume_goes_on(own_server: _OwnServer) -> None:
    """The search used to end with "unexpected StorageInternalError: An exception is raised
    during the commit ... e.g. exceeding max length" (the loop tells trials through Optuna)."""
    url = own_server.url
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("EVOTUNER_STORAGE", None)
    search = subprocess.Popen([sys.executable, "-m", "evotuner.cli", *_search(url, "stop", 40, "--replay-delay",
                                                                                 "0.3,0.3")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 90
        while _finished(url, "stop") < 3 and time.monotonic() < deadline and search.poll() is None:
            time.sleep(0.3)
        assert search.poll() is None, "the search ended before the server was stopped"
        own_server.pg_ctl("-m", "immediate", "stop")
        _, err = search.communicate(timeout=120)
    finally:
        if search.poll() is None:
            search.kill()
            search.communicate()
        if not (own_server.pg.data / "postmaster.pid").exists():
            own_server.pg_ctl("start")
    line = _one_line_error(subprocess.CompletedProcess(search.args, search.returncode, "", err))
    assert "lost the connection" in line and "evotuner resume" in line, line
    assert not any(secret in err for secret in SECRETS), err
    kept = _finished(url, "stop")
    assert kept >= 3
    resumed = _cli("resume", "--study", "stop", "--trials", str(kept + 2), "--replay", str(SWEEP), "--storage", url)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert _finished(url, "stop") >= kept + 2


def test_a_frozen_server_is_given_up_on(own_server: _OwnServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stopped (SIGSTOP) server's kernel still acknowledges the traffic and libpq has no
    client-side statement timeout: a search waited for as long as the server stood still."""
    import evotuner.storage.server as server

    monkeypatch.setattr(server, "SERVER_ANSWER_S", 2.0, raising=False)   # (absent before the bound)
    url = own_server.create_database(f"walk_frozen_{os.getpid()}_{random.randrange(10**9)}")
    with StudyStore(url) as store:
        store.list_studies()                      # pooled connections, each served by a backend
        frozen = own_server.processes()
        pool = ThreadPoolExecutor(1)
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            future = pool.submit(store.list_studies)
            with pytest.raises(StorageError) as err:
                future.result(timeout=40)         # without a bound: TimeoutError, the call still waiting
            assert "lost the connection" in err.value.message, str(err.value)
            assert time.monotonic() - started < 40
        finally:
            for pid in frozen:
                os.kill(pid, signal.SIGCONT)
            pool.shutdown(wait=True)
        assert store.list_studies() == []     # the server back: the store works again
