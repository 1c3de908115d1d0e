"""`evotuner check` / `profile` machinery on the GPU with the real compute-sanitizer and ncu:
the recommended d64 config is memcheck/racecheck/synccheck/initcheck clean at the ragged shapes, the
planted out-of-bounds write (FAULT=1) is reported by memcheck without crashing, and ncu
gives the figures for the kernel and for SDPA's default backend."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from evotuner import diagnose
from evotuner.compiler.builder import Builder
from evotuner.defaults import recommended
from evotuner.problem import Problem, Shape
from evotuner.space import load_space
from evotuner.tools import ncu, sanitizer

pytestmark = pytest.mark.gpu

FAULTS = Path(__file__).resolve().parents[1] / "data" / "spaces" / "faults.toml"
PROBLEM = Problem(Shape(16, 16, 2048, 2048, 64), "fp16", causal=False)


def _target(space, config, tmp_path) -> diagnose.Target:
    with Builder(space.kernel, cache_dir=tmp_path / "cache") as b:
        r = b.build(config, PROBLEM)
    assert r.ok, r.error
    return diagnose.Target(config, None, None, artifact=r.artifact)


@pytest.fixture(scope="module")
def cs() -> Path:
    if shutil.which("compute-sanitizer") is None and not Path("/usr/local/cuda/bin/compute-sanitizer").exists():
        pytest.skip("compute-sanitizer is not installed")
    return sanitizer.executable()


@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "synccheck", "initcheck"])
def test_recommended_config_is_clean(cs, tool, tmp_path):
    target = _target(load_space(None), recommended(PROBLEM)[0], tmp_path)
    out = diagnose.sanitize(target, PROBLEM, tool, exe=cs, timeout_s=300)
    assert out.passed and out.complete and out.errors == 0, out


def test_planted_out_of_bounds_write_is_reported(cs, tmp_path):
    space = load_space(FAULTS)
    config = next(c for c in space.configs() if c["FAULT"] == 1)
    out = diagnose.sanitize(_target(space, config, tmp_path), PROBLEM, "memcheck", exe=cs, timeout_s=300)
    assert not out.passed and out.errors >= 1
    assert out.findings[0].startswith("Invalid __global__ write"), out.findings


def test_ncu_profiles_the_kernel_and_sdpa(tmp_path):
    if shutil.which("ncu") is None and not Path("/usr/local/cuda/bin/ncu").exists():
        pytest.skip("ncu is not installed")
    exe = ncu.executable()
    target = _target(load_space(None), recommended(PROBLEM)[0], tmp_path)
    ours = diagnose.profile(PROBLEM, exe=exe, target=target, timeout_s=300)
    sdpa = diagnose.profile(PROBLEM, exe=exe, target=None, timeout_s=300)
    assert ours.figures and ours.figures["kernel"] == "flashcore_fwd" and ours.figures["registers"] > 0
    assert sdpa.figures and sdpa.figures["tensor_pipe_pct"] > 0
