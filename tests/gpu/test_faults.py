"""Fault injection: every planted kernel fault becomes the right MeasureFailure
kind, the worker recovers (a FAULT=0 measure succeeds after each), and no
process is left behind. Builds tests/data/spaces/faults.toml with the real
Builder and measures through the real worker on the GPU."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from evotuner.compiler.builder import Builder
from evotuner.measure import GpuMeasure, Measurement, MeasureFailure
from evotuner.problem import Problem, Shape
from evotuner.space import load_space

pytestmark = pytest.mark.gpu

SPACE = Path(__file__).resolve().parents[1] / "data" / "spaces" / "faults.toml"
PROBLEM = Problem(Shape(1, 4, 512, 512, 64), "fp16", causal=False)
HANG_TIMEOUT_S = 15.0

#: FAULT value -> (failure kind, a phrase the reason must contain, whether the worker is replaced)
EXPECTED = {
    1: ("illegal_access", "illegal", True),
    2: ("timeout", "within", True),
    3: ("nan", "NaN", False),
    4: ("wrong_result", "exceeds the tolerance", False),
    5: ("smem", "shared memory", False),
    6: ("launch", "cuLaunchKernel", False),
}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[int, object]:
    space = load_space(SPACE)
    configs = {c["FAULT"]: c for c in space.configs()}
    assert sorted(configs) == list(range(7))
    with Builder(space.kernel, cache_dir=tmp_path_factory.mktemp("cache")) as builder:
        futures = {fault: builder.submit(config, PROBLEM) for fault, config in configs.items()}
        results = {fault: f.result() for fault, f in futures.items()}
    for fault, result in results.items():
        assert result.ok, f"FAULT={fault}: {result.error}"
    return {fault: r.artifact for fault, r in results.items()}


@pytest.fixture(scope="module")
def gpu() -> GpuMeasure:
    gm = GpuMeasure(timeout_s=HANG_TIMEOUT_S, budget_s=0.1)
    yield gm
    gm.close()


def test_fault_free_config_measures(artifacts: dict, gpu: GpuMeasure) -> None:
    out = gpu.measure(artifacts[0], PROBLEM)
    assert isinstance(out, Measurement), out
    assert out.max_error <= out.tolerance


@pytest.mark.parametrize("fault", sorted(EXPECTED))
def test_fault_becomes_its_kind_and_the_worker_recovers(artifacts: dict, gpu: GpuMeasure, fault: int) -> None:
    kind, phrase, replaced = EXPECTED[fault]
    gpu.ping()
    spawns, pid = gpu.spawns, gpu.worker_pid
    start = time.monotonic()
    out = gpu.measure(artifacts[fault], PROBLEM)
    took = time.monotonic() - start
    assert isinstance(out, MeasureFailure), f"FAULT={fault} measured as {out}"
    assert out.kind == kind, f"FAULT={fault}: {out}"
    assert phrase.lower() in out.reason.lower(), out.reason
    assert took < HANG_TIMEOUT_S + 10
    if replaced:
        assert gpu.worker_pid is None and _gone(pid)
    else:
        assert gpu.worker_pid == pid, "a non-sticky failure must not cost a worker restart"
    after = gpu.measure(artifacts[0], PROBLEM)
    assert isinstance(after, Measurement), f"after FAULT={fault}: {after}"
    assert gpu.spawns == spawns + (1 if replaced else 0)


def test_no_worker_or_zombie_left(artifacts: dict, gpu: GpuMeasure) -> None:
    gpu.close()
    for pid in gpu.spawned_pids:
        assert _gone(pid), pid
    me = os.getpid()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        state, ppid = stat[stat.rindex(")") + 2:].split()[:2]
        assert not (state == "Z" and int(ppid) == me), f"zombie child {entry}"


def _gone(pid: int | None) -> bool:
    if pid is None:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False
