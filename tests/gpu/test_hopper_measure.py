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
