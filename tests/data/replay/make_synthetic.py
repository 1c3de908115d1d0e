#!/usr/bin/env python3
"""SYNTHETIC replay fixtures: real nvcc builds and ptxas gates, made-up timings.

    python tests/data/replay/make_synthetic.py      # rewrites synthetic_d64.csv, synthetic_d128.csv

Until the H100 sweeps (tests/data/sweep_h100_d{64,128}.csv, made by
scripts/sweep.py on the GPU) exist, the replay, kill -9, scale, report and
sampler-benchmark code is developed against these. They are produced by the
same ``run_sweep`` as the real sweep: every config of the packaged default space
at the two standard shapes, static constraints and the ptxas gate applied to
real nvcc 13 output; only the measure stage is :class:`SyntheticMeasure`, a
deterministic function of the kernel's meta table (tile sizes, warps, pipeline
depth, occupancy) plus hash noise, with a few configs failing ``wrong_result``.
The sidecar says ``"synthetic": true`` and its device is named SYNTHETIC.
These numbers are NOT measurements and must never be reported as such.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import sys
import tempfile
from pathlib import Path

from evotuner.compiler.result import Artifact
from evotuner.measure.base import MeasureFailure, MeasureOutcome, Measurement, MeasureStage
from evotuner.problem import Problem, Shape

HERE = Path(__file__).resolve().parent
SHAPES = {"synthetic_d64.csv": "B=16,H=16,S=2048,D=64", "synthetic_d128.csv": "B=8,H=16,S=2048,D=128"}
DEVICE = {"name": "SYNTHETIC (no GPU; made-up timings)", "sm_count": 132, "synthetic": True}


def _noise(text: str, scale: float) -> float:
    h = int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") / 2**32
    return 1.0 + scale * (2.0 * h - 1.0)


class SyntheticMeasure(MeasureStage):
    """Latency = ideal FLOP time / an efficiency made of smooth per-parameter terms."""

    def measure(self, artifact: Artifact, problem: Problem) -> MeasureOutcome:
        m = artifact.meta
        d = problem.shape.head_dim
        bm, bn, warps, min_blocks = m["block_m"], m["block_n"], m["threads"] // 32, m["min_blocks"]
        stages = (m["smem_bytes"] // (d * 2) - bm) // (2 * bn)
        key = f"{bm},{bn},{warps},{stages},{min_blocks},{d}"
        if _noise("fail" + key, 1.0) < 0.06:        # about 3% of configs
            return MeasureFailure("wrong_result", "max error 0.31 > tolerance 0.0039 (synthetic)")
        pref_bn = 128 if d <= 64 else 64
        eff = 0.62
        eff /= 1 + 0.22 * abs(math.log2(bm / 128))
        eff /= 1 + 0.15 * abs(math.log2(bn / pref_bn))
        eff /= 1 + 0.10 * abs(math.log2((bm // warps) / 16))
        eff /= {1: 1.30, 2: 1.0, 3: 0.96}.get(stages, 1.0)
        blocks_per_sm = max(1, min(2, 233472 // (m["smem_bytes"] + 1024)))
        eff /= 1.0 if (blocks_per_sm >= 2 or bm >= 128) else 1.12
        eff /= 0.97 if min_blocks == 2 and blocks_per_sm >= 2 else 1.0
        us = problem.flops / (eff * 989e12) * 1e6 * _noise(key, 0.03)
        return Measurement(median_us=round(us, 3), p20_us=round(us * 0.995, 3), p80_us=round(us * 1.006, 3),
                           tflops=round(problem.tflops(us), 2), max_error=round(0.0005 * _noise("e" + key, 0.5), 6),
                           tolerance=0.0039, repetitions=200)

    def baselines(self, problem: Problem) -> dict[str, float | None]:
        ideal = problem.flops / 989e12 * 1e6
        return {"sdpa_default": round(ideal / 0.55, 2), "sdpa_flash": round(ideal / 0.55, 2),
                "sdpa_efficient": round(ideal / 0.40, 2)}

    def device(self) -> dict[str, object] | None:
        return dict(DEVICE)


def main() -> int:
    spec = importlib.util.spec_from_file_location("sweep", HERE.parents[2] / "scripts" / "sweep.py")
    sweep = importlib.util.module_from_spec(spec)
    sys.modules["sweep"] = sweep
    spec.loader.exec_module(sweep)
    from evotuner.compiler import Builder
    from evotuner.space import load_space

    space = load_space(None)
    with tempfile.TemporaryDirectory() as cache, Builder(space.kernel, arch=space.arch, cache_dir=cache) as builder:
        for name, shape in SHAPES.items():
            problem = Problem(Shape.parse(shape), dtype="fp16", causal=False)
            summary = sweep.run_sweep(space=space, problem=problem, builder=builder, measure=SyntheticMeasure(),
                                      output=HERE / name, fresh=True,
                                      extra_header={"synthetic": True, "note": __doc__.split("\n\n")[2]})
            print(name, summary.counts, f"{summary.seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
