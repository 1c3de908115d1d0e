"""Scale: a 1000-trial replayed study, and how the time per trial grows.

The default space has 144 configs, too few for 1000 distinct trials, so this test
writes a 4096-config sweep of its own (tmp_path): a space of four 8-valued
parameters over the FlashCore family, every row ``ok`` with the same recorded
nvcc 13 ptxas report (tests/data/ptxas/nvcc13_clean.log, which the real gate
passes) and a latency that is a smooth function of the parameters plus noise.
Nothing is compiled. The loop (run_search with the default sampler, TPE) runs to
1000 finished trials on a real SQLite file; the wall time of trials 1-100 and
901-1000 is taken from the loop's TrialFinished events.

Measured here (Optuna 5.0, SQLite, 2 cores): ~50 ms per trial at trials 1-100
and ~55-60 ms at 901-1000, ratio ~1.2. The per-trial cost is dominated by the
storage writes of a trial (ask, params, user attrs, build and measurement rows,
tell), which do not grow; TPE's Parzen estimator and RDBStorage's read of all
trials per ask do grow O(n), but stay a small share at 1000 trials. The ratio
uses the median time of the trials in each window that were not duplicates
(a duplicate skips build and measure records and is cheaper), so late
duplicates cannot hide growth; the issue's bound, 2x, is asserted.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from pathlib import Path

import pytest

from evotuner import events as ev
from evotuner.config import KernelConfig
from evotuner.loop import run_search
from evotuner.measure.replay import ReplayMeasure, SweepRow, write_sweep
from evotuner.problem import Problem, Shape
from evotuner.propose import make_sampler
from evotuner.space import parse_space
from evotuner.storage import StudyStore

PTXAS = (Path(__file__).parent / "data" / "ptxas" / "nvcc13_clean.log").read_text()
VALUES = [16, 32, 48, 64, 80, 96, 112, 128]
SPACE = f"""
[space]
name = "scale"
kernel = "flashcore"
arch = "sm_90a"
[params.P0]
values = {VALUES}
[params.P1]
values = {VALUES}
[params.P2]
values = {VALUES}
[params.P3]
values = {VALUES}
[device]
max_smem_per_block = 232448
max_smem_per_sm = 233472
smem_reserved_per_block = 1024
regs_per_sm = 65536
reg_alloc_unit = 8
max_regs_per_thread = 255
max_threads_per_block = 1024
max_threads_per_sm = 2048
[gate]
max_spill_bytes = 0
max_stack_bytes = 0
max_registers = 255
"""
TRIALS = 1000
WINDOW = 100
#: The issue's bound on (time per trial, trials 901-1000) / (trials 1-100).
MAX_RATIO = 2.0


def _latency(config: KernelConfig) -> float:
    h = int.from_bytes(hashlib.sha256(str(config).encode()).digest()[:4], "big") / 2**32
    shape = sum((v - 64) ** 2 for _, v in config) / 1000.0
    return round(100.0 + shape + 5.0 * h, 3)


def _write_sweep(tmp_path: Path, space, problem: Problem) -> Path:
    meta = {"threads": 128, "smem_bytes": 16384, "min_blocks": 1}
    rows = [SweepRow(config=c, status="ok", median_us=_latency(c), tflops=problem.tflops(_latency(c)),
                     max_error=1e-3, tolerance=4e-3, repetitions=10, registers=137, spill_bytes=0,
                     smem_bytes=16896, meta=meta, ptxas_log=PTXAS) for c in space.configs()]
    header = {"problem": problem.as_dict(), "space_fingerprint": space.fingerprint(),
              "device": {"name": "scale test (recorded ptxas, made-up latencies)"},
              "baselines": {"sdpa_flash": 150.0}}
    return write_sweep(tmp_path / "scale.csv", space.names, rows, header)


@pytest.mark.slow
def test_thousand_trial_replay(tmp_path: Path) -> None:
    space = parse_space(SPACE, "scale.toml")
    assert space.size == 4096
    problem = Problem(Shape.parse("B=1,H=1,S=256,D=64"))
    replay = ReplayMeasure(_write_sweep(tmp_path, space, problem), problem, space)
    stamps: dict[int, float] = {}
    duplicates: set[int] = set()

    def on_event(event: object) -> None:
        if isinstance(event, ev.TrialFinished) and event.duplicate_of is not None:
            duplicates.add(len(stamps) + 1)
        if isinstance(event, ev.Progress):
            stamps[event.finished] = time.perf_counter()

    url = f"sqlite:///{tmp_path / 'scale.db'}"
    with StudyStore(url) as store:
        store.create_study("scale", problem, space, sampler_name="tpe", seed=0, source_hash="replay", nvcc_version="none")
        t0 = time.perf_counter()
        result = run_search(store=store, study_name="scale", problem=problem, space=space,
                            sampler=make_sampler("tpe", space, 0), seed=0, trials=TRIALS,
                            builder=replay.builder(jobs=1), measure=replay, on_event=on_event)
        total = time.perf_counter() - t0
        summary = store.summary("scale")
    assert result.outcome == "done" and result.finished == TRIALS
    assert sum(1 for t in summary.trials if t.state == "COMPLETE") == TRIALS
    stamps[0] = t0
    took = {n: stamps[n] - stamps[n - 1] for n in range(1, TRIALS + 1)}

    def window(lo: int, hi: int, fresh: bool) -> float:
        return statistics.median(took[n] for n in range(lo, hi + 1) if not (fresh and n in duplicates))

    first, last = window(1, WINDOW, True), window(TRIALS - WINDOW + 1, TRIALS, True)
    ratio = last / first
    facts = {"total_s": round(total, 1), "first_ms": round(first * 1e3, 1), "last_ms": round(last * 1e3, 1),
             "ratio": round(ratio, 2),
             "ratio_all_trials": round(window(TRIALS - WINDOW + 1, TRIALS, False) / window(1, WINDOW, False), 2),
             "duplicates": len(duplicates), "best_us": summary.best.value}
    print("scale:", json.dumps(facts))
    assert ratio <= MAX_RATIO, facts
