"""The GPU runtime's CPU-testable parts: argument validation, the correctness
rule, defaults resolution, driver error classification, lazy imports."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from evotuner.errors import NoGpuError, ShapeError, SpaceError
from evotuner.problem import Problem, Shape
from evotuner.runtime import attention as A
from evotuner.runtime import check as C
from evotuner.runtime import cuda
from evotuner.measure.racing import quantile as _quantile


def t(*shape: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    return torch.randn(*shape).to(dtype)


# --------------------------------------------------------------------------- validation

@pytest.mark.parametrize("q,k,v,kwargs,match", [
    (t(2, 3, 8), t(2, 3, 8, 64), t(2, 3, 8, 64), {}, r"q: expected a 4-D tensor, got 3-D"),
    (t(2, 3, 8, 64, dtype=torch.float32), t(2, 3, 8, 64), t(2, 3, 8, 64), {}, r"q: dtype torch.float32"),
    (t(2, 3, 8, 64), t(2, 3, 8, 64, dtype=torch.bfloat16), t(2, 3, 8, 64), {}, r"q, k, v: dtypes differ"),
    (t(2, 3, 8, 64), t(2, 4, 8, 64), t(2, 4, 8, 64), {}, r"k: H \(heads\) is 4, which does not divide q's 3"),
    (t(2, 8, 8, 64), t(2, 3, 8, 64), t(2, 3, 8, 64), {}, r"k: H \(heads\) is 3, which does not divide q's 8"),
    (t(2, 8, 8, 64), t(2, 2, 8, 64), t(2, 4, 8, 64), {}, r"k, v: heads differ \(k has 2, v has 4\)"),
    (t(2, 3, 8, 64), t(1, 3, 8, 64), t(1, 3, 8, 64), {}, r"k: B \(batch\) is 1 but q's is 2"),
    (t(2, 3, 8, 64), t(2, 3, 8, 64), t(2, 3, 8, 128), {}, r"v: D \(head dim\) is 128 but q's is 64"),
    (t(2, 3, 8, 64), t(2, 3, 9, 64), t(2, 3, 10, 64), {}, r"k, v: seqlen differs \(k has Sk=9, v has 10\)"),
    (t(2, 3, 8, 48), t(2, 3, 8, 48), t(2, 3, 8, 48), {}, r"q: head dim D=48 is not supported"),
    (t(2, 3, 0, 64), t(2, 3, 8, 64), t(2, 3, 8, 64), {}, r"q: S \(seqlen\) is 0"),
    (t(2, 3, 8, 64), t(2, 3, 8, 64), t(2, 3, 8, 64), {"layout": "sbhd"}, r"layout: 'sbhd' is not supported"),
    # [B, S, H, D]: q has H=3 on axis 2, k has H=5
    (t(2, 8, 3, 64), t(2, 8, 5, 64), t(2, 8, 5, 64), {"layout": "bshd"}, r"k: H \(heads\) is 5, which does not divide q's 3.*bshd"),
    (t(2, 3, 8, 64), t(2, 3, 8, 64), t(2, 3, 8, 64), {"scale": float("nan")}, r"scale: nan must be a finite"),
])
def test_validation_names_the_argument_and_dimension(q, k, v, kwargs, match) -> None:
    with pytest.raises(ShapeError, match=match):
        A.flash_attention(q, k, v, **kwargs)


def test_grouped_query_heads_pass_validation_up_to_the_device_check() -> None:
    """GQA (k/v heads dividing q's) and MQA (one k/v head) are valid: only the device check refuses them here."""
    for hkv in (4, 2, 1):
        with pytest.raises(ShapeError, match="must be on a CUDA device"):
            A.flash_attention(t(2, 8, 8, 64), t(2, hkv, 8, 64), t(2, hkv, 8, 64))


@pytest.mark.parametrize("text, heads_kv, error", [
    ("B=1,H=32,HKV=8,S=4096,D=128", 8, None), ("B=1,H=32,S=4096,D=128", 32, None), ("B=2,H=8,HKV=1,S=64,D=64", 1, None),
    ("B=1,H=32,HKV=6,S=64,D=64", None, "do not split into HKV=6"), ("B=1,HKV=2,S=64,D=64", None, "needs H"),
])
def test_shape_takes_key_value_heads(text, heads_kv, error) -> None:
    from evotuner.problem import Problem, Shape

    if error:
        with pytest.raises(ShapeError, match=error):
            Shape.parse(text)
        return
    shape = Shape.parse(text)
    assert shape.heads_kv == heads_kv and Shape.parse(str(shape)) == shape
    problem = Problem(shape)
    assert Problem.from_dict(problem.as_dict()) == problem
    assert ("heads_kv" in problem.as_dict()) == (heads_kv != shape.heads)   # MHA records read as before


def test_non_contiguous_last_dim_is_rejected() -> None:
    q = t(2, 3, 64, 8).transpose(2, 3)  # [2, 3, 8, 64] with D stride 8
    with pytest.raises(ShapeError, match=r"q: the last dimension \(D\) is not contiguous \(stride 8\)"):
        A.flash_attention(q, t(2, 3, 8, 64), t(2, 3, 8, 64))


def test_misaligned_row_stride_is_rejected() -> None:
    bad = t(2, 3, 8, 68)[..., :64]  # rows 136 B apart: not 16-byte aligned
    with pytest.raises(ShapeError, match=r"k: row stride 68 elements is not a multiple of 8"):
        A.flash_attention(t(2, 3, 8, 64), bad, t(2, 3, 8, 64))


def test_cpu_tensors_fail_the_device_check_last() -> None:
    with pytest.raises(ShapeError, match=r"q: must be on a CUDA device, got cpu"):
        A.flash_attention(t(3, 5, 17, 64), t(3, 5, 33, 64), t(3, 5, 33, 64), causal=True)
    with pytest.raises(ShapeError, match=r"q: must be on a CUDA device"):
        A.flash_attention(t(3, 17, 5, 128), t(3, 33, 5, 128), t(3, 33, 5, 128), layout="bshd")


def test_cpu_tensors_on_a_machine_without_a_gpu_are_not_told_to_call_cuda(monkeypatch) -> None:
    """Where torch sees no GPU, `.cuda()` would fail too: the remedy says what is missing."""
    import re

    from evotuner import flash_attention_varlen

    for available, remedy in ((False, "torch.cuda.is_available() is False"), (True, "move it with q.cuda()")):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
        with pytest.raises(ShapeError, match=re.escape(remedy)):
            A.flash_attention(t(1, 2, 8, 64), t(1, 2, 8, 64), t(1, 2, 8, 64))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    packed, cu = torch.zeros(8, 2, 64, dtype=torch.float16), torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ShapeError, match=r"q: on cpu.*is_available\(\) is False"):
        flash_attention_varlen(packed, packed, packed, cu, cu, 8, 8)


