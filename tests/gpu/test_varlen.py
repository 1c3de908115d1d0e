"""Packed variable-length batches on the GPU: evotuner.flash_attention_varlen against the fp32
reference of each sequence on its own (fresh random inputs, NaN-poisoned output memory, FA2's
tolerance rule per sequence): lengths 1..4099 mixed with empty sequences, causal, Sq != Sk per
sequence, GQA, every scheduler (SCHED 0/1/2), D 64/96/128/256, fp16 and bf16, sequences without
keys, and the LSE.  Skips without a GPU."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import evotuner  # noqa: E402
from evotuner.errors import ShapeError  # noqa: E402
from evotuner.runtime import check as C  # noqa: E402

pytestmark = pytest.mark.gpu

_DT = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _offsets(lengths: list[int]) -> torch.Tensor:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device="cuda")


def _poisoned_empty(shape, dtype):
    """Leave a NaN-filled block of this size in the caching allocator for the call's output."""
    junk = torch.full(shape, float("nan"), dtype=dtype, device="cuda")
    del junk


def _run(lq, lk, H, Hkv, D, causal, dtype="fp16", config=None, seed=0):
    torch.manual_seed(seed)
    dt = _DT[dtype]
    tq, tk = sum(lq), sum(lk)
    q = torch.randn(tq, H, D, device="cuda", dtype=dt)
    k = torch.randn(tk, Hkv, D, device="cuda", dtype=dt)
    v = torch.randn(tk, Hkv, D, device="cuda", dtype=dt)
    cq, ck = _offsets(lq), _offsets(lk)
    _poisoned_empty(q.shape, dt)
    out, lse, choice = evotuner.flash_attention_varlen(q, k, v, cq, ck, max(lq), max(lk), causal=causal,
                                                       config=config, return_lse=True, return_choice=True)
    assert choice.family == "hopper" and "packed" in choice.why
    assert out.shape == q.shape and lse.shape == (H, tq)
    scale = 1 / math.sqrt(D)
    for b, (sq, sk) in enumerate(zip(lq, lk)):
        if sq == 0:
            continue
        rows = slice(int(cq[b]), int(cq[b + 1]))
        o_b, l_b = out[rows].transpose(0, 1).unsqueeze(0), lse[:, rows].unsqueeze(0)
        what = f"seq {b} (Sq={sq}, Sk={sk}) H={H}/{Hkv} D={D} causal={causal} {dtype} config={config}"
        if sk == 0:
            assert bool((o_b == 0).all()), f"{what}: a sequence without keys must give zeros"
            assert bool(torch.isneginf(l_b).all()), f"{what}: its LSE must be -inf"
            continue
        qb = q[rows].transpose(0, 1).unsqueeze(0)
        kb = k[int(ck[b]):int(ck[b + 1])].transpose(0, 1).unsqueeze(0)
        vb = v[int(ck[b]):int(ck[b + 1])].transpose(0, 1).unsqueeze(0)
        ref, ref_lse = C.reference(qb, kb, vb, causal, scale)
        tol = C.tolerance(C.torch_low_precision(qb, kb, vb, causal, scale), ref)
        ok, _, reason, _ = C.compare(o_b, ref, tol)
        assert ok, f"{what}: {reason}"
        lse_tol = C.tolerance(C.lse_low_precision(qb, kb, causal, scale), ref_lse)
        ok, _, reason, _ = C.compare(l_b, ref_lse, lse_tol, what="lse")
        assert ok, f"{what}: {reason}"


MIXED = [0, 1, 7, 64, 129, 1000, 4099, 0, 333, 2048]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 96, 128, 256])
def test_mixed_lengths_with_empty_sequences(D, causal):
    _run(MIXED, MIXED, 4, 4, D, causal, seed=D + causal)


@pytest.mark.parametrize("causal", [False, True])
def test_queries_and_keys_of_other_lengths_and_gqa(causal):
    lq, lk = [5, 300, 77, 1, 2500], [900, 12, 1500, 4099, 2500]
    _run(lq, lk, 8, 2, 128, causal, seed=7)
    _run(lq, lk, 6, 1, 64, causal, dtype="bf16", seed=8)    # MQA, bf16
    _run(lq, lk, 8, 2, 96, causal, dtype="bf16", seed=9)    # D=96 (padded tiles; the direct O store's 12 chunks)
    _run(lq, lk, 6, 1, 96, causal, seed=10)                 # D=96 MQA, fp16


