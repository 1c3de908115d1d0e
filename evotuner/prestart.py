"""The GPU worker, spawned before the CLI is imported (issue 28: measuring within seconds).

A search's first measurement waits on its GPU worker: the worker's ``import torch`` and CUDA
context take 4-5 s on the H100 machine, and it could only be spawned once the CLI's own
modules (typer, Optuna, SQLAlchemy, the families: about a second) were imported and the
command's options read. :func:`start_early` spawns it first thing, from the ``evotuner``
entry point (:mod:`evotuner.launch`), for the commands that measure (``search``, ``resume``)
on a machine with an NVIDIA driver; the worker imports torch at once, before its first
request (:func:`evotuner.measure.worker.main`), and binds its GPU when ``init`` names it.
:class:`~evotuner.measure.gpu.GpuMeasure` adopts that process (:func:`take`) instead of
spawning its own, when it would have spawned the same command with the same environment.
An early worker nobody adopted (the command refused its options, replayed, or found no GPU)
is killed with its process group when the command ends (:func:`discard`), so no process
outlives the command; killed with the command, it exits at EOF on its stdin.

This module imports the standard library only: it runs before anything else is loaded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import IO, Any, Sequence

#: The commands that measure on a GPU, hence start a worker.
MEASURING_COMMANDS = ("search", "resume")
#: Set to 1 to never spawn the worker early (it then starts as the command's stages are made).
OFF_ENV = "EVOTUNER_NO_EARLY_WORKER"
#: A file the NVIDIA driver creates on a Linux machine with a GPU (checked without running anything).
DRIVER_NODE = "/dev/nvidiactl"


def worker_command(python: str = sys.executable) -> list[str]:
    """The GPU worker's command line (GpuMeasure's default)."""
    return [python, "-m", "evotuner.measure.worker"]


@dataclass
class Spawned:
    """A worker process: its Popen (stdin/stdout pipes, own process group) and its stderr file."""

    proc: subprocess.Popen[bytes]
    stderr: IO[bytes]
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]


def spawn(command: Sequence[str], env: dict[str, str]) -> Spawned:
    """Start ``command`` as a worker: pipes for the protocol, stderr to a file (a chatty worker
    cannot fill a pipe and block), a process group of its own (killed as a group). Raises
    OSError when it cannot be started."""
    stderr = tempfile.TemporaryFile(prefix="evotuner-worker-", suffix=".stderr")
    try:
        proc = subprocess.Popen(list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                env=env, start_new_session=True, close_fds=True)
    except BaseException:
        stderr.close()
        raise
    return Spawned(proc, stderr, tuple(command), tuple(sorted(env.items())))


def worker_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a worker runs in: ``base`` (default: this process's) with unbuffered output."""
    env = dict(os.environ if base is None else base)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


_early: Spawned | None = None


def measuring(argv: Sequence[str]) -> bool:
    """Whether ``evotuner ARGV`` is a command that measures (``search``, ``resume``)."""
    return bool(argv) and argv[0] in MEASURING_COMMANDS


def wanted(argv: Sequence[str]) -> bool:
    """Whether ``evotuner ARGV`` measures on this machine's GPU: ``search`` or ``resume``, not
    replayed and not asking for help, an NVIDIA driver present, and not switched off by
    ``EVOTUNER_NO_EARLY_WORKER=1``."""
    if not measuring(argv):
        return False
    if os.environ.get(OFF_ENV, "").strip() not in ("", "0"):
        return False
    if any(a in ("--help", "-h") or a == "--replay" or a.startswith("--replay=") for a in argv[1:]):
        return False
    return os.path.exists(DRIVER_NODE)


def start_early(argv: Sequence[str]) -> bool:
    """Spawn the GPU worker now when ``argv`` is a command that will use it (:func:`wanted`).
    True when one was spawned; a failure to spawn is left to the command's own start, which
    reports it."""
    global _early
    if _early is not None or not wanted(argv):
        return False
    try:
        _early = spawn(worker_command(), worker_env())
    except OSError:
        return False
    return True


def take(command: Sequence[str], env: dict[str, str]) -> Spawned | None:
    """The early worker, handed over once, if it runs ``command`` in ``env`` and is alive;
    else None, and an early worker that is not the one asked for is killed and reaped."""
    global _early
    early, _early = _early, None
    if early is None:
        return None
    if early.command != tuple(command) or early.env != tuple(sorted(env.items())) or early.proc.poll() is not None:
        _close(early)            # not the worker asked for (or dead): it would only idle until exit
        return None
    return early


def discard() -> None:
    """Kill the early worker if nobody took it (its whole process group), and reap it."""
    global _early
    early, _early = _early, None
    if early is not None:
        _close(early)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Kill a worker's whole process group (it may have children, also once the leader has
    exited), wait for it, close its pipes."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        if proc.poll() is None:
            proc.kill()
    try:
        proc.wait(timeout=30.0)
    except subprocess.TimeoutExpired:  # pragma: no cover - uninterruptible (D state) process
        pass
    for stream in (proc.stdin, proc.stdout):
        _quietly_close(stream)


def _close(early: Spawned) -> None:
    stop(early.proc)
    _quietly_close(early.stderr)


def _quietly_close(stream: Any) -> None:
    if stream is not None:
        try:
            stream.close()
        except OSError:
            pass
