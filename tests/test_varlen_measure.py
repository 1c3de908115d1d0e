"""The measure stage's side of a packed variable-length problem, without a GPU: the protocol
carries its lengths to the worker, the client asks for the packed baselines, the packed
inputs and the per-sequence correctness check (run on the CPU against runners that are
right, leave rows unwritten, ignore the mask or write into a sequence without keys), the
ragged packed check's lengths, and the SDPA baselines' calls. The GPU side:
tests/gpu/test_varlen_search.py."""

from __future__ import annotations

import json
import math
import os
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from evotuner.compiler.result import Artifact  # noqa: E402
from evotuner.measure import GpuMeasure, Measurement  # noqa: E402
from evotuner.measure.gpu import BASELINES, PACKED_BASELINES, baseline_names  # noqa: E402
from evotuner.measure.protocol import Request, decode_payload, encode, measure_request  # noqa: E402
from evotuner.measure.worker import Worker  # noqa: E402
from evotuner.measure.worker_tools import RAGGED_LENGTHS_K, RAGGED_LENGTHS_Q, ragged_problem  # noqa: E402
from evotuner.problem import Problem, Shape  # noqa: E402
from evotuner.runtime import check as C  # noqa: E402
from evotuner.runtime.packed import check_packed, make_packed_inputs, offsets, packed_baselines  # noqa: E402

PACKED = Problem.packed([5, 0, 70, 3, 33], [9, 4, 70, 0, 20], heads=4, head_dim=64, heads_kv=2, causal=True)


def _request_problem(problem: Problem) -> Problem:
    request = measure_request("/x/k.cubin", "hopper_fwd", {"head_dim": 64}, problem.as_dict(), seed=3, budget_s=0.1)
    wire = decode_payload(encode(request.to_wire())[8:])
    return Problem.from_dict(Request.from_wire(wire).args["problem"])


def test_the_measure_request_carries_the_lengths():
    assert _request_problem(PACKED) == PACKED
    bar = Problem.packed(tuple(range(128, 8193, 512)), heads=32, heads_kv=8, head_dim=128, causal=True)
    assert _request_problem(bar).lengths_q == bar.lengths_q
    dense = Problem(Shape(2, 4, 256, 256, 64))
    assert _request_problem(dense) == dense


def test_a_packed_problem_has_its_own_baselines():
    assert baseline_names(PACKED) == PACKED_BASELINES == ("sdpa_padded", "sdpa_jagged")
    assert baseline_names(Problem(Shape(2, 4, 256, 256, 64))) == BASELINES
    calls = packed_baselines(PACKED, device="cpu")
    assert tuple(calls) == PACKED_BASELINES
    assert calls["sdpa_padded"]().shape == (5, 4, 70, 64)     # the batch padded to its longest lengths
    noncausal = Problem.packed([5, 0, 70], [9, 4, 70], heads=4, head_dim=64, heads_kv=2)
    calls = packed_baselines(noncausal, device="cpu")
    out = calls["sdpa_jagged"]()                          # the sequences with queries and keys
    assert out.is_nested and out.size(0) == 2
    padded = calls["sdpa_padded"]()                       # keys past each sequence masked
    assert padded.shape == (3, 4, 70, 64) and bool(torch.isfinite(padded[0]).all())


def test_packed_inputs_are_fresh_per_seed_and_offsets_are_int32():
    q, k, v, cu_q, cu_k = make_packed_inputs(PACKED, device="cpu", seed=1)
    assert q.shape == (sum(PACKED.lengths_q), 4, 64) and k.shape == v.shape == (sum(PACKED.lengths_k), 2, 64)
    assert q.dtype == torch.float16 and cu_q.dtype == cu_k.dtype == torch.int32
    assert cu_q.tolist() == [0, 5, 5, 75, 78, 111] and cu_k.tolist() == [0, 9, 13, 83, 83, 103]
    again = make_packed_inputs(PACKED, device="cpu", seed=1)[0]
    assert torch.equal(q, again) and not torch.equal(q, make_packed_inputs(PACKED, device="cpu", seed=2)[0])
    assert offsets((0, 0), "cpu").tolist() == [0, 0, 0]
    with pytest.raises(Exception, match="no sequence lengths"):
        make_packed_inputs(Problem(Shape(2, 4, 8, 8, 64), varlen=True), device="cpu")


def _runner(causal: bool, *, skip: int | None = None, no_key_value: float = 0.0):
    """A packed 'kernel' on the CPU: each sequence's fp32 reference rounded to the dtype;
    ``skip``: a sequence left unwritten; ``no_key_value``: what a sequence without keys gets."""
    def run(q, k, v, o, lse, scale, cu_q, cu_k, max_q, max_k):
        assert max_q == max(int(cu_q[b + 1] - cu_q[b]) for b in range(len(cu_q) - 1))
        for b in range(len(cu_q) - 1):
            rows, keys = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
            if rows.start == rows.stop or b == skip:
                continue
            if keys.start == keys.stop:
                o[rows] = no_key_value
                lse[:, rows] = float("-inf")
                continue
            ref, ref_lse = C.reference(q[rows].transpose(0, 1)[None], k[keys].transpose(0, 1)[None],
                                       v[keys].transpose(0, 1)[None], causal, scale)
            o[rows] = ref[0].transpose(0, 1).to(o.dtype)
            lse[:, rows] = ref_lse[0]
    return run


