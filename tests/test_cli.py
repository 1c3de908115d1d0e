"""The command line: every command, and every bad input ending in one line, no traceback,
nothing written. Commands run in-process through ``evotuner.cli.main`` (the console
script's entry point, error boundary included); one test runs the installed script."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evotuner import cli
import cli_helpers
from cli_helpers import assert_one_line_error, run, scaffold_env

TESTS = Path(__file__).parent
TINY = TESTS / "data" / "loop_tiny.toml"
SHAPE = "B=1,H=2,S=256,D=32"
CONFIG = "BLOCK_M=64,BLOCK_N=32,NUM_WARPS=4,STAGES=1,MIN_BLOCKS=1"


@pytest.fixture(autouse=True)
def env(monkeypatch, build_cache_dir, tmp_path):
    scaffold_env(monkeypatch, build_cache_dir, tmp_path)




def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def search(capsys, db, *extra, study="s", trials=4):
    return run(capsys, "search", "--study", study, "--shape", SHAPE, "--space", TINY, "--trials", trials,
               "--jobs", 2, "--storage", f"sqlite:///{db}", *extra)


# -- the commands ------------------------------------------------------------------------------


def test_search_resume_show_export(capsys, tmp_path):
    db = tmp_path / "studies.db"
    code, out, err = search(capsys, db)
    assert code == 0, err
    assert "study 's' has 4 finished trials" in out
    assert "SDPA baselines: sdpa_default 250.0 µs" in out
    assert "best" in out and "vs SDPA" in out
    # the best is a selection among noisy timings: the way to confirm it is named
    assert "the best's µs is the fastest of 2 timings" in " ".join(out.split()), out
    # the command it names reaches this database (the search was given --storage); a long path
    # may be broken after a '/' at the terminal's width
    assert "`evotunerbench--studys--storagesqlite:///" + str(db).replace(" ", "") + "`re-timesthebest5besideSDPA" \
        in "".join(out.split()), out

    code, out, err = search(capsys, db)
    assert code == 0, err
    assert "already has 4 finished trials" in out
    assert "evotuner bench" not in out            # nothing was timed this time

    code, out, err = run(capsys, "resume", "--study", "s", "--trials", 6, "--storage", f"sqlite:///{db}")
    assert code == 0, err
    assert "study 's' has 6 finished trials" in out

    code, out, err = run(capsys, "show", "--study", "s", "--json", "--storage", f"sqlite:///{db}")
    assert code == 0, err
    data = json.loads(out)                       # exactly one JSON object
    assert data["study"] == "s" and sum(data["counts"].values()) == 6
    assert len(data["trials"]) == 6
    for t in data["trials"]:
        assert {"number", "state", "value", "params", "tflops", "gate", "error"} <= t.keys()
        assert set(t["params"]) == {"BLOCK_M", "BLOCK_N", "NUM_WARPS", "STAGES", "MIN_BLOCKS"}
    complete = [t for t in data["trials"] if t["state"] == "COMPLETE"]
    assert data["best"]["value"] == min(t["value"] for t in complete)

    code, out, err = run(capsys, "show", "--study", "s", "--top", 2, "--storage", f"sqlite:///{db}")
    assert code == 0, err
    assert "loop_tiny" in out and "scaffold (test only)" in out and "BM = BLOCK_M" in out

    header = tmp_path / "flashcore_config.h"
    code, out, err = run(capsys, "export", "--study", "s", "--output", header, "--storage", f"sqlite:///{db}")
    assert code == 0, err
    text = header.read_text()
    best = data["best"]["params"]
    assert f"FLASHCORE_TUNED_0_BLOCK_M {best['BLOCK_M']}" in " ".join(text.split())


def test_default_storage_is_evotuner_db_in_the_current_directory(capsys, tmp_path):
    code, out, err = run(capsys, "search", "--study", "s", "--shape", SHAPE, "--space", TINY, "--trials", 1)
    assert code == 0, err
    assert (tmp_path / "evotuner.db").is_file()


def test_storage_from_the_environment(capsys, tmp_path, monkeypatch):
    db = tmp_path / "from-env.db"
    monkeypatch.setenv(cli.STORAGE_ENV, f"sqlite:///{db}")
    code, out, err = run(capsys, "search", "--study", "s", "--shape", SHAPE, "--space", TINY, "--trials", 1)
    assert code == 0, err
    assert db.is_file() and not (tmp_path / "evotuner.db").exists()


def test_an_empty_storage_url_is_a_usage_error_not_the_default_database(capsys, tmp_path, monkeypatch):
    """`--storage "$DB"` with DB unset must not create evotuner.db here; an empty
    $EVOTUNER_STORAGE reads as unset (the default)."""
    code, out, err = search(capsys, "", "--storage", "")      # the later --storage wins
    assert code == 2 and "--storage" in err and "empty" in err, err
    assert not (tmp_path / "evotuner.db").exists() and not list(tmp_path.iterdir())
    monkeypatch.setenv(cli.STORAGE_ENV, "")
    code, out, err = run(capsys, "show", "--study", "s")
    assert code == 1 and f"no study database at {tmp_path / 'evotuner.db'}" in err, err


def test_commands_printed_for_pasting_name_the_database_they_need():
    """A printed `evotuner ...` command carries the --storage its run was given (shell-quoted,
    a password hidden), and none for the default database."""
    from evotuner.cli_options import study_args

    assert study_args("s", None) == "--study s"
    assert study_args("s", cli.DEFAULT_STORAGE) == "--study s"
    assert study_args("s", "sqlite:///studies.db") == "--study s --storage sqlite:///studies.db"
    assert study_args("my study", "sqlite:///a b.db") == "--study 'my study' --storage 'sqlite:///a b.db'"
    shown = study_args("s", "postgresql://tuner:secret@db.example:5432/evo")
    assert "secret" not in shown and shown.endswith("--storage 'postgresql://tuner:***@db.example:5432/evo'")
    shown = study_args("s", "postgresql+psycopg://tuner@db/evo?password=p%40ss&sslmode=require")   # in the query
    assert "p%40ss" not in shown and shown.endswith("'postgresql+psycopg://tuner@db/evo?password=***&sslmode=require'")


def test_compile_json(capsys):
    code, out, err = run(capsys, "compile", "--config", CONFIG, "--shape", "D=32", "--space", TINY, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert set(data) == {"params", "gate", "passed", "reason", "build_seconds", "cached"}
    assert data["params"] == {"BLOCK_M": 64, "BLOCK_N": 32, "NUM_WARPS": 4, "STAGES": 1, "MIN_BLOCKS": 1}
    assert data["passed"] is True and data["reason"] is None
    assert data["gate"]["registers"] > 0 and data["gate"]["spill_stores"] == 0


def test_compile_table_shows_the_gate_verdict(capsys, tmp_path):
    strict = tmp_path / "strict.toml"
    strict.write_text(TINY.read_text().replace("max_registers = 255", "max_registers = 16"))
    code, out, err = run(capsys, "compile", "--config", CONFIG, "--shape", "D=32", "--space", strict)
    assert code == cli.GATE_REJECTED_EXIT, err          # built, but the gate rejects it (README: exit statuses)
    assert "registers" in out and "rejected: registers" in out


def test_search_without_a_gpu_refuses_before_touching_the_database(capsys, tmp_path, monkeypatch):
    import evotuner.measure

    monkeypatch.setitem(cli_helpers.MEASURE, "factory", None)   # the real GPU stage
    monkeypatch.setattr(evotuner.measure, "gpu_available", lambda *a, **k: False)
    db = tmp_path / "never.db"
    code, out, err = search(capsys, db)
    assert_one_line_error(code, out, err, "no CUDA GPU on this machine: evotuner search needs one to measure; ",
                                          "--replay", "`compile`")
    assert not db.exists()


def test_an_unexpected_error_is_one_line_with_the_debug_hint(capsys, tmp_path, monkeypatch):
    def broken_factory():
        raise AttributeError("module 'scaffold' has no attribute 'no_such_factory'")

    monkeypatch.setitem(cli_helpers.MEASURE, "factory", broken_factory)
    code, out, err = search(capsys, tmp_path / "x.db")
    assert_one_line_error(code, out, err, "AttributeError", "EVOTUNER_DEBUG=1")


def test_the_console_script_reports_usage_errors_in_one_line(tmp_path):
    script = Path(sys.executable).parent / "evotuner"
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "evotuner.cli"]
    proc = subprocess.run([*argv, "search", "--study", "s"], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env={**os.environ, "EVOTUNER_DEBUG": ""})
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["error: Missing option '--shape'. (see `evotuner search --help`)"]
    assert not (tmp_path / "evotuner.db").exists()


# -- bad input: one line, non-zero, nothing written ----------------------------------------------


@pytest.mark.parametrize(
    "space_text, fragments",
    [
        ("[space\nname = 'x'\n", ("malformed TOML",)),
        (TINY.read_text() + "\n[tuning]\nfoo = 1\n", ("[tuning]", "unknown top-level key")),
    ],
    ids=["malformed", "unknown-key"],
)
def test_a_bad_space_file(capsys, tmp_path, space_text, fragments):
    bad = tmp_path / "bad.toml"
    bad.write_text(space_text)
    db = tmp_path / "s.db"
    code, out, err = run(capsys, "search", "--study", "s", "--shape", SHAPE, "--space", bad,
                         "--storage", f"sqlite:///{db}")
    assert_one_line_error(code, out, err, str(bad), *fragments)
    assert not db.exists()


@pytest.mark.parametrize(
    "args, fragments",
    [
        (("--sampler", "annealing"), ("unknown sampler 'annealing'", "tpe")),
        (("--shape", "B=1,H=2,D=64"), ("missing dimension S",)),
        (("--shape", "B=1,H=2,S=128,D=48"), ("D=48 is not supported",)),
        (("--dtype", "fp8"), ("--dtype", "fp8")),
    ],
    ids=["sampler", "shape-missing-dim", "head-dim", "dtype"],
)
def test_bad_search_options(capsys, tmp_path, args, fragments):
    db = tmp_path / "s.db"
    code, out, err = search(capsys, db, *args)
    assert_one_line_error(code, out, err, *fragments)
    assert not db.exists()


@pytest.mark.parametrize("argv, fragments", [
    (("compile", "--config", "BLOCK_M=64", "--shape", "B=1,H=32,HKV=0,S=128,D=64"),
     ("'--shape'", "HKV must be a positive integer, got 0", "give HKV=1 or more")),
    (("compile", "--config", "BLOCK_M=64", "--shape", "B=0,H=1,S=1,D=64"), ("'--shape'", "give B=1 or more")),
    (("compile", "--config", "BLOCK_M=64", "--shape", "H=4"), ("'--shape'", "missing dimension D", "D=64")),
    (("search", "--study", "s", "--shape", "B=1,H=1,S=0,D=32"), ("'--shape'", "S must be a positive", "give S=1")),
    (("search", "--study", "s", "--shape", "B=1,H=1,SQ=0,SK=8,D=32"), ("'--shape'", "SQ must be a positive")),
    (("search", "--study", "s", "--shape", "B=1,H=1,S=8,D=0"), ("'--shape'", "D=0 is not supported")),
    (("search", "--study", "s", "--shape", "B=1,H=2,Q=8,D=32"), ("'--shape'", "cannot read 'Q=8'")),
    (("resume", "--study", "s", "--shape", "B=1,H=2,S=-3,D=32"), ("'--shape'", "S must be a positive")),
    (("search", "--study", "s", "--shape", SHAPE, "--sampler", "bogus"), ("'--sampler'", "unknown sampler 'bogus'")),
])
def test_a_malformed_shape_or_sampler_is_a_usage_error_in_the_users_words(capsys, tmp_path, argv, fragments):
    """--shape's errors name the keys written (HKV, B, S), not Shape's fields (heads_kv, batch,
    seqlen_q), and a malformed --shape or --sampler exits 2, naming the option, as the docs say."""
    db = tmp_path / "s.db"
    code, out, err = run(capsys, *argv, "--storage", f"sqlite:///{db}") if argv[0] != "compile" else run(capsys, *argv)
    assert_one_line_error(code, out, err, *fragments)
    assert code == 2
    assert not any(field in err for field in ("heads_kv", "batch", "seqlen", "head_dim"))
    assert not db.exists()


@pytest.mark.parametrize(
    "config, fragments",
    [
        ("BLOCK_M=64,BLOCK_N=32,NUM_WARPS=4,STAGES=1,MIN_BLOCKS=1,SWIZZLE=2", ("unknown parameter SWIZZLE",)),
        ("BLOCK_M=96,BLOCK_N=32,NUM_WARPS=4,STAGES=1,MIN_BLOCKS=1", ("BLOCK_M=96", "64, 128")),
        ("BLOCK_M=128,BLOCK_N=64,NUM_WARPS=4,STAGES=1,MIN_BLOCKS=1", ("test_tile_budget",)),
        ("BLOCK_M=sixty-four", ("BLOCK_M",)),
    ],
    ids=["unknown-param", "outside-domain", "constraint", "not-an-int"],
)
def test_bad_compile_config(capsys, tmp_path, config, fragments):
    code, out, err = run(capsys, "compile", "--config", config, "--shape", "D=32", "--space", TINY)
    assert_one_line_error(code, out, err, *fragments)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "url, fragments",
    [
        ("notadialect://host/db", ("notadialect",)),
        ("sqlite:////nonexistent-evotuner-dir/sub/x.db", ("does not exist",)),
    ],
    ids=["unknown-dialect", "missing-directory"],
)
def test_an_unreachable_storage_url(capsys, tmp_path, url, fragments):
    code, out, err = run(capsys, "search", "--study", "s", "--shape", SHAPE, "--space", TINY,
                         "--storage", url)
    assert_one_line_error(code, out, err, *fragments)
    assert list(tmp_path.iterdir()) == []


def test_a_corrupt_database_file_is_left_alone(capsys, tmp_path):
    db = tmp_path / "s.db"
    db.write_bytes(b"this is not a database, just some bytes\n" * 50)
    before = sha(db)
    for argv in (("search", "--study", "s", "--shape", SHAPE, "--space", TINY),
                 ("resume", "--study", "s"), ("show", "--study", "s")):
        code, out, err = run(capsys, *argv, "--storage", f"sqlite:///{db}")
        assert_one_line_error(code, out, err, str(db), "not a database")
        assert sha(db) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.db"]


def test_a_read_only_database_directory(capsys, tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        if os.access(locked, os.W_OK):
            # Running as root, chmod does not stop writes: make the access check see
            # what an ordinary user would.
            real_access = os.access
            monkeypatch.setattr(os, "access", lambda p, mode, *a, **k:
                                False if Path(p) == locked and mode & os.W_OK else real_access(p, mode, *a, **k))
        code, out, err = search(capsys, locked / "s.db")
        assert_one_line_error(code, out, err, str(locked), "read-only")
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o755)


def test_resume_refuses_an_unknown_study_and_a_missing_database(capsys, tmp_path):
    missing = tmp_path / "missing.db"
    code, out, err = run(capsys, "resume", "--study", "nope", "--storage", f"sqlite:///{missing}")
    assert_one_line_error(code, out, err, "no study database", str(missing))
    assert not missing.exists()

    db = tmp_path / "s.db"
    assert search(capsys, db, trials=1)[0] == 0
    before = sha(db)
    code, out, err = run(capsys, "resume", "--study", "nope", "--storage", f"sqlite:///{db}")
    assert_one_line_error(code, out, err, "'nope' not found", "'s'")
    assert sha(db) == before


def test_resume_refuses_another_shape_or_space(capsys, tmp_path):
    db = tmp_path / "s.db"
    assert search(capsys, db, trials=1)[0] == 0
    before = sha(db)
    code, out, err = run(capsys, "resume", "--study", "s", "--shape", "B=2,H=2,S=256,D=32",
                         "--storage", f"sqlite:///{db}")
    assert_one_line_error(code, out, err, "B=1,H=2,S=256,D=32", "B=2,H=2,S=256,D=32")
    assert sha(db) == before

    other = tmp_path / "other.toml"
    other.write_text(TINY.read_text().replace("values = [1, 2]", "values = [1]"))
    code, out, err = run(capsys, "resume", "--study", "s", "--space", other, "--storage", f"sqlite:///{db}")
    assert_one_line_error(code, out, err, "another search space", str(other))
    assert sha(db) == before

    code, out, err = search(capsys, db, "--shape", "B=1,H=2,S=512,D=32", trials=2)
    assert_one_line_error(code, out, err, "'s'")
    assert sha(db) == before


def test_compile_reports_a_compiler_error_in_one_line(capsys, tmp_path):
    loose = tmp_path / "loose.toml"
    loose.write_text(TINY.read_text().replace("values = [32, 64]", "values = [32, 40]"))
    code, out, err = run(capsys, "compile", "--config", CONFIG.replace("BLOCK_N=32", "BLOCK_N=40"),
                         "--shape", "D=32", "--space", loose)
    assert_one_line_error(code, out, err, "nvcc failed", "BLOCK_N", "ptxas.log")


def test_a_compiler_error_is_told_by_its_error_line_not_the_include_trace():
    from evotuner.cli_options import one_line

    log = ('In file included from gen.cu:8:\n'
           '/k/hopper/instantiate.cuh:12:2: error: #error "HOPPER_STAGES must be defined"\n'
           '   12 | #error "HOPPER_STAGES must be defined"\n'
           '      |  ^~~~~\n')
    assert one_line(log) == '/k/hopper/instantiate.cuh:12:2: error: #error "HOPPER_STAGES must be defined"'
    assert one_line('gen.cu(8): error: static assertion failed\n1 error detected in the compilation') == \
        "gen.cu(8): error: static assertion failed"
    assert one_line("first\nmiddle\nlast") == "first ... last"       # no error line: both ends, as before
