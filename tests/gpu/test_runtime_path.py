"""evotuner.flash_attention as users call it, on the GPU: the cached hot path (plans and
their argument binder), CUDA-graph capture and replay, torch.compile(fullgraph=True), the
forward-only refusal, and tuned configs served from a (replayed) study database.

Every output is compared with the fp32 reference on fresh random inputs (FA2's rule,
evotuner.runtime.check). Skips cleanly without a GPU.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import evotuner  # noqa: E402
from evotuner import session  # noqa: E402
from evotuner.errors import ShapeError  # noqa: E402
from evotuner.problem import Problem, Shape  # noqa: E402
from evotuner.runtime import attention as A  # noqa: E402
from reference_check import assert_graph_replays_like_eager  # noqa: E402
from reference_check import assert_like_reference as _ref_ok  # noqa: E402
from evotuner.space import load_space  # noqa: E402

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
HOPPER_D64 = "BLOCK_N=128,CONSUMER_WGS=3,STAGES=2,REG_PROD=32,REG_CONS=160,OVERLAP=1,PINGPONG=1,SCHED=2," \
             "RESCALE_LOG2=0,EXP_EMU=0"


def _qkv(B, H, S, D, dtype=torch.float16, layout="bhsd", Sk=None):
    shape_q = (B, S, H, D) if layout == "bshd" else (B, H, S, D)
    shape_k = (B, Sk or S, H, D) if layout == "bshd" else (B, H, Sk or S, D)
    return (torch.randn(shape_q, device="cuda", dtype=dtype), torch.randn(shape_k, device="cuda", dtype=dtype),
            torch.randn(shape_k, device="cuda", dtype=dtype))


@pytest.mark.parametrize("family, config", [("hopper", None), ("hopper", HOPPER_D64), ("flashcore", None)])
def test_hot_path_is_correct_on_fresh_inputs_call_after_call(family, config):
    """The first call resolves a plan, the next ones take it (with new pointers each time)."""
    A.forget_plans()   # the C++ table too: an earlier test's plan would serve these keys
    for i in range(4):
        q, k, v = _qkv(2, 3, 300, 64)
        out, lse, choice = evotuner.flash_attention(q, k, v, causal=bool(i % 2), family=family, config=config,
                                                    return_lse=True, return_choice=True)
        assert choice.family == family
        _ref_ok(out, q, k, v, bool(i % 2), lse=lse)
    plans = [p for p in A._plans.values() if p.choice.family == family]
    assert len(plans) == 2                       # one per causal flag: the calls after the first hit
    assert all(p.binder is not None for p in plans), "the argument binder did not derive on this driver"


def test_a_hit_with_another_shape_stride_dtype_or_layout_re_resolves():
    A.forget_plans()   # the C++ table too: an earlier test's plan would serve these keys
    q, k, v = _qkv(1, 4, 256, 128)
    _ref_ok(evotuner.flash_attention(q, k, v), q, k, v, False)
    cases = [
        _qkv(1, 4, 129, 128),                                              # shape
        _qkv(2, 4, 256, 128, dtype=torch.bfloat16),                        # dtype
        tuple(t.transpose(1, 2).contiguous().transpose(1, 2) for t in _qkv(1, 4, 256, 128)),  # strides
        (q, *_qkv(1, 4, 256, 128, Sk=77)[1:]),                             # Sq != Sk
    ]
    for qq, kk, vv in cases:
        _ref_ok(evotuner.flash_attention(qq, kk, vv), qq, kk, vv, False)
    qb, kb, vb = _qkv(1, 256, 4, 128, layout="bshd")
    _ref_ok(evotuner.flash_attention(qb, kb, vb, layout="bshd", scale=0.05), qb, kb, vb, False, 0.05, "bshd")
    assert len(A._plans) == 6


def test_a_misaligned_pointer_on_a_hit_is_refused_not_launched():
    q, k, v = _qkv(1, 2, 64, 64)
    evotuner.flash_attention(q, k, v, family="hopper")
    buf = torch.randn(q.numel() + 1, device="cuda", dtype=q.dtype)
    skew = buf[1:].view(q.shape)                 # same shape and strides, pointer 2 bytes off
    with pytest.raises(ShapeError, match="16-byte aligned"):
        evotuner.flash_attention(skew, k, v, family="hopper")


def test_a_partial_config_runs_over_the_problems_recommended_config():
    """The keys a config leaves out come from the config recommended for the problem (a small
    decode problem's: split-KV); one that cannot combine with them is a build error that says so."""
    A.forget_plans()
    q, k, v = _qkv(1, 8, 64, 128, Sk=4096)
    out, choice = evotuner.flash_attention(q, k, v, config="RESCALE_LOG2=8", return_choice=True)   # hopper's key
    (recommended,) = A.get_family("hopper").recommended_configs(Problem(Shape(1, 8, 64, 4096, 128), "fp16", False))
    assert choice.config.as_dict() == {**recommended.as_dict(), "RESCALE_LOG2": 8} and A.PARTIAL_NOTE in choice.why
    _ref_ok(out, q, k, v, False)
    assert recommended["SPLITS"] > 1, recommended      # split-KV (SCHED 0 only) is what this problem runs
    with pytest.raises(A.KernelBuildError, match="SPLITS > 1 needs SCHED=0") as err:
        evotuner.flash_attention(q, k, v, config="SCHED=1")
    assert A.PARTIAL_NOTE in str(err.value)


def test_inputs_that_require_grad_are_refused():
    q, k, v = _qkv(1, 2, 64, 64)
    q.requires_grad_(True)
    with pytest.raises(ShapeError, match="forward-only"):
        evotuner.flash_attention(q, k, v)
    with torch.no_grad():
        _ref_ok(evotuner.flash_attention(q, k, v), q.detach(), k, v, False)


@pytest.mark.parametrize("family, config, layout", [("hopper", None, "bhsd"), ("hopper", HOPPER_D64, "bshd"),
                                                    ("flashcore", None, "bhsd")])
def test_cuda_graph_capture_and_replay_equal_eager(family, config, layout):
    q, k, v = _qkv(2, 4, 333, 64, layout=layout)

    def call():
        return evotuner.flash_attention(q, k, v, causal=True, family=family, config=config, layout=layout,
                                        return_lse=True)

    call()
    assert_graph_replays_like_eager(call, q, k, v, True, layout=layout)


def test_torch_compile_fullgraph_has_one_graph_and_matches_eager():
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()

    def block(q, k, v):
        return evotuner.flash_attention(q * 1.0, k, v, causal=True).float().sum(-1)

    counter = CompileCounter()
    compiled = torch.compile(block, fullgraph=True, backend=counter)
    q, k, v = _qkv(2, 4, 200, 128)
    with torch.no_grad():
        got = compiled(q, k, v)
        want = block(q, k, v)
    assert counter.frame_count == 1 and counter.op_count >= 1
    assert torch.equal(got, want)
    # the default backend (inductor) too, with the lse output
    torch._dynamo.reset()

    def with_lse(q, k, v):
        out, lse = evotuner.flash_attention(q, k, v, return_lse=True)
        return out, lse

    inductor = torch.compile(with_lse, fullgraph=True)
    with torch.no_grad():
        out, lse = inductor(q, k, v)
    _ref_ok(out, q, k, v, False, lse=lse)


def test_tune_then_use_on_the_gpu(tmp_path):
    """A replayed hopper study's best config is what flash_attention serves at its shape, and
    it runs correctly; another head dim falls back to the recommended config."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    problem = Problem(Shape.parse("B=16,H=16,S=2048,D=64"))
    grid = load_space(ROOT / "search_spaces" / "hopper_grid.toml")
    store = session.open_store(url)
    with ExitStack() as stack:
        builder, measure = session.StageFactory(replay=ROOT / "tests/data/sweep_h100_hopper_d64.csv").stages(
            problem, grid, 2, stack)
        session.start_study(store, "d64", problem, grid, "guided", 0, builder)
        session.run_study(store, "d64", problem, grid, "guided", 0, 6, builder, measure, transfer=False)
    best = store.summary("d64").best.kernel_config
    store.close()
    try:
        evotuner.use_tuned(url, shipped=False)
        q, k, v = _qkv(16, 16, 2048, 64)
        name = torch.cuda.get_device_name()
        out, choice = evotuner.flash_attention(q, k, v, return_choice=True)
        if name == "NVIDIA H100 80GB HBM3":        # the sweep's GPU model
            assert choice.config == best and "study 'd64'" in choice.why
        else:
            assert "recommended config" in choice.why and name in choice.why
        _ref_ok(out, q, k, v, False)
        q, k, v = _qkv(2, 4, 256, 128)
        out, choice = evotuner.flash_attention(q, k, v, return_choice=True)
        assert "recommended config" in choice.why
        _ref_ok(out, q, k, v, False)
    finally:
        evotuner.use_tuned(None)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tensors_on_another_device_than_the_current_one():
    """A plan of cuda:1 called while cuda:0 is current (and the other way round): the launch
    finds the other context current, is refused, and the call takes the slow path there."""
    for dev, current in ((1, 0), (0, 1), (1, 1)):
        q, k, v = (torch.randn(1, 2, 100, 64, device=f"cuda:{dev}", dtype=torch.float16) for _ in range(3))
        with torch.cuda.device(current):
            out = evotuner.flash_attention(q, k, v, family="hopper")
            out2 = evotuner.flash_attention(q, k, v, family="hopper")
            assert torch.cuda.current_device() == current
        assert out.device == q.device and torch.equal(out, out2)
        _ref_ok(out, q, k, v, False)