def test_the_packed_check_passes_a_right_kernel_and_reports_its_closest_sequence():
    result = check_packed(_runner(True), PACKED, device="cpu", seed=5)
    assert result.ok and result.kind is None
    assert 0 < result.max_error <= result.tolerance


def test_the_packed_check_fails_unwritten_rows_a_wrong_mask_and_a_sequence_without_keys():
    unwritten = check_packed(_runner(True, skip=2), PACKED, device="cpu")
    assert not unwritten.ok and unwritten.kind == "nan" and "sequence 2 (Sq=70, Sk=70)" in unwritten.reason
    assert unwritten.max_error == math.inf
    unmasked = check_packed(_runner(False), PACKED, device="cpu")
    assert not unmasked.ok and unmasked.kind == "wrong_result" and "exceeds the tolerance" in unmasked.reason
    no_keys = check_packed(_runner(True, no_key_value=1.0), PACKED, device="cpu")
    assert not no_keys.ok and no_keys.kind == "wrong_result" and "sequence 3 (Sq=3, Sk=0)" in no_keys.reason
    nan_no_keys = check_packed(_runner(True, no_key_value=float("nan")), PACKED, device="cpu")
    assert not nan_no_keys.ok and nan_no_keys.kind == "nan"


def test_the_ragged_packed_check_covers_empty_sequences_and_keeps_the_grouping():
    r = ragged_problem(PACKED)
    assert r.varlen and r.lengths_q == RAGGED_LENGTHS_Q and r.lengths_k == RAGGED_LENGTHS_K
    pairs = r.sequences()
    assert (0, 17) in pairs and any(q and not k for q, k in pairs)
    assert any(q > k > 0 for q, k in pairs) and any(0 < q < k for q, k in pairs)
    assert r.shape.kv_group == PACKED.shape.kv_group and (r.dtype, r.causal) == (PACKED.dtype, PACKED.causal)
    dense = ragged_problem(Problem(Shape(2, 8, 256, 256, 128, 2), "bf16", True))
    assert not dense.varlen and (dense.shape.seqlen_q, dense.shape.seqlen_k) == (97, 203)
    assert check_packed(_runner(False), Problem.packed(r.lengths_q, r.lengths_k, heads=2, head_dim=64),
                        device="cpu").ok


FAKE = textwrap.dedent(r'''
    import json, os, sys
    from evotuner.measure.protocol import read_message_blocking, write_message, PipeClosed
    inp, out = os.fdopen(os.dup(0), "rb", buffering=0), os.fdopen(os.dup(1), "wb", buffering=0)
    log = open(os.environ["FAKE_LOG"], "a")
    while True:
        try:
            msg = read_message_blocking(inp)
        except PipeClosed:
            sys.exit(0)
        log.write(json.dumps(msg) + "\n"); log.flush()
        op = msg["op"]
        if op == "baselines":
            write_message(out, {"ok": True, "value": {"sdpa_padded": {"us": 900.0, "reason": None},
                                                      "sdpa_jagged": {"us": None, "reason": "nested refused"}}})
        elif op == "measure":
            write_message(out, {"ok": True, "value": {"measurement": {
                "median_us": 100.0, "p20_us": 99.0, "p80_us": 101.0, "tflops": 1.0, "max_error": 1e-3,
                "tolerance": 2e-3, "repetitions": 10}, "detail": {}}})
        else:
            write_message(out, {"ok": True, "value": {"pid": os.getpid(), "name": "fake"}})
            if op == "shutdown":
                sys.exit(0)
''')


def test_the_client_sends_the_lengths_and_reads_the_packed_baselines(tmp_path: Path):
    script, log = tmp_path / "fake.py", tmp_path / "requests.log"
    script.write_text(FAKE)
    env = {**os.environ, "FAKE_LOG": str(log), "PYTHONPATH": os.pathsep.join(sys.path)}
    with GpuMeasure(timeout_s=20, worker_cmd=[sys.executable, str(script)], env=env) as gm:
        assert gm.baselines(PACKED) == {"sdpa_padded": 900.0, "sdpa_jagged": None}
        assert gm.baseline_reasons == {"sdpa_jagged": "nested refused"}
        artifact = Artifact(cubin=tmp_path / "k.cubin", key="k", sha256="", meta={}, entry="hopper_fwd",
                            family="hopper")
        assert isinstance(gm.measure(artifact, PACKED), Measurement)
    sent = [json.loads(line) for line in log.read_text().splitlines()]
    problems = [Problem.from_dict(m["problem"]) for m in sent if m["op"] in ("baselines", "measure")]
    assert problems == [PACKED, PACKED]


def test_the_worker_refuses_a_dense_build_or_a_problem_without_lengths_before_touching_cuda(tmp_path: Path):
    worker = Worker()
    meta = {"head_dim": 64, "is_causal": 1, "dtype": 0, "varlen": 0}
    reply = worker.handle(Request("measure", {"cubin": str(tmp_path / "dense.cubin"), "meta": meta,
                                              "problem": PACKED.as_dict(), "seed": 0}))
    assert not reply.ok and reply.failure.kind == "launch"
    assert "built for varlen=0 (problem: 1)" in reply.failure.reason
    bare = Problem(Shape(2, 4, 64, 64, 64), causal=True, varlen=True)
    reply = worker.handle(Request("measure", {"cubin": str(tmp_path / "k.cubin"), "meta": {**meta, "varlen": 1},
                                              "problem": bare.as_dict(), "seed": 0}))
    assert not reply.ok and reply.failure.kind == "launch" and "without sequence lengths" in reply.failure.reason
    assert worker.torch is None          # neither reached the GPU
