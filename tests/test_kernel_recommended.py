"""The recommended FlashCore configs (kernels/flashcore/defaults.toml), compiled for real.

Issue 3: every head dim x dtype x causal combination of the recommended configs
builds with nvcc for sm_90a with 0 spill bytes and a 0-byte stack frame, passes
the default space's gate, and requests exactly the shared memory that the space
file's static formula predicts (the formula prunes configs before compiling, so
it must agree with the kernel's own kSmemBytes read back from the cubin).
"""

from __future__ import annotations

import itertools
import shutil

import pytest

from evotuner.compiler import Builder
from evotuner.gate import apply_gate, parse_ptxas
from evotuner.problem import DTYPES, Problem, Shape
from evotuner.runtime.attention import default_config, supported_head_dims
from evotuner.space import load_space

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")

COMBOS = list(itertools.product(supported_head_dims(), DTYPES, (False, True)))


@pytest.fixture(scope="module")
def built(build_cache_dir):
    """Build every combination once, in parallel (the pool is the Builder's own)."""
    space = load_space(None)
    with Builder(space.kernel, arch=space.arch, cache_dir=build_cache_dir) as builder:
        futures = {}
        for head_dim, dtype, causal in COMBOS:
            problem = Problem(Shape(1, 1, 64, 64, head_dim), dtype=dtype, causal=causal)
            config = default_config(head_dim, dtype, causal)
            futures[(head_dim, dtype, causal)] = (problem, config, builder.submit(config, problem))
        return space, {key: (p, c, f.result()) for key, (p, c, f) in futures.items()}


def test_head_dims_64_and_128_are_recommended():
    assert {64, 128} <= set(supported_head_dims())


@pytest.mark.parametrize("head_dim,dtype,causal", COMBOS, ids=lambda v: str(v))
def test_recommended_config_builds_without_spills(built, head_dim, dtype, causal):
    space, results = built
    problem, config, result = results[(head_dim, dtype, causal)]
    assert result.ok, f"{config} D={head_dim} {dtype} causal={causal}: {result.error}"
    report = parse_ptxas(result.ptxas_log)
    assert report.spill_stores == 0 and report.spill_loads == 0, (str(config), report)
    assert report.stack == 0, (str(config), report)
    assert report.registers <= 255
    space.validate(config)
    assert space.violated(config, problem) is None
    verdict = apply_gate(result, space.gate)
    assert verdict.passed, verdict.reason
    # The space's static shared-memory formula is the kernel's, byte for byte.
    assert space.derive(config, problem)["smem_bytes"] == result.artifact.meta["smem_bytes"]
    assert result.artifact.meta["threads"] == space.derive(config, problem)["threads"]
