"""The hopper family at head dim 96 on the GPU (issue #24: tiles padded to D=128's two
128B-swizzle panels, columns 96..127 zero-filled by TMA, QK^T over six k16 steps, PV with
wgmma N=96): the recommended config and other configs the gate passes (every scheduler,
OVERLAP 0, one warpgroup, two CTAs per SM, split-KV, query-head packing), against the fp32 reference on fresh
random inputs with NaN-poisoned output and LSE (FA2's rule): fp16 and bf16, causal and not,
Sq != Sk with ragged tails, GQA (group 4) and MQA, both layouts, and flash_attention's
routing. Packed varlen batches at D=96: tests/gpu/test_varlen.py. Skips without a GPU."""

from __future__ import annotations

import itertools
import math

import pytest

torch = pytest.importorskip("torch")

import evotuner  # noqa: E402
from evotuner.config import KernelConfig  # noqa: E402
from evotuner.family import get_family  # noqa: E402
from evotuner.problem import Problem, Shape  # noqa: E402
from evotuner.runtime import attention as A  # noqa: E402
from evotuner.runtime import check as C  # noqa: E402

pytestmark = pytest.mark.gpu

HOPPER = get_family("hopper")
D = 96
BASE = dict(BLOCK_N=128, CONSUMER_WGS=2, STAGES=2, REG_PROD=24, REG_CONS=240, OVERLAP=1, PINGPONG=1, SCHED=0,
            RESCALE_LOG2=8, EXP_EMU=0)
ONE_WG = dict(BASE, CONSUMER_WGS=1, REG_CONS=256, PINGPONG=0)
#: Config overrides (None: the recommended config of each problem).
CONFIGS = [
    None,
    dict(SCHED=1), dict(SCHED=2),                                                     # persistent schedulers
    dict(BLOCK_N=80, CONSUMER_WGS=3, REG_CONS=160, SCHED=2),                          # [d96]'s tile, explicit
    dict(BLOCK_N=176, OVERLAP=0, PINGPONG=0),                                         # wide K/V tile, no overlap
    dict(ONE_WG, STAGES=3, RESCALE_LOG2=0),                                           # [d96.short]'s shape
    dict(ONE_WG, BLOCK_N=64, REG_CONS=232, CTAS_PER_SM=2, SCHED=2),                   # two CTAs per SM
]
#: ((B, H, Hkv), Sq, Sk): ragged tails both ways, Sq != Sk, GQA group 4, MQA, one row.
CASES = [((1, 4, 4), 77, 131), ((2, 4, 1), 65, 33), ((1, 8, 2), 97, 513), ((2, 2, 2), 1, 200),
         ((1, 4, 1), 300, 300), ((1, 2, 2), 1100, 1031)]


def _config(overrides):
    return None if overrides is None else KernelConfig.of({**BASE, **overrides})


@pytest.mark.parametrize("overrides", CONFIGS, ids=[f"cfg{i}" for i in range(len(CONFIGS))])
def test_d96_matrix(overrides):
    cfg = _config(overrides)
    for ((B, H, Hkv), Sq, Sk), causal, dtype, layout in itertools.product(CASES, (False, True), ("fp16", "bf16"),
                                                                          ("bhsd", "bshd")):
        problem = Problem(Shape(B, H, Sq, Sk, D, Hkv), dtype, causal)
        chosen = cfg or HOPPER.recommended_configs(problem)[0]
        run = A.kernel_module(chosen, problem, torch.cuda.current_device(), family="hopper").launch
        res = C.check(run, problem, seed=Sq + Sk + causal + H, layout=layout)
        assert res.ok, f"D=96 {chosen} {problem} {layout}: {res.reason}"


def _call(B, H, Hkv, Sq, Sk, causal, dtype, config=None, seed=0):
    """flash_attention on fresh inputs (NaN-poisoned output block), checked with its LSE."""
    torch.manual_seed(seed)
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    q = torch.randn(B, H, Sq, D, device="cuda", dtype=dt)
    k, v = (torch.randn(B, Hkv, Sk, D, device="cuda", dtype=dt) for _ in range(2))
    scale = 1 / math.sqrt(D)
    junk = torch.full((B, H, Sq, D), float("nan"), dtype=dt, device="cuda")
    del junk   # the output's block comes back NaN-filled from the caching allocator
    out, lse, choice = evotuner.flash_attention(q, k, v, causal=causal, config=config, return_lse=True,
                                                return_choice=True)
    assert choice.family == "hopper", choice
    ref, ref_lse = C.reference(q, k, v, causal, scale)
    what = f"B={B} H={H}/{Hkv} Sq={Sq} Sk={Sk} D=96 causal={causal} {dtype} config={config}"
    ok, _, reason, _ = C.compare(out, ref, C.tolerance(C.torch_low_precision(q, k, v, causal, scale), ref))
    assert ok, f"{what}: {reason}"
    ok, _, reason, _ = C.compare(lse, ref_lse, C.tolerance(C.lse_low_precision(q, k, causal, scale), ref_lse),
                                 what="lse")
    assert ok, f"{what}: {reason}"
    return choice


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_d96_routes_to_hopper_with_gqa_and_mqa(dtype, causal):
    _call(2, 8, 2, 333, 555, causal, dtype, seed=1)                         # GQA group 4
    _call(1, 6, 1, 77, 131, causal, dtype, seed=2)                          # MQA
    _call(4, 16, 16, 2048, 2048, causal, dtype, seed=3)                     # a [d96.mid] / [d96.causal.mid] size


#: Split-KV and query-head packing at D=96 (SCHED 0; no space offers them at D=96 yet, the
#: kernel builds them): the combine's 3 columns per lane (split.cuh) and empty shares.
SPLIT = [
    (1, 4, 4, 3, 1000, False, dict(ONE_WG, SPLITS=3)),          # 8 key blocks over 3 splits
    (1, 2, 2, 1, 300, False, dict(ONE_WG, SPLITS=8)),           # 3 blocks, 8 splits: 5 empty
    (1, 2, 1, 150, 150, True, dict(BASE, SPLITS=4)),            # causal with split
    (2, 8, 2, 5, 700, False, dict(ONE_WG, PACK_GQA=1)),         # packed heads
    (1, 8, 1, 16, 900, False, dict(ONE_WG, SPLITS=4, PACK_GQA=1)),
]


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("case", SPLIT, ids=[f"split{i}" for i in range(len(SPLIT))])
def test_d96_split_kv_and_packed_heads(case, dtype):
    B, H, Hkv, Sq, Sk, causal, config = case
    for call in range(2):   # the per-tile counters must be back at zero after a launch
        _call(B, H, Hkv, Sq, Sk, causal, dtype, config={**config, "RESCALE_LOG2": 0}, seed=call)
