"""Damaged study databases the decoders once tripped over (a third hostile walk): a device
row or an Optuna parameter row of another shape, a trial value that is no median, a stored
space that no longer parses, and databases that cannot be opened at all, read through the
Python API or $EVOTUNER_TUNED rather than the CLI. Each is one line naming what is damaged
(the table, row and column) and a remedy naming what named the database.

Studies come from the synthetic replay sweep (no GPU, no nvcc)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from cli_helpers import assert_one_line_error, run
from evotuner import tuned
from evotuner.errors import EvotunerError, StorageError
from evotuner.runtime import choice
from test_hardening_walk import cli_env  # noqa: F401 -- the same fixture
from test_hostile_walk import _replayed

_CATEGORICAL = json.dumps({"name": "CategoricalDistribution", "attributes": {"choices": [1, 2]}})


def _damage(db: Path, sql: str) -> None:
    conn = sqlite3.connect(db)
    with conn:
        before = conn.total_changes
        conn.executescript(sql)
        assert conn.total_changes > before, f"{sql} changed nothing"
    conn.close()


def _tuned_error(url: str) -> EvotunerError:
    """What evotuner.use_tuned(url) raises (it reads the table through tuned.load)."""
    with pytest.raises(EvotunerError) as info:
        tuned.load(url)
    return info.value


@pytest.mark.parametrize("sql, says", [
    ("UPDATE evotuner_devices SET fingerprint_json = '[1,2]'",
     ("table evotuner_devices, row 1, column fingerprint_json", "not a JSON object")),
    ("UPDATE trial_params SET distribution_json = '[]' WHERE param_id = 1",
     ("table trial_params, row 1, column distribution_json", "not an Optuna distribution")),
    ("UPDATE trial_params SET distribution_json = '{\"name\": \"Nope\", \"attributes\": {}}' WHERE param_id = 1",
     ("table trial_params, row 1, column distribution_json", "Nope")),
    (f"UPDATE trial_params SET distribution_json = '{_CATEGORICAL}', param_value = 5 WHERE param_id = 1",
     ("table trial_params, row 1, column param_value", "outside its distribution")),
    ("UPDATE trial_params SET param_value = 1e999 WHERE param_id = 1",
     ("table trial_params, row 1, column param_value", "outside its distribution")),
])
def test_a_row_of_another_shape_is_one_line_naming_its_cell(capsys, cli_env, sql, says):
    _replayed(capsys, cli_env)
    db = cli_env / "evotuner.db"
    _damage(db, sql)
    for argv in (["show", "--study", "s"], ["show", "--study", "s", "--json"],
                 ["export", "--study", "s", "-o", cli_env / "h.h"], ["report", "--study", "s", "-o", cli_env / "rep"]):
        code, out, err = run(capsys, *argv)
        assert_one_line_error(code, out, err, "is damaged", "restore it from a copy", *says)
        assert "unexpected" not in err
    error = _tuned_error(f"sqlite:///{db}")          # evotuner.use_tuned(DB)
    assert isinstance(error, StorageError) and all(s in error.message for s in says), error


@pytest.mark.parametrize("value, says", [("'abc'", "holds 'abc' (not a number)"),
                                         ("1e999", "holds inf (not a finite number)"),
                                         ("-3.5", "holds -3.5 (not a positive number")])
def test_export_names_the_cell_of_a_damaged_trial_value(capsys, cli_env, value, says):
    _replayed(capsys, cli_env)
    db = cli_env / "evotuner.db"
    conn = sqlite3.connect(db)
    row, number = conn.execute("SELECT v.trial_value_id, t.number FROM trial_values v JOIN trials t "
                               "ON t.trial_id = v.trial_id WHERE t.state = 'COMPLETE' ORDER BY t.number").fetchone()
    conn.close()
    _damage(db, f"UPDATE trial_values SET value = {value} WHERE trial_value_id = {row}")
    code, out, err = run(capsys, "export", "--study", "s", "-o", cli_env / "h.h")
    if value == "'abc'":      # text where a number belongs: refused as the study is read (show says the same)
        assert_one_line_error(code, out, err, f"database {db} is damaged",
                              f"table trial_values, row {row}, column value {says}", "restore it from a copy")
    else:                     # a number, but no median: refused as the trial's row is made
        assert_one_line_error(code, out, err, f"study 's': trial {number}: database {db} is damaged",
                              f"table trial_values, row {row}, column value {says}", "restore it from a copy",
                              "export the other studies")
    assert "re-run" not in err and "median µs" not in err
    assert not (cli_env / "h.h").exists()
    if value == "'abc'":                           # use_tuned names the same cell
        assert f"table trial_values, row {row}, column value holds 'abc'" in _tuned_error(f"sqlite:///{db}").message
        # report too (Optuna's importances once met the string: "unexpected TypeError"), before any file
        code, out, err = run(capsys, "report", "--study", "s", "-o", cli_env / "rep")
        assert_one_line_error(code, out, err, f"table trial_values, row {row}, column value holds 'abc'")
        assert "unexpected" not in err and not (cli_env / "rep").exists()


def test_export_of_a_damaged_stored_space_says_what_show_says(capsys, cli_env):
    _replayed(capsys, cli_env)
    _damage(cli_env / "evotuner.db", "UPDATE evotuner_studies SET space_text = 'garbage [['")
    code, out, shown = run(capsys, "show", "--study", "s")
    assert_one_line_error(code, out, shown, "evotuner_studies.space_text", "restore the database from a copy")
    code, out, err = run(capsys, "export", "--study", "s", "-o", cli_env / "h.h")
    assert_one_line_error(code, out, err, "evotuner_studies.space_text", "restore the database from a copy")
    assert err == shown and "fix the line" not in err


def _junk(p: Path) -> None:
    p.write_text("hello, not a database\n")


def _foreign(p: Path) -> None:
    conn = sqlite3.connect(p)
    conn.execute("CREATE TABLE customers (id INTEGER)")
    conn.commit()
    conn.close()


def _optuna_only(p: Path) -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    optuna.create_study(study_name="s", storage=f"sqlite:///{p}")


def _corrupt(p: Path) -> None:
    _foreign(p)
    data = p.read_bytes()
    p.write_bytes(data[:100] + b"\xff" * (len(data) - 100))


@pytest.mark.parametrize("make, says", [
    (_junk, "file is not a database"),
    (lambda p: p.mkdir(), "is not a file"),
    (_foreign, "belongs to another application"),
    (_optuna_only, "holds no evotuner study"),
    (_corrupt, "corrupt"),
])
def test_a_tuned_database_that_cannot_be_opened_names_use_tuned_not_storage(capsys, cli_env, monkeypatch,
                                                                            make, says):
    db = cli_env / "x.db"
    make(db)
    url = f"sqlite:///{db}"
    error = _tuned_error(url)                       # evotuner.use_tuned(url)
    assert says in error.message and tuned.TUNED_SOURCES in error.remedy, error
    assert "--storage" not in error.remedy, error
    monkeypatch.setenv(tuned.ENV_VAR, url)           # $EVOTUNER_TUNED, read by choose()/served_tables()
    monkeypatch.setattr(choice, "_tables", None)
    with pytest.raises(EvotunerError) as info:
        choice.served_tables()
    assert info.value.message.startswith(f"${tuned.ENV_VAR}: ") and says in info.value.message
    assert tuned.TUNED_SOURCES in info.value.remedy and "--storage" not in info.value.remedy, info.value
    monkeypatch.setattr(choice, "_tables", None)
    code, out, err = run(capsys, "show", "--study", "s", "--storage", url)    # the CLI keeps its option
    assert_one_line_error(code, out, err, says, "--storage / $EVOTUNER_STORAGE")


@pytest.mark.parametrize("sql, says", [
    ("UPDATE trial_values SET value = 'abc' WHERE trial_value_id = 1", "table trial_values, row 1, column value holds 'abc'"),
    ("UPDATE trials SET number = 'x' WHERE trial_id = 2", "table trials, row 2, column number holds 'x'"),
])
def test_show_refuses_text_where_a_trial_number_or_value_belongs(capsys, cli_env, sql, says):
    """show read them back as they were (a value of 'abc' as none, "number": 'x' in its JSON) and
    exited 0 while export and report refused; a non-finite value still shows as none."""
    _replayed(capsys, cli_env)
    _damage(cli_env / "evotuner.db", sql)
    for argv in (["show", "--study", "s"], ["show", "--study", "s", "--json"]):
        code, out, err = run(capsys, *argv)
        assert_one_line_error(code, out, err, "is damaged", says, "restore it from a copy")
