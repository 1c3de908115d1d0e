"""Q_IN_REGS=1 (kernels/hopper/consumer.cuh load_q: S = Q K^T with Q's A fragments in
registers, RS-wgmma over K-major K) on the GPU: FA2's rule on fresh NaN-poisoned outputs, and
the same bits as Q_IN_REGS=0 (the same products in the same order; only where the tensor cores
read Q from changes), at head dims 64, 96 and 128, one and two consumer warpgroups, every
scheduler, cross-tile pipelining, causal, packed grouped-query heads, ragged tiles and packed
variable-length batches. Skips without a GPU.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import evotuner  # noqa: E402
from evotuner.config import KernelConfig  # noqa: E402
from evotuner.problem import Problem, Shape  # noqa: E402
from evotuner.runtime import attention as A  # noqa: E402
from evotuner.runtime import check as C  # noqa: E402
from reference_check import launch_side_by_side  # noqa: E402

pytestmark = pytest.mark.gpu

#: (BLOCK_N, CONSUMER_WGS, REG_CONS, PINGPONG): two warpgroups of 128 columns, one of 64.
WIDE, NARROW = (128, 2, 240, 1), (64, 1, 256, 0)
#: (B, H, HKV, Sq, Sk): ragged both ways, one row, fewer tiles than SMs and many more, GQA 8:2.
SHAPES = ((3, 5, 5, 97, 513), (1, 1, 1, 1, 17), (4, 37, 37, 513, 97), (2, 8, 2, 1000, 777),
          (3, 12, 4, 300, 1500))
#: (D, tile, SCHED, TILE_OVERLAP, causal, dtype): every scheduler, with and without the
#: cross-tile pipeline, at each head dim Q fits in registers beside the accumulators.
CASES = tuple((128, WIDE, *m) for m in ((0, 0, False, "fp16"), (1, 1, False, "bf16"), (2, 1, False, "fp16"),
                                        (2, 0, True, "bf16"), (1, 0, True, "fp16"))) + (
    (128, NARROW, 1, 1, False, "fp16"), (128, NARROW, 0, 0, True, "bf16"),
    (64, WIDE, 1, 1, False, "bf16"), (64, WIDE, 2, 0, True, "fp16"),
    (96, WIDE, 0, 0, False, "fp16"), (96, WIDE, 2, 1, False, "fp16"), (96, WIDE, 1, 0, True, "bf16"))


def _config(tile: tuple[int, int, int, int], sched: int, overlap: int, pack: int, q_regs: int) -> KernelConfig:
    bn, wgs, reg, pp = tile
    return KernelConfig.of(dict(BLOCK_N=bn, CONSUMER_WGS=wgs, STAGES=2, REG_PROD=24, REG_CONS=reg, OVERLAP=1,
                                PINGPONG=pp, SCHED=sched, RESCALE_LOG2=8, EXP_EMU=0, PACK_GQA=pack,
                                TILE_OVERLAP=overlap, Q_IN_REGS=q_regs))


def _builds(case) -> list[tuple[KernelConfig, Problem]]:
    d, tile, sched, overlap, causal, dtype = case
    out = []
    for b, h, hkv, sq, sk in SHAPES:
        problem = Problem(Shape(b, h, sq, sk, d, hkv), dtype, causal)
        pack = int(hkv != h and not causal)
        out += [(_config(tile, sched, overlap, pack, q_regs), problem) for q_regs in (1, 0)]
    return out


@pytest.fixture(scope="module", autouse=True)
def _built_in_parallel():
    """Every build of this file at once (nvcc in parallel), so the tests load from the cache."""
    builder = A._get_builder("hopper")
    futures = [builder.submit(cfg, problem) for case in CASES for cfg, problem in _builds(case)]
    for f in futures:
        f.result()


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"d{c[0]}-wg{c[1][1]}-sched{c[2]}-to{c[3]}-"
                                                      f"{'causal' if c[4] else 'full'}-{c[5]}")
def test_q_in_registers_is_right_and_matches_q_from_shared_memory(case) -> None:
    dev = torch.cuda.current_device()
    d, _, _, _, causal, dtype = case
    pairs = _builds(case)
    for si in range(len(SHAPES)):
        (cfg, problem), (plain_cfg, _) = pairs[2 * si], pairs[2 * si + 1]
        b, h, sq = problem.shape.batch, problem.shape.heads, problem.shape.seqlen_q
        what = f"Q_IN_REGS=1 {cfg} {problem.shape} {dtype} causal={causal}"
        module = A.kernel_module(cfg, problem, dev, family="hopper")
        plain = A.kernel_module(plain_cfg, problem, dev, family="hopper")
        for rep in range(2):
            res = C.check(module.launch, problem, seed=1300 + 10 * si + rep)
            assert res.ok, f"{what} launch {rep + 1}: {res.reason} (max error {res.max_error:.3g})"
            assert res.lse_error is not None and res.lse_error <= res.lse_tolerance, what
        q, k, v = C.make_inputs(problem.shape, dtype, device="cuda", seed=1400 + si)
        outs = launch_side_by_side((module, plain), q, k, v, 1.0 / math.sqrt(d), (b, h, sq))
        assert torch.equal(outs[0][0], outs[1][0]), f"{what}: O differs from Q_IN_REGS=0's"
        assert torch.equal(outs[0][1], outs[1][1]), f"{what}: LSE differs from Q_IN_REGS=0's"


@pytest.mark.parametrize("causal", [False, True])
def test_q_in_registers_on_packed_variable_length_batches(causal: bool) -> None:
    """Lengths 0..4099 mixed, GQA 8:2, through flash_attention_varlen; the same bits as Q_IN_REGS=0."""
    lengths = [0, 1, 7, 129, 1000, 4099, 0, 333]
    cu = torch.tensor([0] + [sum(lengths[:i + 1]) for i in range(len(lengths))], dtype=torch.int32, device="cuda")
    torch.manual_seed(21 + causal)
    total = int(cu[-1])
    q = torch.randn(total, 8, 128, device="cuda", dtype=torch.float16)
    k = torch.randn(total, 2, 128, device="cuda", dtype=torch.float16)
    v = torch.randn(total, 2, 128, device="cuda", dtype=torch.float16)
    outs = []
    for q_regs in (1, 0):
        cfg = (f"BLOCK_N=128,CONSUMER_WGS=2,STAGES=2,REG_PROD=24,REG_CONS=240,OVERLAP=1,PINGPONG=1,SCHED=1,"
               f"RESCALE_LOG2=8,EXP_EMU=0,Q_IN_REGS={q_regs}")
        junk = torch.full_like(q, float("nan"))   # the output's memory comes back poisoned
        del junk
        outs.append(evotuner.flash_attention_varlen(q, k, v, cu, cu, max(lengths), max(lengths), causal=causal,
                                                    config=cfg))
    assert not bool(torch.isnan(outs[0]).any()), "Q_IN_REGS=1 left NaN in a packed batch's output"
    assert torch.equal(outs[0], outs[1]), "packed batch: Q_IN_REGS=1 differs from Q_IN_REGS=0"
    for b, n in enumerate(lengths):   # and right against the fp32 reference, sequence by sequence
        if n == 0:
            continue
        rows = slice(int(cu[b]), int(cu[b + 1]))
        qb, kb, vb = (t[rows].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        kb, vb = kb.repeat_interleave(4, dim=1), vb.repeat_interleave(4, dim=1)
        scale = 1 / math.sqrt(128)
        ref, _ = C.reference(qb, kb, vb, causal, scale)
        tol = C.tolerance(C.torch_low_precision(qb, kb, vb, causal, scale), ref)
        ok, _, reason, _ = C.compare(outs[0][rows].transpose(0, 1).unsqueeze(0), ref, tol)
        assert ok, f"packed sequence {b} (length {n}) causal={causal}: {reason}"
