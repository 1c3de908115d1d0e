"""GpuMeasure: the parent-side client of the GPU worker process.

The search process never touches CUDA. GpuMeasure spawns
``python -m evotuner.measure.worker`` in its own process group with pipes,
speaks :mod:`evotuner.measure.protocol` to it, and turns everything that can go
wrong with a kernel into a :class:`MeasureFailure`:

========================  ==================================================
what happened             outcome
========================  ==================================================
worker replied a failure  that failure (launch, smem, wrong_result, nan, ...)
reply marked ``fatal``    that failure (illegal_access); the worker exits and
                          is respawned on the next request
no reply in time          ``timeout``; the worker's process group is killed
EOF / garbage on the pipe ``crash`` with the exit status and stderr tail
========================  ==================================================

Every read has a deadline, every kill is followed by ``wait()`` (no zombies),
and the worker is respawned on demand, so the next trial works.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from functools import lru_cache
from typing import Any, Sequence

from evotuner import prestart
from evotuner.compiler.result import Artifact
from evotuner.errors import NoGpuError
from evotuner.measure.base import MeasureFailure, MeasureOutcome, MeasureStage, PendingMeasure
from evotuner.measure.protocol import (
    FrameReader, FrameTimeout, PipeClosed, ProtocolError, Reply, Request, encode, measure_request,
    measurement_from_wire,
)
from evotuner.measure.racing import Race
from evotuner.problem import Problem

#: Names of the SDPA baselines, in the order ``baselines()`` returns them.
BASELINES = ("sdpa_default", "sdpa_flash", "sdpa_efficient")
#: A packed variable-length problem's: SDPA's default backend on the batch padded to its
#: longest lengths, and on jagged nested tensors (evotuner/runtime/packed.py).
PACKED_BASELINES = ("sdpa_padded", "sdpa_jagged")


def baseline_names(problem: Problem) -> tuple[str, ...]:
    """The baselines measured for ``problem`` (dense: SDPA's backends; packed: padded and nested)."""
    return PACKED_BASELINES if problem.varlen else BASELINES

_STDERR_TAIL = 1500


class _WorkerLost(Exception):
    """The worker did not answer properly; ``kind`` is timeout or crash."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


class GpuMeasure(MeasureStage):
    """Measures artifacts in a separate worker process bound to one GPU.

    ``timeout_s`` bounds one request (a measure trial, a baseline set);
    ``start_timeout_s`` bounds the worker's start (torch import + CUDA context).
    ``budget_s`` is the timing budget per trial the worker spends (~0.3-1 s).
    ``worker_cmd`` replaces the worker's command line (tests plant fake workers
    there); by default ``[python, "-m", "evotuner.measure.worker"]``.
    """

    def __init__(
        self,
        device_index: int = 0,
        timeout_s: float = 60.0,
        python: str = sys.executable,
        *,
        start_timeout_s: float = 180.0,
        budget_s: float = 0.5,
        seed: int = 0,
        worker_cmd: Sequence[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        if timeout_s <= 0 or start_timeout_s <= 0:
            raise ValueError("timeout_s and start_timeout_s must be positive")
        self.device_index = int(device_index)
        self.timeout_s = float(timeout_s)
        self.start_timeout_s = float(start_timeout_s)
        self.budget_s = float(budget_s)
        self.seed = int(seed)
        self.worker_cmd = list(worker_cmd) if worker_cmd is not None else prestart.worker_command(python)
        self.env = env
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: FrameReader | None = None
        self._stderr: Any = None
        self._trials = 0
        self._lock = threading.Lock()
        #: How many workers were started (1 + restarts); tests and the CLI report it.
        self.spawns = 0
        #: Pids of every worker this client started (for zombie checks).
        self.spawned_pids: list[int] = []
        #: The last measure's extra numbers (ragged-shape error, timing detail) or failure detail.
        self.last_detail: dict[str, Any] = {}
        #: Why a baseline is None, filled by ``baselines()``.
        self.baseline_reasons: dict[str, str] = {}
        self._fingerprint: dict[str, object] | None = None
        #: ``start()`` sent ``init`` and nobody has read its reply yet.
        self._init_pending = False
        #: The submitted measurement whose reply is not read yet (one at most).
        self._owed: PendingMeasure | None = None

    #: The worker races (evotuner/measure/racing.py): ``measure`` takes the loop's ``race``.
    races = True

    # ------------------------------------------------------------ public API
    def measure(self, artifact: Artifact, problem: Problem, race: Race | None = None) -> MeasureOutcome:
        """Gate and time ``artifact`` in the worker; with ``race``, the worker may stop the
        timing early once the config is clearly slower than ``race.incumbent_us``."""
        return self.submit(artifact, problem, race).result()

    def submit(self, artifact: Artifact, problem: Problem, race: Race | None = None) -> PendingMeasure:
        """Send the measure request and return at once: the worker checks and times the
        config while the caller goes on; ``result()`` reads its reply (``timeout_s`` from
        then). Any other request first collects it."""
        self._trials += 1
        request = measure_request(str(artifact.cubin), artifact.entry, dict(artifact.meta), problem.as_dict(),
                                  seed=self.seed + self._trials, budget_s=self.budget_s,
                                  key=artifact.key, sha256=artifact.sha256, family=artifact.family,
                                  race=race.to_wire() if race is not None else None)
        with self._lock:
            self._collect_owed()
            try:
                self._ensure_worker()
                self._send(request)
            except _WorkerLost as lost:
                self.last_detail = {"worker": lost.kind}
                return PendingMeasure.ready(MeasureFailure(lost.kind, lost.reason))
            pending = self._owed = PendingMeasure(self._result_of_owed)
        return pending

    def _result_of_owed(self) -> MeasureOutcome:
        # PendingMeasure calls this only while unsettled, i.e. while it is still the owed one
        # (a collect by another call, or a kill, settles it first)
        with self._lock:
            outcome = self._collect_owed()
        assert outcome is not None, "GpuMeasure: a measurement collected twice"
        return outcome

    def _collect_owed(self) -> MeasureOutcome | None:
        """Read the reply of the outstanding measure request, if any (the lock held), settle
        its PendingMeasure with it and return it."""
        pending, self._owed = self._owed, None
        if pending is None:
            return None
        outcome = self._read_measurement()
        pending.settle(outcome)
        return outcome

    def _read_measurement(self) -> MeasureOutcome:
        try:
            reply = self._read_reply("measure", self.timeout_s)
        except _WorkerLost as lost:
            self.last_detail = {"worker": lost.kind}
            return MeasureFailure(lost.kind, lost.reason)
        if not reply.ok:
            assert reply.failure is not None
            self.last_detail = {"fatal": reply.fatal}
            return reply.failure
        value = reply.value if isinstance(reply.value, dict) else {}
        try:
            measurement = measurement_from_wire(value.get("measurement"))
        except ProtocolError as exc:
            self._kill()
            return MeasureFailure("crash", f"worker sent a malformed measurement ({exc}); worker restarted")
        self.last_detail = dict(value.get("detail") or {})
        return measurement

    def start(self) -> None:
        """Spawn the worker and send it ``init`` now, without waiting for the reply: its torch
        import and CUDA context come up while the caller goes on (opening the study, starting
        builds). The first request reads the init reply (``start_timeout_s``) before its own.
        A worker that cannot be spawned here is reported by that first request."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                return
            if self._proc is not None:
                self._kill()
            try:
                self._spawn()
            except _WorkerLost:
                return
            assert self._proc is not None and self._proc.stdin is not None
            try:
                self._proc.stdin.write(encode(Request("init", {"device_index": self.device_index}).to_wire()))
                self._proc.stdin.flush()
            except (BrokenPipeError, OSError):
                self._kill()           # the next request spawns a new one and says what went wrong
                return
            self._init_pending = True

    def baselines(self, problem: Problem) -> dict[str, float | None]:
        """SDPA's backends at ``problem``'s shape (:func:`baseline_names`); None (reason in
        ``baseline_reasons``) where one can't run."""
        request = Request("baselines", {"problem": problem.as_dict(), "budget_s": self.budget_s})
        names = baseline_names(problem)
        self.baseline_reasons = {}
        try:
            reply = self._call(request, self.timeout_s * len(names))
        except _WorkerLost as lost:
            self.baseline_reasons = {name: f"{lost.kind}: {lost.reason}" for name in names}
            return {name: None for name in names}
        if not reply.ok:
            assert reply.failure is not None
            why = f"{reply.failure.kind}: {reply.failure.reason}"
            self.baseline_reasons = {name: why for name in names}
            return {name: None for name in names}
        value = reply.value if isinstance(reply.value, dict) else {}
        out: dict[str, float | None] = {}
        for name in names:
            entry = value.get(name) or {}
            us = entry.get("us") if isinstance(entry, dict) else None
            if isinstance(us, (int, float)) and us > 0:
                out[name] = float(us)
            else:
                out[name] = None
                reason = entry.get("reason") if isinstance(entry, dict) else None
                self.baseline_reasons[name] = str(reason or "the worker returned no time")
        return out

    def device(self) -> dict[str, object] | None:
        """The worker's device fingerprint (cached: taken once, at the start of the study)."""
        if self._fingerprint is None:
            try:
                reply = self._call(Request("fingerprint"), self.timeout_s)
            except _WorkerLost as lost:
                raise NoGpuError(f"GPU worker could not fingerprint device {self.device_index}: {lost.reason}",
                                 "check `nvidia-smi` and that torch sees the GPU") from None
            if not reply.ok or not isinstance(reply.value, dict):
                reason = reply.failure.reason if reply.failure else "no fingerprint"
                raise NoGpuError(f"GPU worker could not fingerprint device {self.device_index}: {reason}",
                                 "check `nvidia-smi` and that torch sees the GPU")
            self._fingerprint = dict(reply.value)
        return dict(self._fingerprint)

    def model_name(self) -> str | None:
        """The GPU's model from ``nvidia-smi`` (milliseconds, no CUDA), while the worker still
        starts; from the worker's fingerprint when ``CUDA_VISIBLE_DEVICES`` renumbers the GPUs
        (nvidia-smi's indices are then not torch's) or nvidia-smi cannot answer."""
        if self._fingerprint is None and os.environ.get("CUDA_VISIBLE_DEVICES") is None:
            from evotuner.measure.fingerprint import nvidia_smi_query

            smi, why = nvidia_smi_query(self.device_index)
            if why is None and smi.get("name"):
                return str(smi["name"])
        return super().model_name()

    def call(self, op: str, args: dict[str, Any] | None = None, timeout_s: float | None = None) -> Reply:
        """Send one request (``sanitize``, ``profile``, ...) and return the worker's reply; a
        timeout or a crash comes back as a failure Reply (the worker is killed and reaped)."""
        try:
            return self._call(Request(op, dict(args or {})), self.timeout_s if timeout_s is None else timeout_s)
        except _WorkerLost as lost:
            return Reply.fail(lost.kind, lost.reason)

    def ping(self) -> bool:
        """True when the worker (started if needed) answers a ping in time."""
        try:
            return self._call(Request("ping"), self.timeout_s).ok
        except _WorkerLost:
            return False

    @property
    def worker_pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def close(self) -> None:
        """Ask the worker to exit; kill its process group if it does not within a few seconds."""
        with self._lock:
            proc = self._proc
            if proc is None:
                return
            if self._init_pending:     # still starting (start() and nothing since): nothing to finish
                self._kill()
                return
            if proc.poll() is None:
                try:
                    assert proc.stdin is not None
                    proc.stdin.write(encode(Request("shutdown").to_wire()))
                    proc.stdin.flush()
                    proc.wait(timeout=self.shutdown_grace_s)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            self._kill()

    def __del__(self) -> None:  # last resort: never leave a worker behind
        try:
            self._kill()
        except Exception:
            pass

    # ------------------------------------------------------------ internals
    def _call(self, request: Request, timeout_s: float) -> Reply:
        with self._lock:
            self._collect_owed()
            self._ensure_worker()
            self._send(request)
            return self._read_reply(request.op, timeout_s)

    def _send(self, request: Request) -> None:
        assert self._proc is not None and self._reader is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(encode(request.to_wire()))
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise self._lost("crash", f"could not send {request.op!r} to the worker ({exc})") from None

    def _read_reply(self, op: str, timeout_s: float) -> Reply:
        assert self._reader is not None and self._proc is not None
        try:
            reply = Reply.from_wire(self._reader.read(timeout_s))
        except FrameTimeout:
            raise self._lost("timeout", f"no answer to {op!r} within {timeout_s:.1f} s "
                                        "(kernel hang?); worker killed and will be restarted") from None
        except PipeClosed:
            raise self._lost("crash", f"worker died during {op!r}") from None
        except ProtocolError as exc:
            raise self._lost("crash", f"worker wrote garbage during {op!r} ({exc})") from None
        if reply.fatal:
            self._reap_after_fatal()
        return reply

    def _ensure_worker(self) -> None:
        if self._proc is not None and (self._init_pending or self._proc.poll() is None):
            if not self._init_pending:
                return
            self._init_pending = False      # start() sent init: its reply comes first
            try:
                reply = self._read_reply("init", self.start_timeout_s)
            except _WorkerLost as lost:
                raise _WorkerLost(lost.kind, f"GPU worker failed to start: {lost.reason}") from None
            self._check_init(reply)
            return
        if self._proc is not None:
            self._kill()  # exited on its own: reap it and close its pipes
        self._spawn()
        try:
            reply = self._read_reply_after_send(Request("init", {"device_index": self.device_index}),
                                                self.start_timeout_s)
        except _WorkerLost as lost:
            raise _WorkerLost(lost.kind, f"GPU worker failed to start: {lost.reason}") from None
        self._check_init(reply)

    def _check_init(self, reply: Reply) -> None:
        if not reply.ok:
            assert reply.failure is not None
            self._kill()
            raise _WorkerLost("crash", f"GPU worker failed to start: {reply.failure.reason}")

    def _read_reply_after_send(self, request: Request, timeout_s: float) -> Reply:
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(encode(request.to_wire()))
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise self._lost("crash", f"could not send {request.op!r} ({exc})") from None
        return self._read_reply(request.op, timeout_s)

    def _spawn(self) -> None:
        env = prestart.worker_env(self.env)
        # the worker the entry point spawned before the CLI was imported, when it is this one
        spawned = prestart.take(self.worker_cmd, env)
        self._last_stderr = ""
        if spawned is None:
            try:
                spawned = prestart.spawn(self.worker_cmd, env)
            except OSError as exc:
                raise _WorkerLost("crash", f"GPU worker could not be started: {self.worker_cmd[0]}: {exc}") from None
        self._proc, self._stderr = spawned.proc, spawned.stderr
        assert self._proc.stdout is not None
        self._reader = FrameReader(self._proc.stdout.fileno())
        self.spawns += 1
        self.spawned_pids.append(self._proc.pid)

    def _lost(self, kind: str, reason: str) -> _WorkerLost:
        """Kill (or reap) the worker and describe how it ended."""
        proc = self._proc
        self._kill()
        detail = []
        if proc is not None and proc.returncode is not None and kind == "crash":
            rc = proc.returncode
            detail.append(f"killed by signal {signal.Signals(-rc).name}" if rc < 0 and -rc in signal.valid_signals()
                          else f"exit status {rc}")
        tail = self._last_stderr
        if tail:
            detail.append(f"stderr: {tail}")
        return _WorkerLost(kind, reason + (f" [{'; '.join(detail)}]" if detail else ""))

    def _reap_after_fatal(self) -> None:
        """The worker said its context is lost and it is exiting: wait for it, then reap."""
        if self._proc is not None:
            try:
                self._proc.wait(timeout=10.0)
            except subprocess.TimeoutExpired:
                pass
        self._kill()

    _last_stderr = ""
    #: How long close() lets the worker exit on its own before killing its group.
    shutdown_grace_s = 5.0

    def _kill(self) -> None:
        """Kill the worker's whole process group (it may have children), wait(), close pipes."""
        proc, self._proc, self._reader = self._proc, None, None
        self._init_pending = False
        owed, self._owed = self._owed, None
        if owed is not None:
            owed.settle(MeasureFailure("crash", "the GPU worker was stopped before it answered this measurement"))
        if proc is not None:
            prestart.stop(proc)
        if self._stderr is not None:
            try:
                self._stderr.seek(0)
                text = self._stderr.read().decode("utf-8", "replace").strip()
                self._last_stderr = text[-_STDERR_TAIL:].replace("\n", " | ") if text else ""
                self._stderr.close()
            except (OSError, ValueError):
                pass
            self._stderr = None


