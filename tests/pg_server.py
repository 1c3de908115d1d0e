"""TEST SCAFFOLDING: a throwaway PostgreSQL server on loopback, in a temporary directory.

Uses the server binaries of Debian's ``postgresql`` package (``initdb``, ``pg_ctl``;
found on PATH or under /usr/lib/postgresql/<version>/bin). ``initdb`` refuses to run as
root, so as root the data directory is given to the ``postgres`` user and the server
runs as that user (``runuser``); otherwise it runs as the current user. Trust
authentication on 127.0.0.1 only, a free port, unix sockets in the data directory.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

START_TIMEOUT_S = 60


def pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """``with PgServer() as pg: pg.url("db")`` -- start, hand out URLs, stop and delete."""

    def __init__(self) -> None:
        self.initdb = pg_bin("initdb")
        self.pg_ctl = pg_bin("pg_ctl")
        if not self.initdb or not self.pg_ctl:
            raise FileNotFoundError("PostgreSQL server binaries (initdb, pg_ctl) not found: apt-get install postgresql")
        self.root = Path(tempfile.mkdtemp(prefix="evotuner-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.as_root = os.geteuid() == 0

    def _run(self, args: list[str], timeout: float = START_TIMEOUT_S) -> None:
        cmd = ["runuser", "-u", "postgres", "--", *args] if self.as_root else args
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed ({result.returncode}): {result.stderr[-2000:]}")

    def start(self) -> "PgServer":
        if self.as_root:
            shutil.chown(self.root, "postgres", "postgres")
        os.chmod(self.root, 0o700)
        self._run([self.initdb, "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
        opts = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.data} -c fsync=off -c max_connections=200"
        self._run([self.pg_ctl, "-D", str(self.data), "-o", opts, "-l", str(self.root / "server.log"), "-w",
                   "-t", str(START_TIMEOUT_S), "start"])
        return self

    def stop(self) -> None:
        try:
            self._run([self.pg_ctl, "-D", str(self.data), "-m", "immediate", "-w", "stop"], timeout=30)
        except Exception:  # noqa: BLE001 -- best effort: the directory goes anyway
            pass
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        import psycopg

        deadline = time.monotonic() + 10
        while True:
            try:
                with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
                                     autocommit=True) as conn:
                    conn.execute(f'CREATE DATABASE "{name}"')
                return self.url(name)
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def __enter__(self) -> "PgServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
