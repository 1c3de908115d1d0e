"""The Hopper family on the GPU through the real runtime (evotuner.runtime: Builder ->
cubin -> driver, tensor maps encoded by kernels/hopper/params.py): the issue's
correctness matrix with every recommended config (each size-limited entry too), every
scheduler of the big-tile ones (incl. SCHED=2's
per-launch tile counter), two CTAs per SM under every scheduler, LSE, and
evotuner.flash_attention's choice.

Every check draws fresh random inputs, poisons O and LSE with NaN and applies FA2's
rule (evotuner.runtime.check). Skips cleanly without a GPU.
"""

from __future__ import annotations

import itertools
import math

import pytest

torch = pytest.importorskip("torch")

from evotuner.config import KernelConfig  # noqa: E402
from evotuner.family import get_family  # noqa: E402
from evotuner.problem import Problem, Shape  # noqa: E402
from evotuner.runtime import attention as A  # noqa: E402
from evotuner.runtime import check as C  # noqa: E402
from evotuner.space import load_space  # noqa: E402

pytestmark = pytest.mark.gpu

HOPPER = get_family("hopper")
SPACE = load_space(HOPPER.default_space())
SEQLENS = (1, 17, 97, 513, 2047)
DTYPES = ("fp16", "bf16")
LAYOUTS = ("bhsd", "bshd")
#: Sq != Sk: one query row, ragged tails on both sides, Sq > Sk (rows past Sk under causal).
CROSS = ((1, 513), (17, 2047), (128, 97), (513, 200), (1024, 17), (200, 1), (97, 1024))


def _batch_heads(sq: int, sk: int) -> tuple[int, int]:
    return (3, 5) if sq * sk <= 513 * 513 else (1, 3)     # odd B*H


def _entries(problem: Problem) -> list[KernelConfig]:
    """Every recommended config for the problem's (D, dtype, causal) whatever its size:
    defaults.toml's size-limited entries ([d64.short], [d64.mid]) as well as the big one,
    so the matrix's small shapes check all of them, not only the one their size picks."""
    found: list[KernelConfig] = []
    for b, h, s in ((1, 1, 4096), (1, 16, 1024), (1, 1, 2**31 - 1)):    # 4096, 16384, unbounded rows
        probe = Problem(Shape(b, h, s, 1, problem.shape.head_dim), problem.dtype, problem.causal)
        cfg = HOPPER.recommended_configs(probe)[0]
        if cfg not in found:
            found.append(cfg)
    return found


def _runner(problem: Problem, config: KernelConfig | None = None):
    cfg = config or HOPPER.recommended_configs(problem)[0]
    return A.kernel_module(cfg, problem, torch.cuda.current_device(), family="hopper").launch


def _assert_ok(res: C.CheckResult, what: str) -> None:
    assert res.ok, f"{what}: {res.reason} (max error {res.max_error:.3g}, tolerance {res.tolerance:.3g})"
    assert res.lse_error is not None and res.lse_error <= res.lse_tolerance, what


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_seqlen_matrix(head_dim: int, dtype: str, causal: bool) -> None:
    for i, (s, layout) in enumerate(itertools.product(SEQLENS, LAYOUTS)):
        b, h = _batch_heads(s, s)
        problem = Problem(Shape(b, h, s, s, head_dim), dtype, causal)
        for cfg in _entries(problem):
            res = C.check(_runner(problem, cfg), problem, seed=300 + i, layout=layout)
            _assert_ok(res, f"hopper {cfg} {problem.shape} {dtype} causal={causal} {layout}")


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_cross_lengths(head_dim: int, dtype: str, causal: bool) -> None:
    for i, ((sq, sk), layout) in enumerate(itertools.product(CROSS, LAYOUTS)):
        b, h = _batch_heads(sq, sk)
        problem = Problem(Shape(b, h, sq, sk, head_dim), dtype, causal)
        for cfg in _entries(problem):
            res = C.check(_runner(problem, cfg), problem, seed=400 + i, layout=layout)
            _assert_ok(res, f"hopper {cfg} {problem.shape} {dtype} causal={causal} {layout}")


@pytest.mark.parametrize("sched", [0, 1, 2])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_every_scheduler_of_the_recommended_config(sched: int, head_dim: int, causal: bool) -> None:
    # SCHED=2's tile counter must be back at zero after a launch: launch twice on one module.
    for i, (sq, sk) in enumerate(((97, 513), (2047, 2047), (1, 17), (513, 97))):
        b, h = _batch_heads(sq, sk)
        problem = Problem(Shape(b, h, sq, sk, head_dim), "bf16", causal)
        cfg = KernelConfig.of({**_entries(problem)[-1].as_dict(), "SCHED": sched})   # the big-tile entry
        if SPACE.violated(cfg, problem) is not None:      # D128 causal: 3 stages + an O tile exceed smem
            cfg = KernelConfig.of({**cfg.as_dict(), "STAGES": 2})
        assert SPACE.violated(cfg, problem) is None, cfg
        runner = _runner(problem, cfg)
        for rep in range(2):
            res = C.check(runner, problem, seed=500 + 10 * i + rep)
            _assert_ok(res, f"hopper SCHED={sched} {problem.shape} causal={causal} launch {rep + 1}")


