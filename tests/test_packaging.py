"""The built wheel: one import name (`evotuner`), with the kernel sources, the kernel's
recommended configs and the default space inside it, and no top-level `kernels` or
`storage` module (a popular PyPI package is called `kernels`)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_wheel_holds_one_import_name_and_its_data(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path), str(ROOT)], check=True, timeout=300, capture_output=True)
    (wheel,) = tmp_path.glob("evotuner-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"evotuner"}, tops
    for needed in ("evotuner/kernels/flashcore/params.h", "evotuner/kernels/flashcore/instantiate.cuh",
                   "evotuner/kernels/flashcore/kernel.cuh", "evotuner/kernels/flashcore/defaults.toml",
                   "evotuner/kernels/hopper/extension/hopper_launch_row.cu.in",
                   "evotuner/kernels/hopper/extension/hopper_ext.cpp",
                   "evotuner/search_spaces/flashcore.toml", "evotuner/storage/store.py"):
        assert needed in names, needed


def test_the_readme_is_a_short_guide_whose_test_command_ci_runs():
    """The README stays a user's guide (under 300 lines); its two command blocks are one line
    each, and CI's .ci/run runs the test block's install and pytest exactly."""
    import re

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 300
    section = readme.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)\n```", section, re.S)
    assert len(blocks) == 2 and all("\n" not in b for b in blocks), blocks
    main_job, tests = blocks
    assert main_job.startswith("python -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 -e . && ")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "apt-get install -y postgresql" in tests and "apt-get install -y postgresql" in ci
    run_tests = tests.split(" && ", 2)[2]      # after apt-get update && apt-get install
    assert run_tests in ci, (run_tests, ci)
    for link in re.findall(r"\]\(([^)#]+)\)", readme):
        assert link.startswith("http") or (ROOT / link).exists(), link


def test_the_measurements_index_names_every_file_it_describes():
    """docs/measurements/README.md indexes the measurement runs: every top-level file and
    folder there is named."""
    folder = ROOT / "docs" / "measurements"
    index = (folder / "README.md").read_text(encoding="utf-8")
    for entry in folder.iterdir():
        if entry.name in ("README.md", "h100.md"):
            continue
        stem = entry.name.split(".")[0]
        assert stem in index or f"{entry.name}/" in index, entry.name
