"""The real GPU worker on a real GPU: the recommended config measures sanely,
SDPA baselines run, the fingerprint is complete, and the search process never
initializes CUDA itself. Skips cleanly without a GPU (tests/conftest.py)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from evotuner.compiler.builder import Builder
from evotuner.measure import GpuMeasure, Measurement
from evotuner.problem import Problem, Shape

pytestmark = pytest.mark.gpu

PROBLEMS = [
    Problem(Shape(2, 8, 1024, 1024, 64), "fp16", causal=False),
    Problem(Shape(1, 4, 512, 640, 128), "bf16", causal=True),
]


@pytest.fixture(scope="module")
def builder(tmp_path_factory: pytest.TempPathFactory) -> Builder:
    with Builder("flashcore", cache_dir=tmp_path_factory.mktemp("cache")) as b:
        yield b


def recommended(problem: Problem):
    from evotuner.runtime.attention import default_config

    return default_config(problem.shape.head_dim, problem.dtype, problem.causal)


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: f"{p.shape}-{p.dtype}-causal{int(p.causal)}")
def test_recommended_config_measures_sanely(builder: Builder, gpu: GpuMeasure, problem: Problem) -> None:
    result = builder.build(recommended(problem), problem)
    assert result.ok, result.error
    out = gpu.measure(result.artifact, problem)
    assert isinstance(out, Measurement), out
    assert 0 < out.p20_us <= out.median_us <= out.p80_us
    assert out.tflops > 0 and math.isclose(out.tflops, problem.tflops(out.median_us))
    assert out.max_error <= out.tolerance and out.tolerance > 0
    assert out.repetitions >= 10
    detail = gpu.last_detail
    assert detail["ragged_max_error"] <= detail["ragged_tolerance"], detail
    # The same artifact again: same worker, a comparable time (no restart, no drift by 3x).
    again = gpu.measure(result.artifact, problem)
    assert isinstance(again, Measurement)
    assert gpu.spawns == 1
    assert 1 / 3 < again.median_us / out.median_us < 3


def test_baselines_flash_at_d64(gpu: GpuMeasure) -> None:
    problem = PROBLEMS[0]
    got = gpu.baselines(problem)
    assert set(got) == {"sdpa_default", "sdpa_flash", "sdpa_efficient"}
    assert got["sdpa_flash"] is not None and got["sdpa_flash"] > 0, gpu.baseline_reasons
    assert got["sdpa_default"] is not None and got["sdpa_default"] > 0, gpu.baseline_reasons
    for name, us in got.items():
        assert (us is None) == (name in gpu.baseline_reasons)


def test_baseline_that_cannot_run_is_none_with_a_reason(gpu: GpuMeasure) -> None:
    # torch's flash backend refuses is_causal with seqlen_q != seqlen_k (sdp_utils:
    # check_flash_causal_non_square_seqlens); the other backends run it.
    problem = PROBLEMS[1]
    got = gpu.baselines(problem)
    assert got["sdpa_flash"] is None
    assert "cannot run" in gpu.baseline_reasons["sdpa_flash"] and str(problem.shape) in gpu.baseline_reasons["sdpa_flash"]
    assert got["sdpa_efficient"] is not None and got["sdpa_efficient"] > 0, gpu.baseline_reasons


def test_fingerprint(gpu: GpuMeasure) -> None:
    fp = gpu.device()
    assert fp["sm_count"] > 0 and fp["compute_capability"] == "9.0"
    assert "H100" in fp["name"] or "H200" in fp["name"] or "H20" in fp["name"], fp["name"]
    assert fp["torch"] and fp["cuda"] and fp["driver"], fp
    assert fp["clocks_at_start"]["clocks.sm"] is not None and fp["clocks_at_start"]["clocks.max.sm"] > 0, fp
    assert fp["nvcc"], fp["unavailable"]


def test_search_process_never_initializes_cuda(tmp_path: Path) -> None:
    """A fresh process measures through the worker and still has no CUDA context of its own."""
    problem = Problem(Shape(1, 2, 256, 256, 64), "fp16", causal=False)
    script = textwrap.dedent(f"""
        import sys
        from evotuner.compiler.builder import Builder
        from evotuner.config import KernelConfig
        from evotuner.measure import GpuMeasure, Measurement, gpu_available
        from evotuner.problem import Problem, Shape
        assert gpu_available()
        problem = Problem(Shape(1, 2, 256, 256, 64), "fp16", causal=False)
        config = KernelConfig.parse("BLOCK_M=128,BLOCK_N=64,NUM_WARPS=4,STAGES=2,MIN_BLOCKS=1")
        with Builder("flashcore", cache_dir={str(tmp_path)!r}) as b:
            art = b.build(config, problem).artifact
        with GpuMeasure(timeout_s=60, budget_s=0.1) as gm:
            out = gm.measure(art, problem)
        assert isinstance(out, Measurement), out
        assert "torch" not in sys.modules, "the search process imported torch"
        print("ok", out.median_us)
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith("ok")