#: Configs whose shared memory fits with every scheduler (SCHED 1, 2 stage O apart from Q).
BY_SCHED = {128: "BLOCK_N=128,CONSUMER_WGS=2,STAGES=2,REG_PROD=24,REG_CONS=240,OVERLAP=1,PINGPONG=1,"
                 "RESCALE_LOG2=8,EXP_EMU=0",
            64: "BLOCK_N=128,CONSUMER_WGS=3,STAGES=2,REG_PROD=32,REG_CONS=160,OVERLAP=1,PINGPONG=1,"
                "RESCALE_LOG2=0,EXP_EMU=0"}


@pytest.mark.parametrize("sched", [0, 1, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_every_scheduler(sched, causal):
    lengths = [3000, 1, 0, 640, 129, 64, 4097]
    _run(lengths, lengths, 4, 4, 128, causal, config=f"{BY_SCHED[128]},SCHED={sched}", seed=sched)
    _run(lengths, lengths, 4, 2, 64, causal, config=f"{BY_SCHED[64]},SCHED={sched}", seed=sched + 9)


def test_sequences_without_keys_and_an_empty_batch():
    _run([5, 70, 3], [0, 100, 0], 2, 2, 128, False, seed=3)
    _run([5, 70, 3], [0, 100, 0], 2, 2, 64, True, seed=4)
    q = torch.randn(0, 2, 64, device="cuda", dtype=torch.float16)
    out = evotuner.flash_attention_varlen(q, q, q, _offsets([0, 0]), _offsets([0, 0]), 0, 0)
    assert out.shape == (0, 2, 64)


def test_fresh_inputs_each_round_and_the_dense_call_agree():
    """One packed batch of equal lengths is the dense problem: same output as flash_attention."""
    for seed in range(3):
        torch.manual_seed(100 + seed)
        B, S, H, D = 3, 515, 4, 128
        q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.float16) for _ in range(3))
        dense = evotuner.flash_attention(q, k, v, causal=True, layout="bshd", family="hopper")
        cu = _offsets([S] * B)
        packed = evotuner.flash_attention_varlen(q.reshape(B * S, H, D), k.reshape(B * S, H, D),
                                                 v.reshape(B * S, H, D), cu, cu, S, S, causal=True)
        assert torch.equal(packed.view(B, S, H, D), dense) or \
            float((packed.view(B, S, H, D).float() - dense.float()).abs().max()) < 2e-3


def test_wrong_inputs_are_refused_with_a_remedy():
    q = torch.randn(10, 4, 128, device="cuda", dtype=torch.float16)
    cu = _offsets([4, 6])
    with pytest.raises(ShapeError, match="int32"):
        evotuner.flash_attention_varlen(q, q, q, cu.long(), cu, 6, 6)
    with pytest.raises(ShapeError, match="batch \\+ 1"):
        evotuner.flash_attention_varlen(q, q, q, cu, _offsets([10]), 6, 10)
    with pytest.raises(ShapeError, match="packed"):
        evotuner.flash_attention_varlen(q.view(1, 10, 4, 128), q, q, cu, cu, 6, 6)
    with pytest.raises(ShapeError, match="head dim"):
        q32 = torch.randn(10, 4, 32, device="cuda", dtype=torch.float16)
        evotuner.flash_attention_varlen(q32, q32, q32, cu, cu, 6, 6)
    with pytest.raises(ShapeError, match="divide"):
        evotuner.flash_attention_varlen(q, q[:, :3], q[:, :3], cu, cu, 6, 6)


def test_offsets_a_caller_got_wrong_give_no_fault_and_leave_later_calls_right():
    """cu_seqlens are not read back (no sync), so wrong ones cannot be refused: offsets past the
    packed tensors, running backwards, starting before row 0, or lengths past max_seqlen_* give
    wrong rows, but no access outside the tensors (a fault would poison the context and fail the
    synchronize and every later call; memcheck: scripts/sanitize_paths.py --only varlen)."""
    import importlib.util
    from pathlib import Path

    where = Path(__file__).resolve().parents[2] / "scripts" / "sanitize_paths.py"
    spec = importlib.util.spec_from_file_location("sanitize_paths", where)
    paths = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(paths)
    lq, lk = [70, 1, 130], [70, 200, 1]
    for causal in (False, True):
        torch.manual_seed(1)
        q = torch.randn(sum(lq), 4, 128, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(sum(lk), 2, 128, device="cuda", dtype=torch.float16) for _ in range(2))
        for cq, ck, max_q, max_k in paths.bad_offsets(_offsets(lq), _offsets(lk), max(lq), max(lk)):
            out = evotuner.flash_attention_varlen(q, k, v, cq, ck, max_q, max_k, causal=causal)
            torch.cuda.synchronize()
            assert out.shape == q.shape
        _run(lq, lk, 4, 2, 128, causal, seed=2)          # the context is whole: a right call is right
