"""Issue 29: a hostile walk. No command destroys a file it was not asked to write, nothing
hangs, every failure is one clean line.

Studies come from a recorded sweep (--replay), so nothing here needs a GPU; the CLI runs
in-process through its error boundary unless a test needs a real process (signals, hangs).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_helpers import assert_one_line_error, run, scaffold_env, sweep_copy

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
    return sweep_copy(SWEEP, dest)


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


# -- 2. stored space text: whatever the user wrote reads back --------------------------------------

SPACES = REPO / "search_spaces"
HOPPER_SWEEP = REPO / "tests" / "data" / "sweep_h100_hopper_d64.csv"
MARK_COMMENT = "# ---- base: hopper.toml"


def _stacked_grid() -> tuple[str, str]:
    """(base, sub-grid) texts of a stacked space whose resolved model is hopper_grid.toml's
    (the recorded sweeps' fingerprint): the base is hopper_grid.toml named "hopper", the
    sub-grid takes it with `base` and narrows it as hopper_grid.toml once did hopper.toml."""
    whole = (SPACES / "hopper_grid.toml").read_text()
    base = whole.replace('name = "hopper_grid"\n', 'name = "hopper"\n', 1)
    grid = ('[space]\nname = "hopper_grid"\nbase = "hopper.toml"\n'
            'doc = "Sub-grid of the hopper space that the recorded sweeps cover (BLOCK_N step 32, STAGES 1-3, '
            'lazy rescale, no exp2 emulation)."\n\n'
            "[params.BLOCK_N]\nvalues = [64, 96, 128, 160, 192]\n\n[params.STAGES]\nvalues = [1, 2, 3]\n\n"
            "[params.RESCALE_LOG2]\nvalues = [8]\n\n[params.EXP_EMU]\nvalues = [0]\n")
    return base, grid


def _grid_with_comment(folder: Path) -> Path:
    """A stacked grid and its base beside it, the grid holding a comment that reads like the
    mark the stored text used to join the two files with."""
    folder.mkdir(parents=True, exist_ok=True)
    base, text = _stacked_grid()
    (folder / "hopper.toml").write_text(base)
    text = text.replace('base = "hopper.toml"\n', f'base = "hopper.toml"\n{MARK_COMMENT}\n', 1)
    assert MARK_COMMENT in text
    (folder / "hopper_grid.toml").write_text(text)
    return folder / "hopper_grid.toml"


def test_a_space_file_with_the_old_marker_comment_serves_show_resume_export(capsys, cli_env):
    space = _grid_with_comment(cli_env / "spaces")
    code, out, err = run(capsys, "search", "--study", "g", "--shape", SHAPE, "--trials", 3, "--sampler", "random",
                         "--space", space, "--replay", HOPPER_SWEEP)
    assert code == 0, err
    code, out, err = run(capsys, "show", "--study", "g")
    assert code == 0, err
    assert "hopper_grid" in out
    code, out, err = run(capsys, "resume", "--study", "g", "--trials", 5, "--replay", HOPPER_SWEEP)
    assert code == 0, err
    code, out, err = run(capsys, "export", "--study", "g", "-o", cli_env / "g.h")
    assert code == 0, err
    from evotuner.space import load_space, parse_space
    from evotuner.storage import StudyStore

    with StudyStore("sqlite:///evotuner.db", read_only=True) as store:
        stored = store.space_text("g")
    assert parse_space(stored).fingerprint() == load_space(space).fingerprint()
    assert MARK_COMMENT in json.loads(stored)["files"][0]["text"]        # kept byte for byte


@pytest.mark.parametrize("where", ["grid", "base", "plain"])
def test_marker_comments_anywhere_round_trip(tmp_path, where):
    from evotuner.space import load_space, parse_space

    folder = tmp_path / "spaces"
    folder.mkdir()
    base, grid = _stacked_grid()
    if where == "base":
        base = base.replace("[space]\n", f"[space]\n{MARK_COMMENT}\n", 1)
    else:
        grid = grid.replace('base = "hopper.toml"\n', f'base = "hopper.toml"\n{MARK_COMMENT}\n', 1)
    (folder / "hopper.toml").write_text(base)
    (folder / "hopper_grid.toml").write_text(grid)
    path = folder / ("hopper.toml" if where == "plain" else "hopper_grid.toml")
    if where == "plain":
        path.write_text(base.replace("[space]\n", f"[space]\n{MARK_COMMENT}\n", 1))
    space = load_space(path)
    again = parse_space(space.text, "stored")
    assert again.fingerprint() == space.fingerprint() and again.params == space.params


def test_texts_stored_before_the_stack_format_still_read_back(tmp_path):
    """Studies stored a sub-grid as its text + "\\n# ---- base: NAME\\n" + the base's text; one
    whose sub-grid held that comment line could not be read at all ("Cannot declare twice")."""
    from evotuner.space import BASE_MARK, load_space, parse_space

    grid_path = _grid_with_comment(tmp_path)
    grid_text = grid_path.read_text()
    base_text = (tmp_path / "hopper.toml").read_text()
    old = f"{grid_text}{BASE_MARK}hopper.toml\n{base_text}"
    assert parse_space(old, "old study").fingerprint() == load_space(grid_path).fingerprint()
    plain = f"{grid_text.replace(MARK_COMMENT + chr(10), '')}{BASE_MARK}hopper.toml\n{base_text}"   # no stray comment
    assert parse_space(plain, "old study").fingerprint() == load_space(grid_path).fingerprint()


def test_a_damaged_stored_stack_is_one_line(capsys, cli_env):
    from evotuner.errors import SpaceError
    from evotuner.space import load_space, parse_space

    text = load_space(_grid_with_comment(cli_env / "spaces")).text
    for damaged in (text[:-40], text.replace('"name": "hopper.toml"', '"name": "other.toml"')):
        with pytest.raises(SpaceError, match="damaged"):
            parse_space(damaged, "stored")


TINY_CONFIG = "BLOCK_M=64,BLOCK_N=32,NUM_WARPS=4,STAGES=1,MIN_BLOCKS=1"


@pytest.mark.parametrize("edit, says", [
    (('threads = "NUM_WARPS * 32"', 'threads = "min(NUM_WARPS) * 32"'), "min() takes at least 2 arguments"),
    (('threads = "NUM_WARPS * 32"', 'threads = "abs(NUM_WARPS, 1) * 32"'), "abs() takes exactly 1 argument"),
    (('kernel = "flashcore"', 'kernel = "flashcore\\n"'), "[space] kernel"),
    (('arch = "sm_90a"', 'arch = "sm_90a\\n"'), "[space] arch"),
    (('name = "loop_tiny"', 'name = "loop_tiny\\n"'), "[space] name"),
])
def test_odd_space_files_are_one_line(capsys, cli_env, edit, says):
    text = TINY_SPACE.read_text()
    assert edit[0] in text
    space = cli_env / "odd.toml"
    space.write_text(text.replace(edit[0], edit[1], 1))
    code, out, err = run(capsys, "compile", "--config", TINY_CONFIG, "--shape", "D=32", "--space", space)
    assert_one_line_error(code, out, err, says, "odd.toml")
    assert "unexpected" not in err


def test_a_binary_base_file_is_one_line(capsys, cli_env):
    (cli_env / "base.toml").write_bytes(b"\x7fELF\x02\x01\x01\x00\xff\xfe" * 20)
    sub = cli_env / "sub.toml"
    sub.write_text('[space]\nname = "sub"\nbase = "base.toml"\n[params.BLOCK_M]\nvalues = [64]\n')
    code, out, err = run(capsys, "compile", "--config", TINY_CONFIG, "--shape", "D=32", "--space", sub)
    assert_one_line_error(code, out, err, "base.toml", "UTF-8")
    assert "unexpected" not in err


# -- 3. bounded work before anything expensive -------------------------------------------------------


def _child_env(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("COLUMNS", "LINES", "EVOTUNER_STORAGE", "EVOTUNER_DEBUG")}
    env.update(EVOTUNER_CACHE_DIR=str(cache))
    return env


def _cli_bounded(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 60,
                 memory: int = 3 << 30) -> subprocess.CompletedProcess:
    """The CLI as a subprocess with a hard timeout and address-space limit (a hang or a
    runaway allocation fails the test, not the machine)."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    try:
        return subprocess.run([sys.executable, "-m", "evotuner.cli", *args], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=timeout, preexec_fn=limit)
    except subprocess.TimeoutExpired:
        pytest.fail(f"evotuner {' '.join(args)} still running after {timeout} s")


@pytest.mark.parametrize("exclude_all", [False, True])
@pytest.mark.parametrize("command", ["search", "compile"])
def test_a_huge_space_is_refused_before_the_gpu_check_naming_the_limit(tmp_path, build_cache_dir, exclude_all,
                                                                       command):
    from evotuner.spacelimits import MAX_CONFIGS

    many = "values = [" + ", ".join(str(16 * i) for i in range(1, 4097)) + "]"
    text = TINY_SPACE.read_text().replace("values = [64, 128]", many, 1).replace("values = [32, 64]", many, 1)
    if exclude_all:
        text += '\n[[constraints]]\nname = "nothing"\nexpr = "BLOCK_M < 0"\nmessage = "never"\n'
    space = tmp_path / "huge.toml"
    space.write_text(text)
    args = (["search", "--study", "s", "--shape", SHAPE, "--trials", "4"] if command == "search"
            else ["compile", "--config", TINY_CONFIG, "--shape", "D=32"])
    started = time.monotonic()
    result = _cli_bounded([*args, "--space", str(space)], tmp_path, _child_env(build_cache_dir))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert f"more than the limit of {MAX_CONFIGS}" in lines[0] and "33554432 configs" in lines[0]   # 4096 x 4096 x 2
    assert "BLOCK_M (4096 values)" in lines[0] and "BLOCK_N (4096 values)" in lines[0]
    assert "GPU" not in lines[0]                        # before the GPU check
    assert time.monotonic() - started < 30
    assert not (tmp_path / "evotuner.db").exists()


def test_parameter_values_must_fit_a_c_int(capsys, cli_env):
    space = cli_env / "wide.toml"
    space.write_text(TINY_SPACE.read_text().replace("values = [1, 2]", "values = [1, 4294967296]", 1))
    code, out, err = run(capsys, "compile", "--config", TINY_CONFIG, "--shape", "D=32", "--space", space)
    assert_one_line_error(code, out, err, "MIN_BLOCKS", "4294967296", "C int")


# -- 4. child processes: own group, killed as a group, output read with a deadline ----------------------

FAKE_VERSION = 'if [ "$1" = "--version" ]; then echo "Cuda compilation tools, release 13.0, V13.0.88"; exit 0; fi\n'


def _fake_nvcc(folder: Path, body: str) -> Path:
    exe = folder / "nvcc"
    exe.write_text("#!/bin/sh\n" + FAKE_VERSION + body)
    exe.chmod(0o755)
    return exe


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("leave_group", [False, True])
def test_a_compiler_whose_daemon_keeps_stdout_open_does_not_hang(tmp_path, leave_group):
    from evotuner.compiler import nvcc

    pidfile = tmp_path / "daemon.pid"
    spawn = "setsid sleep 300 &" if leave_group else "sleep 300 &"
    exe = _fake_nvcc(tmp_path, f"echo compiling\n{spawn}\necho $! > {pidfile}\nexit 0\n")
    started = time.monotonic()
    try:
        outcome = nvcc.run([str(exe), "-o", "kernel.cubin", "gen.cu"], cwd=tmp_path, timeout_s=120)
        took = time.monotonic() - started
        assert took < 10, took
        assert outcome.returncode == 0 and not outcome.timed_out and "compiling" in outcome.output
        daemon = int(pidfile.read_text())
        if not leave_group:                 # what stayed in the compiler's group was killed with it
            for _ in range(50):
                if not _alive(daemon):
                    break
                time.sleep(0.1)
            assert not _alive(daemon)
    finally:
        if pidfile.exists():
            try:
                os.kill(int(pidfile.read_text()), 9)
            except (ProcessLookupError, ValueError):
                pass


def test_a_timeout_kills_the_whole_group(tmp_path):
    from evotuner.compiler import nvcc

    pidfile = tmp_path / "child.pid"
    exe = _fake_nvcc(tmp_path, f"sleep 300 &\necho $! > {pidfile}\nwait\n")
    started = time.monotonic()
    outcome = nvcc.run([str(exe), "gen.cu"], cwd=tmp_path, timeout_s=1.5)
    assert outcome.timed_out and outcome.returncode is None
    assert time.monotonic() - started < 10
    child = int(pidfile.read_text())
    for _ in range(50):
        if not _alive(child):
            break
        time.sleep(0.1)
    assert not _alive(child)


def test_a_compiler_that_exits_0_without_a_cubin_is_one_line(capsys, cli_env, monkeypatch):
    exe = _fake_nvcc(cli_env, "echo 'all good'\nexit 0\n")
    monkeypatch.setenv("EVOTUNER_NVCC", str(exe))
    monkeypatch.setenv("EVOTUNER_CACHE_DIR", str(cli_env / "cache"))
    code, out, err = run(capsys, "compile", "--config", TINY_CONFIG, "--shape", "D=32", "--space", TINY_SPACE)
    assert_one_line_error(code, out, err, "wrote no kernel.cubin", str(exe))
    assert "unexpected" not in err
    # the remedy is the compiler setting's, not the kernel's
    assert "point EVOTUNER_NVCC" in err and "fix the kernel" not in err
    # nothing was cached: a real nvcc later builds it
    assert not list((cli_env / "cache").rglob("build.json"))


# -- 5. SQLite URL options are honoured --------------------------------------------------------------


@pytest.mark.parametrize("option", ["?mode=ro&uri=true", "?mode=ro", "?immutable=1", "?immutable=1&uri=true"])
def test_a_read_only_url_reads_and_a_writing_command_refuses_it(capsys, cli_env, option):
    csv = _replayed(capsys, cli_env, "s", 4, "sqlite:///ro.db")
    before = _listing(cli_env)
    url = f"sqlite:///ro.db{option}"
    code, out, err = run(capsys, "show", "--study", "s", "--storage", url)
    assert code == 0, err
    assert "best" in out and err == ""                           # no SQLAlchemy warnings either
    code, out, err = run(capsys, "export", "--study", "s", "-o", cli_env / "h.h", "--storage", url)
    assert code == 0, err
    (cli_env / "h.h").unlink()
    for argv in (["search", "--study", "s", "--shape", SHAPE, "--trials", 6, "--replay", csv],
                 ["resume", "--study", "s", "--replay", csv]):
        code, out, err = run(capsys, *argv, "--storage", url)
        assert_one_line_error(code, out, err, "read-only", option.split("&")[0].lstrip("?"))
    assert _listing(cli_env) == before                        # no 'ro.db?mode=ro' file, ro.db untouched


def test_a_read_only_url_to_a_missing_file_creates_nothing(capsys, cli_env):
    csv = _sweep_copy(cli_env / "sweep")
    code, out, err = run(capsys, "search", "--study", "s", "--shape", SHAPE, "--trials", 2, "--replay", csv,
                         "--storage", "sqlite:///new.db?mode=ro&uri=true")
    assert_one_line_error(code, out, err, "read-only")
    assert sorted(p.name for p in cli_env.iterdir()) == ["sweep"]


@pytest.mark.parametrize("url, says", [
    ("sqlite:///x.db?mode=bogus", "mode='bogus'"),
    ("sqlite:///x.db?colour=blue", "unknown SQLite option 'colour'"),
    ("sqlite:///x.db?immutable=maybe", "not a boolean"),
    ("sqlite+aiosqlite:///x.db", "Python's sqlite3"),
    ("sqlite+pysqlcipher:///x.db", "Python's sqlite3"),
])
def test_odd_sqlite_urls_are_one_line(capsys, cli_env, url, says):
    csv = _sweep_copy(cli_env / "sweep")
    for argv in (["search", "--study", "s", "--shape", SHAPE, "--trials", 2, "--replay", csv], ["show", "--study", "s"]):
        code, out, err = run(capsys, *argv, "--storage", url)
        assert_one_line_error(code, out, err, says)
        assert "unexpected" not in err
    assert sorted(p.name for p in cli_env.iterdir()) == ["sweep"]


def test_a_file_uri_names_the_file(capsys, cli_env):
    _replayed(capsys, cli_env, "s", 4, "sqlite:///my%20db.db")
    assert (cli_env / "my db.db").is_file()
    code, out, err = run(capsys, "show", "--study", "s", "--storage", f"sqlite:///file:{cli_env}/my%20db.db?mode=ro&uri=true")
    assert code == 0, err


def _listing(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()}


# -- 6. numbers: finite and in range at every entry ------------------------------------------------------


@pytest.mark.parametrize("delay, says", [("nan,0", "'nan'"), ("0,inf", "'inf'"), ("1e400,0", "'1e400'"),
                                         ("-1,0", "out of range"), ("0.1", "not BUILD,MEASURE")])
def test_a_non_finite_replay_delay_is_one_line(capsys, cli_env, delay, says):
    csv = _sweep_copy(cli_env / "sweep")
    code, out, err = run(capsys, "search", "--study", "s", "--shape", SHAPE, "--trials", 2, "--replay", csv,
                         "--replay-delay", delay)
    assert_one_line_error(code, out, err, "--replay-delay", says)   # what was typed: 1e400, not inf
    assert code == 2, (code, err)                                   # a usage error, as --stale-after nan is
    assert "unexpected" not in err and not (cli_env / "evotuner.db").exists()


@pytest.mark.parametrize("option, value", [("--stale-after", "inf"), ("--stale-after", "nan"),
                                           ("--stale-after", "1e400"), ("--budget", "inf"), ("--budget", "nan")])
def test_non_finite_seconds_options_are_usage_errors(capsys, cli_env, option, value):
    csv = _sweep_copy(cli_env / "sweep")
    argv = (["search", "--study", "s", "--shape", SHAPE, "--trials", 2, "--replay", csv] if option == "--stale-after"
            else ["bench", "--study", "s"])
    code, out, err = run(capsys, *argv, option, value)
    assert_one_line_error(code, out, err, option)
    assert code == 2 and not (cli_env / "evotuner.db").exists()


def _edited_sweep(dest: Path, cell: dict[str, str] | None = None, sidecar: dict | None = None,
                  row: int = 1) -> Path:
    """The D=64 sweep with row ``row``'s cells (by column) or the sidecar's keys replaced."""
    import csv as csvlib
    import io

    csv = _sweep_copy(dest)
    rows = list(csvlib.reader(io.StringIO(csv.read_text())))
    for col, value in (cell or {}).items():
        rows[row][rows[0].index(col)] = value
    buf = io.StringIO()
    csvlib.writer(buf, lineterminator="\n").writerows(rows)
    csv.write_text(buf.getvalue())
    if sidecar:
        side = csv.with_name(csv.name + ".json")
        side.write_text(json.dumps({**json.loads(side.read_text()), **sidecar}))
    return csv


@pytest.mark.parametrize("cell, sidecar, says", [
    ({"median_us": "inf"}, None, "median_us"),
    ({"median_us": "nan"}, None, "median_us"),
    ({"tflops": "nan"}, None, "tflops"),
    ({"tflops": "-Infinity"}, None, "tflops"),
    ({"p20_us": "0"}, None, "p20_us"),
    ({"registers": "1e3"}, None, "registers"),
    ({"meta": "[1, 2]"}, None, "meta"),
    ({"meta": '{"threads": "many"}'}, None, "meta"),
    ({"meta": '{"threads": NaN}'}, None, "meta"),
    ({"ptxas_log": "x" * 200_000}, None, "field"),
    (None, {"baselines": {"sdpa_flash": "fast"}}, "baselines sdpa_flash"),
    (None, {"baselines": {"sdpa_flash": -5.0}}, "baselines sdpa_flash"),
    (None, {"baselines": [1, 2]}, "'baselines'"),
    (None, {"device": "H100"}, "'device'"),
    (None, {"device": {"name": 7}}, "'device'"),
])
def test_malformed_replay_inputs_are_one_line_and_store_nothing(capsys, cli_env, cell, sidecar, says):
    csv = _edited_sweep(cli_env / "sweep", cell, sidecar)
    code, out, err = run(capsys, "search", "--study", "s", "--shape", SHAPE, "--trials", 4, "--replay", csv)
    assert_one_line_error(code, out, err, says)
    assert "unexpected" not in err


def test_baseline_infinity_in_a_sidecar_is_refused(capsys, cli_env):
    csv = _sweep_copy(cli_env / "sweep")
    side = csv.with_name(csv.name + ".json")
    side.write_text(side.read_text().replace('"sdpa_flash": 930.7519793510437', '"sdpa_flash": Infinity'))
    assert "Infinity" in side.read_text()
    code, out, err = run(capsys, "search", "--study", "s", "--shape", SHAPE, "--trials", 4, "--replay", csv)
    assert_one_line_error(code, out, err, "Infinity")


@pytest.mark.parametrize("shape", ["B=2147483648,H=1,S=128,D=64", "B=1,H=1,SQ=128,SK=99999999999,D=64"])
def test_shapes_past_int32_are_one_line(capsys, cli_env, shape):
    csv = _sweep_copy(cli_env / "sweep")
    code, out, err = run(capsys, "search", "--study", "s", "--shape", shape, "--trials", 2, "--replay", csv)
    assert_one_line_error(code, out, err, "32-bit")


def _strict_json(text: str) -> dict:
    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in JSON output")
    return json.loads(text, parse_constant=refuse)


def test_show_json_is_strict_even_over_non_finite_rows(capsys, cli_env):
    _replayed(capsys, cli_env)
    conn = sqlite3.connect(cli_env / "evotuner.db")
    with conn:
        conn.execute("UPDATE evotuner_baselines SET median_us = 1e999 WHERE backend = 'sdpa_flash'")
        conn.execute("UPDATE trial_user_attributes SET value_json = 'NaN' WHERE key = 'tflops'")
        conn.execute("UPDATE trial_values SET value = 1e999 WHERE trial_id = (SELECT min(trial_id) FROM trial_values)")
    conn.close()
    code, out, err = run(capsys, "show", "--study", "s", "--json")
    assert code == 0, err
    data = _strict_json(out)
    assert data["baselines"]["sdpa_flash"] is None
    assert all(t["tflops"] is None for t in data["trials"])
    code, out, err = run(capsys, "show", "--study", "s")
    assert code == 0, err
    assert "-0.0" not in out and "inf" not in out.lower().replace("info", "")


# -- 7. a damaged database is one line naming the table, row and remedy ------------------------------------


@pytest.mark.parametrize("sql, says", [
    ("UPDATE evotuner_studies SET problem_json = '{not json'", ("evotuner_studies", "problem_json")),
    ("UPDATE evotuner_studies SET problem_json = '{\"batch\": 1}'", ("evotuner_studies", "problem_json")),
    ("UPDATE evotuner_studies SET created_at = 'yesterday'", ("evotuner_studies", "created_at")),
    ("UPDATE evotuner_studies SET seed = 'abc'", ("evotuner_studies", "seed")),
    ("UPDATE trials SET state = 'EXPLODED' WHERE number = 1", ("trials", "state", "EXPLODED")),
    ("UPDATE trials SET datetime_start = 'not a date' WHERE number = 2", ("trials", "datetime_start")),
    ("UPDATE trial_user_attributes SET value_json = '{oops' WHERE trial_id = 1", ("trial_user_attributes",
                                                                                  "value_json")),
    ("UPDATE evotuner_schema_version SET version = 'three'", ("evotuner_schema_version", "version")),
])
def test_a_damaged_database_is_one_line_naming_the_row(capsys, cli_env, sql, says):
    csv = _replayed(capsys, cli_env)
    conn = sqlite3.connect(cli_env / "evotuner.db")
    with conn:
        conn.execute(sql)
    conn.close()
    for argv in (["show", "--study", "s"], ["show", "--study", "s", "--json"],
                 ["export", "--study", "s", "-o", cli_env / "h.h"],
                 ["resume", "--study", "s", "--trials", 6, "--replay", csv]):
        code, out, err = run(capsys, *argv)
        assert_one_line_error(code, out, err, "damaged", "restore it from a copy", *says)
        assert "unexpected" not in err


def test_a_full_disk_is_named_as_such(tmp_path):
    """SQLite's max_page_count makes a database 'full' as a full disk does."""
    from sqlalchemy import event

    from evotuner.errors import StorageError
    from evotuner.problem import Problem, Shape
    from evotuner.space import load_space
    from evotuner.storage import StudyStore

    url = f"sqlite:///{tmp_path / 'full.db'}"
    StudyStore(url).close()
    store = StudyStore(url)
    pages = sqlite3.connect(tmp_path / "full.db").execute("PRAGMA page_count").fetchone()[0]
    for engine in (store._engine, store.optuna_storage.engine):
        event.listen(engine, "connect", lambda dbapi, _r: dbapi.execute(f"PRAGMA max_page_count = {pages}"))
        engine.dispose()
    space = load_space(TINY_SPACE)
    try:
        with pytest.raises(StorageError, match="the disk is full") as info:
            for i in range(50):
                store.create_study(f"s{i}" + "x" * 4000, Problem(Shape.parse(SHAPE)), space, "tpe", 0,
                                   source_hash="h", nvcc_version="n")
        assert "free some disk space" in str(info.value)
    finally:
        store.close()


# -- SIGTERM is handled as Ctrl-C is -------------------------------------------------------------------


@pytest.mark.parametrize("command", ["search", "resume"])
def test_sigterm_says_what_was_kept_and_leaves_no_trial_running(tmp_path, build_cache_dir, command):
    import signal

    csv = _sweep_copy(tmp_path / "sweep")
    env = {**_child_env(build_cache_dir), "PYTHONUNBUFFERED": "1"}
    base = [sys.executable, "-m", "evotuner.cli"]
    if command == "resume":
        first = subprocess.run([*base, "search", "--study", "t", "--shape", SHAPE, "--trials", "3", "--replay", str(csv)],
                               cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert first.returncode == 0, first.stderr
        argv = ["resume", "--study", "t", "--trials", "500", "--replay", str(csv)]
    else:
        argv = ["search", "--study", "t", "--shape", SHAPE, "--trials", "500", "--replay", str(csv)]
    proc = subprocess.Popen([*base, *argv, "--replay-delay", "0.02,0.05"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        seen = ""
        while time.monotonic() < deadline and "#5 " not in seen:
            line = proc.stdout.readline()
            if not line:
                break
            seen += line
        assert "#5 " in seen, seen + proc.stderr.read()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, (proc.returncode, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: terminated (SIGTERM)"), err
    assert "finished trials" in lines[0] and "evotuner resume --study t" in lines[0]
    assert "keeps its " in lines[0], lines[0]
    kept = int(lines[0].split("keeps its ")[1].split()[0])
    shown = subprocess.run([*base, "show", "--study", "t", "--json"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
    trials = json.loads(shown.stdout)["trials"]
    assert not [t for t in trials if t["state"] == "RUNNING"], [t for t in trials if t["state"] == "RUNNING"]
    finished = [t for t in trials if not str(t.get("error") or "").startswith("interrupted")]
    assert kept == len(finished) > 0, (kept, len(finished), lines[0])


# -- output encoding never raises; names that are not text ------------------------------------------------


@pytest.mark.parametrize("env_extra", [{"PYTHONIOENCODING": "ascii"}, {"LANG": "C", "LC_ALL": "C", "PYTHONUTF8": "0",
                                                                       "PYTHONIOENCODING": ""}])
def test_a_terminal_that_cannot_print_unicode_gets_escapes_not_errors(tmp_path, build_cache_dir, env_extra):
    csv = _sweep_copy(tmp_path / "sweep")
    env = {**_child_env(build_cache_dir), **env_extra}
    env = {k: v for k, v in env.items() if v != ""}
    base = [sys.executable, "-m", "evotuner.cli"]
    for argv in (["search", "--study", "café ü", "--shape", SHAPE, "--trials", "3", "--replay", str(csv)],
                 ["show", "--study", "café ü"], ["export", "--study", "café ü", "-o", "h.h"],
                 ["show", "--study", "naïve-missing"]):
        result = subprocess.run([*base, *argv], cwd=tmp_path, env=env, capture_output=True, timeout=120)
        text = (result.stdout + result.stderr).decode("ascii", "replace")
        assert "UnicodeEncodeError" not in text and "unexpected" not in text, text
        assert result.returncode == (1 if "naïve-missing" in argv else 0), text
    assert "caf\\xe9" in text                      # the study names come out escaped, visible


@pytest.mark.parametrize("name", [b"caf\xe9", b"\xff\xfe", b"ok\xed\xa0\x80"])
def test_study_names_that_are_not_utf8_are_one_line(tmp_path, build_cache_dir, name):
    csv = _sweep_copy(tmp_path / "sweep")
    for argv in ([b"search", b"--study", name, b"--shape", SHAPE.encode(), b"--trials", b"2", b"--replay", bytes(csv)],
                 [b"show", b"--study", name]):
        result = subprocess.run([sys.executable.encode(), b"-m", b"evotuner.cli", *argv], cwd=tmp_path,
                                env=_child_env(build_cache_dir), capture_output=True, timeout=120)
        err = result.stderr.decode("utf-8", "replace")
        lines = err.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, err
        assert "--study" in lines[0] and "not UTF-8" in lines[0] and "unexpected" not in lines[0]
    assert not (tmp_path / "evotuner.db").exists()


# -- the build environment: cache folders and HOME ---------------------------------------------------------


@pytest.mark.parametrize("root, says", [
    ("~nouser-evotuner/cache", "~nouser-evotuner names no user's home"),
    ("/proc/evotuner-cache/builds", "cannot be created"),
    ("/proc/self/evotuner-cache", "cannot be created"),
])
def test_an_unusable_cache_dir_is_one_line(capsys, cli_env, monkeypatch, root, says):
    monkeypatch.setenv("EVOTUNER_CACHE_DIR", root)
    code, out, err = run(capsys, "compile", "--config", TINY_CONFIG, "--shape", "D=32", "--space", TINY_SPACE)
    assert_one_line_error(code, out, err, "build cache", says)
    assert "unexpected" not in err


@pytest.mark.parametrize("home", ["", "/nonexistent-evotuner/home", "relative/home", None])
def test_without_a_usable_home_the_cache_falls_back_to_a_private_temp_folder(tmp_path, home):
    exe = _fake_nvcc(tmp_path, 'for a; do last="$out"; out="$a"; done\n: > kernel.cubin\nexit 0\n')
    env = {k: v for k, v in os.environ.items() if k not in ("EVOTUNER_CACHE_DIR", "XDG_CACHE_HOME", "HOME",
                                                             "EVOTUNER_STORAGE", "EVOTUNER_DEBUG")}
    if home is not None:
        env["HOME"] = home
    fallback_parent = tmp_path / "tmp"
    fallback_parent.mkdir()
    env.update(EVOTUNER_NVCC=str(exe), TMPDIR=str(fallback_parent))
    result = subprocess.run([sys.executable, "-m", "evotuner.cli", "compile", "--config", TINY_CONFIG, "--shape", "D=32",
                             "--space", str(TINY_SPACE)], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1 and "unexpected" not in lines[0], result.stderr
    assert "nvcc failed" in lines[0]                           # it got as far as the (empty) cubin
    assert not Path("/nonexistent-evotuner").exists() and not (tmp_path / "relative").exists()
    cache = fallback_parent / f"evotuner-cache-{os.getuid()}"
    assert cache.is_dir() and (cache.stat().st_mode & 0o777) == 0o700
    assert list(cache.rglob("build.json"))                       # the failed build is cached there
