"""The scripts' argument parser: a usage error is one line, exit status 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from evotuner.scriptargs import ArgumentParser

REPO = Path(__file__).resolve().parents[1]


def test_a_usage_error_is_one_line_with_the_help_hint(capsys):
    ap = ArgumentParser(prog="bench_x.py")
    ap.add_argument("--rounds", type=int, required=True)
    with pytest.raises(SystemExit) as exit_:
        ap.parse_args(["--rounds", "many"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.splitlines() == ["error: argument --rounds: invalid int value: 'many' (see bench_x.py --help)"]


@pytest.mark.parametrize("script", ["bench_runtime.py", "bench_extension.py", "build_extension.py", "sweep.py"])
def test_the_scripts_use_it(script):
    ran = subprocess.run([sys.executable, str(REPO / "scripts" / script), "--no-such-option"], capture_output=True,
                         text=True, timeout=120)
    assert ran.returncode == 2 and len(ran.stderr.splitlines()) == 1, ran.stderr
    assert ran.stderr.startswith("error: ") and "--help" in ran.stderr


def test_an_output_a_script_cannot_write_is_refused_before_any_work(tmp_path, capsys):
    """An empty path, '-', a folder, a link, a database or a missing folder: one usage line at
    parse time (a benchmark once ran whole and then lost its results on such an --output)."""
    import os

    from evotuner.scriptargs import ArgumentParser, output_path

    (tmp_path / "db").write_bytes(b"SQLite format 3\x00" + bytes(100))
    os.symlink(tmp_path / "target", tmp_path / "link")
    for bad, says in (("", "the path is empty"), ("-", "not to standard output"), (tmp_path, "not a regular file"),
                      (tmp_path / "link", "symbolic link"), (tmp_path / "db", "SQLite database"),
                      (tmp_path / "no" / "x.json", "does not exist")):
        ap = ArgumentParser(prog="s.py")
        ap.add_argument("--output", type=output_path)
        with pytest.raises(SystemExit) as exit_:
            ap.parse_args(["--output", str(bad)])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and says in err and len(err.strip().splitlines()) == 1, err
    ap = ArgumentParser(prog="s.py")
    ap.add_argument("--output", type=output_path)
    assert ap.parse_args(["--output", str(tmp_path / "ok.json")]).output == tmp_path / "ok.json"
    assert not list(tmp_path.glob("ok*"))      # parsing writes nothing
