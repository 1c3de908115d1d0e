"""The hopper family at head dims 192 and 256 on the GPU: the recommended config and other
configs the gate passes, against the fp32 reference on fresh random inputs (NaN-poisoned
output and LSE, FA2's rule): ragged lengths, Sq != Sk, causal, both layouts, bf16, GQA, and
every scheduler that fits. Skips without a GPU."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")

from evotuner.config import KernelConfig  # noqa: E402
from evotuner.family import get_family  # noqa: E402
from evotuner.problem import Problem, Shape  # noqa: E402
from evotuner.runtime import attention as A  # noqa: E402
from evotuner.runtime import check as C  # noqa: E402

pytestmark = pytest.mark.gpu

HOPPER = get_family("hopper")
BASE = dict(CONSUMER_WGS=2, STAGES=2, REG_PROD=24, REG_CONS=240, OVERLAP=1, PINGPONG=1, RESCALE_LOG2=8, EXP_EMU=0)
#: (D, config overrides): each D's recommended config, then the other shapes of tile the space leaves.
CONFIGS = [
    (192, None), (192, dict(BLOCK_N=64, SCHED=2)), (192, dict(BLOCK_N=96, OVERLAP=0, PINGPONG=0, SCHED=0)),
    (192, dict(BLOCK_N=64, CONSUMER_WGS=1, REG_CONS=256, PINGPONG=0, SCHED=1, RESCALE_LOG2=0)),
    (256, None), (256, dict(BLOCK_N=80, SCHED=0)), (256, dict(BLOCK_N=64, OVERLAP=0, PINGPONG=0, SCHED=0)),
    (256, dict(BLOCK_N=64, CONSUMER_WGS=1, REG_CONS=256, PINGPONG=0, SCHED=2, STAGES=1)),
]
CASES = [((1, 3), 97, 97), ((2, 2), 1, 513), ((1, 4), 513, 200), ((1, 2), 200, 1031), ((1, 2), 1100, 1100)]


def _config(d, overrides):
    if overrides is None:
        return None
    return KernelConfig.of({**BASE, **overrides})


@pytest.mark.parametrize("d, overrides", CONFIGS, ids=[f"D{d}-{i}" for i, (d, _) in enumerate(CONFIGS)])
def test_wide_head_dims(d, overrides):
    cfg = _config(d, overrides)
    for ((B, H), Sq, Sk), causal, dtype, layout in itertools.product(CASES, (False, True), ("fp16", "bf16"),
                                                                      ("bhsd", "bshd")):
        problem = Problem(Shape(B, H, Sq, Sk, d), dtype, causal)
        chosen = cfg or HOPPER.recommended_configs(problem)[0]
        run = A.kernel_module(chosen, problem, torch.cuda.current_device(), family="hopper").launch
        res = C.check(run, problem, seed=Sq + Sk + causal, layout=layout)
        assert res.ok, f"D={d} {chosen} {problem} {layout}: {res.reason}"


@pytest.mark.parametrize("d", [192, 256])
def test_wide_head_dims_through_flash_attention_with_gqa(d):
    import math

    q = torch.randn(2, 8, 333, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 2, 555, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out, lse, choice = A.flash_attention(q, k, v, causal=True, return_lse=True, return_choice=True)
    assert choice.family == "hopper", choice
    ref, ref_lse = C.reference(q, k, v, True, 1 / math.sqrt(d))
    tol = C.tolerance(C.torch_low_precision(q, k, v, True, 1 / math.sqrt(d)), ref)
    assert float((out.float() - ref).abs().max()) <= tol
    assert torch.allclose(lse, ref_lse, atol=1e-3)
