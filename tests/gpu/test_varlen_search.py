"""Tuning for a packed variable-length batch on the GPU: the real worker measures a packed
build of the hopper family (each sequence checked against its fp32 reference, the ragged
packed check, the timing, the padded and nested SDPA baselines); the packed check fails a
kernel launched wrong (a wrong scale, a grid short of the longest sequence); a short real
``evotuner search --lengths`` end to end, whose best config then runs correctly through
``flash_attention_varlen``; and the issue's speed bar (16 sequences of 128..8192, D=128,
causal) measured against SDPA on the padded batch. Skips without a GPU.

Run on the device: ``python -m pytest -q tests/gpu/test_varlen_search.py``."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")

import evotuner  # noqa: E402
from evotuner.config import KernelConfig  # noqa: E402
from evotuner.family import get_family  # noqa: E402
from evotuner.lengths import packed_problem  # noqa: E402
from evotuner.measure import Measurement  # noqa: E402
from evotuner.problem import Problem  # noqa: E402
from evotuner.runtime.attention import kernel_module  # noqa: E402
from evotuner.runtime.packed import check_packed  # noqa: E402

pytestmark = pytest.mark.gpu

HOPPER = get_family("hopper")
MIXED = Problem.packed([0, 1, 97, 640, 129, 2048, 0, 1500], [5, 1, 300, 640, 0, 2048, 7, 800],
                       heads=8, heads_kv=2, head_dim=128, causal=True)
BAR = packed_problem("H=32,HKV=8,D=128", "random:16:128..8192:seed=0", None, dtype="fp16", causal=True)


@pytest.mark.parametrize("problem", [MIXED, Problem.packed([333, 64, 1000], heads=4, head_dim=64, dtype="bf16")],
                         ids=["mixed-gqa-causal-d128", "bf16-d64"])
def test_the_worker_measures_a_packed_build(builder, gpu, problem):
    config = HOPPER.recommended_configs(problem)[0]
    build = builder.build(config, problem)
    assert build.ok, build.error
    assert build.artifact.meta["varlen"] == 1
    out = gpu.measure(build.artifact, problem)
    assert isinstance(out, Measurement), out
    assert 0 < out.p20_us <= out.median_us <= out.p80_us and out.repetitions >= 10
    assert math.isclose(out.tflops, problem.tflops(out.median_us))
    assert out.max_error <= out.tolerance and out.tolerance > 0
    detail = gpu.last_detail
    assert detail["ragged_max_error"] <= detail["ragged_tolerance"], detail
    assert "sequences" in detail["ragged_shape"]
    # a dense build is refused for the packed problem, naming why
    dense = builder.build(config, Problem(problem.shape, problem.dtype, problem.causal))
    refused = gpu.measure(dense.artifact, problem)
    assert not isinstance(refused, Measurement) and refused.kind == "launch" and "varlen=0" in refused.reason


def test_the_packed_baselines_run(gpu):
    baselines = gpu.baselines(MIXED)
    assert set(baselines) == {"sdpa_padded", "sdpa_jagged"}
    assert baselines["sdpa_padded"] and baselines["sdpa_padded"] > 0
    # nested tensors: timed, or None with SDPA's reason
    assert baselines["sdpa_jagged"] or gpu.baseline_reasons["sdpa_jagged"]


def test_the_packed_check_fails_a_wrong_launch():
    config = HOPPER.recommended_configs(MIXED)[0]
    module = kernel_module(config, Problem(MIXED.shape, MIXED.dtype, MIXED.causal, varlen=True), 0, "hopper")
    right = check_packed(module.launch_varlen, MIXED, seed=3, device="cuda:0")
    assert right.ok, right.reason

    def wrong_scale(q, k, v, o, lse, scale, *packed):
        module.launch_varlen(q, k, v, o, lse, scale * 1.5, *packed)

    wrong = check_packed(wrong_scale, MIXED, seed=3, device="cuda:0")
    assert not wrong.ok and wrong.kind == "wrong_result"

    def short_grid(q, k, v, o, lse, scale, cu_q, cu_k, max_q, max_k):
        module.launch_varlen(q, k, v, o, lse, scale, cu_q, cu_k, 128, max_k)    # rows past 128 never written

    unwritten = check_packed(short_grid, MIXED, seed=3, device="cuda:0")
    assert not unwritten.ok and unwritten.kind == "nan"


def test_a_short_packed_search_end_to_end(capsys, tmp_path, monkeypatch):
    from evotuner import cli

    monkeypatch.setenv("EVOTUNER_CACHE_DIR", str(tmp_path / "cache"))
    db = f"sqlite:///{tmp_path / 'studies.db'}"
    code = cli.main(["search", "--study", "v", "--shape", "H=8,HKV=2,D=128", "--lengths",
                     "random:6:100..2000:seed=0", "--causal", "--trials", "6", "--storage", db])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "sdpa_padded" in out
    code = cli.main(["show", "--study", "v", "--json", "--storage", db])
    data = json.loads(capsys.readouterr()[0])
    assert code == 0 and data["best"] is not None and data["counts"].get("COMPLETE", 0) >= 1
    problem = Problem.from_dict(data["problem"])
    assert problem.varlen and len(problem.lengths_q) == 6
    best = KernelConfig.of(data["best"]["params"])

    def through_the_op(q, k, v, o, lse, scale, cu_q, cu_k, max_q, max_k):
        out, out_lse = evotuner.flash_attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=True, scale=scale,
                                                       config=best, return_lse=True)
        o.copy_(out)
        lse.copy_(out_lse)

    result = check_packed(through_the_op, problem, seed=11, device="cuda:0")
    assert result.ok, result.reason
    code = cli.main(["bench", "--study", "v", "--top", "1", "--json", "--storage", db])
    bench = json.loads(capsys.readouterr()[0])
    assert code == 0 and bench["rows"][0]["median_us"] > 0


def test_the_speed_bar(builder, gpu):
    """16 sequences of 128..8192 (D=128, causal, GQA 32/8): the recommended config, built
    packed, is correct and faster than SDPA on the batch padded to its longest sequence."""
    config = HOPPER.recommended_configs(BAR)[0]
    build = builder.build(config, BAR)
    assert build.ok, build.error
    out = gpu.measure(build.artifact, BAR)
    assert isinstance(out, Measurement), out
    baselines = gpu.baselines(BAR)
    print(f"\nspeed bar {BAR}: {out.median_us:.1f} µs ({out.tflops:.0f} TFLOP/s); SDPA {baselines} "
          f"{gpu.baseline_reasons}")
    assert baselines["sdpa_padded"] and out.median_us < baselines["sdpa_padded"]
