"""scripts/kernel_smoke.py is a thin driver of the library: its options, its plan, and its
build + gate step through the real Builder (nvcc; no GPU needed with --build-only)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

from evotuner.defaults import recommended
from evotuner.problem import Problem, Shape
from evotuner.space import load_space

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def smoke():
    spec = importlib.util.spec_from_file_location("kernel_smoke", ROOT / "scripts" / "kernel_smoke.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["kernel_smoke"] = module
    spec.loader.exec_module(module)
    return module


def test_documented_options_parse_and_plan(smoke, tmp_path: Path) -> None:
    # kernels/flashcore/README.md: `--out DIR`, and `--out DIR --focus d128 --ref-kernels OLD --rounds N`
    args = smoke.parse_args(["--out", str(tmp_path), "--focus", "d128", "--ref-kernels", str(tmp_path), "--rounds", "5"])
    assert args.out == tmp_path and args.focus == "d128" and args.rounds == 5 and args.ref_kernels == tmp_path
    focus = smoke.plan(args)
    assert {j.role for j in focus} == {"check", "fault", "time"}
    assert any(j.root == "ref" for j in focus) and all(j.root == "" for j in focus if j.role != "time")
    assert sorted(j.flags[0] for j in focus if j.role == "fault") == [f"-DFLASHCORE_FAULT={n}" for n in range(3, 7)]
    full = smoke.plan(smoke.parse_args(["--out", str(tmp_path)]))
    space = load_space(family="flashcore")
    for b, h, s, d, causal in smoke.TIME_SHAPES:          # every statically feasible config is timed
        problem = Problem(Shape(b, h, s, s, d), causal=causal)
        timed = {j.config for j in full if j.role == "time" and j.problem == problem}
        assert timed == {c for c in space.configs() if space.violated(c, problem) is None}
    checks = [j for j in full if j.role == "check"]           # the family's recommended configs
    assert checks and all(j.config in recommended(j.problem, "flashcore") for j in checks)
    assert len(full) == len(set(full))
    with pytest.raises(SystemExit):
        smoke.parse_args(["--focus", "d64"])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_build_only_builds_and_gates_with_the_real_builder(smoke, tmp_path: Path) -> None:
    match = "D64 fp16 BLOCK_M=128,BLOCK_N=64,MIN_BLOCKS=1,NUM_WARPS=4,STAGES=2"
    out = tmp_path / "out"
    rc = smoke.main(["--out", str(out), "--build-only", "--no-timing", "--no-faults", "--match", match,
                     "--cache-dir", str(tmp_path / "cache"), "--jobs", "1"])
    assert rc == 0
    report = json.loads((out / "ptxas.json").read_text())
    assert list(report) == [match]
    entry = report[match]
    assert entry["ok"] and entry["gate"] is True and entry["spill_stores"] == entry["spill_loads"] == 0 and entry["registers"] > 0 and entry["smem"] > 0
    assert "1/1 cubins" in (out / "smoke.log").read_text()
