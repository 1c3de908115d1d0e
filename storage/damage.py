"""Telling a damaged or hand-edited database from a bug, and naming the damaged cell.

SQLite stores any value in any column: a trial state Optuna does not know, a date that
is not a date, ``"abc"`` in an integer column, a JSON column that is not JSON. Reading
such a row fails deep inside SQLAlchemy or Optuna with a ValueError, LookupError or
TypeError that says nothing about where. When a read fails that way, :func:`locate`
reads every table evotuner and Optuna keep, *raw* (no type conversion), and checks each
cell as its column's type would convert it; the first one that does not convert is the
damage, and :func:`damaged` is the one-line :class:`StorageError` naming the table, the
row, the column and what it holds, with the remedy. A cell Optuna cannot do without may
also be empty (a NULL parameter value, a NULL value its value type calls finite), and a row
may name a row that is gone (``evotuner_studies.optuna_study_id`` pointing past Optuna's
``studies``); :func:`locate` names those too. Where nothing is damaged the original
exception stands (it is a bug, and the CLI reports it as one).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Iterable

from sqlalchemy import Boolean, DateTime, Enum, Float, Integer, Table, select, text
from sqlalchemy.engine import Connection

from evotuner.errors import StorageError
from evotuner.storage import schema

#: What a read of damaged rows raises inside SQLAlchemy, Optuna or evotuner's decoders (Optuna
#: asserts a value's type against the value: a NULL "finite" value is an AssertionError).
DECODE_ERRORS = (ValueError, LookupError, TypeError, OverflowError, AssertionError)
#: Cells Optuna's models let be NULL but cannot read back empty.
REQUIRED = frozenset({("trial_params", "param_value")})
#: Optuna's value tables: (value column, type column); ±inf and NaN are stored as NULL with
#: their type, so a NULL value must say so and a number must be FINITE.
TYPED_VALUES = {"trial_values": ("value", "value_type"),
                "trial_intermediate_values": ("intermediate_value", "intermediate_value_type")}
#: References no foreign key declares: (table, column) -> (table, column, value that names
#: nothing on purpose). evotuner_studies.optuna_study_id is CREATING while a creation is under way.
REFERENCES = {("evotuner_studies", "optuna_study_id"): ("studies", "study_id", schema.CREATING)}
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
    shown = "NULL" if value is None else repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return StorageError(f"database {where} is damaged: table {table}, row {row}, column {column} holds {shown} "
                        f"({why})", REMEDY)


def json_object(where: str, table: str, row: Any, column: str, value: Any) -> dict[str, Any]:
    """A cell that holds a JSON object (a device fingerprint), decoded; the one-line error
    naming the cell when it is not JSON, or JSON of another shape (a list, a number)."""
    try:
        data = json.loads(value)
    except (TypeError, ValueError) as exc:
        why = f"not JSON: {exc.msg}" if isinstance(exc, json.JSONDecodeError) else "not JSON text"
        raise damaged(where, table, row, column, value, why) from None
    if not isinstance(data, dict):
        raise damaged(where, table, row, column, value, f"not a JSON object but {_json_kind(data)}")
    return data


def _json_kind(data: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(data), "a number")


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


def check_row(table: Table, cells: dict[str, Any]) -> tuple[str, str] | None:
    """(column, why) of an empty cell the row cannot do without, or None."""
    for column in table.columns:
        if cells[column.name] is None and (not column.nullable or (table.name, column.name) in REQUIRED):
            return column.name, "a value is needed"
    if table.name in TYPED_VALUES:
        value, kind = TYPED_VALUES[table.name]
        if cells[kind] == "FINITE" and cells[value] is None:
            return value, f"no number though {kind} is FINITE"
        if cells[kind] == "FINITE" and not math.isfinite(cells[value]):
            return value, f"not a finite number though {kind} is FINITE (Optuna keeps ±inf empty)"
        if cells[kind] not in (None, "FINITE") and cells[value] is not None:
            return value, f"a number though {kind} is {cells[kind]} (whose value is kept empty)"
    if table.name == "trial_params":
        return check_param(cells["distribution_json"], cells["param_value"])
    return None


def check_param(distribution_json: str, param_value: float) -> tuple[str, str] | None:
    """(column, why) of an Optuna parameter row whose distribution is not one Optuna can
    rebuild, or whose value lies outside it (a choice index past its choices), or None."""
    from optuna.distributions import json_to_distribution

    try:
        distribution = json_to_distribution(distribution_json)
    except (*DECODE_ERRORS, AttributeError) as exc:
        shape = json.loads(distribution_json)   # JSON already (check_cell)
        why = ("not a JSON object" if not isinstance(shape, dict) else
               f"{type(exc).__name__}: {str(exc).splitlines()[0]}" if str(exc) else type(exc).__name__)
        return "distribution_json", f"not an Optuna distribution: {why}"
    try:
        inside = distribution._contains(param_value)
    except (*DECODE_ERRORS, AttributeError):
        inside = False
    if not inside:
        return "param_value", f"outside its distribution {type(distribution).__name__}"
    return None


def locate(conn: Connection, tables: Iterable[Table]) -> Damage | None:
    """The first cell of ``tables`` (those that exist) that does not read as its column's type,
    else the first empty cell a row needs, else the first reference to a row that is gone."""
    from sqlalchemy import inspect

    present = set(inspect(conn).get_table_names())
    tables = [t for t in tables if t.name in present]
    for table in tables:
        key = next(iter(table.primary_key.columns), None)
        raw = conn.execute(select(*(text(f'"{c.name}"') for c in table.columns)).select_from(text(f'"{table.name}"')))
        for values in raw:
            cells = dict(zip((c.name for c in table.columns), values))
            found = [(c.name, why) for c in table.columns if (why := check_cell(c, cells[c.name], conn.dialect))]
            found = found or [w for w in [check_row(table, cells)] if w is not None]
            if found:
                column, why = found[0]
                return Damage(table.name, cells[key.name] if key is not None else "?", column, cells[column], why)
    return _dangling(conn, tables, present)


def _dangling(conn: Connection, tables: list[Table], present: set[str]) -> Damage | None:
    """The first cell naming a row of another table (a foreign key, or :data:`REFERENCES`) that is not there."""
    for table in tables:
        key = next(iter(table.primary_key.columns), None)
        for column in table.columns:
            targets = [(*fk.target_fullname.rsplit(".", 1), None) for fk in column.foreign_keys]
            targets += [REFERENCES[(table.name, column.name)]] if (table.name, column.name) in REFERENCES else []
            for target, target_column, exempt in targets:
                if target not in present or key is None:
                    continue
                spare = f' AND "{column.name}" != {int(exempt)}' if exempt is not None else ""
                row = conn.execute(text(
                    f'SELECT "{key.name}", "{column.name}" FROM "{table.name}" WHERE "{column.name}" IS NOT NULL'
                    f'{spare} AND "{column.name}" NOT IN (SELECT "{target_column}" FROM "{target}") LIMIT 1')).first()
                if row is not None:
                    return Damage(table.name, row[0], column.name, row[1],
                                  f"no row of table {target} has {target_column} {row[1]!r}")
    return None