@pytest.mark.parametrize("ctas", [1, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_the_dynamic_schedulers_counter_is_zero_after_every_launch(ctas: int, causal: bool) -> None:
    """SCHED=2 hands tiles out from a counter the runtime zeroes once per stream; the launch's
    last fetch puts it back to zero. Fewer tiles than CTAs, many more, and a packed batch
    whose empty sequences' tiles are skipped: after each launch it reads 0 and the next
    launch on the same buffer is still right."""
    cfg = dict(BLOCK_N=128, CONSUMER_WGS=1, STAGES=2, REG_PROD=24, REG_CONS=232 if ctas == 2 else 256, OVERLAP=1,
               PINGPONG=0, SCHED=2, RESCALE_LOG2=8, EXP_EMU=0, CTAS_PER_SM=ctas)
    stream = torch.cuda.current_stream().cuda_stream
    for i, (b, h, sq, sk) in enumerate(((1, 1, 1, 17), (3, 5, 97, 513), (4, 37, 513, 97), (2, 40, 1000, 300))):
        problem = Problem(Shape(b, h, sq, sk, 64), "fp16", causal)
        module = A.kernel_module(KernelConfig.of(cfg), problem, torch.cuda.current_device(), family="hopper")
        for rep in range(3):
            res = C.check(module.launch, problem, seed=900 + 10 * i + rep)
            _assert_ok(res, f"hopper SCHED=2 CTAS_PER_SM={ctas} {problem.shape} causal={causal} launch {rep + 1}")
            torch.cuda.synchronize()
            assert int(module._workspace[stream][:4].view(torch.int32)[0]) == 0, f"{problem.shape} launch {rep + 1}"
    lengths = [0, 700, 1, 0, 129]
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device="cuda")
    problem = Problem.packed(lengths, lengths, heads=4, head_dim=64, dtype="fp16", causal=causal)
    module = A.kernel_module(KernelConfig.of(cfg), problem, torch.cuda.current_device(), family="hopper")
    q, k, v = (torch.randn(sum(lengths), 4, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    for rep in range(3):
        o = torch.full_like(q, float("nan"))
        module.launch_varlen(q, k, v, o, None, 0.125, cu, cu, max(lengths), max(lengths))
        torch.cuda.synchronize()
        assert int(module._workspace[stream][:4].view(torch.int32)[0]) == 0, f"packed launch {rep + 1}"
        for s in range(len(lengths)):
            rows = slice(int(cu[s]), int(cu[s + 1]))
            if lengths[s]:
                qb, kb, vb = (t[rows].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
                ref, _ = C.reference(qb, kb, vb, causal, 0.125)
                tol = C.tolerance(C.torch_low_precision(qb, kb, vb, causal, 0.125), ref)
                ok, _, reason, _ = C.compare(o[rows].transpose(0, 1).unsqueeze(0), ref, tol)
                assert ok, f"packed launch {rep + 1}, sequence {s}: {reason}"


@pytest.mark.parametrize("sched", [0, 1, 2])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_two_ctas_per_sm(sched: int, head_dim: int, causal: bool) -> None:
    """CTAS_PER_SM=2 (__launch_bounds__(256, 2), 64-row tiles, 2 x #SMs persistent CTAs):
    ragged, Sq != Sk, more tiles than CTA slots, two launches per module (SCHED=2's counter)."""
    cfg = KernelConfig.of(dict(BLOCK_N=64 if head_dim == 128 else 128, CONSUMER_WGS=1, STAGES=2, REG_PROD=24,
                               REG_CONS=232, OVERLAP=1, PINGPONG=0, SCHED=sched, RESCALE_LOG2=8, EXP_EMU=0,
                               CTAS_PER_SM=2))
    for i, (b, h, sq, sk) in enumerate(((3, 5, 97, 513), (2, 3, 2047, 2047), (1, 1, 1, 17), (4, 37, 513, 97))):
        problem = Problem(Shape(b, h, sq, sk, head_dim), "bf16", causal)
        assert SPACE.violated(cfg, problem) is None, cfg
        runner = _runner(problem, cfg)
        for rep in range(2):
            res = C.check(runner, problem, seed=700 + 10 * i + rep)
            _assert_ok(res, f"hopper CTAS_PER_SM=2 SCHED={sched} {problem.shape} causal={causal} launch {rep + 1}")


def test_flash_attention_runs_hopper_where_it_is_recommended() -> None:
    B, H, Sq, Sk, D = 3, 5, 97, 513, 128
    q = torch.randn(B, H, Sq, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, H, Sk, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(B, H, Sk, D, device="cuda", dtype=torch.bfloat16)
    out, lse, choice = A.flash_attention(q, k, v, causal=True, return_lse=True, return_choice=True)
    assert choice.family == "hopper", choice
    ref, ref_lse = C.reference(q, k, v, True, 1 / math.sqrt(D))
    tol = C.tolerance(C.torch_low_precision(q, k, v, True, 1 / math.sqrt(D)), ref)
    assert float((out.float() - ref).abs().max()) <= tol
    assert torch.allclose(lse, ref_lse, atol=1e-3)
    # D=32: not a hopper problem; FlashCore runs it and the choice says why
    q32 = torch.randn(1, 2, 33, 32, device="cuda", dtype=torch.float16)
    _, choice32 = A.flash_attention(q32, q32, q32, return_choice=True)
    assert choice32.family == "flashcore" and "hopper" in choice32.why


def test_bshd_packed_qkv_views_take_the_tensor_maps() -> None:
    B, S, H, D = 2, 193, 4, 64
    qkv = torch.randn(B, S, 3, H, D, device="cuda", dtype=torch.float16)   # row stride 3*H*D
    q, k, v = qkv.unbind(2)
    out, choice = A.flash_attention(q, k, v, layout="bshd", scale=0.3, family="hopper", return_choice=True)
    view = lambda t: t.transpose(1, 2)  # noqa: E731
    ref, _ = C.reference(view(q), view(k), view(v), False, 0.3)
    tol = C.tolerance(C.torch_low_precision(view(q), view(k), view(v), False, 0.3), ref)
    assert choice.family == "hopper" and float((view(out).float() - ref).abs().max()) <= tol