def test_causal_must_be_a_bool() -> None:
    with pytest.raises(ShapeError, match="causal: expected a bool"):
        A.flash_attention(t(1, 1, 8, 64), t(1, 1, 8, 64), t(1, 1, 8, 64), causal=1)


# --------------------------------------------------------------------------- defaults

DEFAULTS = """
[d64]
BLOCK_M = 128
BLOCK_N = 64
NUM_WARPS = 4
[d64.causal]
BLOCK_N = 32
[d128.bf16]
BLOCK_M = 64
BLOCK_N = 32
NUM_WARPS = 4
"""


def test_defaults_most_specific_entry_wins() -> None:
    entries = A.parse_defaults(DEFAULTS)
    assert A.supported_head_dims(entries) == (64, 128)
    assert A.default_config(64, "fp16", False, entries).as_dict() == {"BLOCK_M": 128, "BLOCK_N": 64, "NUM_WARPS": 4}
    assert A.default_config(64, "bf16", True, entries)["BLOCK_N"] == 32
    assert A.default_config(128, "bf16", False, entries)["BLOCK_M"] == 64
    with pytest.raises(ShapeError, match=r"head dim D=128 has no recommended FlashCore config \(fp16"):
        A.default_config(128, "fp16", False, entries)


def test_defaults_array_of_tables_form() -> None:
    entries = A.parse_defaults('[[config]]\nhead_dim = 64\ndtype = "bf16"\nBLOCK_M = 64\n'
                               '[[config]]\nhead_dim = 64\nBLOCK_M = 128\n')
    assert A.default_config(64, "bf16", False, entries)["BLOCK_M"] == 64
    assert A.default_config(64, "fp16", True, entries)["BLOCK_M"] == 128


def test_packaged_defaults_cover_64_and_128() -> None:
    dims = A.supported_head_dims()
    assert 64 in dims and 128 in dims
    for d in (64, 128):
        for dtype in ("fp16", "bf16"):
            for causal in (False, True):
                cfg = A.default_config(d, dtype, causal)
                assert {"BLOCK_M", "BLOCK_N", "NUM_WARPS"} <= set(cfg.as_dict())


