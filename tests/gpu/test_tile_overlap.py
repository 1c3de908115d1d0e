"""TILE_OVERLAP=1 (kernels/hopper/tile_overlap.cuh: Q double-buffered, the next tile's first
QK^T under this tile's O store) on the GPU: FA2's rule on fresh NaN-poisoned outputs, and
the same bits as TILE_OVERLAP=0 (the arithmetic is the same, only the order of the tiles'
boundaries moves), for one, two and three consumer warpgroups, both persistent schedulers,
ragged tiles (warpgroups with no rows), fewer tiles than CTAs and many more, packed
grouped-query heads, and two launches per module (SCHED=2's counter). Skips without a GPU.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from evotuner.config import KernelConfig  # noqa: E402
from evotuner.family import get_family  # noqa: E402
from evotuner.problem import Problem, Shape  # noqa: E402
from evotuner.runtime import attention as A  # noqa: E402
from evotuner.runtime import check as C  # noqa: E402
from evotuner.space import load_space  # noqa: E402
from reference_check import launch_side_by_side  # noqa: E402

pytestmark = pytest.mark.gpu

HOPPER = get_family("hopper")
SPACE = load_space(HOPPER.default_space())

#: (BLOCK_N, CONSUMER_WGS, REG_CONS, PINGPONG) at D=64 / D=128: the [d128] and [d64] tiles,
#: two warpgroups of 128 columns, one warpgroup (no ping-pong).
TILES = {64: ((128, 3, 160, 1), (128, 2, 240, 1), (128, 1, 256, 0)),
         128: ((80, 3, 160, 1), (128, 2, 240, 1), (64, 1, 256, 0))}
#: (B, H, HKV, Sq, Sk): ragged both ways, one row, fewer tiles than SMs and many more, GQA 8:2.
SHAPES = ((3, 5, 5, 97, 513), (2, 3, 3, 2047, 2047), (1, 1, 1, 1, 17), (4, 37, 37, 513, 97),
          (2, 8, 2, 1000, 777), (1, 4, 1, 4096, 129), (3, 12, 4, 300, 1500))


def _config(head_dim: int, tile: tuple[int, int, int, int], sched: int, overlap: int, pack: int) -> KernelConfig:
    bn, wgs, reg, pp = tile
    return KernelConfig.of(dict(BLOCK_N=bn, CONSUMER_WGS=wgs, STAGES=2, REG_PROD=24, REG_CONS=reg, OVERLAP=1,
                                PINGPONG=pp, SCHED=sched, RESCALE_LOG2=8, EXP_EMU=0, PACK_GQA=pack,
                                TILE_OVERLAP=overlap))


@pytest.mark.parametrize(("sched", "dtype"), [(1, "fp16"), (2, "bf16")])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("pack", [0, 1])
def test_tile_overlap_is_right_and_matches_the_plain_kernel(sched: int, dtype: str, head_dim: int, pack: int) -> None:
    dev = torch.cuda.current_device()
    for ti, tile in enumerate(TILES[head_dim]):
        for si, (b, h, hkv, sq, sk) in enumerate(SHAPES):
            if pack and hkv == h:
                continue   # PACK_GQA=1: the grouped shapes only (the space rejects it elsewhere)
            problem = Problem(Shape(b, h, sq, sk, head_dim, hkv), dtype, False)
            cfg = _config(head_dim, tile, sched, 1, pack)
            assert SPACE.violated(cfg, problem) is None, cfg
            what = f"TILE_OVERLAP=1 {cfg} {problem.shape} {dtype}"
            module = A.kernel_module(cfg, problem, dev, family="hopper")
            plain = A.kernel_module(_config(head_dim, tile, sched, 0, pack), problem, dev, family="hopper")
            for rep in range(2):
                res = C.check(module.launch, problem, seed=1100 + 100 * ti + 10 * si + rep)
                assert res.ok, f"{what} launch {rep + 1}: {res.reason} (max error {res.max_error:.3g})"
                assert res.lse_error is not None and res.lse_error <= res.lse_tolerance, what
            q, k, v = C.make_inputs(problem.shape, dtype, device="cuda", seed=1200 + si)
            outs = launch_side_by_side((module, plain), q, k, v, 1.0 / math.sqrt(head_dim), (b, h, sq))
            assert torch.equal(outs[0][0], outs[1][0]), f"{what}: O differs from TILE_OVERLAP=0's"
            assert torch.equal(outs[0][1], outs[1][1]), f"{what}: LSE differs from TILE_OVERLAP=0's"
