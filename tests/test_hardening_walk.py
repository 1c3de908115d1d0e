"""Issue 29: a hostile walk. No command destroys a file it was not asked to write, nothing
hangs, every failure is one clean line.

Studies come from a recorded sweep (--replay), so nothing here needs a GPU; the CLI runs
in-process through its error boundary unless a test needs a real process (signals, hangs).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_helpers import assert_one_line_error, run, scaffold_env

REPO = Path(__file__).resolve().parents[1]
SWEEP = REPO / "tests" / "data" / "sweep_h100_d64.csv"
SHAPE = "B=16,H=16,S=2048,D=64"
TINY_SPACE = REPO / "tests" / "data" / "loop_tiny.toml"


@pytest.fixture
def cli_env(monkeypatch, tmp_path, build_cache_dir):
    scaffold_env(monkeypatch, build_cache_dir, tmp_path)
    monkeypatch.setenv("COLUMNS", "80")
    return tmp_path


def _sweep_copy(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    csv = dest / SWEEP.name
    shutil.copy(SWEEP, csv)
    shutil.copy(SWEEP.with_name(SWEEP.name + ".json"), dest / (SWEEP.name + ".json"))
    return csv


def _replayed(capsys, where: Path, study: str = "s", trials: int = 4, db: str = "sqlite:///evotuner.db",
              *extra: str) -> Path:
    csv = _sweep_copy(where / "sweep")
    code, out, err = run(capsys, "search", "--study", study, "--shape", SHAPE, "--trials", trials,
                         "--replay", csv, "--storage", db, *extra)
    assert code == 0, err
    return csv


def _studies(db: Path) -> list[str]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return sorted(r[0] for r in conn.execute("SELECT study_name FROM studies"))
    finally:
        conn.close()


# -- 1. the output rule: never the database, a link, or a non-regular file -----------------------


@pytest.mark.parametrize("target", ["db.db", "./x/../db.db", "x/../db.db-wal", "hardlink.db"])
def test_export_never_replaces_the_study_database(capsys, cli_env, target):
    (cli_env / "x").mkdir()
    _replayed(capsys, cli_env, "s", 4, "sqlite:///db.db")
    _replayed(capsys, cli_env, "t", 4, "sqlite:///db.db")
    os.link(cli_env / "db.db", cli_env / "hardlink.db")
    before = (cli_env / "db.db").read_bytes()
    code, out, err = run(capsys, "export", "--study", "s", "--output", target, "--storage", "sqlite:///db.db")
    assert_one_line_error(code, out, err, "cannot write", "database")
    assert "unexpected" not in err
    assert (cli_env / "db.db").read_bytes() == before
    assert _studies(cli_env / "db.db") == ["s", "t"]
    assert not [p for p in cli_env.iterdir() if p.name.endswith(".tmp")]


def test_export_never_replaces_another_sqlite_database(capsys, cli_env):
    _replayed(capsys, cli_env)
    other = cli_env / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    before = other.read_bytes()
    code, out, err = run(capsys, "export", "--study", "s", "-o", other)
    assert_one_line_error(code, out, err, "SQLite database", str(other))
    assert other.read_bytes() == before


def test_report_does_not_write_through_symlinks(capsys, cli_env):
    pytest.importorskip("matplotlib")
    _replayed(capsys, cli_env)
    rep = cli_env / "rep"
    rep.mkdir()
    victims = {name: cli_env / f"victim-{name}" for name in ("history.png", "report.json")}
    for name, victim in victims.items():
        victim.write_text(f"precious {name}\n")
        (rep / name).symlink_to(victim)
    code, out, err = run(capsys, "report", "--study", "s", "--output", rep)
    assert_one_line_error(code, out, err, "symbolic link")
    for name, victim in victims.items():
        assert victim.read_text() == f"precious {name}\n"
        assert (rep / name).is_symlink()
    assert sorted(p.name for p in rep.iterdir()) == ["history.png", "report.json"]   # nothing drawn


def test_report_never_replaces_the_study_database(capsys, cli_env):
    pytest.importorskip("matplotlib")
    _replayed(capsys, cli_env, "s", 4, "sqlite:///report.json")
    before = (cli_env / "report.json").read_bytes()
    code, out, err = run(capsys, "report", "--study", "s", "--output", ".", "--storage", "sqlite:///report.json")
    assert_one_line_error(code, out, err, "study database in use")
    assert (cli_env / "report.json").read_bytes() == before


def test_export_refuses_a_link_and_a_fifo(capsys, cli_env):
    _replayed(capsys, cli_env)
    victim = cli_env / "victim.h"
    victim.write_text("keep\n")
    (cli_env / "link.h").symlink_to(victim)
    code, out, err = run(capsys, "export", "--study", "s", "-o", cli_env / "link.h")
    assert_one_line_error(code, out, err, "symbolic link")
    assert victim.read_text() == "keep\n" and (cli_env / "link.h").is_symlink()
    os.mkfifo(cli_env / "pipe.h")
    code, out, err = run(capsys, "export", "--study", "s", "-o", cli_env / "pipe.h")
    assert_one_line_error(code, out, err, "not a regular file")


def test_export_to_the_longest_file_name_works_and_a_longer_one_is_one_line(capsys, cli_env):
    _replayed(capsys, cli_env)
    longest = cli_env / ("h" * 253 + ".h")          # NAME_MAX: 255
    code, out, err = run(capsys, "export", "--study", "s", "-o", longest)
    assert code == 0, err
    assert "kConfigs" in longest.read_text()
    code, out, err = run(capsys, "export", "--study", "s", "-o", cli_env / ("h" * 300 + ".h"))
    assert_one_line_error(code, out, err, "File name too long", "shorter")
    assert "unexpected" not in err
