"""FlashCore on the GPU: the issue's correctness matrix, the public function,
every gated config of the default space, LSE and masking edge cases.

Every check draws fresh random inputs, poisons the output and LSE with NaN and
applies FA2's rule (evotuner.runtime.check). Skips cleanly without a GPU.
"""

from __future__ import annotations

import itertools
import math

import pytest

torch = pytest.importorskip("torch")

from evotuner.problem import Problem, Shape  # noqa: E402
from evotuner.runtime import attention as A  # noqa: E402
from evotuner.runtime import check as C  # noqa: E402

pytestmark = pytest.mark.gpu

SEQLENS = (1, 17, 97, 128, 200, 513, 1024, 2047)
DTYPES = ("fp16", "bf16")
LAYOUTS = ("bhsd", "bshd")
#: Sq != Sk pairs: one query row, ragged tails on both sides, Sq > Sk (rows past Sk under causal).
CROSS = ((1, 513), (17, 2047), (128, 97), (513, 200), (1024, 17), (200, 1), (97, 1024))


def _head_dims() -> tuple[int, ...]:
    dims = A.supported_head_dims()
    assert 64 in dims and 128 in dims, f"the kernel must support D=64 and D=128, defaults cover {dims}"
    return dims


def _batch_heads(sq: int, sk: int) -> tuple[int, int]:
    # odd B*H on small shapes; fewer heads where the fp32 reference gets large
    return (3, 5) if sq * sk <= 513 * 513 else (1, 3)


def _default_runner(problem: Problem):
    cfg = A.default_config(problem.shape.head_dim, problem.dtype, problem.causal)
    return A.kernel_module(cfg, problem, torch.cuda.current_device()).launch


def _assert_ok(res: C.CheckResult, what: str) -> None:
    assert res.ok, f"{what}: {res.reason} (max error {res.max_error:.3g}, tolerance {res.tolerance:.3g})"
    assert res.lse_error is not None and res.lse_error <= res.lse_tolerance


# --------------------------------------------------------------------------- the matrix

@pytest.mark.parametrize("head_dim", [64, 128, 32, 96, 256])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_seqlen_matrix(head_dim: int, dtype: str, causal: bool) -> None:
    if head_dim not in _head_dims():
        pytest.skip(f"the kernel's defaults do not cover D={head_dim}")
    for i, (s, layout) in enumerate(itertools.product(SEQLENS, LAYOUTS)):
        b, h = _batch_heads(s, s)
        problem = Problem(Shape(b, h, s, s, head_dim), dtype, causal)
        res = C.check(_default_runner(problem), problem, seed=100 + i, layout=layout)
        _assert_ok(res, f"{problem.shape} {dtype} causal={causal} {layout}")


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_cross_lengths(head_dim: int, dtype: str, causal: bool) -> None:
    for i, ((sq, sk), layout) in enumerate(itertools.product(CROSS, LAYOUTS)):
        b, h = _batch_heads(sq, sk)
        problem = Problem(Shape(b, h, sq, sk, head_dim), dtype, causal)
        res = C.check(_default_runner(problem), problem, seed=200 + i, layout=layout)
        _assert_ok(res, f"{problem.shape} {dtype} causal={causal} {layout}")


def test_rows_with_one_visible_key_and_rows_past_sk_are_finite() -> None:
    # Top-left causal never masks a whole row, but whole key *tiles* are masked for
    # early rows, and rows past Sk (Sq > Sk) see every key: none may produce NaN/Inf.
    for sq, sk in ((2047, 1), (1, 2047), (300, 64)):
        problem = Problem(Shape(2, 3, sq, sk, 64), "fp16", True)
        res = C.check(_default_runner(problem), problem, seed=7)
        _assert_ok(res, f"{problem.shape} causal")


# --------------------------------------------------------------------------- the public function

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_flash_attention_matches_the_reference(layout: str, dtype: torch.dtype) -> None:
    B, H, Sq, Sk, D = 2, 3, 77, 130, 128
    shape = (B, H, Sq, D) if layout == "bhsd" else (B, Sq, H, D)
    kshape = (B, H, Sk, D) if layout == "bhsd" else (B, Sk, H, D)
    q = torch.randn(shape, device="cuda", dtype=dtype)
    k = torch.randn(kshape, device="cuda", dtype=dtype)
    v = torch.randn(kshape, device="cuda", dtype=dtype)
    out, lse = A.flash_attention(q, k, v, causal=True, layout=layout, return_lse=True, family="flashcore")
    assert out.shape == q.shape and out.dtype == dtype and out.is_contiguous()
    view = (lambda t: t.transpose(1, 2)) if layout == "bshd" else (lambda t: t)
    ref, ref_lse = C.reference(view(q), view(k), view(v), True, 1 / math.sqrt(D))
    tol = C.tolerance(C.torch_low_precision(view(q), view(k), view(v), True, 1 / math.sqrt(D)), ref)
    assert float((view(out).float() - ref).abs().max()) <= tol
    assert torch.allclose(lse, ref_lse, atol=1e-3)
    # the SDPA call a user would make (top-left causal) agrees too
    sdpa = torch.nn.functional.scaled_dot_product_attention(view(q), view(k), view(v), is_causal=True)
    assert float((view(out).float() - sdpa.float()).abs().max()) <= tol + float((sdpa.float() - ref).abs().max())


def test_custom_scale_partial_config_and_strided_views() -> None:
    B, S, H, D = 2, 193, 4, 64
    qkv = torch.randn(B, S, 3, H, D, device="cuda", dtype=torch.float16)  # packed: row stride 3*H*D
    q, k, v = qkv.unbind(2)
    out = A.flash_attention(q, k, v, layout="bshd", scale=0.3, config={"BLOCK_N": 32})
    view = lambda t: t.transpose(1, 2)  # noqa: E731
    ref, _ = C.reference(view(q), view(k), view(v), False, 0.3)
    tol = C.tolerance(C.torch_low_precision(view(q), view(k), view(v), False, 0.3), ref)
    assert float((view(out).float() - ref).abs().max()) <= tol


