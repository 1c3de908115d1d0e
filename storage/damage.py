"""Telling a damaged or hand-edited database from a bug, and naming the damaged cell.

SQLite stores any value in any column: a trial state Optuna does not know, a date that
is not a date, ``"abc"`` in an integer column, a JSON column that is not JSON. Reading
such a row fails deep inside SQLAlchemy or Optuna with a ValueError, LookupError or
TypeError that says nothing about where. When a read fails that way, :func:`locate`
reads every table evotuner and Optuna keep, *raw* (no type conversion), and checks each
cell as its column's type would convert it; the first one that does not convert is the
damage, and :func:`damaged` is the one-line :class:`StorageError` naming the table, the
row, the column and what it holds, with the remedy. Where no cell is damaged the
original exception stands (it is a bug, and the CLI reports it as one).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Iterable

from sqlalchemy import Boolean, DateTime, Enum, Float, Integer, Table, select, text
from sqlalchemy.engine import Connection

from evotuner.errors import StorageError

#: What a read of damaged rows raises inside SQLAlchemy, Optuna or evotuner's decoders.
DECODE_ERRORS = (ValueError, LookupError, TypeError, OverflowError)
#: The remedy of every damage error.
REMEDY = ("the database was damaged or edited by hand: restore it from a copy, or fix or delete "
          "that row (e.g. with the sqlite3 shell)")


@dataclass(frozen=True)
class Damage:
    """One cell that does not read as its column's type."""

    table: str
    row: Any
    column: str
    value: Any
    why: str

    def error(self, where: str) -> StorageError:
        return damaged(where, self.table, self.row, self.column, self.value, self.why)


def damaged(where: str, table: str, row: Any, column: str, value: Any, why: str) -> StorageError:
    """The one-line error for a cell that cannot be read."""
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return StorageError(f"database {where} is damaged: table {table}, row {row}, column {column} holds {shown} "
                        f"({why})", REMEDY)


def optuna_tables() -> list[Table]:
    """Optuna's RDB tables (its own SQLAlchemy models)."""
    from optuna.storages._rdb import models

    return list(models.BaseModel.metadata.sorted_tables)


def check_cell(column: Any, value: Any, dialect: Any) -> str | None:
    """Why ``value`` (as stored) does not read as ``column``'s type, or None."""
    if value is None:
        return None
    kind = column.type
    try:
        if isinstance(kind, Boolean):
            if value not in (0, 1, True, False):
                return "not a boolean"
        elif isinstance(kind, Integer):
            if isinstance(value, bool) or not isinstance(value, int):
                return "not an integer"
        elif isinstance(kind, Float):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return "not a number"
        elif isinstance(kind, (DateTime, Enum)):
            process = kind.dialect_impl(dialect).result_processor(dialect, None)
            if process is not None:
                process(value)
            if isinstance(kind, Enum) and value not in kind.enums:
                return f"not one of {', '.join(kind.enums)}"
        if column.name.endswith("_json"):
            if not isinstance(value, str):
                return "not JSON text"
            json.loads(value, parse_constant=lambda c: math.nan)
    except json.JSONDecodeError as exc:
        return f"not JSON: {exc.msg}"
    except (ValueError, LookupError, TypeError, OverflowError) as exc:
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return None


def locate(conn: Connection, tables: Iterable[Table]) -> Damage | None:
    """The first cell of ``tables`` (those that exist) that does not read as its column's type."""
    from sqlalchemy import inspect

    present = set(inspect(conn).get_table_names())
    for table in tables:
        if table.name not in present:
            continue
        key = next(iter(table.primary_key.columns), None)
        raw = conn.execute(select(*(text(f'"{c.name}"') for c in table.columns)).select_from(text(f'"{table.name}"')))
        for values in raw:
            cells = dict(zip((c.name for c in table.columns), values))
            for column in table.columns:
                why = check_cell(column, cells[column.name], conn.dialect)
                if why is not None:
                    return Damage(table.name, cells[key.name] if key is not None else "?", column.name,
                                  cells[column.name], why)
    return None
