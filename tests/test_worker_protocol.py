"""The GPU worker protocol and the parent client, without a GPU.

The REAL GpuMeasure client talks to fake workers (a small script written to
tmp_path that speaks the real framing and misbehaves on cue: hangs, dies,
writes garbage, reports a fatal error, leaves a grandchild behind). Every test
checks that the parent answers in bounded time with the right failure kind,
that the next request works on a fresh worker, and that no zombie or stray
process is left.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from evotuner.compiler.result import Artifact
from evotuner.measure import GpuMeasure, Measurement, MeasureFailure
from evotuner.measure.protocol import (
    MAGIC, MAX_FRAME, FrameReader, FrameTimeout, PipeClosed, ProtocolError, Reply, Request, encode,
    measure_request, read_message_blocking,
)
from evotuner.measure.worker import Worker, serve
from evotuner.problem import Problem, Shape

PROBLEM = Problem(Shape(2, 4, 256, 256, 64), "fp16", causal=False)

FAKE_WORKER = textwrap.dedent(r'''
    import os, sys, time, subprocess
    from pathlib import Path
    from evotuner.measure.protocol import read_message_blocking, write_message, PipeClosed

    inp = os.fdopen(os.dup(0), "rb", buffering=0)
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    mode = os.environ.get("FAKE_MODE", "")
    if mode == "hang_at_start":
        time.sleep(3600)

    def reply(value):
        write_message(out, {"ok": True, "value": value})

    while True:
        try:
            msg = read_message_blocking(inp)
        except PipeClosed:
            sys.exit(0)
        op = msg["op"]
        if op in ("init", "ping"):
            reply({"pid": os.getpid()})
        elif op == "shutdown":
            reply({"pid": os.getpid()})
            sys.exit(0)
        elif op == "fingerprint":
            reply({"name": "fake GPU", "sm_count": 1, "pid": os.getpid()})
        elif op == "baselines":
            reply({"sdpa_default": {"us": 12.5, "reason": None},
                   "sdpa_flash": {"us": None, "reason": "flash cannot run D=64 here"},
                   "sdpa_efficient": {"us": 20.0, "reason": None}})
        elif op == "measure":
            what = Path(msg["cubin"]).stem
            if what == "slow":
                time.sleep(0.6)
            if what in ("ok", "slow"):
                reply({"measurement": {"median_us": 100.0, "p20_us": 99.0, "p80_us": 101.0,
                                       "tflops": 1.5, "max_error": 1e-3, "tolerance": 2e-3,
                                       "repetitions": 50},
                       "detail": {"pid": os.getpid(), "seed": msg["seed"]}})
            elif what == "hang":
                time.sleep(3600)
            elif what == "die":
                sys.stderr.write("fake worker: dying on purpose\n"); sys.stderr.flush()
                os._exit(7)
            elif what == "segv":
                os.kill(os.getpid(), 11)
            elif what == "garbage":
                out.write(b"Segmentation fault (core dumped)\n"); out.flush()
                time.sleep(3600)
            elif what == "badvalue":
                reply({"measurement": {"median_us": "fast"}})
            elif what == "nan":
                write_message(out, {"ok": False, "failure": {"kind": "nan", "reason": "3 NaN"}, "fatal": False})
            elif what == "fatal":
                write_message(out, {"ok": False, "fatal": True,
                                    "failure": {"kind": "illegal_access", "reason": "CUDA_ERROR_ILLEGAL_ADDRESS"}})
                os._exit(3)
            elif what == "grandchild":
                child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
                Path(os.environ["FAKE_PIDFILE"]).write_text(str(child.pid))
                time.sleep(3600)
            else:
                raise SystemExit(f"fake worker: unknown cubin {what}")
''')


@pytest.fixture
def fake_worker(tmp_path: Path) -> list[str]:
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)
    return [sys.executable, str(script)]


def artifact(tmp_path: Path, what: str) -> Artifact:
    cubin = tmp_path / f"{what}.cubin"
    cubin.write_bytes(b"\x7fELF fake")
    meta = {"abi": 1, "threads": 128, "smem_bytes": 49152, "block_m": 128, "block_n": 64, "head_dim": 64,
            "is_causal": 0, "dtype": 0, "min_blocks": 1}
    return Artifact(cubin=cubin, key=f"key-{what}", sha256="0" * 64, meta=meta)


def zombies_of_this_process() -> list[int]:
    """Children of this test process in state Z (scanned from /proc, no psutil)."""
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] == "Z" and int(fields[1]) == me:
            found.append(int(entry))
    return found


def gone(pid: int) -> bool:
    """True once the process is gone AND reaped (a zombie still answers kill(pid, 0))."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def assert_clean(client: GpuMeasure) -> None:
    client.close()
    assert client.worker_pid is None
    for pid in client.spawned_pids:
        assert gone(pid), f"worker {pid} is still there"
    assert zombies_of_this_process() == []