# ---------------------------------------------------------------- availability
@lru_cache(maxsize=None)
def gpu_available(python: str = sys.executable, timeout_s: float = 60.0) -> bool:
    """Whether a CUDA GPU can be used, checked WITHOUT initializing CUDA here.

    ``nvidia-smi -L`` first, so a machine with no NVIDIA driver answers in milliseconds;
    when it lists a GPU and ``CUDA_VISIBLE_DEVICES`` is not set, that is the answer: the
    GPU worker's own start (torch import + CUDA context, begun in the background by
    ``GpuMeasure.start``) is the real check, and it says in one line why when torch cannot
    use the GPU. Otherwise (no ``nvidia-smi``, or a device list that may hide every GPU
    from torch) a short-lived subprocess asks ``torch.cuda.is_available()``, which costs
    a torch import and a CUDA init: seconds on the search's start path. Every subprocess
    has a timeout.
    """
    try:
        smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=min(timeout_s, 20.0), text=True)
        if smi.returncode != 0 or "GPU" not in smi.stdout:
            return False
        if os.environ.get("CUDA_VISIBLE_DEVICES") is None:
            return True
    except FileNotFoundError:
        pass  # no nvidia-smi on PATH: let torch decide
    except (subprocess.TimeoutExpired, OSError):
        return False
    code = "import sys, torch; sys.exit(0 if torch.cuda.is_available() and torch.cuda.device_count() > 0 else 3)"
    try:
        result = subprocess.run([python, "-c", code], capture_output=True, timeout=timeout_s)
    except (subprocess.TimeoutExpired, OSError):
        return False
    return result.returncode == 0


def require_gpu() -> None:
    """Raise NoGpuError at once when no CUDA GPU can be used (the CLI calls it before ``search``)."""
    if not gpu_available():
        raise NoGpuError("no CUDA GPU is visible (nvidia-smi / torch.cuda.is_available())",
                         "run `search` on a machine with an NVIDIA Hopper GPU (check `nvidia-smi`)")
