"""Split-KV on the GPU (the hopper family's SPLITS knob): evotuner.flash_attention with
SPLITS > 1 against the fp32 reference (fresh random inputs, NaN-poisoned output memory,
FA2's tolerance rule, the LSE): decoding shapes (Sq 1..16 against long keys, MHA and GQA),
splits that do not divide the key blocks and more splits than key blocks (empty shares),
causal with split, one and two consumer warpgroups, two CTAs per SM, D 64/128, fp16 and bf16, repeated
calls (the per-tile counters must be back at zero after every launch) and CUDA-graph
replay; GQA query-head packing (PACK_GQA) with and without split, both layouts (bshd with
several rows cannot be packed and runs unpacked). Skips without a GPU."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import evotuner  # noqa: E402
from evotuner.runtime import check as C  # noqa: E402

pytestmark = pytest.mark.gpu

_DT = {"fp16": torch.float16, "bf16": torch.bfloat16}

#: One and two consumer warpgroups (64- and 128-row tiles), both SCHED 0 as split needs.
ONE_WG = dict(BLOCK_N=128, CONSUMER_WGS=1, STAGES=2, REG_PROD=24, REG_CONS=256, OVERLAP=1, PINGPONG=0, SCHED=0,
              RESCALE_LOG2=0, EXP_EMU=0)
TWO_WG = dict(BLOCK_N=128, CONSUMER_WGS=2, STAGES=2, REG_PROD=24, REG_CONS=240, OVERLAP=1, PINGPONG=1, SCHED=0,
              RESCALE_LOG2=0, EXP_EMU=0)


def _check(B, H, Hkv, Sq, Sk, D, causal, config, dtype="fp16", seed=0, calls=1, layout="bhsd"):
    torch.manual_seed(seed)
    dt = _DT[dtype]
    q = torch.randn(B, H, Sq, D, device="cuda", dtype=dt)
    k = torch.randn(B, Hkv, Sk, D, device="cuda", dtype=dt)
    v = torch.randn(B, Hkv, Sk, D, device="cuda", dtype=dt)
    if layout == "bshd":   # the same values, laid out [B, S, H, D]: the call gets views in bhsd order back
        q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    scale = 1 / math.sqrt(D)
    ref, ref_lse = C.reference(q, k, v, causal, scale)
    tol = C.tolerance(C.torch_low_precision(q, k, v, causal, scale), ref)
    lse_tol = C.tolerance(C.lse_low_precision(q, k, causal, scale), ref_lse)
    what = f"B={B} H={H}/{Hkv} Sq={Sq} Sk={Sk} D={D} causal={causal} {dtype} config={config}"
    for call in range(calls):
        junk = torch.full((B, H, Sq, D), float("nan"), dtype=dt, device="cuda")
        del junk   # the output's block comes back NaN-filled from the caching allocator
        if layout == "bshd":
            out, lse, choice = evotuner.flash_attention(*(x.transpose(1, 2) for x in (q, k, v)), causal=causal,
                                                        config=config, return_lse=True, return_choice=True,
                                                        layout="bshd")
            out = out.transpose(1, 2)
        else:
            out, lse, choice = evotuner.flash_attention(q, k, v, causal=causal, config=config, return_lse=True,
                                                        return_choice=True)
        assert choice.family == "hopper" and choice.config["SPLITS"] == config["SPLITS"]
        ok, _, reason, _ = C.compare(out, ref, tol)
        assert ok, f"{what} call {call}: {reason}"
        ok, _, reason, _ = C.compare(lse, ref_lse, lse_tol, what="lse")
        assert ok, f"{what} call {call}: {reason}"


@pytest.mark.parametrize("Sq", [1, 4, 16])
@pytest.mark.parametrize("Hkv", [8, 1])          # MHA and MQA-like 8:1 grouping
def test_decode_shapes(Sq, Hkv):
    _check(2, 8, Hkv, Sq, 4096 + 77, 128, False, {**ONE_WG, "SPLITS": 8}, seed=Sq * 10 + Hkv, calls=2)


@pytest.mark.parametrize("splits", [2, 3, 6, 32])
def test_splits_that_do_not_divide_the_key_blocks(splits):
    # Sk = 1000: 8 key blocks of 128 (the last one ragged); 32 splits leave 24 shares empty.
    _check(1, 4, 4, 33, 1000, 64, False, {**ONE_WG, "SPLITS": splits}, seed=splits)


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("config", [ONE_WG, TWO_WG], ids=["1wg", "2wg"])
def test_causal_with_split(D, config):
    # Square causal: shares of the lower m blocks lie wholly above the diagonal for some
    # warpgroups (all their blocks skipped); a ragged Sq leaves a warpgroup past the end.
    _check(2, 4, 2, 700, 700, D, True, {**config, "SPLITS": 4}, seed=D)


#: Two 64-row CTAs per SM (the split space's CTAS_PER_SM=2; [d64.causal.mid] at few rows):
#: split shares of both CTAs on an SM count and combine through the same scratch.
TWO_CTAS = {**ONE_WG, "CTAS_PER_SM": 2, "REG_CONS": 232}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("splits", [1, 3])
def test_two_ctas_per_sm_with_split(causal, splits):
    _check(2, 4, 2, 700, 1500 if not causal else 700, 64, causal, {**TWO_CTAS, "SPLITS": splits}, seed=splits,
           calls=2)
    _check(2, 8, 2, 16, 4096 + 77, 64, causal, {**TWO_CTAS, "SPLITS": 4 * splits}, seed=splits + 1)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_long_keys(dtype):
    _check(1, 4, 1, 1, 131072, 128, False, {**ONE_WG, "SPLITS": 32}, dtype=dtype, seed=3)


def test_non_split_and_split_agree_and_counters_reset():
    # Many calls in a row: a counter left non-zero would make a later launch combine too
    # early (wrong output) or never (O never written: the NaN poison shows).
    _check(4, 8, 2, 5, 3000, 128, False, {**TWO_WG, "SPLITS": 4}, seed=11, calls=5)


def test_cuda_graph_replay_equals_eager():
    torch.manual_seed(5)
    q = torch.randn(1, 8, 1, 128, device="cuda", dtype=torch.float16)
    k = torch.randn(1, 8, 8192, 128, device="cuda", dtype=torch.float16)
    v = torch.randn_like(k)
    cfg = {**ONE_WG, "SPLITS": 16}
    eager = evotuner.flash_attention(q, k, v, config=cfg)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = evotuner.flash_attention(q, k, v, config=cfg)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("Sq", [1, 5, 16])
@pytest.mark.parametrize("splits", [1, 8])
def test_query_head_packing(Sq, splits, layout):
    # 32 query heads on 4 K/V heads: 8 x Sq rows per packed head (128 at Sq=16: two 64-row tiles)
    _check(2, 32, 4, Sq, 2000, 128, False, {**ONE_WG, "SPLITS": splits, "PACK_GQA": 1}, seed=Sq + splits,
           layout=layout, calls=2)


@pytest.mark.parametrize("D", [64, 128])
def test_packing_with_two_warpgroups_and_causal_fallback(D):
    _check(1, 16, 2, 9, 777, D, False, {**TWO_WG, "SPLITS": 4, "PACK_GQA": 1}, seed=D)
    _check(1, 16, 2, 9, 777, D, True, {**TWO_WG, "SPLITS": 4, "PACK_GQA": 1}, seed=D + 1)   # unpacked: causal


def test_one_config_across_shapes_keeps_its_counters_at_zero():
    # The kernel lays its scratch out by the launch sizes: a buffer one shape used holds its
    # partials where another shape keeps counters. Each shape must get its own zeroed
    # scratch (a shared one made the B=16 decode bench's 2-split packed config wrong on the H100).
    cfg = {**ONE_WG, "SPLITS": 2, "PACK_GQA": 1}
    for Sq, Sk in ((16, 1000), (1, 1000), (16, 1100), (1, 1000)):
        _check(16, 32, 4, Sq, Sk, 128, False, cfg, seed=Sq * 100 + Sk)