# ------------------------------------------------------------------ framing
def test_frame_round_trip_through_a_pipe_in_pieces() -> None:
    messages = [{"op": "ping"}, {"ok": True, "value": {"x": [1, 2.5, None], "s": "é∑"}},
                {"ok": True, "value": {"err": float("inf")}}]
    data = b"".join(encode(m) for m in messages)
    r, w = os.pipe()
    try:
        reader = FrameReader(r)
        got = []
        # Write in 3-byte pieces: frames split across reads and several frames in one read both occur.
        for i in range(0, len(data), 3):
            os.write(w, data[i:i + 3])
        for _ in messages:
            got.append(reader.read(timeout_s=2.0))
        assert got[:2] == messages[:2]
        assert got[2]["value"]["err"] == float("inf")
    finally:
        os.close(r)
        os.close(w)


def test_frame_reader_times_out_on_a_partial_frame_then_reports_eof() -> None:
    r, w = os.pipe()
    try:
        reader = FrameReader(r)
        os.write(w, encode({"op": "ping"})[:6])
        start = time.monotonic()
        with pytest.raises(FrameTimeout):
            reader.read(timeout_s=0.3)
        assert 0.25 < time.monotonic() - start < 2.0
        os.close(w)
        w = -1
        with pytest.raises(PipeClosed, match="6 bytes"):
            reader.read(timeout_s=2.0)
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


@pytest.mark.parametrize("garbage", [b"Segmentation fault\n", b"E", b"EVT2\x00\x00\x00\x01x",
                                     MAGIC + (MAX_FRAME + 1).to_bytes(4, "big"),
                                     MAGIC + (3).to_bytes(4, "big") + b"{x}"])
def test_garbage_is_a_protocol_error_at_once(garbage: bytes) -> None:
    r, w = os.pipe()
    try:
        os.write(w, garbage)
        if garbage == b"E":
            os.write(w, b"X")  # "E" alone could still be the start of the magic
        start = time.monotonic()
        with pytest.raises(ProtocolError):
            FrameReader(r).read(timeout_s=5.0)
        assert time.monotonic() - start < 1.0
    finally:
        os.close(r)
        os.close(w)


def test_blocking_reader_and_request_reply_values() -> None:
    req = measure_request("/x/a.cubin", "flashcore_fwd", {"threads": 128}, PROBLEM.as_dict(), seed=3, budget_s=0.4,
                          key="k", sha256="s")
    stream = io.BytesIO(encode(req.to_wire()))
    back = Request.from_wire(read_message_blocking(stream))
    assert back == req and back.args == req.args
    with pytest.raises(PipeClosed, match="between frames"):
        read_message_blocking(stream)
    with pytest.raises(ProtocolError, match="unknown op"):
        Request.from_wire({"op": "format_disk"})
    fail = Reply.fail("illegal_access", "boom", fatal=True)
    assert Reply.from_wire(fail.to_wire()) == fail
    with pytest.raises(ProtocolError):
        Reply.from_wire({"ok": False, "failure": {"kind": "gremlins", "reason": ""}})
    with pytest.raises(ProtocolError):
        Reply.from_wire({"value": 1})


