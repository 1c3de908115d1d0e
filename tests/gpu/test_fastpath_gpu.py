"""The C++ hot path (evotuner/runtime/fastpath.cpp) on the GPU: after the first call of a key
registers its plan, later calls run in C++ (proved by clearing the Python plans: a C++ hit
makes none) and give the same bits as the Python path and the fp32 reference, for every
family's recommended config, SCHED=2 (its tile counter reset per launch, several calls),
split-KV decoding, bshd and the LSE; another shape, stride, dtype or device re-resolves; CUDA
graphs and torch.compile(fullgraph=True) keep working. The host time per call is printed,
never asserted. Skips without a GPU.

    pytest -q -s tests/gpu/test_fastpath_gpu.py
"""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")

import evotuner  # noqa: E402
from evotuner.runtime import attention as A  # noqa: E402
from reference_check import assert_graph_replays_like_eager  # noqa: E402
from reference_check import assert_like_reference as _ref_ok  # noqa: E402
from evotuner.runtime import fastpath  # noqa: E402

pytestmark = pytest.mark.gpu

SCHED2 = "BLOCK_N=128,CONSUMER_WGS=3,STAGES=2,REG_PROD=32,REG_CONS=160,OVERLAP=1,PINGPONG=1,SCHED=2," \
         "RESCALE_LOG2=0,EXP_EMU=0"


@pytest.fixture(scope="module", autouse=True)
def native():
    state = fastpath.build()
    assert state.startswith("on ("), state
    yield fastpath.native()


def _qkv(B, H, S, D, dtype=torch.float16, layout="bhsd", Sk=None, Hk=None):
    sq = (B, S, H, D) if layout == "bshd" else (B, H, S, D)
    sk = (B, Sk or S, Hk or H, D) if layout == "bshd" else (B, Hk or H, Sk or S, D)
    return (torch.randn(sq, device="cuda", dtype=dtype), torch.randn(sk, device="cuda", dtype=dtype),
            torch.randn(sk, device="cuda", dtype=dtype))


def _python_path(monkeypatch, **kw):
    with monkeypatch.context() as m:
        m.setattr(fastpath, "run", None)
        return evotuner.flash_attention(**kw)


CASES = [  # (name, shape B,H,S,D, Sk, Hk, kwargs)
    ("hopper recommended", (2, 4, 333, 64), None, None, dict(family="hopper")),
    ("hopper recommended d128 causal", (1, 8, 512, 128), None, None, dict(family="hopper", causal=True)),
    ("hopper SCHED=2", (2, 4, 333, 64), None, None, dict(config=SCHED2)),
    ("hopper SCHED=2 causal lse", (2, 4, 700, 64), None, None, dict(config=SCHED2, causal=True, return_lse=True)),
    ("split-KV decode", (2, 8, 4, 128), 4096, None, dict(family="hopper", return_lse=True)),
    ("split-KV decode gqa", (1, 32, 1, 128), 8192, 8, dict(family="hopper")),
    ("flashcore recommended", (2, 4, 333, 64), None, None, dict(family="flashcore")),
    ("flashcore d96", (1, 4, 256, 96), None, None, dict()),
    ("bshd", (2, 4, 333, 64), None, None, dict(layout="bshd", return_lse=True)),
]


@pytest.mark.parametrize("name, shape, Sk, Hk, kw", CASES, ids=[c[0] for c in CASES])
def test_the_fast_path_equals_the_python_path_and_the_reference(monkeypatch, native, name, shape, Sk, Hk, kw):
    layout = kw.get("layout", "bhsd")
    causal = kw.get("causal", False)
    q, k, v = _qkv(*shape, layout=layout, Sk=Sk, Hk=Hk)
    first = evotuner.flash_attention(q, k, v, **kw, return_choice=True)   # resolves and registers
    choice = first[-1]
    if "SCHED=2" in name:
        assert choice.config["SCHED"] == 2
    if "split" in name:
        assert choice.config.as_dict().get("SPLITS", 1) > 1, choice
    A._plans.clear()
    for _ in range(3):     # several calls: the SCHED=2 counter and split scratch must be reset each time
        q, k, v = _qkv(*shape, layout=layout, Sk=Sk, Hk=Hk)
        fast = evotuner.flash_attention(q, k, v, **kw)
        assert not A._plans, "the call took the Python path: the C++ table missed"
        slow = _python_path(monkeypatch, q=q, k=k, v=v, **kw)
        fast_out, fast_lse = fast if kw.get("return_lse") else (fast, None)
        slow_out, slow_lse = slow if kw.get("return_lse") else (slow, None)
        torch.cuda.synchronize()
        assert torch.equal(fast_out, slow_out), name
        if fast_lse is not None:
            assert torch.equal(fast_lse, slow_lse)
        _ref_ok(fast_out, q, k, v, causal, layout=layout, lse=fast_lse)
        A._plans.clear()
    assert evotuner.flash_attention(q, k, v, **kw, return_choice=True)[-1] == choice