def test_runs_on_the_current_stream_and_is_deterministic() -> None:
    q, k, v = (torch.randn(1, 4, 513, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    first = A.flash_attention(q, k, v, family="flashcore")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        second = A.flash_attention(q, k, v, family="flashcore")
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert torch.equal(first, second)


def test_wrong_device_index_is_named() -> None:
    q = torch.randn(1, 1, 8, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(Exception, match="must be on a CUDA device"):
        A.flash_attention(q, q.cpu(), q)


# --------------------------------------------------------------------------- every config of the space

@pytest.mark.parametrize("head_dim,dtype,causal", [(64, "fp16", True), (128, "bf16", False)])
def test_every_gated_config_of_the_default_space(head_dim: int, dtype: str, causal: bool) -> None:
    gate = pytest.importorskip("evotuner.gate")
    from evotuner.runtime.loader import KernelModule
    from evotuner.space import load_space

    space = load_space(None)
    problem = Problem(Shape(2, 3, 200, 333, head_dim), dtype, causal)
    configs = list(space.feasible(problem))
    assert configs, "the default space has no feasible config"
    builder = A._get_builder(space.kernel)
    futures = [(c, builder.submit(c, problem)) for c in configs]
    passed = failures = 0
    problems = []
    for i, (cfg, fut) in enumerate(futures):
        result = fut.result()
        if not result.ok:
            failures += 1
            problems.append(f"{cfg}: build failed: {(result.error or '').strip().splitlines()[-1:]}")
            continue
        verdict = gate.apply_gate(result, space.gate)
        if not verdict.passed:
            continue
        mod = KernelModule.load(result.artifact)
        res = C.check(mod.launch, problem, seed=300 + i, layout=LAYOUTS[i % 2])
        if not res.ok:
            problems.append(f"{cfg}: {res.reason}")
        passed += 1
    assert not problems, "\n".join(problems)
    assert passed > 0, "no config of the default space passed the ptxas gate"


# --------------------------------------------------------------------------- faults and timing

def _fault_artifact(fault: int):
    from evotuner.compiler import Builder
    from evotuner.config import KernelConfig

    problem = Problem(Shape(1, 2, 256, 256, 64), "fp16", False)
    cfg = A.default_config(64, "fp16", False)
    with Builder("flashcore", extra_flags=(f"-DFLASHCORE_FAULT={fault}",)) as b:
        result = b.build(cfg, problem)
    assert result.ok, result.error
    return result.artifact, problem


def test_too_much_shared_memory_is_refused_at_load() -> None:
    from evotuner.runtime.loader import KernelModule, SharedMemoryError

    artifact, _ = _fault_artifact(5)  # meta claims 300 KiB of dynamic shared memory
    with pytest.raises(SharedMemoryError, match="shared memory per block") as info:
        KernelModule.load(artifact, cache=False)
    assert info.value.failure_kind == "smem"


def test_a_rejected_launch_is_a_non_sticky_cuda_error() -> None:
    from evotuner.runtime.cuda import CudaError
    from evotuner.runtime.loader import KernelModule

    artifact, problem = _fault_artifact(6)  # meta claims 2048 threads per block
    mod = KernelModule.load(artifact, cache=False)
    with pytest.raises(CudaError) as info:
        C.check(mod.launch, problem)
    assert info.value.name == "CUDA_ERROR_INVALID_VALUE" and not info.value.sticky
    assert info.value.failure_kind == "launch" and "cuLaunchKernel" in info.value.call
    # the context survives: a good kernel still runs
    _assert_ok(C.check(_default_runner(problem), problem, seed=5), "after a rejected launch")


def test_an_illegal_access_is_a_sticky_cuda_error(tmp_path) -> None:
    import subprocess
    import sys

    artifact, _ = _fault_artifact(1)
    code = f"""
import torch
from evotuner.runtime import cuda
from evotuner.runtime.loader import KernelModule
q = torch.randn(1, 2, 256, 64, device="cuda", dtype=torch.float16)
mod = KernelModule.load({str(artifact.cubin)!r})
try:
    mod.launch(q, q, q, torch.empty_like(q), None, 0.125)
    cuda.stream_synchronize(torch.cuda.current_stream().cuda_stream)
except cuda.CudaError as e:
    print(e.name, e.sticky, e.failure_kind)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["CUDA_ERROR_ILLEGAL_ADDRESS", "True", "illegal_access"], out.stdout + out.stderr


def test_time_cuda_reports_ordered_quantiles() -> None:
    from evotuner.runtime.timing import time_cuda

    problem = Problem(Shape(4, 8, 1024, 1024, 64), "fp16", False)
    run = _default_runner(problem)
    q, k, v = C.make_inputs(problem.shape, "fp16", seed=3)
    o = torch.empty_like(q)
    fixed = time_cuda(lambda: run(q, k, v, o, None, 0.125), warmup=3, reps=20)
    assert fixed.repetitions == 20 and len(fixed.samples_us) == 20
    assert 0 < fixed.p20_us <= fixed.median_us <= fixed.p80_us
    budget = time_cuda(lambda: run(q, k, v, o, None, 0.125), budget_s=0.05, min_reps=5)
    assert budget.repetitions >= 5
    # flushing the L2 cannot make a repetition faster than not flushing by much
    warm = time_cuda(lambda: run(q, k, v, o, None, 0.125), reps=20, flush_l2=False)
    assert warm.median_us <= fixed.median_us * 1.5