def test_real_worker_serve_loop_without_cuda() -> None:
    """The real worker's loop: ping, an unknown op, then shutdown ends it with status 0."""
    inp = io.BytesIO(encode({"op": "ping"}) + encode({"op": "nope"}) + encode({"op": "shutdown"})
                     + encode({"op": "ping"}))
    out = io.BytesIO()
    assert serve(inp, out, Worker()) == 0
    out.seek(0)
    first, second, third = (Reply.from_wire(read_message_blocking(out)) for _ in range(3))
    assert first.ok and first.value["pid"] == os.getpid()
    assert not second.ok and second.failure.kind == "crash" and "unknown op" in second.failure.reason
    assert third.ok
    with pytest.raises(PipeClosed):  # nothing answered after shutdown
        read_message_blocking(out)


# -------------------------------------------------------- client vs fake workers
def test_measure_ok_baselines_and_fingerprint(tmp_path: Path, fake_worker: list[str]) -> None:
    with GpuMeasure(worker_cmd=fake_worker, timeout_s=5.0, start_timeout_s=10.0) as gm:
        out = gm.measure(artifact(tmp_path, "ok"), PROBLEM)
        assert isinstance(out, Measurement) and out.median_us == 100.0 and out.repetitions == 50
        assert gm.last_detail["pid"] == gm.worker_pid
        assert gm.baselines(PROBLEM) == {"sdpa_default": 12.5, "sdpa_flash": None, "sdpa_efficient": 20.0}
        assert "flash cannot run" in gm.baseline_reasons["sdpa_flash"]
        assert gm.device()["name"] == "fake GPU"
        assert gm.spawns == 1
    assert_clean(gm)


def test_submit_returns_while_the_worker_times_and_replies_never_cross(tmp_path: Path, fake_worker: list[str]) -> None:
    with GpuMeasure(worker_cmd=fake_worker, timeout_s=5.0, start_timeout_s=10.0) as gm:
        gm.shutdown_grace_s = 0.5
        assert gm.ping()
        start = time.monotonic()
        pending = gm.submit(artifact(tmp_path, "slow"), PROBLEM)
        assert time.monotonic() - start < 0.4, "submit must not wait for the worker's answer"
        assert pending.in_progress
        # another request first collects the owed measurement: its reply is not taken for the fingerprint
        assert gm.device()["name"] == "fake GPU"
        assert not pending.in_progress
        out = pending.result()
        assert isinstance(out, Measurement) and out.median_us == 100.0 and pending.result() is out
        assert time.monotonic() - start >= 0.6
        # a second submit collects the first; each keeps its own outcome
        first = gm.submit(artifact(tmp_path, "ok"), PROBLEM)
        second = gm.submit(artifact(tmp_path, "nan"), PROBLEM)
        assert second.result() == MeasureFailure("nan", "3 NaN")
        assert isinstance(first.result(), Measurement)
        # closing with a measurement owed (a hung kernel) settles it as lost, after the grace
        hung = gm.submit(artifact(tmp_path, "hang"), PROBLEM)
    out = hung.result()
    assert isinstance(out, MeasureFailure) and out.kind == "crash" and "stopped before it answered" in out.reason
    assert_clean(gm)


