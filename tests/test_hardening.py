"""Issue 12: a new user's walk. Files and databases left as found, output that reads at
80 columns, no hangs, no leaked secrets, and one-line errors for odd inputs.

Every test drives the CLI (in-process through its error boundary, or as a real
subprocess on a pseudo-terminal) over real files; studies come from a recorded sweep
(--replay), so nothing here needs a GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import MEASURE, assert_one_line_error, run, scaffold_env

REPO = Path(__file__).resolve().parents[1]
SWEEP = REPO / "tests" / "data" / "sweep_h100_d64.csv"
SHAPE = "B=16,H=16,S=2048,D=64"
#: Names that try every way out of a // comment or a terminal line.
EVIL_STUDY = "evil\nname */ \\ é [bold red]x[/] \x1b]0;pwned\x07\x1b[2J"
EVIL_DEVICE = "H100 with a trailing backslash \\"


def _sweep_copy(dest: Path, device_name: str | None = None) -> Path:
    """The D=64 sweep and its sidecar under ``dest`` (the sidecar's device renamed)."""
    dest.mkdir(parents=True, exist_ok=True)
    csv = dest / SWEEP.name
    shutil.copy(SWEEP, csv)
    side = json.loads(SWEEP.with_name(SWEEP.name + ".json").read_text())
    if device_name is not None:
        side["device"]["name"] = device_name
    (dest / (SWEEP.name + ".json")).write_text(json.dumps(side))
    return csv


@pytest.fixture
def cli_env(monkeypatch, tmp_path, build_cache_dir):
    scaffold_env(monkeypatch, build_cache_dir, tmp_path)
    monkeypatch.setenv("COLUMNS", "80")
    return tmp_path


def _replayed(capsys, tmp_path: Path, study: str = "s", trials: int = 6, device: str | None = None,
              db: str = "sqlite:///evotuner.db") -> Path:
    csv = _sweep_copy(tmp_path / "sweep", device)
    code, out, err = run(capsys, "search", "--study", study, "--shape", SHAPE, "--trials", trials,
                         "--replay", csv, "--storage", db)
    assert code == 0, err
    return csv


# -- export: the header's mode, unwritable targets, adversarial text ----------------------------


def test_export_names_its_header_escaped_on_the_terminal(capsys, cli_env):
    """-o with an escape sequence or a newline in its name: the file is written as named, and the
    summary's first line shows the name escaped (no raw ESC reaches the terminal, no line break)."""
    _replayed(capsys, cli_env)
    for name, shown in (("c\x1b[31mred.h", "c\\x1b[31mred.h"), ("a\nb.h", "a\\x0ab.h")):
        code, out, err = run(capsys, "export", "--study", "s", "-o", name)
        assert code == 0, err
        assert (cli_env / name).is_file() and "\x1b" not in out, out
        assert out.splitlines()[0].startswith(shown), out.splitlines()[0]


def test_a_tuned_table_that_is_a_folder_or_a_misnamed_header_says_so(tmp_path, monkeypatch):
    """$EVOTUNER_TUNED / use_tuned at a folder says "a directory" (not "no such file"); at a file
    neither a header by its suffix nor an SQLite database (an exported header renamed .txt) says
    what it takes, not the database layer's --storage advice."""
    from evotuner import tuned
    from evotuner.runtime import choice

    folder = tmp_path / "tuned.h"
    folder.mkdir()
    text = tmp_path / "tuned.txt"
    text.write_text("#define FLASHCORE_TUNED_COUNT 0\n")
    for source, why in ((folder, "a directory"), (text, "not an SQLite study database")):
        with pytest.raises(tuned.TunedError) as exc:
            tuned.load(source)
        assert why in exc.value.message and "--storage" not in str(exc.value), exc.value
        monkeypatch.setenv(tuned.ENV_VAR, str(source))
        monkeypatch.setattr(choice, "_tables", None)
        with pytest.raises(tuned.TunedError, match=f"EVOTUNER_TUNED: tuned table {source}: {why}"):
            choice.served_tables()
    monkeypatch.setattr(choice, "_tables", None)


def test_export_to_a_header_the_system_refuses_says_chmod_only_where_the_mode_is_why(capsys, cli_env,
                                                                                     monkeypatch):
    """A header whose mode lets this user write it but which the system refuses (chattr +i, a
    read-only mount: os.access says no) points at lsattr/findmnt, not at chmod; a header whose
    mode is the reason still says chmod (not for root, whose writes no mode refuses)."""
    import evotuner.atomicfile as atomicfile

    _replayed(capsys, cli_env)
    header = cli_env / "h.h"
    header.write_text("// old\n")
    refused = str(header)
    real_access = os.access
    monkeypatch.setattr(atomicfile.os, "access",
                        lambda p, m, *a, **k: False if str(p) == refused else real_access(p, m, *a, **k))
    header.chmod(0o644)
    code, out, err = run(capsys, "export", "--study", "s", "-o", header)
    assert code != 0 and "lsattr" in err and "chmod" not in err, err
    assert len(err.strip().splitlines()) == 1 and header.read_text() == "// old\n"
    if os.geteuid() != 0:
        header.chmod(0o444)
        code, out, err = run(capsys, "export", "--study", "s", "-o", header)
        assert code != 0 and "read-only" in err and "chmod u+w" in err, err


def test_export_keeps_the_mode_of_an_existing_header_and_umask_for_a_new_one(capsys, cli_env):
    _replayed(capsys, cli_env)
    header = cli_env / "h.h"
    header.write_text("// old\n")
    header.chmod(0o644)
    code, out, err = run(capsys, "export", "--study", "s", "-o", header)
    assert code == 0, err
    assert "flashcore::tuned" in header.read_text()
    assert stat.S_IMODE(header.stat().st_mode) == 0o644
    header.chmod(0o640)
    assert run(capsys, "export", "--study", "s", "-o", header)[0] == 0
    assert stat.S_IMODE(header.stat().st_mode) == 0o640
    old = os.umask(0o027)
    try:
        fresh = cli_env / "new.h"
        assert run(capsys, "export", "--study", "s", "-o", fresh)[0] == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o640
    assert not [p for p in cli_env.iterdir() if p.name.endswith(".tmp")]


def test_export_to_an_unwritable_target_is_one_line(capsys, cli_env):
    _replayed(capsys, cli_env)
    code, out, err = run(capsys, "export", "--study", "s", "-o", "/proc/evotuner_config.h")
    assert_one_line_error(code, out, err, "/proc/evotuner_config.h", "--output")
    assert "unexpected" not in err


def _compiler() -> list[str]:
    gxx = shutil.which("g++") or shutil.which("c++")
    if gxx is None:
        pytest.skip("no host C++ compiler")
    return [gxx, "-std=c++17", "-fsyntax-only", "-Wall", "-Werror", "-x", "c++"]


def test_adversarial_names_are_made_safe_in_the_header_which_compiles(capsys, cli_env):
    _replayed(capsys, cli_env, study=EVIL_STUDY, device=EVIL_DEVICE)
    header = cli_env / "evil.h"
    code, out, err = run(capsys, "export", "--study", EVIL_STUDY, "-o", header)
    assert code == 0, err
    text = header.read_text(encoding="utf-8")
    assert text.isascii()
    assert "\\" not in text and "*/" not in text and "\x1b" not in text
    assert "<U+005C>" in text                     # the device name's backslash, visible
    comment_lines = [line for line in text.splitlines() if line.lstrip().startswith("//")]
    assert any("evil name" in line for line in comment_lines)
    user = cli_env / "use.cpp"
    user.write_text(f'#include "{header}"\n'
                    "static_assert(flashcore::tuned::kNumConfigs == 1, \"one row\");\n"
                    "static_assert(flashcore::tuned::index_of(flashcore::tuned::select(64, 0, false, 2048, 16 * 16 * 2048)) == 0);\n"
                    "int main() { return 0; }\n")
    result = subprocess.run([*_compiler(), str(user)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


# -- 80 columns, a real terminal, untrusted names ------------------------------------------------

_ANSI = __import__("re").compile(r"\x1b(\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[@-Z\\-_])")


def _on_pty(argv: list[str], cwd: Path, env: dict[str, str], cols: int = 80, timeout: float = 240) -> tuple[int, str]:
    """Run ``argv`` on a fresh pseudo-terminal ``cols`` wide; (exit status, what it wrote, ANSI removed)."""
    import fcntl
    import pty
    import select
    import struct
    import termios
    import time

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, cols, 0, 0))
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return code, _ANSI.sub("", b"".join(chunks).decode("utf-8", "replace"))


def _child_env(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("COLUMNS", "LINES", "EVOTUNER_STORAGE", "EVOTUNER_DEBUG")}
    env.update(EVOTUNER_CACHE_DIR=str(cache), TERM="xterm-256color")
    return env


def _cli() -> list[str]:
    return [sys.executable, "-m", "evotuner.cli"]


def test_search_and_show_on_an_80_column_terminal_show_every_value(tmp_path, build_cache_dir):
    csv = _sweep_copy(tmp_path / "sweep")
    env = _child_env(build_cache_dir)
    code, text = _on_pty([*_cli(), "search", "--study", "wide", "--shape", SHAPE, "--trials", "40",
                          "--replay", str(csv)], tmp_path, env)
    assert code == 0, text
    assert "…" not in text, text                  # nothing cut: no config, no live line
    code, shown = _on_pty([*_cli(), "show", "--study", "wide", "--top", "10"], tmp_path, env)
    assert code == 0, shown
    assert "…" not in shown, shown
    lines = [line.rstrip() for line in shown.replace("\r", "").splitlines()]
    assert all(len(line) <= 80 for line in lines), lines
    assert "BM = BLOCK_M" in shown and "MB = MIN_BLOCKS" in shown
    # every top row shows all five values, so no two rows read the same
    rule = next(i for i, line in enumerate(lines) if line.startswith("───"))
    values = [tuple(line.split()[1:6]) for line in lines[rule + 1:rule + 11]]
    assert len(values) == 10 and all(len(vs) == 5 and all(v.isdigit() for v in vs) for vs in values), values
    assert len(set(values)) == len(values)


def test_export_table_fits_80_columns(capsys, cli_env):
    _replayed(capsys, cli_env)
    code, out, err = run(capsys, "export", "--study", "s", "-o", cli_env / "h.h")
    assert code == 0, err
    assert "…" not in out
    assert all(len(line.rstrip()) <= 80 for line in out.splitlines()), out
    assert "STAGES" in out and "BM = BLOCK_M" in out


def test_untrusted_names_print_literally(capsys, cli_env):
    _replayed(capsys, cli_env, study=EVIL_STUDY, device="GPU [bold]x[/] \x1b[31mred")
    code, out, err = run(capsys, "show", "--study", EVIL_STUDY)
    assert code == 0, err
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b]0;pwned\\x07\\x1b[2J" in out             # visible, harmless
    assert "[bold red]x[/]" in out and "GPU [bold]x[/] \\x1b[31mred" in out   # markup stays literal
    code, out, err = run(capsys, "show", "--study", "nope\x1b[2J")
    assert code == 1 and "\x1b" not in err and "\\x1b[2J" in err


# -- space files that used to hang -------------------------------------------------------------

TINY_SPACE = REPO / "tests" / "data" / "loop_tiny.toml"
TINY_CONFIG = "BLOCK_M=64,BLOCK_N=32,NUM_WARPS=4,STAGES=1,MIN_BLOCKS=1"


def _run_cli(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    """The CLI as a subprocess with a hard timeout (a hang fails the test instead of the suite)."""
    try:
        return subprocess.run([*_cli(), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"evotuner {' '.join(args)} still running after {timeout} s")


@pytest.mark.parametrize("expr", [
    "(((max_smem_per_sm ** 64) ** 64) ** 64) ** 64 > 0",
    " * ".join(["max_smem_per_sm"] * 16) + " > 0",
    "-" * 60 + "1 < 0",                  # 60 nested negations: a syntax tree 62 deep
])
def test_unbounded_space_expressions_are_refused_quickly(tmp_path, build_cache_dir, expr):
    space = tmp_path / "space.toml"
    space.write_text(TINY_SPACE.read_text() + f'\n[[constraints]]\nname = "huge"\nexpr = "{expr}"\nmessage = "x"\n')
    result = _run_cli(["compile", "--config", TINY_CONFIG, "--shape", "D=32", "--space", str(space)],
                      tmp_path, _child_env(build_cache_dir), timeout=30)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "huge" in lines[0], result.stderr
    assert "bits" in lines[0] or "nested" in lines[0]


def test_a_parameter_with_200000_values_is_refused_quickly(tmp_path, build_cache_dir):
    text = TINY_SPACE.read_text().replace("values = [1, 2]", "values = [" + ", ".join(map(str, range(1, 200_001))) + "]")
    space = tmp_path / "space.toml"
    space.write_text(text)
    result = _run_cli(["compile", "--config", TINY_CONFIG, "--shape", "D=32", "--space", str(space)],
                      tmp_path, _child_env(build_cache_dir), timeout=30)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert "MIN_BLOCKS" in lines[0] and "200000 values" in lines[0]
    # the duplicate check is linear: a long list with one repeat at the end is named at once
    from evotuner.space import parse_space
    import time
    started = time.perf_counter()
    with pytest.raises(Exception, match="duplicate value 7"):
        parse_space(TINY_SPACE.read_text().replace("values = [1, 2]", "values = [" + ", ".join(
            map(str, [*range(1, 4000), 7])) + "]"))
    assert time.perf_counter() - started < 2.0


# -- databases: read-only, another application's, secrets in URLs --------------------------------


def _listing(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()}


def _immutable(paths: list[Path]) -> bool:
    """chattr +i each path (works as root, whom file modes do not stop); False where unsupported."""
    chattr = shutil.which("chattr")
    if chattr is None:
        return False
    for p in paths:
        if subprocess.run([chattr, "+i", str(p)], capture_output=True).returncode != 0:
            _mutable(paths)
            return False
    return True


def _mutable(paths: list[Path]) -> None:
    for p in paths:
        subprocess.run(["chattr", "-i", str(p)], capture_output=True)


def _unprivileged_prefix() -> list[str] | None:
    """setpriv to nobody, where that user can run this interpreter (file modes then bind)."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or os.geteuid() != 0:
        return [] if os.geteuid() != 0 else None
    prefix = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
    probe = subprocess.run([*prefix, sys.executable, "-c", "import evotuner"], capture_output=True)
    return prefix if probe.returncode == 0 else None


@pytest.fixture(params=["immutable", "unprivileged"])
def read_only_db(request, tmp_path, build_cache_dir, capsys, cli_env):
    """(db URL, folder, command prefix): a study database that this process cannot write."""
    import tempfile

    _replayed(capsys, cli_env)
    base = Path(tempfile.mkdtemp(prefix="evotuner-ro-"))     # reachable by an unprivileged user
    base.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(base, ignore_errors=True))
    folder = base / "ro"
    folder.mkdir()
    shutil.copy(cli_env / "evotuner.db", folder / "evotuner.db")
    db = folder / "evotuner.db"
    if request.param == "immutable":
        if not _immutable([db, folder]):
            pytest.skip("chattr +i is not available here")
        yield f"sqlite:///{db}", folder, []
        _mutable([db, folder])
    else:
        prefix = _unprivileged_prefix()
        if prefix is None:
            pytest.skip("no unprivileged user can run this interpreter here")
        db.chmod(0o444)
        folder.chmod(0o555)
        yield f"sqlite:///{db}", folder, prefix
        folder.chmod(0o755)


def test_read_only_database_serves_show_export_report(read_only_db, build_cache_dir):
    url, folder, prefix = read_only_db
    before = _listing(folder)
    out_dir = folder.parent / "out"
    out_dir.mkdir()
    out_dir.chmod(0o777)
    env = _child_env(out_dir / "cache")
    env.update(MPLCONFIGDIR=str(out_dir / "mpl"), HOME=str(out_dir))

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*prefix, *_cli(), *args, "--storage", url], cwd=out_dir, env=env,
                              capture_output=True, text=True, timeout=300)

    shown = cli("show", "--study", "s")
    assert shown.returncode == 0, shown.stderr
    assert "best" in shown.stdout
    exported = cli("export", "--study", "s", "-o", str(out_dir / "h.h"))
    assert exported.returncode == 0, exported.stderr
    assert "kConfigs" in (out_dir / "h.h").read_text()
    reported = cli("report", "--study", "s", "-o", str(out_dir / "report"))
    assert reported.returncode == 0, reported.stderr
    assert (out_dir / "report" / "history.png").is_file()
    assert _listing(folder) == before                      # nothing written, no side files
    resumed = cli("resume", "--study", "s", "--replay", str(_sweep_copy(out_dir / "sweep")))
    assert resumed.returncode == 1
    assert "read-only" in resumed.stderr and len(resumed.stderr.strip().splitlines()) == 1
    assert _listing(folder) == before


def test_read_only_commands_leave_a_writable_database_as_found(capsys, cli_env):
    _replayed(capsys, cli_env)
    before = _listing(cli_env)
    data = (cli_env / "evotuner.db").read_bytes()
    assert run(capsys, "show", "--study", "s")[0] == 0
    assert run(capsys, "show", "--study", "s", "--json")[0] == 0
    assert run(capsys, "export", "--study", "s", "-o", cli_env / "h.h")[0] == 0
    after = _listing(cli_env)
    after.pop("h.h")
    assert after == before
    assert (cli_env / "evotuner.db").read_bytes() == data


def _foreign_db(path: Path) -> list[str]:
    import sqlite3

    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, customer INTEGER)")
        conn.execute("INSERT INTO customers (name) VALUES ('ada')")
    conn.close()
    return _tables(path)


def _tables(path: Path) -> list[str]:
    import sqlite3

    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return sorted(r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
    finally:
        conn.close()


def test_another_applications_sqlite_file_is_refused_untouched(capsys, cli_env):
    app_db = cli_env / "app.sqlite"
    tables = _foreign_db(app_db)
    csv = _sweep_copy(cli_env / "sweep")
    for argv in (["search", "--study", "s", "--shape", SHAPE, "--trials", 2, "--replay", csv],
                 ["show", "--study", "s"], ["export", "--study", "s", "-o", cli_env / "h.h"]):
        code, out, err = run(capsys, *argv, "--storage", f"sqlite:///{app_db}")
        assert_one_line_error(code, out, err, "another application", "customers")
        assert _tables(app_db) == tables
    # an empty file and an Optuna-only database are fine
    empty = cli_env / "empty.db"
    empty.touch()
    code, out, err = run(capsys, "search", "--study", "s", "--shape", SHAPE, "--trials", 2, "--replay", csv,
                         "--storage", f"sqlite:///{empty}")
    assert code == 0, err


@pytest.mark.parametrize("url", [
    "postgresql://u@127.0.0.1:1/db?password=s3cr3t",
    "postgresql://u:s3cr3t@127.0.0.1:1/db",
    "postgresql://u@127.0.0.1:1/db?p%61ssword=s3cr3t",
    "postgresql://u:s3cr3t@127.0.0.1:notaport/db",
    "postgresql://u@127.0.0.1:notaport/db?password=s3cr3t",
    "mysql+pymysql://u@127.0.0.1:1/db?password=s3cr3t",
    "nosuchdialect://u:s3cr3t@h/db?password=s3cr3t",
    "mssql+pyodbc:///?odbc_connect=DRIVER%3D%7Bx%7D%3BUID%3Du%3BPWD%3Ds3cr3t",
])
def test_passwords_never_appear_in_errors(capsys, cli_env, url):
    for argv in (["show", "--study", "s"], ["export", "--study", "s", "-o", cli_env / "h.h"]):
        code, out, err = run(capsys, *argv, "--storage", url)
        assert_one_line_error(code, out, err)
        assert "s3cr3t" not in out + err
        assert "unexpected" not in err


def test_a_newer_schema_gives_advice_that_works_from_a_checkout(capsys, cli_env):
    import sqlite3

    _replayed(capsys, cli_env)
    conn = sqlite3.connect(cli_env / "evotuner.db")
    with conn:
        conn.execute("UPDATE evotuner_schema_version SET version = 999, evotuner_version = '9.9.9'")
    conn.close()
    code, out, err = run(capsys, "show", "--study", "s")
    assert_one_line_error(code, out, err, "999", "9.9.9", "git pull", "pip install -e .")
    assert "pip install -U evotuner" not in err


# -- odd inputs: one line naming the input and the remedy -------------------------------------------


def test_a_negative_seed_is_a_usage_error_naming_the_option(capsys, cli_env):
    csv = _sweep_copy(cli_env / "sweep")
    code, out, err = run(capsys, "search", "--study", "s", "--shape", SHAPE, "--seed", -1, "--replay", csv)
    assert_one_line_error(code, out, err, "--seed")
    assert code == 2 and "unexpected" not in err
    assert not (cli_env / "evotuner.db").exists()


def test_a_cache_dir_that_is_a_file_is_one_line(capsys, cli_env, monkeypatch):
    blocker = cli_env / "cachefile"
    blocker.write_text("not a folder")
    for root in (blocker, blocker / "below"):
        monkeypatch.setenv("EVOTUNER_CACHE_DIR", str(root))
        code, out, err = run(capsys, "compile", "--config", TINY_CONFIG, "--shape", "D=32", "--space", TINY_SPACE)
        assert_one_line_error(code, out, err, "EVOTUNER_CACHE_DIR", str(blocker), "not a directory")
        assert "unexpected" not in err
    assert blocker.read_text() == "not a folder"


def test_sampler_gp_names_what_it_needs(capsys, cli_env):
    import importlib.util

    import optuna

    csv = _sweep_copy(cli_env / "sweep")
    code, out, err = run(capsys, "search", "--study", "g", "--shape", SHAPE, "--trials", 3, "--sampler", "gp",
                         "--replay", csv)
    if importlib.util.find_spec("scipy") is not None and hasattr(optuna.samplers, "GPSampler"):
        assert code == 0, err
    else:
        assert_one_line_error(code, out, err, "gp needs", "pip install")
        assert "unknown sampler" not in err
    pyproject = (REPO / "pyproject.toml").read_text()
    assert 'gp = ["scipy"]' in pyproject                 # the extra the message points at


def test_bench_without_a_gpu_names_bench(capsys, cli_env, monkeypatch):
    import evotuner.measure
    from evotuner import cli

    _replayed(capsys, cli_env)
    monkeypatch.setattr(evotuner.measure, "gpu_available", lambda *a, **k: False)
    monkeypatch.setitem(MEASURE, "factory", None)          # the real GPU stage, not the scaffold
    code, out, err = run(capsys, "bench", "--study", "s")
    assert_one_line_error(code, out, err, "evotuner bench needs one")
    assert "evotuner search" not in err


def test_compile_help_asks_for_d_only_and_the_exit_status_is_the_verdict(capsys, cli_env):
    from evotuner import cli

    code, out, err = run(capsys, "compile", "--help")
    assert code == 0
    assert "B=" not in out and "D=64" in out and "Exit status" in out
    strict = cli_env / "strict.toml"
    strict.write_text(TINY_SPACE.read_text().replace("max_registers = 255", "max_registers = 16"))
    for extra in ([], ["--json"]):
        code, out, err = run(capsys, "compile", "--config", TINY_CONFIG, "--shape", "D=32", "--space", strict, *extra)
        assert code == cli.GATE_REJECTED_EXIT == 3, err
    code, out, err = run(capsys, "compile", "--config", TINY_CONFIG, "--shape", "D=32", "--space", TINY_SPACE)
    assert code == 0, err


# -- the stop rule: true, and the same on every run ----------------------------------------------


def test_a_stuck_sampler_stops_as_stalled_and_stays_stopped(capsys, cli_env, build_cache_dir):
    import optuna

    from evotuner.compiler import Builder
    from evotuner.config import KernelConfig
    from evotuner.loop import DUPLICATE_STREAK, run_search
    from evotuner.problem import Problem, Shape
    from evotuner.propose import params_for
    from evotuner.space import load_space
    from evotuner.storage import StudyStore
    from scaffold import ScaffoldMeasure

    space = load_space(TINY_SPACE)
    problem = Problem(Shape.parse("B=1,H=2,S=256,D=32"))
    fixed = params_for(KernelConfig.parse(TINY_CONFIG), space)

    class Stuck(optuna.samplers.RandomSampler):
        """Proposes the same config for ever (a sampler stuck on a small space)."""

        def sample_independent(self, study, trial, name, distribution):
            return fixed[name]

    def search(store, trials):
        return run_search(store=store, study_name="s", problem=problem, space=space, sampler=Stuck(seed=0),
                          seed=0, trials=trials, builder=builder, measure=ScaffoldMeasure(), batch=1)

    with Builder(space.kernel, arch=space.arch, cache_dir=build_cache_dir, jobs=1) as builder, \
            StudyStore(f"sqlite:///{cli_env / 'study.db'}") as store:
        store.create_study("s", problem, space, "random", 0, source_hash=builder.source_hash(),
                           nvcc_version=builder.nvcc_version())
        first = search(store, 10**12)
        assert first.outcome == "stalled"
        assert first.finished == 1 + DUPLICATE_STREAK
        assert first.untried is not None and 0 < first.untried < first.feasible
        again = search(store, 10**12)
        assert again.outcome == "stalled" and again.new_trials == 0 and again.finished == first.finished
    # the CLI says what is true, once, and adds nothing
    for _ in range(2):
        code, out, err = run(capsys, "resume", "--study", "s", "--trials", 10**12,
                             "--storage", f"sqlite:///{cli_env / 'study.db'}")
        assert code == 0, err
        lines = out.splitlines()
        starts = [i for i, line in enumerate(lines) if line.startswith(("stopped:", "space exhausted"))]
        assert len(starts) == 1, out
        end = next((j for j in range(starts[0] + 1, len(lines)) if not lines[j].startswith("    ")), len(lines))
        verdict = [" ".join(line.strip() for line in lines[starts[0]:end])]    # with its wrapped lines
        assert f"{DUPLICATE_STREAK} times in a row" in verdict[0]
        assert f"{first.untried} of {first.feasible} feasible configs never tried" in verdict[0]
        assert "every config" not in verdict[0]
        with StudyStore(f"sqlite:///{cli_env / 'study.db'}", read_only=True) as store:
            assert len(store.summary("s").trials) == first.finished


# -- Ctrl-C --------------------------------------------------------------------------------------


def test_ctrl_c_during_a_search_says_what_was_saved_and_how_to_continue(tmp_path, build_cache_dir):
    import fcntl
    import pty
    import select
    import signal
    import struct
    import termios
    import time

    csv = _sweep_copy(tmp_path / "sweep")
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 80, 0, 0))
    # A terminal's foreground job gets Ctrl-C with SIGINT's default action; a test run started
    # in the background by a non-interactive shell (`pytest ... &`) inherits SIGINT *ignored*,
    # and so would the search (exit 0 after all 500 trials, seen twice): give it the default.
    proc = subprocess.Popen([*_cli(), "search", "--study", "c", "--shape", SHAPE, "--trials", "500",
                             "--replay", str(csv)], cwd=tmp_path, env=_child_env(build_cache_dir),
                            stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    os.close(slave)
    data, sent, deadline = b"", False, time.monotonic() + 240
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                data += chunk
            if not sent and b"#5 " in data:
                os.killpg(proc.pid, signal.SIGINT)          # what the terminal sends on Ctrl-C
                sent = True
            if proc.poll() is not None and not ready:
                break
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    text = _ANSI.sub("", data.decode("utf-8", "replace")).replace("\r", "")
    assert sent and code == 130, f"{text[:1500]}\n...\n{text[-1500:]}"
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, text[-2000:]
    assert "interrupted" in errors[0] and "finished trials" in errors[0]
    assert "evotuner resume --study c" in errors[0]
    kept = int(errors[0].split("keeps its ")[1].split()[0])
    shown = subprocess.run([*_cli(), "show", "--study", "c", "--json"], cwd=tmp_path,
                           env=_child_env(build_cache_dir), capture_output=True, text=True, timeout=120)
    finished = [t for t in json.loads(shown.stdout)["trials"]
                if t["state"] != "RUNNING" and not str(t.get("error") or "").startswith("interrupted")]
    assert kept == len(finished) > 0


# -- report: the improvement visible, unmeasured trials shown ---------------------------------------


def test_history_plot_fits_the_study_and_shows_unmeasured_trials(capsys, cli_env, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    drawn: dict[str, tuple[float, float]] = {}
    save = Figure.savefig

    def spy(fig, fname, *args, **kwargs):       # the y range the PNG really has
        name = Path(str(getattr(fname, "name", fname))).name      # a path, or the output rule's temp file
        if name.startswith(".") and name.endswith(".tmp"):         # .history.png.<random>.tmp
            name = name[1:].rsplit(".", 2)[0]
        drawn[name] = fig.axes[0].get_ylim()
        return save(fig, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    _replayed(capsys, cli_env, trials=40)
    code, out, err = run(capsys, "report", "--study", "s", "-o", cli_env / "report")
    assert code == 0, err
    assert (cli_env / "report" / "history.png").stat().st_size > 10_000
    code, shown, _ = run(capsys, "show", "--study", "s", "--json")
    data = json.loads(shown)
    values = [t["value"] for t in sorted(data["trials"], key=lambda t: t["number"]) if t["state"] == "COMPLETE"]
    lo, hi = drawn["history.png"]
    assert lo < min(values) < hi
    assert (values[0] - min(values)) / (hi - lo) > 0.05       # visible on the PNG itself
    history = json.loads((cli_env / "report" / "report.json").read_text())["history"]
    assert history["ylim"] == pytest.approx([lo, hi])
    assert lo < min(values) < hi
    # the tuned improvement (first best -> final best) is a visible share of the axis, not a flat line
    assert (values[0] - min(values)) / (hi - lo) > 0.05
    # SDPA's slow backend (2095 µs) does not stretch the axis: it is marked off scale with its value
    baselines = data["baselines"]
    assert "sdpa_efficient" in history["off_scale_baselines"] and baselines["sdpa_efficient"] > hi
    # PRUNED trials are shown by reason class, with counts matching the study
    pruned = sum(1 for t in data["trials"] if t["state"] == "PRUNED")
    assert pruned > 0
    assert sum(n for k, n in history["not_measured"].items() if k.startswith("PRUNED")) == pruned
    assert set(history["not_measured"]) <= {"PRUNED constraint", "PRUNED gate"}


def test_a_database_behind_a_closed_folder_is_one_line(capsys, cli_env):
    import tempfile

    prefix = _unprivileged_prefix()
    if not prefix:
        pytest.skip("needs root and an unprivileged user that can run this interpreter")
    _replayed(capsys, cli_env)
    closed = Path(tempfile.mkdtemp(prefix="evotuner-closed-"))
    try:
        shutil.copy(cli_env / "evotuner.db", closed / "evotuner.db")
        closed.chmod(0o700)                                  # nobody may not search it
        result = subprocess.run([*prefix, *_cli(), "show", "--study", "s", "--storage",
                                 f"sqlite:///{closed / 'evotuner.db'}"], cwd="/", env=_child_env(closed / "cache"),
                                capture_output=True, text=True, timeout=120)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 1 and len(lines) == 1, result.stderr
        assert "cannot be reached" in lines[0] and "unexpected" not in lines[0]
    finally:
        shutil.rmtree(closed, ignore_errors=True)


def test_legend_lines_keep_each_pair_whole_and_headers_do_not_depend_on_the_width():
    from evotuner import columns

    names = ["BLOCK_N", "CONSUMER_WGS", "STAGES", "REG_PROD", "PINGPONG", "SCHED", "RESCALE_LOG2"]
    short = columns.short_names(names)
    lines = columns.legend_lines(short, 30)
    assert all(len(line) <= 30 for line in lines), lines
    pairs = [p.strip() for p in " ".join(lines).split(",")]
    assert pairs == [f"{s} = {n}" for n, s in short.items() if s != n]     # no pair split across lines
    heads = columns.headers(names)
    assert heads["STAGES"] == "STAG" and heads["PINGPONG"] == "PING" and heads["BLOCK_N"] == "BN"
    assert heads["SCHED"] == "SCHE" and heads["CONSUMER_WGS"] == "CW"
