"""CLUSTER=2 on the GPU: CTA pairs along M that share each K/V load (TMA multicast, remote
mbarrier arrivals, kernels/hopper/traits.cuh kCluster).

The pair computes exactly what two unpaired CTAs compute: the same tiles, the same key
blocks in the same order, the same instructions on the same data. So besides the usual
check (fresh random inputs, O and LSE poisoned with NaN, FA2's rule against the fp32
reference) every output of a CLUSTER=2 kernel must equal, bit for bit, the one of the same
config with CLUSTER=1. Shapes: an odd number of query blocks (the last pair's second CTA
has no rows and keeps only its side of the handshakes), one query row, Sq != Sk, ragged key
tails, grouped-query heads, both layouts, more pairs than the SMs hold (the persistent
walk), D 64, 128 and 256, two launches per module. Skips cleanly without a GPU.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from evotuner.config import KernelConfig  # noqa: E402
from evotuner.family import get_family  # noqa: E402
from evotuner.problem import Problem, Shape  # noqa: E402
from evotuner.runtime import attention as A  # noqa: E402
from evotuner.runtime import check as C  # noqa: E402
from paired_space import with_pairs  # noqa: E402

pytestmark = pytest.mark.gpu

HOPPER = get_family("hopper")
#: (B, H, HKV, Sq, Sk): odd query blocks at BLOCK_M 128 (97, 513, 2047 rows), one query row,
#: Sq != Sk both ways, ragged Sk, GQA 4:1 and MQA, and 4*40*8 = 1280 query blocks (more pairs
#: than a persistent grid's 66).
SHAPES = ((3, 5, 5, 97, 513), (1, 3, 3, 2047, 2047), (2, 2, 2, 1, 17), (2, 8, 2, 513, 97),
          (1, 4, 1, 200, 1000), (4, 40, 8, 1024, 1024))


def _config(head_dim: int, sched: int, cluster: int) -> KernelConfig:
    wide = head_dim > 128
    # D=256: an O staging tile (SCHED 1) leaves room for one 64-row K/V stage
    values = dict(BLOCK_N=(64 if sched else 80) if wide else 128, CONSUMER_WGS=2, STAGES=1 if wide and sched else 2,
                  REG_PROD=24, REG_CONS=240, OVERLAP=1, PINGPONG=1, SCHED=sched, RESCALE_LOG2=8, EXP_EMU=0,
                  CLUSTER=cluster)
    if not wide:
        values["CTAS_PER_SM"] = 1
    return KernelConfig.of(values)


def _space(head_dim: int):
    """hopper.toml (D 64, 128) or hopper_wide.toml (D 256) listing CLUSTER [1, 2] (the packaged
    files list [1]: pairs measured slower; a small problem's hopper_split.toml has no pair)."""
    return with_pairs(HOPPER.space_for(Problem(Shape(4, 32, 4096, 4096, head_dim), "fp16", False)))


def _run(module, q, k, v, scale):
    o = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"), dtype=torch.float32, device=q.device)
    module.launch(q, k, v, o, lse, scale)
    torch.cuda.synchronize()
    return o, lse


@pytest.mark.parametrize("sched", [0, 1])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_a_pair_computes_what_two_unpaired_ctas_compute(sched: int, head_dim: int, dtype: str) -> None:
    space = _space(head_dim)
    paired, single = _config(head_dim, sched, 2), _config(head_dim, sched, 1)
    device = torch.cuda.current_device()
    for i, (b, h, hkv, sq, sk) in enumerate(SHAPES):
        problem = Problem(Shape(b, h, sq, sk, head_dim, hkv), dtype, False)
        assert space.violated(paired, problem) is None, (paired, problem)
        mod2 = A.kernel_module(paired, problem, device, family="hopper")
        mod1 = A.kernel_module(single, problem, device, family="hopper")
        for layout in ("bhsd", "bshd"):
            res = C.check(mod2.launch, problem, seed=1100 + 10 * i, layout=layout)
            assert res.ok, f"CLUSTER=2 SCHED={sched} {problem.shape} {dtype} {layout}: {res.reason}"
            assert res.lse_error is not None and res.lse_error <= res.lse_tolerance
        scale = C.default_scale(head_dim)
        q, k, v = C.make_inputs(problem.shape, dtype, seed=1200 + i)
        for rep in range(2):                              # a second launch on the same module
            o2, lse2 = _run(mod2, q, k, v, scale)
            o1, lse1 = _run(mod1, q, k, v, scale)
            assert torch.equal(o2, o1), f"CLUSTER=2 differs from CLUSTER=1 at {problem.shape}, launch {rep + 1}"
            assert torch.equal(lse2, lse1), f"LSE differs at {problem.shape}, launch {rep + 1}"


def test_the_space_offers_pairs_only_where_the_kernel_builds_them() -> None:
    """Causal, packed and SCHED=2 problems never propose CLUSTER=2 (traits.cuh refuses them)."""
    space = _space(128)
    shape = Shape(1, 4, 256, 256, 128)
    assert space.violated(_config(128, 1, 2), Problem(shape, "fp16", True)) is not None
    assert space.violated(_config(128, 2, 2), Problem(shape, "fp16", False)) is not None
    assert space.violated(_config(128, 1, 2), Problem(shape, "fp16", False)) is None