def test_hang_times_out_kills_the_process_group_and_the_next_trial_works(
        tmp_path: Path, fake_worker: list[str]) -> None:
    pidfile = tmp_path / "grandchild.pid"
    gm = GpuMeasure(worker_cmd=fake_worker, timeout_s=1.0, start_timeout_s=10.0,
                    env={**os.environ, "FAKE_PIDFILE": str(pidfile)})
    assert isinstance(gm.measure(artifact(tmp_path, "ok"), PROBLEM), Measurement)
    first = gm.spawned_pids[-1]
    start = time.monotonic()
    out = gm.measure(artifact(tmp_path, "hang"), PROBLEM)
    assert time.monotonic() - start < 5.0
    assert out == MeasureFailure(out.kind, out.reason) and out.kind == "timeout"
    assert "within 1.0 s" in out.reason and "restarted" in out.reason
    assert gone(first) and zombies_of_this_process() == []
    # A worker that left a grandchild in its group: the timeout kills the whole group.
    out = gm.measure(artifact(tmp_path, "grandchild"), PROBLEM)
    assert out.kind == "timeout"
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 5.0
    while not _dead_or_zombie(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _dead_or_zombie(grandchild), "the grandchild in the worker's process group survived"
    ok = gm.measure(artifact(tmp_path, "ok"), PROBLEM)
    assert isinstance(ok, Measurement)
    assert gm.spawns == 3
    assert_clean(gm)


def _dead_or_zombie(pid: int) -> bool:
    """The grandchild is reparented to init (or a subreaper), which reaps it; a Z state counts as dead."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


@pytest.mark.parametrize("what,expect", [
    ("die", "exit status 7"),
    ("segv", "killed by signal SIGSEGV"),
    ("garbage", "garbage"),
    ("badvalue", "malformed measurement"),
])
def test_crashes_become_crash_failures_and_the_worker_restarts(
        tmp_path: Path, fake_worker: list[str], what: str, expect: str) -> None:
    gm = GpuMeasure(worker_cmd=fake_worker, timeout_s=5.0, start_timeout_s=10.0)
    start = time.monotonic()
    out = gm.measure(artifact(tmp_path, what), PROBLEM)
    assert time.monotonic() - start < 4.0, "a crash must be noticed at once, not after the timeout"
    assert isinstance(out, MeasureFailure) and out.kind == "crash", out
    assert expect in out.reason
    if what == "die":
        assert "dying on purpose" in out.reason  # the worker's stderr tail is in the reason
    assert isinstance(gm.measure(artifact(tmp_path, "ok"), PROBLEM), Measurement)
    assert gm.spawns == 2
    assert_clean(gm)


def test_fatal_failure_reaps_the_worker_and_plain_failures_keep_it(tmp_path: Path, fake_worker: list[str]) -> None:
    gm = GpuMeasure(worker_cmd=fake_worker, timeout_s=5.0, start_timeout_s=10.0)
    out = gm.measure(artifact(tmp_path, "nan"), PROBLEM)
    assert out == MeasureFailure("nan", "3 NaN")
    pid = gm.worker_pid
    assert pid is not None  # a non-fatal failure keeps the worker
    out = gm.measure(artifact(tmp_path, "fatal"), PROBLEM)
    assert out.kind == "illegal_access"
    assert gm.worker_pid is None and gone(pid) and zombies_of_this_process() == []
    assert isinstance(gm.measure(artifact(tmp_path, "ok"), PROBLEM), Measurement)
    assert gm.spawns == 2
    assert_clean(gm)


def test_worker_that_never_starts_is_a_timeout_and_baselines_degrade_to_none(fake_worker: list[str]) -> None:
    gm = GpuMeasure(worker_cmd=fake_worker, timeout_s=0.5, start_timeout_s=0.5,
                    env={**os.environ, "FAKE_MODE": "hang_at_start"})
    start = time.monotonic()
    assert gm.baselines(PROBLEM) == {"sdpa_default": None, "sdpa_flash": None, "sdpa_efficient": None}
    assert time.monotonic() - start < 3.0
    assert "failed to start" in gm.baseline_reasons["sdpa_flash"]
    assert gm.ping() is False
    assert_clean(gm)


def test_missing_worker_executable_is_not_a_hang(tmp_path: Path) -> None:
    gm = GpuMeasure(worker_cmd=[sys.executable, str(tmp_path / "no_such_worker.py")], timeout_s=5.0,
                    start_timeout_s=10.0)
    out = gm.measure(artifact(tmp_path, "ok"), PROBLEM)
    assert out.kind == "crash" and "failed to start" in out.reason and "exit status 2" in out.reason
    assert_clean(gm)


def test_real_worker_on_a_machine_without_cuda_reports_why(tmp_path: Path) -> None:
    """The real `python -m evotuner.measure.worker` (skipped where a GPU is usable)."""
    from evotuner.measure import gpu_available

    if gpu_available():
        pytest.skip("a GPU is visible: tests/gpu/ covers the real worker")
    gm = GpuMeasure(timeout_s=30.0, start_timeout_s=120.0)
    out = gm.measure(artifact(tmp_path, "ok"), PROBLEM)
    assert isinstance(out, MeasureFailure) and out.kind == "crash"
    assert "failed to start" in out.reason and "torch.cuda.is_available() is False" in out.reason
    assert_clean(gm)


def test_gpu_available_does_not_import_torch_here() -> None:
    code = ("import sys; from evotuner.measure import gpu_available; r = gpu_available(); "
            "assert isinstance(r, bool); assert 'torch' not in sys.modules, 'torch imported'; print(r)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() in ("True", "False")


def test_close_kills_a_worker_that_ignores_shutdown(tmp_path: Path, fake_worker: list[str]) -> None:
    gm = GpuMeasure(worker_cmd=fake_worker, timeout_s=5.0, start_timeout_s=10.0)
    assert gm.ping()
    pid = gm.worker_pid
    os.kill(pid, signal.SIGSTOP)  # a stopped worker cannot answer shutdown
    gm.shutdown_grace_s = 0.5
    start = time.monotonic()
    gm.close()
    assert time.monotonic() - start < 3.0
    assert gone(pid)
    assert_clean(gm)


def test_unstartable_worker_command_is_a_crash_failure(tmp_path: Path) -> None:
    gm = GpuMeasure(worker_cmd=[str(tmp_path / "no-such-python")], timeout_s=5.0)
    out = gm.measure(artifact(tmp_path, "ok"), PROBLEM)
    assert out.kind == "crash" and "could not be started" in out.reason
    assert gm.spawns == 0
    assert_clean(gm)


def test_gpu_model_name_comes_from_nvidia_smi_without_starting_the_worker(monkeypatch) -> None:
    """--gpus checks the GPUs are one model before any build: the name from nvidia-smi, no
    worker start (a torch import and a CUDA context); renumbered GPUs ask the worker."""
    from evotuner.errors import NoGpuError
    from evotuner.measure import fingerprint as F
    from evotuner.measure.gpu import GpuMeasure

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(F, "nvidia_smi_query", lambda index: ({"name": f"GPU model {index}"}, None))
    stage = GpuMeasure(device_index=3, worker_cmd=[sys.executable, "-c", "import sys; sys.exit(3)"],
                       start_timeout_s=10.0)
    try:
        assert stage.model_name() == "GPU model 3" and stage.spawns == 0
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")    # nvidia-smi's index 3 is not torch's 3
        with pytest.raises(NoGpuError):
            stage.model_name()
        assert stage.spawns >= 1
    finally:
        stage.close()


def test_closing_a_worker_that_is_still_starting_does_not_wait_for_it(fake_worker: list[str]) -> None:
    """A command that fails right after starting the worker (a study mismatch, say) exits at
    once: close() kills a worker whose start nobody waited for instead of letting it finish."""
    gm = GpuMeasure(worker_cmd=fake_worker, timeout_s=5.0, start_timeout_s=10.0,
                    env={**os.environ, "FAKE_MODE": "hang_at_start"})
    gm.start()
    pid = gm.worker_pid
    assert pid is not None
    started = time.monotonic()
    gm.close()
    assert time.monotonic() - started < 2.0
    assert gone(pid) and zombies_of_this_process() == []
