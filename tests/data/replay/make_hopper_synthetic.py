#!/usr/bin/env python3
"""SYNTHETIC hopper replay fixture: real nvcc builds and ptxas gates, made-up timings.

    python tests/data/replay/make_hopper_synthetic.py    # rewrites hopper_synthetic_d64.csv

No hopper sweep has been recorded on the H100 yet. Until one exists, the hopper
family's replayed search, resume and export are tested against this file: every
config of the test slice tests/data/spaces/hopper_small.toml at B16 H16 S2048 D64
fp16, built with the real Builder and judged by the real gate (hopper's own rules
included); only the measure stage is :class:`SyntheticHopperMeasure`, a
deterministic function of the meta table plus hash noise. The sidecar says
``"synthetic": true`` and its device is named SYNTHETIC. These numbers are NOT
measurements and must never be reported as such.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import tempfile
from pathlib import Path

from evotuner.compiler.result import Artifact
from evotuner.measure.base import Measurement, MeasureOutcome, MeasureStage
from evotuner.problem import Problem, Shape

HERE = Path(__file__).resolve().parent
SPACE = HERE.parent / "spaces" / "hopper_small.toml"
OUTPUT = HERE / "hopper_synthetic_d64.csv"
SHAPE = "B=16,H=16,S=2048,D=64"
DEVICE = {"name": "SYNTHETIC (no GPU; made-up timings)", "sm_count": 132, "synthetic": True}


def _noise(text: str, scale: float) -> float:
    h = int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") / 2**32
    return 1.0 + scale * (2.0 * h - 1.0)


class SyntheticHopperMeasure(MeasureStage):
    """Latency = ideal FLOP time / a made-up efficiency of the meta table's knobs."""

    def measure(self, artifact: Artifact, problem: Problem) -> MeasureOutcome:
        m = artifact.meta
        key = ",".join(f"{k}={m[k]}" for k in sorted(m))
        eff = 0.45
        eff *= {2: 1.0, 3: 1.05}.get(m["consumer_wgs"], 0.7)
        eff *= 1.04 if m["pingpong"] else 1.0
        eff *= 1.0 if m["block_n"] == 128 else 0.93
        eff *= {0: 1.0, 1: 1.01, 2: 1.005}[m["sched"]]
        us = problem.flops / (eff * 989e12) * 1e6 * _noise(key, 0.02)
        return Measurement(median_us=round(us, 3), p20_us=round(us * 0.995, 3), p80_us=round(us * 1.006, 3),
                           tflops=round(problem.tflops(us), 2), max_error=round(0.0005 * _noise("e" + key, 0.5), 6),
                           tolerance=0.0039, repetitions=200)

    def baselines(self, problem: Problem) -> dict[str, float | None]:
        ideal = problem.flops / 989e12 * 1e6
        return {"sdpa_default": round(ideal / 0.44, 2), "sdpa_flash": round(ideal / 0.44, 2),
                "sdpa_efficient": round(ideal / 0.30, 2)}

    def device(self) -> dict[str, object] | None:
        return dict(DEVICE)


def main() -> int:
    spec = importlib.util.spec_from_file_location("sweep", HERE.parents[2] / "scripts" / "sweep.py")
    sweep = importlib.util.module_from_spec(spec)
    sys.modules["sweep"] = sweep
    spec.loader.exec_module(sweep)
    from evotuner.compiler import Builder
    from evotuner.space import load_space

    space = load_space(SPACE)
    with tempfile.TemporaryDirectory() as cache, Builder(space.kernel, arch=space.arch, cache_dir=cache) as builder:
        problem = Problem(Shape.parse(SHAPE), dtype="fp16", causal=False)
        summary = sweep.run_sweep(space=space, problem=problem, builder=builder, measure=SyntheticHopperMeasure(),
                                  output=OUTPUT, fresh=True,
                                  extra_header={"synthetic": True, "note": __doc__.split("\n\n")[2]})
        print(OUTPUT.name, summary.counts, f"{summary.seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
