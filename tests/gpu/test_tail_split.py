"""SCHED=3 (kernels/hopper/tile_scheduler.cuh: SCHED 2 with the last wave's tiles cut into parts
of their key blocks, fp32 partials combined by each tile's last part, split.cuh) on the GPU:
FA2's rule and the LSE on fresh NaN-poisoned outputs, three launches per module (the tile
counter and the per-tile part counters must come back to zero), and the same bits as SCHED=2 in
every row of a tile the plan leaves whole (only the split tiles' arithmetic changes). The
shapes are chosen so that the plan on the GPU's grid (launch.py tail_plan, read back from the
launch's Params) cuts tiles into 2 to 8 parts: one, two and three consumer warpgroups, D 64 and
128, ragged query and key tails, packed grouped-query heads; and two where it cuts none (a last
round more than half full, too few key blocks). Skips without a GPU.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from evotuner.config import KernelConfig  # noqa: E402
from evotuner.kernels.hopper import launch as L  # noqa: E402
from evotuner.kernels.hopper.params import Params  # noqa: E402
from evotuner.problem import Problem, Shape  # noqa: E402
from evotuner.runtime import attention as A  # noqa: E402
from evotuner.runtime import check as C  # noqa: E402
from reference_check import launch_side_by_side  # noqa: E402

pytestmark = pytest.mark.gpu

#: (BLOCK_N, CONSUMER_WGS, REG_PROD, REG_CONS, PINGPONG)
ONE, TWO, THREE = (128, 1, 24, 256, 0), (128, 2, 24, 240, 1), (80, 3, 24, 160, 1)
#: (tile, pack, dtype, (B, H, HKV, Sq, Sk, D)); the parts on an H100's 132 SMs in the comment.
CASES = (
    (ONE, 0, "fp16", (1, 133, 133, 60, 1100, 128)),    # 133 tiles: 1 split in 4 (9 key blocks)
    (TWO, 0, "bf16", (2, 9, 3, 1000, 777, 128)),       # 144 tiles: 12 split in 3; ragged Sq and Sk
    (THREE, 1, "fp16", (3, 9, 3, 1000, 777, 128)),     # packed: 144 tiles of 192 rows, 12 split in 5
    (ONE, 0, "bf16", (1, 140, 140, 64, 2000, 64)),     # D=64: 140 tiles, 8 split in 8
    (TWO, 1, "fp16", (1, 32, 8, 4096, 4096, 128)),     # packed: 1024 tiles, 100 in the last round: none
    (THREE, 0, "fp16", (1, 137, 137, 150, 100, 128)),  # 137 tiles, 2 key blocks: none (a part needs 2)
)


def _config(tile: tuple[int, int, int, int, int], sched: int, pack: int) -> KernelConfig:
    bn, wgs, rp, rc, pp = tile
    return KernelConfig.of(dict(BLOCK_N=bn, CONSUMER_WGS=wgs, STAGES=2, REG_PROD=rp, REG_CONS=rc, OVERLAP=1,
                                PINGPONG=pp, SCHED=sched, RESCALE_LOG2=8, EXP_EMU=0, PACK_GQA=pack))


def _problem(case) -> Problem:
    _, _, dtype, (b, h, hkv, sq, sk, d) = case
    return Problem(Shape(b, h, sq, sk, d, hkv), dtype, False)


@pytest.fixture(scope="module", autouse=True)
def _built_in_parallel():
    """Every build of this file at once (nvcc in parallel), so the tests load from the cache."""
    builder = A._get_builder("hopper")
    futures = [builder.submit(_config(c[0], s, c[1]), _problem(c)) for c in CASES for s in (2, 3)]
    for f in futures:
        f.result()


def _whole_rows(params: Params, meta, b: int, h: int, hkv: int, sq: int, pack: int) -> torch.Tensor:
    """[B, H, Sq] True where the row's tile is whole (below tail_first, in the kernel's tile order:
    m block fastest, then head, then batch; packed: a K/V head's G query heads as G*Sq rows)."""
    bm = meta["block_m"]
    group = h // hkv if pack else 1
    rows = group * sq
    heads = h // group
    tile = torch.arange(b * heads * rows, device="cuda").view(b, heads, rows)
    bb = tile // (heads * rows)
    hh = (tile // rows) % heads
    m = (tile % rows) // bm
    index = (bb * heads + hh) * (-(-rows // bm)) + m
    return (index < params.tail_first).view(b, heads, group, sq).reshape(b, h, sq)


@pytest.mark.parametrize("case", CASES, ids=[f"{c[3]}-wgs{c[0][1]}-pack{c[1]}" for c in CASES])
def test_the_last_wave_split_is_right(case) -> None:
    tile, pack, dtype, (b, h, hkv, sq, sk, d) = case
    dev = torch.cuda.current_device()
    problem = _problem(case)
    cfg = _config(tile, 3, pack)   # (SCHED=3 is not in the searched space: built here by its config)
    module = A.kernel_module(cfg, problem, dev, family="hopper")
    plain = A.kernel_module(_config(tile, 2, pack), problem, dev, family="hopper")
    what = f"SCHED=3 {cfg} {problem.shape} {dtype}"

    # The plan the launch carries is launch.py's on this GPU's grid.
    q, k, v = C.make_inputs(problem.shape, dtype, device="cuda", seed=4100 + d + sq)
    o = torch.empty_like(q)
    lse = torch.empty((b, h, sq), device="cuda", dtype=torch.float32)
    spec = module.launch_spec(q, k, v, o, lse, 1.0 / math.sqrt(d), 1 << 40, 1 << 41)
    params = Params.from_buffer_copy(spec.args[0])
    group = h // hkv if pack else 1
    tiles = -(-(group * sq) // module.meta["block_m"]) * (h // group) * b
    plan = L.tail_plan(tiles, spec.grid[0], -(-sk // module.meta["block_n"]), L.tail_slots(tiles, 1))
    assert (params.tail_first, params.tail_parts) == (plan["first"], plan["parts"]), what
    if module.sm_count == 132 and tiles in (133, 144, 140):
        assert params.tail_parts > 1, f"{what}: the plan splits nothing on 132 SMs ({plan})"

    for rep in range(3):
        res = C.check(module.launch, problem, seed=4200 + 10 * rep + d)
        assert res.ok, f"{what} launch {rep + 1}: {res.reason} (max error {res.max_error:.3g})"
        assert res.lse_error is not None and res.lse_error <= res.lse_tolerance, f"{what} launch {rep + 1}: LSE"

    outs = launch_side_by_side((module, plain), q, k, v, 1.0 / math.sqrt(d), (b, h, sq))
    whole = _whole_rows(params, module.meta, b, h, hkv, sq, pack)
    assert torch.equal(outs[0][0][whole], outs[1][0][whole]), f"{what}: a whole tile's O differs from SCHED=2's"
    assert torch.equal(outs[0][1][whole], outs[1][1][whole]), f"{what}: a whole tile's LSE differs from SCHED=2's"
    assert not torch.isnan(outs[0][0]).any() and not torch.isnan(outs[0][1]).any(), f"{what}: a row left unwritten"
    if params.tail_parts == 1:
        assert bool(whole.all()), what
