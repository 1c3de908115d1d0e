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
                   "evotuner/search_spaces/default.toml", "evotuner/storage/store.py"):
        assert needed in names, needed
