"""Grouped-query and multi-query attention on the GPU through evotuner.flash_attention: k/v
with fewer heads than q (group sizes 1, 2, 4, 8 and MQA), both families, both layouts,
causal, Sq != Sk and ragged lengths, against the fp32 reference on fresh random inputs with
NaN-poisoned outputs checked by FA2's rule (evotuner.runtime.check).  Skips without a GPU."""

from __future__ import annotations

import itertools
import math

import pytest

torch = pytest.importorskip("torch")

import evotuner  # noqa: E402
from evotuner.problem import Problem, Shape  # noqa: E402
from evotuner.runtime import attention as A  # noqa: E402
from evotuner.runtime import check as C  # noqa: E402

pytestmark = pytest.mark.gpu

#: (H query heads, HKV key/value heads): MHA, groups of 2, 4 and 8, MQA.
HEADS = ((4, 4), (8, 4), (8, 2), (16, 2), (6, 1))
#: (Sq, Sk): ragged tails, one query row, Sq > Sk, Sq < Sk.
LENGTHS = ((97, 97), (1, 513), (513, 200), (200, 1031), (1031, 1031))


def _run_check(family, layout, causal, H, Hkv, Sq, Sk, D, dtype="fp16"):
    shape = Shape(2, H, Sq, Sk, D, Hkv)
    q, k, v = C.make_inputs(shape, dtype, layout=layout, seed=H * 1000 + Sq)
    t = (lambda x: x.transpose(1, 2)) if layout == "bshd" else (lambda x: x)
    out, lse, choice = evotuner.flash_attention(t(q), t(k), t(v), causal=causal, layout=layout, family=family,
                                                return_lse=True, return_choice=True)
    assert choice.family == family
    scale = 1 / math.sqrt(D)
    ref, ref_lse = C.reference(q, k, v, causal, scale)
    tol = C.tolerance(C.torch_low_precision(q, k, v, causal, scale), ref)
    ok, err, reason, _ = C.compare(t(out), ref, tol)
    assert ok, f"{family} {layout} causal={causal} {shape}: {reason}"
    lse_tol = C.tolerance(C.lse_low_precision(q, k, causal, scale), ref_lse)
    ok, _, reason, _ = C.compare(lse, ref_lse, lse_tol, what="lse")
    assert ok, f"{family} {layout} causal={causal} {shape}: {reason}"


@pytest.mark.parametrize("family", ["hopper", "flashcore"])
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"H{h[0]}-HKV{h[1]}")
def test_gqa_matrix(family, heads):
    H, Hkv = heads
    for (Sq, Sk), causal, layout, D in itertools.product(LENGTHS, (False, True), ("bhsd", "bshd"), (64, 128)):
        _run_check(family, layout, causal, H, Hkv, Sq, Sk, D)


def test_gqa_bf16_and_the_sdpa_call_a_user_would_make():
    q = torch.randn(1, 32, 777, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, 8, 777, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out = evotuner.flash_attention(q, k, v, causal=True)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    ref, _ = C.reference(q, k, v, True, 1 / math.sqrt(128))
    tol = C.tolerance(C.torch_low_precision(q, k, v, True, 1 / math.sqrt(128)), ref)
    assert float((out.float() - ref).abs().max()) <= tol
    assert float((out.float() - sdpa.float()).abs().max()) <= tol + float((sdpa.float() - ref).abs().max())


def test_gqa_through_the_measure_stages_check():
    """The GPU worker's correctness check on a GQA problem (what a search's trial runs)."""
    problem = Problem(Shape(1, 16, 300, 300, 64, 4), "fp16", True)
    cfg = A.choose(problem, family="hopper").config
    run = A.kernel_module(cfg, problem, torch.cuda.current_device(), family="hopper").launch
    for seed in range(3):
        res = C.check(run, problem, seed=seed)
        assert res.ok, res.reason


@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
def test_packed_query_heads_at_every_head_dim(head_dim):
    """Non-causal grouped heads run with PACK_GQA=1 (the recommended configs pack a K/V head's
    query heads into one head of G*Sq rows where the layout allows): groups of 2, 4 and 8 and
    MQA, ragged lengths, both layouts (bshd cannot be packed and runs unpacked)."""
    problem = Problem(Shape(2, 8, 97, 97, head_dim, 2), "fp16", False)
    assert A.choose(problem, family="hopper").config.as_dict().get("PACK_GQA") == 1
    for (H, Hkv), (Sq, Sk), layout in itertools.product(((8, 4), (8, 2), (16, 2), (6, 1)), ((97, 97), (513, 200),
                                                                                        (200, 1031)),
                                                        ("bhsd", "bshd")):
        _run_check("hopper", layout, False, H, Hkv, Sq, Sk, head_dim)
