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

from cli_helpers import assert_one_line_error, run, scaffold_env

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
                    "static_assert(flashcore::tuned::index_of(flashcore::tuned::select(64, 0, false, 2048)) == 0);\n"
                    "int main() { return 0; }\n")
    result = subprocess.run([*_compiler(), str(user)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
