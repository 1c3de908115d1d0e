"""The real GPU worker measures the Hopper family's recommended configs (and a SCHED=2
variant, whose tile counter the runtime zeroes per launch): sane timings, correct
results on the worker's ragged check. Skips cleanly without a GPU."""

from __future__ import annotations

import math

import pytest

from evotuner.compiler.builder import Builder
from evotuner.config import KernelConfig
from evotuner.family import get_family
from evotuner.measure import GpuMeasure, Measurement
from evotuner.problem import Problem, Shape
from evotuner.space import load_space

pytestmark = pytest.mark.gpu

HOPPER = get_family("hopper")
PROBLEMS = [
    Problem(Shape(2, 8, 1024, 1024, 64), "fp16", causal=False),
    Problem(Shape(1, 4, 512, 640, 128), "bf16", causal=True),
]


@pytest.mark.parametrize("sched", [None, 2])
@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: f"{p.shape}-{p.dtype}-causal{int(p.causal)}")
def test_recommended_config_measures_sanely(builder: Builder, gpu: GpuMeasure, problem: Problem, sched) -> None:
    cfg = HOPPER.recommended_configs(problem)[0]
    if sched is not None:
        # a hopper.toml config (a small problem's recommended one is hopper_split.toml's: no
        # split and no head packing with a persistent scheduler)
        values = {k: v for k, v in cfg.as_dict().items() if k not in ("SPLITS", "PACK_GQA")}
        cfg = KernelConfig.of({**values, "SCHED": sched})
        if load_space(HOPPER.default_space()).violated(cfg, problem) is not None:   # smem: fewer stages
            cfg = KernelConfig.of({**cfg.as_dict(), "STAGES": 2})
    result = builder.build(cfg, problem)
    assert result.ok, result.error
    out = gpu.measure(result.artifact, problem)
    assert isinstance(out, Measurement), out
    assert 0 < out.p20_us <= out.median_us <= out.p80_us
    assert out.tflops > 0 and math.isclose(out.tflops, problem.tflops(out.median_us))
    assert out.max_error <= out.tolerance and out.tolerance > 0
    detail = gpu.last_detail
    assert detail["ragged_max_error"] <= detail["ragged_tolerance"], detail


def test_later_checks_of_a_problem_reuse_the_first_checks_tolerance(builder: Builder) -> None:
    """The worker computes FA2's bound on its first check of a study's problem and judges the
    next trials' fresh inputs by it (the ragged shape's bound stays per trial); a worker of its
    own, so the first measure below is its first check of the problem."""
    problem = Problem(Shape(1, 4, 640, 640, 128), "fp16", causal=True)
    built = builder.build(HOPPER.recommended_configs(problem)[0], problem)
    assert built.ok, built.error
    with GpuMeasure(timeout_s=120.0, budget_s=0.05) as gm:
        runs = [gm.measure(built.artifact, problem) for _ in range(3)]
    assert all(isinstance(m, Measurement) for m in runs), runs
    assert runs[0].tolerance == runs[1].tolerance == runs[2].tolerance > 0
    assert all(m.max_error <= m.tolerance for m in runs)
    assert len({m.max_error for m in runs}) > 1        # fresh inputs each time: other draws, other errors
