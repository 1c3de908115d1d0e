"""The hopper cost model on big packed batches: the guided sampler costs every feasible config
of the space before its first proposal, so a batch of thousands of sequences must cost a config
without an array of every tile (65535 sequences at 32 heads: 10^9 tiles) and without walking
every sequence again for each config (a 256-sequence search spent 90 s there)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from evotuner.kernels.hopper import cost
from evotuner.problem import Problem

CONFIG = {"BLOCK_N": 128, "CONSUMER_WGS": 2, "STAGES": 2, "REG_PROD": 24, "REG_CONS": 240, "OVERLAP": 1,
          "PINGPONG": 1, "SCHED": 2, "RESCALE_LOG2": 8, "EXP_EMU": 0}


def _batch(n: int, causal: bool = True, seed: int = 0) -> Problem:
    rnd = random.Random(seed)
    return Problem.packed([rnd.randint(1, 8192) for _ in range(n)], heads=32, head_dim=128, heads_kv=8,
                          causal=causal)


@pytest.mark.parametrize("sched", [1, 2])
def test_a_huge_batch_is_costed_in_closed_form_without_an_array_of_its_tiles(sched, monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("an array of every tile was built")
    monkeypatch.setattr(cost, "_packed_makespan", refuse)
    estimate = cost.estimate_us({**CONFIG, "SCHED": sched}, _batch(65535))
    assert np.isfinite(estimate) and estimate > 0


def test_the_batch_is_walked_once_per_tile_geometry_not_once_per_config():
    cost._batch_tile_shapes.cache_clear()
    problem = _batch(2048)
    for reg_prod, pingpong, stages in [(24, 0, 2), (32, 1, 2), (24, 1, 3)]:   # one geometry: BLOCK_N, 2 WGs
        cost.estimate_us({**CONFIG, "REG_PROD": reg_prod, "PINGPONG": pingpong, "STAGES": stages}, problem)
    info = cost._batch_tile_shapes.cache_info()
    assert (info.misses, info.hits) == (1, 2)


@pytest.mark.parametrize("causal", [False, True])
def test_the_closed_form_is_the_makespan_the_tiles_give(causal):
    """Past EXACT_TILES tiles handed out dynamically, the tile-by-tile form is the same closed form."""
    problem = _batch(48, causal=causal, seed=3)
    estimate = cost.estimate_us(CONFIG, problem)
    block_m, n = 128, CONFIG["BLOCK_N"]
    per_seq = tuple(tuple(cost._tile(CONFIG, 128, rows, blocks, True, 1, 1)
                          for rows, blocks in cost._tile_shapes(q, k, block_m, n, causal, 1))
                    for q, k in problem.sequences())
    assert len(problem.sequences()) * max(map(len, per_seq)) * 32 > cost.EXACT_TILES
    clocks = cost._packed_makespan(per_seq, 32, causal, cost.SMS, False)
    kv_floor = 2 * sum(problem.lengths_k) * 8 * 128 * 2 / cost.HBM_BYTES_PER_CLK
    assert estimate == pytest.approx(max(clocks, kv_floor) / (cost.CLOCK_GHZ * 1e3), rel=1e-9)
