"""A second hostile walk of the CLI (after tests/test_hardening_walk.py): junk in the
environment, damaged and foreign databases, failing commands that must leave nothing
behind, options without a bound, and signals.

Studies come from the synthetic replay sweep (no GPU, no nvcc); the CLI runs in-process
through its error boundary unless a test needs a real process.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import assert_one_line_error, run, sweep_copy
from test_hardening_walk import cli_env  # noqa: F401 -- the same fixture

REPO = Path(__file__).resolve().parents[1]
SWEEP = REPO / "tests" / "data" / "replay" / "synthetic_d64.csv"
SHAPE = "B=16,H=16,S=2048,D=64"


def _sweep_copy(dest: Path) -> Path:
    return sweep_copy(SWEEP, dest)


def _replayed(capsys, where: Path, study: str = "s", trials: int = 4) -> Path:
    csv = _sweep_copy(where / "sweep")
    code, out, err = run(capsys, "search", "--study", study, "--shape", SHAPE, "--trials", trials, "--replay", csv)
    assert code == 0, err
    return csv


def _child_env(cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVOTUNER_") and k not in ("COLUMNS", "LINES")}
    env.update(EVOTUNER_CACHE_DIR=str(cache), **extra)
    return env


def _cli(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evotuner.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


# -- the environment ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "", "false", "no", "off", " OFF "])
def test_evotuner_debug_set_to_a_false_value_keeps_errors_one_line(tmp_path, build_cache_dir, value):
    result = _cli(["show", "--study", "s"], tmp_path, _child_env(build_cache_dir, EVOTUNER_DEBUG=value))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: no study database"), \
        result.stderr


def test_evotuner_debug_1_still_shows_the_traceback(tmp_path, build_cache_dir):
    result = _cli(["show", "--study", "s"], tmp_path, _child_env(build_cache_dir, EVOTUNER_DEBUG="1"))
    assert "Traceback" in result.stderr


# -- damaged databases: one line naming the row, never "unexpected" ---------------------------------------


@pytest.mark.parametrize("sql, says", [
    ("UPDATE trial_params SET param_value = NULL WHERE param_id = 2", ("trial_params", "row 2", "param_value")),
    ("UPDATE trial_values SET value = NULL", ("trial_values", "value", "FINITE")),
    ("UPDATE trial_values SET value_type = 'INF_POS'", ("trial_values", "value", "INF_POS")),
    ("PRAGMA foreign_keys = OFF; DELETE FROM studies", ("evotuner_studies", "optuna_study_id", "studies")),
])
def test_damage_that_reads_as_null_or_a_lost_row_is_one_line_naming_it(capsys, cli_env, sql, says):
    csv = _replayed(capsys, cli_env)
    conn = sqlite3.connect(cli_env / "evotuner.db")
    conn.executescript(sql)
    conn.commit()
    conn.close()
    for argv in (["show", "--study", "s"], ["export", "--study", "s", "-o", cli_env / "h.h"],
                 ["resume", "--study", "s", "--trials", 6, "--replay", csv]):
        code, out, err = run(capsys, *argv)
        assert_one_line_error(code, out, err, "damaged", "restore it from a copy", *says)
        assert "unexpected" not in err


def _optuna_only(path: Path) -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    optuna.create_study(study_name="s", storage=f"sqlite:///{path}")


@pytest.mark.parametrize("make, says", [
    (lambda p: p.write_bytes(b""), "is empty: it holds no study"),
    (_optuna_only, "holds no evotuner study"),
])
def test_reading_an_empty_or_optuna_only_database_is_one_line_and_leaves_it_as_found(capsys, cli_env, make, says):
    db = cli_env / "x.db"
    make(db)
    before = db.read_bytes()
    for argv in (["show", "--study", "s"], ["show", "--study", "s", "--json"], ["export", "--study", "s", "-o", "h.h"],
                 ["report", "--study", "s", "-o", "rep"]):
        code, out, err = run(capsys, *argv, "--storage", "sqlite:///x.db")
        assert_one_line_error(code, out, err, says, str(db))
        assert "unexpected" not in err and "writing" not in err
    assert db.read_bytes() == before
    assert sorted(p.name for p in cli_env.iterdir()) == ["x.db"]


def test_a_missing_optuna_table_is_one_line_without_optunas_fallback_warning(capsys, cli_env):
    _replayed(capsys, cli_env)
    conn = sqlite3.connect(cli_env / "evotuner.db")
    conn.execute("DROP TABLE trial_values")
    conn.commit()
    conn.close()
    result = _cli(["show", "--study", "s"], cli_env, _child_env(cli_env / "cache"))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and "trial_values" in lines[0]


def test_report_of_a_study_without_a_complete_trial_prints_no_matplotlib_warning(capsys, cli_env):
    pytest.importorskip("matplotlib")
    _replayed(capsys, cli_env, trials=2)
    conn = sqlite3.connect(cli_env / "evotuner.db")
    conn.execute("UPDATE trials SET state = 'PRUNED'")
    conn.commit()
    conn.close()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")        # matplotlib's "No artists with labels" is a failure
        code, out, err = run(capsys, "report", "--study", "s", "-o", cli_env / "rep")
    assert code == 0 and err == "", err
    assert (cli_env / "rep" / "history.png").is_file()


# -- a failing command leaves nothing behind ---------------------------------------------------------------


def test_report_of_a_missing_study_creates_no_folder(capsys, cli_env):
    pytest.importorskip("matplotlib")
    _replayed(capsys, cli_env)
    code, out, err = run(capsys, "report", "--study", "nope", "-o", cli_env / "rep" / "deeper")
    assert_one_line_error(code, out, err, "'nope' not found")
    assert not (cli_env / "rep").exists()


def test_report_into_a_file_says_it_is_a_file(capsys, cli_env):
    pytest.importorskip("matplotlib")
    _replayed(capsys, cli_env)
    (cli_env / "notes.txt").write_text("keep\n")
    code, out, err = run(capsys, "report", "--study", "s", "-o", cli_env / "notes.txt")
    assert_one_line_error(code, out, err, "notes.txt", "is a file, not a folder")
    assert (cli_env / "notes.txt").read_text() == "keep\n"


HOPPER_SWEEP = REPO / "tests" / "data" / "replay" / "hopper_synthetic_d64.csv"


@pytest.mark.parametrize("extra, says", [
    (["--replay", "nope.csv"], "sweep file not found"),
    (["--replay", "."], "is a folder, not a sweep file"),
    (["--replay", "/dev/zero"], "is not a regular file"),
    (["--replay", "SWEEP", "--sampler", "TPE"], "unknown sampler 'TPE'"),
    (["--replay", "SWEEP", "--sampler", "guided"], "sampler 'guided'"),
    (["--replay", "SWEEP", "--space", "hopper"], "--replay"),
    (["--replay", str(HOPPER_SWEEP)], "--replay"),
    (["--replay", "SWEEP", "--study", "   "], "--study"),
])
def test_a_search_refused_for_its_options_creates_no_database(capsys, cli_env, extra, says):
    csv = _sweep_copy(cli_env / "sweep")
    extra = [str(csv) if e == "SWEEP" else e for e in extra]
    study = [] if "--study" in extra else ["--study", "s"]
    code, out, err = run(capsys, "search", *study, "--shape", SHAPE, "--trials", 2, *extra)
    assert_one_line_error(code, out, err, says)
    assert "unexpected" not in err
    assert sorted(p.name for p in cli_env.iterdir()) == ["sweep"]


# -- every child process has a deadline ----------------------------------------------------------------------


@pytest.mark.parametrize("command", ["check", "profile"])
@pytest.mark.parametrize("value", ["inf", "1e400", "nan", "100000"])
def test_a_tool_timeout_without_a_bound_is_a_usage_error(capsys, cli_env, command, value):
    code, out, err = run(capsys, command, "--study", "s", "--timeout", value)
    assert_one_line_error(code, out, err, "--timeout")
    assert code == 2


@pytest.mark.parametrize("command", ["check", "profile"])
def test_check_and_profile_say_what_to_run_before_looking_for_their_tool(capsys, cli_env, monkeypatch, command):
    monkeypatch.setenv("PATH", str(cli_env / "no-tools"))
    code, out, err = run(capsys, command)
    assert_one_line_error(code, out, err, "name --study S", "--config C")


@pytest.mark.parametrize("timeout", [float("inf"), float("nan"), 0.0, -1.0])
def test_childproc_refuses_a_run_without_a_deadline_and_kills_the_child(tmp_path, timeout):
    from evotuner import childproc

    proc = childproc.start(["sleep", "300"])
    with pytest.raises(ValueError, match="finite"):
        childproc.collect(proc, timeout)
    assert proc.returncode is not None


def test_export_to_dash_writes_no_file_named_dash(capsys, cli_env):
    _replayed(capsys, cli_env)
    code, out, err = run(capsys, "export", "--study", "s", "-o", "-")
    assert_one_line_error(code, out, err, "--output -", "header file")
    assert not (cli_env / "-").exists()
    code, out, err = run(capsys, "export", "--study", "s", "-o", "./-")     # a file named '-' on purpose
    assert code == 0, err
    assert "kConfigs" in (cli_env / "-").read_text()


def test_export_under_a_file_says_it_is_a_file(capsys, cli_env):
    _replayed(capsys, cli_env)
    (cli_env / "keep.h").write_text("keep\n")
    code, out, err = run(capsys, "export", "--study", "s", "-o", cli_env / "keep.h" / "x.h")
    assert_one_line_error(code, out, err, "keep.h is a file, not a folder", "inside a folder")
    assert (cli_env / "keep.h").read_text() == "keep\n"


def test_report_to_dash_writes_no_folder_named_dash(capsys, cli_env):
    pytest.importorskip("matplotlib")
    _replayed(capsys, cli_env)
    code, out, err = run(capsys, "report", "--study", "s", "-o", "-")
    assert_one_line_error(code, out, err, "--output -", "folder of plots")
    assert not (cli_env / "-").exists()


def test_report_under_a_file_says_the_parent_is_no_folder(capsys, cli_env):
    pytest.importorskip("matplotlib")
    _replayed(capsys, cli_env)
    (cli_env / "notes.txt").write_text("keep\n")
    code, out, err = run(capsys, "report", "--study", "s", "-o", cli_env / "notes.txt" / "rep")
    assert_one_line_error(code, out, err, "cannot create the report folder", "parents are folders")
    assert (cli_env / "notes.txt").read_text() == "keep\n"


# -- signals -----------------------------------------------------------------------------------------------


def test_ctrl_c_while_the_cli_loads_is_one_line(tmp_path):
    """The import of evotuner.cli interrupted (as a Ctrl-C in its first second does)."""
    code = ("import sys\n"
            "class Interrupt:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'evotuner.cli':\n"
            "            raise KeyboardInterrupt\n"
            "sys.meta_path.insert(0, Interrupt())\n"
            "from evotuner.launch import main\n"
            "sys.exit(main(['show', '--study', 's']))\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 130, result.stderr
    assert result.stderr.strip().splitlines() == ["error: interrupted by user (while starting; nothing was done)"]


@pytest.mark.parametrize("after", [0.3, 0.7])
def test_a_real_ctrl_c_early_in_start_up_prints_no_traceback(tmp_path, build_cache_dir, after):
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", "evotuner.cli", "show", "--study", "s"], cwd=tmp_path,
                            env=_child_env(build_cache_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(after)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 1, err
    assert proc.returncode in (1, 130, -signal.SIGINT), (proc.returncode, err)   # -2: before Python's handler


def test_every_entry_point_starts_through_launch():
    text = (REPO / "pyproject.toml").read_text()
    assert 'evotuner = "evotuner.launch:main"' in text
    assert "from evotuner.launch import main" in (REPO / "evotuner" / "__main__.py").read_text()


def _search_until(tmp_path: Path, env: dict[str, str], trials: int, seen_mark: str, preexec=None):
    """A replayed search as a process, read until its output shows ``seen_mark``."""
    import time

    csv = _sweep_copy(tmp_path / "sweep")
    proc = subprocess.Popen([sys.executable, "-m", "evotuner.cli", "search", "--study", "t", "--shape", SHAPE,
                             "--trials", str(trials), "--replay", str(csv), "--replay-delay", "0.02,0.05"],
                            cwd=tmp_path, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=preexec)
    deadline, seen = time.monotonic() + 120, ""
    while time.monotonic() < deadline and seen_mark not in seen:
        line = proc.stdout.readline()
        if not line:
            break
        seen += line
    assert seen_mark in seen, seen
    return proc


def _hang_up(proc, timeout: float) -> str:
    """SIGHUP to ``proc``, then its stderr once it ended (killed if it outlives ``timeout``)."""
    import signal

    try:
        proc.send_signal(signal.SIGHUP)
        return proc.communicate(timeout=timeout)[1]
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sighup_ends_a_search_as_sigterm_does(tmp_path, build_cache_dir):
    import json
    import signal

    env = _child_env(build_cache_dir)
    proc = _search_until(tmp_path, env, 500, "#3 ", lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    err = _hang_up(proc, 60)
    lines = err.strip().splitlines()
    assert proc.returncode == 129 and len(lines) == 1, (proc.returncode, err)
    assert lines[0].startswith("error: terminated (SIGHUP): study 't' keeps its "), lines[0]
    shown = _cli(["show", "--study", "t", "--json"], tmp_path, env)
    assert not [t for t in json.loads(shown.stdout)["trials"] if t["state"] == "RUNNING"]


def test_sighup_ignored_as_under_nohup_stays_ignored(tmp_path, build_cache_dir):
    import signal

    proc = _search_until(tmp_path, _child_env(build_cache_dir), 8, "#1 ",
                         lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    err = _hang_up(proc, 120)
    assert proc.returncode == 0, err


@pytest.mark.parametrize("command", ["export", "report"])
def test_an_empty_output_path_is_a_usage_error_not_the_current_folder(capsys, cli_env, command):
    _replayed(capsys, cli_env)
    before = sorted(p.name for p in cli_env.iterdir())
    code, out, err = run(capsys, command, "--study", "s", "-o", "")
    assert_one_line_error(code, out, err, "--output", "the path is empty")
    assert code == 2 and sorted(p.name for p in cli_env.iterdir()) == before


def test_export_to_a_name_ending_in_a_slash_writes_no_file(capsys, cli_env):
    _replayed(capsys, cli_env)
    code, out, err = run(capsys, "export", "--study", "s", "-o", "h.h/")
    assert_one_line_error(code, out, err, "h.h/", "names a folder")
    assert not (cli_env / "h.h").exists()


@pytest.mark.parametrize("argv, says", [
    (["search", "--study", "s", "--shape", SHAPE, "--trials", "2", "--replay", "SWEEP", "--sampler", ""],
     "unknown sampler ''"),
    (["check", "--study", "s", "--tools", ""], "--tools"),
])
def test_an_empty_choice_is_refused_not_read_as_the_default(capsys, cli_env, argv, says):
    csv = _sweep_copy(cli_env / "sweep")
    code, out, err = run(capsys, *[str(csv) if a == "SWEEP" else a for a in argv])
    assert_one_line_error(code, out, err, says)
    assert not (cli_env / "evotuner.db").exists()


def test_a_damaged_stored_space_says_the_database_is_damaged(capsys, cli_env):
    csv = _replayed(capsys, cli_env)
    conn = sqlite3.connect(cli_env / "evotuner.db")
    conn.execute("UPDATE evotuner_studies SET space_text = 'junk ['")
    conn.commit()
    conn.close()
    for argv in (["show", "--study", "s"], ["resume", "--study", "s", "--trials", 6, "--replay", csv]):
        code, out, err = run(capsys, *argv)
        assert_one_line_error(code, out, err, "study 's'", "evotuner_studies.space_text", "restore the database")
        assert "fix the line" not in err


def test_resume_on_an_empty_file_leaves_it_empty(capsys, cli_env):
    csv = _sweep_copy(cli_env / "sweep")
    (cli_env / "evotuner.db").write_bytes(b"")
    code, out, err = run(capsys, "resume", "--study", "s", "--replay", csv)
    assert_one_line_error(code, out, err, "is empty: it holds no study")
    assert (cli_env / "evotuner.db").read_bytes() == b""
    assert sorted(p.name for p in cli_env.iterdir()) == ["evotuner.db", "sweep"]


@pytest.mark.parametrize("make", ["fifo", "device"])
def test_lengths_from_a_fifo_or_a_device_is_refused_at_once(capsys, cli_env, make):
    csv = _sweep_copy(cli_env / "sweep")
    if make == "fifo":
        os.mkfifo(cli_env / "lengths")       # nobody writes to it: reading it would wait for ever
        where = cli_env / "lengths"
    else:
        where = Path("/dev/zero")
    code, out, err = run(capsys, "search", "--study", "s", "--shape", "H=16,D=64", "--lengths", f"@{where}",
                         "--trials", 2, "--replay", csv)
    assert_one_line_error(code, out, err, "--lengths", "not a regular file")


def test_a_relative_evotuner_nvcc_is_run_from_where_it_was_named(capsys, cli_env, monkeypatch):
    """The build runs nvcc in its own folder: EVOTUNER_NVCC=./nvcc used to be 'No such file'."""
    exe = cli_env / "nvcc"
    exe.write_text('#!/bin/sh\nif [ "$1" = "--version" ]; then echo "Cuda compilation tools, release 13.0, '
                   'V13.0.88"; exit 0; fi\necho ran\nexit 0\n')
    exe.chmod(0o755)
    monkeypatch.setenv("EVOTUNER_NVCC", "./nvcc")
    monkeypatch.setenv("EVOTUNER_CACHE_DIR", str(cli_env / "cache"))
    code, out, err = run(capsys, "compile", "--config", "BLOCK_M=64,BLOCK_N=32,NUM_WARPS=4,STAGES=1,MIN_BLOCKS=1",
                         "--shape", "D=64")
    assert_one_line_error(code, out, err, "wrote no kernel.cubin", str(exe))


def test_a_relative_tool_path_comes_back_absolute(tmp_path, monkeypatch):
    from evotuner.tools import find_tool

    tool = tmp_path / "ncu"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EVOTUNER_NCU", "./ncu")
    assert find_tool("ncu", "EVOTUNER_NCU") == tool


# -- compile: the error names what is wrong ----------------------------------------------------------------

_HOPPER_D64 = "BLOCK_N=128,CONSUMER_WGS=3,EXP_EMU=0,OVERLAP=1,PINGPONG=1,REG_CONS=160,REG_PROD=32,RESCALE_LOG2=0,STAGES=2"


@pytest.mark.parametrize("extra, says", [
    ("SCHED=2,TILE_OVERLAP=-1", "TILE_OVERLAP=-1 is outside"),   # not SCHED=2, which hopper_split lacks
    ("SCHED=2,CTAS_PER_SM=3", "CTAS_PER_SM=3 is outside"),
    ("SCHED=0,SPLITS=3", "SPLITS=3 is outside"),
])
def test_compile_without_space_names_the_value_no_packaged_space_takes(capsys, cli_env, extra, says):
    code, out, err = run(capsys, "compile", "--shape", "D=64", "--config", f"{_HOPPER_D64},{extra}")
    assert_one_line_error(code, out, err, says)


def test_compile_of_a_packing_config_without_heads_says_to_give_them(capsys, cli_env):
    code, out, err = run(capsys, "compile", "--shape", "D=64", "--config",
                         "BLOCK_N=128,CONSUMER_WGS=1,EXP_EMU=0,OVERLAP=1,PINGPONG=0,REG_CONS=256,REG_PROD=24,"
                         "RESCALE_LOG2=0,STAGES=2,SCHED=0,SPLITS=2,PACK_GQA=1")
    assert_one_line_error(code, out, err, "breaks constraint pack_gqa", "give the heads in --shape")