def test_packaged_defaults_are_inside_the_default_space() -> None:
    from evotuner.space import load_space

    space = load_space(None)
    for d in A.supported_head_dims():
        for dtype in ("fp16", "bf16"):
            for causal in (False, True):
                cfg = A.default_config(d, dtype, causal)
                space.validate(cfg)
                assert space.violated(cfg, Problem(Shape(1, 1, 128, 128, d), dtype, causal)) is None


def test_partial_config_overrides_the_default_and_unknown_keys_fail() -> None:
    base = A.default_config(64, "fp16", False)
    cfg = A.resolve_config({"block_n": 32}, 64, "fp16", False)
    assert cfg["BLOCK_N"] == 32 and cfg["BLOCK_M"] == base["BLOCK_M"]
    assert A.resolve_config("BLOCK_N=32", 64, "fp16", False) == cfg
    with pytest.raises(SpaceError, match="unknown kernel parameter TILE"):
        A.resolve_config({"TILE": 4}, 64, "fp16", False)


# --------------------------------------------------------------------------- the correctness rule

def _sdpa_runner(q, k, v, o, lse, scale, *, causal=False):
    ref, ref_lse = C.reference(q, k, v, causal, scale)
    o.copy_(ref.to(o.dtype))
    if lse is not None:
        lse.copy_(ref_lse)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("causal", [False, True])
def test_check_passes_a_correct_kernel(dtype: str, layout: str, causal: bool) -> None:
    problem = Problem(Shape(2, 3, 37, 53, 64), dtype, causal)
    res = C.check(lambda *a: _sdpa_runner(*a, causal=causal), problem, seed=1, layout=layout, device="cpu")
    assert res.ok, res.reason
    assert 0 <= res.max_error <= res.tolerance and res.kind is None
    assert res.lse_error is not None and res.lse_error <= res.lse_tolerance


def test_check_fails_a_kernel_that_ignores_the_mask() -> None:
    problem = Problem(Shape(1, 2, 40, 40, 64), "fp16", True)
    res = C.check(lambda *a: _sdpa_runner(*a, causal=False), problem, device="cpu")
    assert not res.ok and res.kind == "wrong_result"
    assert "exceeds the tolerance" in res.reason and res.max_error > res.tolerance


def test_check_fails_an_unwritten_element_as_nan() -> None:
    def skips_last_row(q, k, v, o, lse, scale):
        full = torch.empty_like(o)
        _sdpa_runner(q, k, v, full, lse, scale)
        o[:, :, :-1].copy_(full[:, :, :-1])

    res = C.check(skips_last_row, Shape(1, 2, 17, 17, 64), "fp16", False, device="cpu")
    assert not res.ok and res.kind == "nan" and math.isinf(res.max_error)
    assert "128 of" in res.reason  # 1 row x 2 heads x 64


def test_check_fails_a_wrong_lse() -> None:
    def bad_lse(q, k, v, o, lse, scale):
        _sdpa_runner(q, k, v, o, lse, scale)
        lse.add_(0.01)

    res = C.check(bad_lse, Shape(1, 1, 16, 16, 64), "bf16", False, device="cpu")
    assert not res.ok and res.reason.startswith("lse: max error")


def test_check_reuses_given_bounds_on_fresh_inputs() -> None:
    """The worker's second and later checks of a problem judge fresh inputs against the first
    check's tolerances (``bounds``): a correct kernel still passes, the reference is fresh
    (a kernel that ignores the mask still fails), and the bounds given are the ones used."""
    problem = Problem(Shape(1, 2, 40, 40, 64), "fp16", True)
    first = C.check(lambda *a: _sdpa_runner(*a, causal=True), problem, seed=1, device="cpu")
    assert first.ok and first.lse_tolerance is not None
    bounds = (first.tolerance, first.lse_tolerance)
    again = C.check(lambda *a: _sdpa_runner(*a, causal=True), problem, seed=2, device="cpu", bounds=bounds)
    assert again.ok and again.tolerance == first.tolerance and again.lse_tolerance == first.lse_tolerance
    wrong = C.check(lambda *a: _sdpa_runner(*a, causal=False), problem, seed=3, device="cpu", bounds=bounds)
    assert not wrong.ok and wrong.kind == "wrong_result"
    tight = C.check(lambda *a: _sdpa_runner(*a, causal=True), problem, seed=4, device="cpu", bounds=(0.0, None))
    assert not tight.ok and tight.tolerance == 0.0 and tight.lse_tolerance is not None and tight.lse_tolerance > 0


