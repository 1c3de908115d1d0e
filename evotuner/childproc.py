"""Running a short-lived child process (nvcc, ``tool --version``, nvidia-smi) with bounds.

* The child starts in a new session, so it and everything it forks (cicc, ptxas, a
  wrapper's helpers) form one process group, which is killed as a whole on a timeout,
  and after the child exits (what it left behind in its group has no business running).
* Its output is read with a deadline: until the child itself has exited plus
  :data:`EXIT_GRACE_S`, not until every holder of the pipe has closed it. A compiler
  wrapper that leaves a daemon holding stdout open (one that even left the group) ends the
  read at once instead of at the build timeout; ``subprocess.run(..., timeout=)`` waits for
  that daemon for ever after its timeout, because it reads the pipe to the end.
* At most :data:`MAX_OUTPUT_BYTES` of output are kept (the end of it: a compile's
  errors and ptxas's figures come last).

The child is reaped only after its group was signalled (``waitid(..., WNOWAIT)`` sees the
exit without reaping it), so the group id cannot have been reused by then.
"""

from __future__ import annotations

import math
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: After the child exits, how long its output pipe may stay open (held by what it left behind).
EXIT_GRACE_S = 1.0
#: The most output kept per run (its tail).
MAX_OUTPUT_BYTES = 4 << 20


@dataclass(frozen=True)
class ChildOutcome:
    """What one run did: exit status (None on timeout), merged stdout+stderr, wall time."""

    returncode: int | None
    output: bytes
    seconds: float
    timed_out: bool


def start(argv: Sequence[str], *, cwd: Path | str | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session, stdout and stderr merged into one pipe, no stdin
    (raises OSError when it cannot be started)."""
    return subprocess.Popen(list(argv), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)


def collect(proc: subprocess.Popen[bytes], timeout_s: float) -> ChildOutcome:
    """Read ``proc``'s output until it exits (plus :data:`EXIT_GRACE_S`) or ``timeout_s`` passes;
    then kill its process group and reap it. An exception (Ctrl-C) kills the group too.
    ``timeout_s`` must be finite and above 0 (ValueError, the child killed): no child runs unbounded."""
    if not 0 < timeout_s < math.inf:           # nan fails this too
        kill_group(proc)
        _reap(proc)
        raise ValueError(f"timeout_s must be a finite number of seconds above 0, not {timeout_s!r}")
    started = time.monotonic()
    deadline = started + timeout_s
    kept = bytearray()
    exited_at: float | None = None
    timed_out = False
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while True:
                now = time.monotonic()
                if exited_at is None and _exited(proc):
                    exited_at = now
                if exited_at is not None and now - exited_at >= EXIT_GRACE_S:
                    break                       # something the child left behind holds the pipe
                if exited_at is None and now >= deadline:
                    timed_out = True
                    break
                limit = (exited_at + EXIT_GRACE_S if exited_at is not None else deadline) - now
                if not sel.select(timeout=max(0.0, min(0.05, limit))):
                    continue
                data = os.read(fd, 1 << 16)
                if not data:                    # every holder closed it
                    break
                kept += data
                if len(kept) > MAX_OUTPUT_BYTES:
                    del kept[:len(kept) - MAX_OUTPUT_BYTES]
    except BaseException:
        kill_group(proc)
        _reap(proc)
        raise
    kill_group(proc)
    _reap(proc)
    return ChildOutcome(None if timed_out else proc.returncode, bytes(kept), time.monotonic() - started, timed_out)


def run(argv: Sequence[str], *, cwd: Path | str | None = None, timeout_s: float) -> ChildOutcome:
    """:func:`start` then :func:`collect` (raises OSError when ``argv`` cannot be started)."""
    return collect(start(argv, cwd=cwd), timeout_s)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's process group (the child too, if it still runs)."""
    if proc.returncode is not None:
        return                                  # reaped: its group id may belong to another process now
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            proc.kill()
        except OSError:
            pass


def _exited(proc: subprocess.Popen[bytes]) -> bool:
    """Whether the child has exited, without reaping it (its pid and group id stay ours)."""
    if proc.returncode is not None:
        return True
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def _reap(proc: subprocess.Popen[bytes]) -> None:
    if proc.stdout is not None:
        proc.stdout.close()
    proc.wait()