def test_racing_in_the_real_worker_stops_a_clearly_slower_config_and_times_a_contender_in_full(
        builder: Builder, gpu: GpuMeasure) -> None:
    """Issue 28: against an incumbent far below its time, the worker stops at an early look
    (16, or 32/64 when the first repetitions are autocorrelated) and says so; against one far
    above, it times the whole budget."""
    from evotuner.measure.racing import Race

    problem = PROBLEMS[0]
    result = builder.build(recommended(problem), problem)
    assert result.ok, result.error
    full = gpu.measure(result.artifact, problem)
    assert isinstance(full, Measurement) and not full.stopped_early and full.planned_repetitions is None
    beaten = gpu.measure(result.artifact, problem, race=Race(full.median_us / 2))
    assert isinstance(beaten, Measurement), beaten
    assert beaten.stopped_early and beaten.repetitions in (16, 32, 64), beaten
    assert beaten.planned_repetitions is not None and beaten.planned_repetitions > beaten.repetitions
    assert beaten.incumbent_us == full.median_us / 2 and beaten.median_us > beaten.incumbent_us * 1.01
    contender = gpu.measure(result.artifact, problem, race=Race(full.median_us * 2))
    assert isinstance(contender, Measurement) and not contender.stopped_early
    assert contender.repetitions == contender.planned_repetitions >= 10
    assert gpu.spawns == 1


def test_a_paired_race_times_the_incumbent_alternately_and_stops_a_slower_config(
        builder: Builder, gpu: GpuMeasure) -> None:
    """--paired-race in the real worker: against its own artifact a config is no slower
    (ratio near 1, timed in full, 64 pairs); a config clearly slower than the incumbent timed
    beside it stops at a look with as many incumbent repetitions as its own, although the
    unpaired rule (incumbent figure far above) would stop nothing."""
    import dataclasses

    from evotuner.config import KernelConfig
    from evotuner.measure.protocol import artifact_wire
    from evotuner.measure.racing import DEFAULT_RULE, PAIRED_MARGIN, Race

    paired = dataclasses.replace(DEFAULT_RULE, paired_margin=PAIRED_MARGIN)
    problem = PROBLEMS[0]
    built = {}
    for text in (str(recommended(problem)), "BLOCK_M=64,BLOCK_N=32,NUM_WARPS=4,STAGES=1,MIN_BLOCKS=1"):
        result = builder.build(KernelConfig.parse(text), problem)
        assert result.ok, result.error
        full = gpu.measure(result.artifact, problem)
        assert isinstance(full, Measurement), full
        built[text] = (full.median_us, result.artifact)
    (fast_us, fast), (slow_us, slow) = sorted(built.values(), key=lambda x: x[0])
    assert slow_us > 1.15 * fast_us, f"the two configs are too close to test with: {built}"

    same = gpu.measure(fast, problem, race=Race(fast_us * 2, paired, artifact_wire(fast), fast_us))
    assert isinstance(same, Measurement) and not same.stopped_early, same
    figures = gpu.last_detail["paired"]
    assert figures["pairs"] == paired.paired_reps and 0.9 < figures["ratio_median"] < 1.1, figures
    assert (same.pairs, same.pair_ratio) == (figures["pairs"], figures["ratio_median"])

    beaten = gpu.measure(slow, problem, race=Race(slow_us * 2, paired, artifact_wire(fast), fast_us))
    assert isinstance(beaten, Measurement) and beaten.stopped_early and beaten.repetitions in (16, 32, 64), beaten
    figures = gpu.last_detail["paired"]
    assert figures["pairs"] == beaten.repetitions and figures["ratio_median"] > 1 + PAIRED_MARGIN, figures
    # its figures are its ratio on the incumbent's recorded scale, never below the incumbent
    assert beaten.median_us == pytest.approx(figures["ratio_median"] * fast_us), (beaten, figures)
    assert (beaten.pairs, beaten.pair_ratio) == (figures["pairs"], figures["ratio_median"])   # what the trial records
    assert beaten.median_us > (1 + PAIRED_MARGIN) * fast_us and figures["raw_median_us"] > 0, figures
    assert gpu.spawns == 1


def test_a_started_worker_answers_the_first_request(tmp_path: Path) -> None:
    """GpuMeasure.start: the worker comes up in the background; the first call reads its init."""
    with GpuMeasure(timeout_s=60.0, budget_s=0.1) as gm:
        gm.start()
        assert gm.worker_pid is not None
        assert gm.device()["name"]
        assert gm.spawns == 1