def test_check_draws_fresh_inputs_per_seed() -> None:
    s = Shape(1, 1, 4, 4, 64)
    a = C.make_inputs(s, "fp16", device="cpu", seed=1)[0]
    b = C.make_inputs(s, "fp16", device="cpu", seed=2)[0]
    assert not torch.equal(a, b) and torch.equal(a, C.make_inputs(s, "fp16", device="cpu", seed=1)[0])
    q = C.make_inputs(Shape(2, 3, 5, 5, 64), "fp16", layout="bshd", device="cpu")[0]
    assert q.shape == (2, 3, 5, 64) and q.transpose(1, 2).is_contiguous()


def test_tolerance_is_fa2s_rule() -> None:
    ref = torch.zeros(4)
    assert C.tolerance(torch.tensor([0.0, 0.25, -0.5, 0.0]), ref) == pytest.approx(2 * 0.5 + 1e-5)


def test_reference_is_top_left_causal_and_matches_sdpa() -> None:
    q, k, v = C.make_inputs(Shape(1, 2, 5, 9, 64), "fp16", device="cpu", seed=3)
    ref, lse = C.reference(q, k, v, True, 0.125)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True,
                                                            scale=0.125)
    assert torch.allclose(ref, sdpa, atol=1e-5)
    # row 0 sees key 0 only: out == v[..., 0, :], lse == score(0, 0)
    assert torch.allclose(ref[:, :, 0], v[:, :, 0].float(), atol=1e-6)
    assert torch.allclose(lse[:, :, 0], (q[:, :, 0].float() * k[:, :, 0].float()).sum(-1) * 0.125, atol=1e-5)


def test_low_precision_baseline_is_really_low_precision() -> None:
    q, k, v = C.make_inputs(Shape(1, 2, 128, 128, 64), "bf16", device="cpu", seed=4)
    ref, _ = C.reference(q, k, v, False, 0.125)
    rounding_only = float((ref.to(torch.bfloat16).float() - ref).abs().max())
    assert float((C.torch_low_precision(q, k, v, False, 0.125).float() - ref).abs().max()) > rounding_only


# --------------------------------------------------------------------------- driver binding and timing

def test_cuda_error_names_and_stickiness() -> None:
    e = cuda.CudaError(700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered", "cuLaunchKernel")
    assert e.sticky and e.failure_kind == "illegal_access"
    assert "cuLaunchKernel failed: CUDA_ERROR_ILLEGAL_ADDRESS (700)" in str(e) and "restart" in str(e)
    r = cuda.CudaError(701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources", "cuLaunchKernel")
    assert not r.sticky and r.failure_kind == "launch"


def test_missing_driver_is_a_no_gpu_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import ctypes

    def no_lib(name: str, *a: object, **kw: object) -> None:
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(cuda, "_lib", None)
    monkeypatch.setattr(ctypes, "CDLL", no_lib)
    with pytest.raises(NoGpuError, match="cannot load libcuda.so.1"):
        cuda.driver_version()


def test_import_evotuner_is_lazy() -> None:
    code = ("import sys, evotuner; assert 'torch' not in sys.modules, 'torch imported eagerly'; "
            "import evotuner.runtime.cuda; f = evotuner.flash_attention; assert callable(f)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_quantiles_interpolate() -> None:
    values = [float(x) for x in range(1, 11)]
    assert _quantile(values, 0.5) == pytest.approx(5.5)
    assert _quantile(values, 0.2) == pytest.approx(2.8)
    assert _quantile([3.0], 0.8) == 3.0


@pytest.mark.parametrize("args, kwargs, why", [
    ((5,), {}, "source 5 is a int"),
    ((b"sqlite:///x.db",), {}, "is a bytes"),
    ((None,), {"shipped": "no"}, "shipped='no' is not True or False"),
])
def test_use_tuned_refuses_a_source_or_flag_of_the_wrong_type(args, kwargs, why) -> None:
    """use_tuned(5) once read as a file named '5'; shipped='no' as true."""
    from evotuner import use_tuned
    from evotuner.tuned import TunedError

    with pytest.raises(TunedError, match=why):
        use_tuned(*args, **kwargs)


def test_an_unknown_fastpath_setting_is_said_not_silently_taken(monkeypatch, caplog) -> None:
    from evotuner.runtime import fastpath

    for value, how in (("0", "off"), ("OFF", "off"), ("sync", "sync"), ("", "background"), ("1", "background")):
        monkeypatch.setenv(fastpath.ENV_VAR, value)
        with caplog.at_level("WARNING", logger=fastpath.__name__):
            caplog.clear()
            assert fastpath.mode() == how and not caplog.records
    monkeypatch.setenv(fastpath.ENV_VAR, "maybe")
    with caplog.at_level("WARNING", logger=fastpath.__name__):
        assert fastpath.mode() == "background"
    assert "'maybe' is not one of 0/off, sync, 1/on" in caplog.text