def test_another_shape_stride_dtype_or_device_re_resolves(native):
    q, k, v = _qkv(1, 4, 256, 128)
    _ref_ok(evotuner.flash_attention(q, k, v), q, k, v, False)
    cases = [
        _qkv(1, 4, 129, 128),
        _qkv(1, 4, 256, 128, dtype=torch.bfloat16),
        tuple(t.transpose(1, 2).contiguous().transpose(1, 2) for t in _qkv(1, 4, 256, 128)),
        (q, *_qkv(1, 4, 256, 128, Sk=77)[1:]),
        (torch.randn(1, 4, 512, 128, device="cuda", dtype=torch.float16)[:, :, ::2], k, v),
    ]
    if torch.cuda.device_count() > 1:
        cases.append(tuple(t.to("cuda:1") for t in _qkv(1, 4, 256, 128)))
    for qq, kk, vv in cases:
        A._plans.clear()
        for _ in range(2):
            nan = torch.full_like(qq, float("nan"))
            del nan
            _ref_ok(evotuner.flash_attention(qq, kk, vv), qq, kk, vv, False)
        assert len(A._plans) == 1, "a new key must resolve in Python once"


def test_a_misaligned_pointer_is_refused_not_launched(native):
    q, k, v = _qkv(1, 2, 64, 64)
    evotuner.flash_attention(q, k, v, family="hopper")
    buf = torch.randn(q.numel() + 1, device="cuda", dtype=q.dtype)
    with pytest.raises(evotuner.errors.ShapeError, match="16-byte aligned"):
        evotuner.flash_attention(buf[1:].view(q.shape), k, v, family="hopper")


@pytest.mark.parametrize("config", [None, SCHED2])
def test_cuda_graph_capture_and_replay_equal_eager(native, config):
    q, k, v = _qkv(2, 4, 333, 64)

    def call():
        return evotuner.flash_attention(q, k, v, causal=True, config=config, return_lse=True)

    call()
    # two warm-ups: the first registers the capture stream's buffers, the second is a C++ hit
    assert_graph_replays_like_eager(call, q, k, v, True, warmups=2)


def test_torch_compile_fullgraph_equals_eager(native):
    torch._dynamo.reset()

    def block(q, k, v):   # the op between two fused elementwise ops; its output compared bit for bit
        return evotuner.flash_attention(q * 1.0, k, v, causal=True, config=SCHED2) * 2.0

    compiled = torch.compile(block, fullgraph=True)
    for _ in range(3):
        q, k, v = _qkv(2, 4, 256, 64)
        got, want = compiled(q, k, v), block(q, k, v)
        assert torch.equal(got, want)
        _ref_ok(got / 2.0, q, k, v, True)


def test_host_time_per_call_is_printed(native, monkeypatch):
    """Informational: µs of host time per back-to-back call, C++ and Python path (no assertion)."""
    q, k, v = _qkv(1, 8, 512, 64)

    def per_call(n=2000):
        evotuner.flash_attention(q, k, v)
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(n):
                evotuner.flash_attention(q, k, v)
            best = min(best, (time.perf_counter() - t) / n * 1e6)
            torch.cuda.synchronize()
        return best

    fast = per_call(200)
    with monkeypatch.context() as m:
        m.setattr(fastpath, "run", None)
        slow = per_call(200)
    print(f"\nhost µs per call at 1,8,512,64 (best of 5 x 200): fast path {fast:.1f}, Python path {slow:.1f}")
