"""The database's clock: heartbeats and claims are timed by the database server, never by
a worker's own clock (hosts' clocks differ). Its own module so that both
:mod:`evotuner.storage.liveness` and :mod:`evotuner.storage.claims` use it without
importing each other."""

from __future__ import annotations

from typing import Any

from sqlalchemy import literal_column, select
from sqlalchemy.orm import Session


def epoch_sql(dialect: str) -> Any:
    if dialect == "sqlite":
        return literal_column("((julianday('now') - 2440587.5) * 86400.0)")
    if dialect == "postgresql":
        return literal_column("extract(epoch from clock_timestamp())")
    if dialect in ("mysql", "mariadb"):
        return literal_column("UNIX_TIMESTAMP(NOW(6))")
    return literal_column("CURRENT_TIMESTAMP")   # pragma: no cover - other servers


def db_now(s: Session) -> float:
    """The database's clock, epoch seconds."""
    return float(s.execute(select(epoch_sql(s.get_bind().dialect.name))).scalar())
