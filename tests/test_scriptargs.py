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
