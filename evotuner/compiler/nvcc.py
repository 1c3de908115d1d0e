"""The CUDA toolchain: find nvcc, read its version, run it with a timeout.

Discovery order: the ``nvcc=`` argument, ``$EVOTUNER_NVCC`` (a path, or a bare
command name looked up on ``PATH`` as a shell does), ``nvcc`` on ``PATH``,
``$CUDA_HOME/bin/nvcc`` (or ``$CUDA_PATH``), ``/usr/local/cuda/bin/nvcc``.
A missing or unusable nvcc (one that is not nvcc, or exits 0 without writing its
cubin) is the one build problem that raises (:class:`~evotuner.errors.BuildError`);
everything a compile does, including a timeout, comes back as a
:class:`CompileOutcome` value.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from evotuner import childproc
from evotuner.errors import BuildError

_REMEDY = (
    "install the CUDA toolkit 12.4+ or 13 (it provides nvcc), then put nvcc on PATH "
    "or set EVOTUNER_NVCC=/path/to/nvcc"
)
#: The remedy for a program that runs but is not a working nvcc (the setting that named it is at fault).
NOT_NVCC_REMEDY = ("point EVOTUNER_NVCC (or the nvcc= argument) at the CUDA toolkit's nvcc, "
                   "e.g. /usr/local/cuda/bin/nvcc, or unset EVOTUNER_NVCC to use nvcc on PATH")

#: Where a toolkit lives when nothing points at it.
FALLBACK_DIRS: tuple[str, ...] = ("/usr/local/cuda/bin",)

#: ``nvcc --version`` answers in well under a second; 30 s is only a guard.
VERSION_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Toolchain:
    """An nvcc that answered ``--version``.

    ``version`` is the full ``nvcc --version`` text (part of every cache key);
    ``release`` its short form, e.g. ``"13.0, V13.0.88"``.
    """

    nvcc: Path
    version: str
    release: str


@dataclass(frozen=True)
class CompileOutcome:
    """What one nvcc run did: exit status (None on timeout), merged stdout+stderr, wall time."""

    returncode: int | None
    output: str
    seconds: float
    timed_out: bool


def find_nvcc(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The nvcc executable, as an absolute path (builds run it from their own folder, where a
    relative ``EVOTUNER_NVCC=./nvcc`` or PATH entry names nothing), or BuildError naming where it looked."""
    return _find_nvcc(explicit).absolute()


def _find_nvcc(explicit: str | os.PathLike[str] | None) -> Path:
    if explicit is not None:
        return _check_executable(_command(os.fspath(explicit)), "nvcc= argument")
    env = os.environ.get("EVOTUNER_NVCC")
    if env:
        return _check_executable(_command(env), "EVOTUNER_NVCC")
    on_path = shutil.which("nvcc")
    if on_path:
        return Path(on_path)
    candidates = [Path(os.environ[v]) / "bin" / "nvcc" for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    candidates += [Path(d) / "nvcc" for d in FALLBACK_DIRS]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise BuildError(
        "nvcc not found (looked at EVOTUNER_NVCC, PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)", _REMEDY
    )


def _command(given: str) -> Path:
    """``given`` as a shell takes it: a bare command name (``nvcc``) found on PATH, else the path."""
    return Path(shutil.which(given) or given)


def _check_executable(path: Path, source: str) -> Path:
    if not path.is_file():
        where = ("which is not a file" if path.exists() or os.sep in str(path)
                 else "which is no file here and no command on PATH")
        raise BuildError(f"nvcc not found: {source} points to {path}, {where}", _REMEDY)
    if not os.access(path, os.X_OK):
        raise BuildError(f"nvcc at {path} ({source}) is not executable", f"chmod +x {path}, or {_REMEDY}")
    return path


def probe(nvcc: Path) -> Toolchain:
    """Run ``nvcc --version``; raise BuildError when it does not answer."""
    outcome = run([str(nvcc), "--version"], cwd=None, timeout_s=VERSION_TIMEOUT_S)
    if outcome.timed_out:
        raise BuildError(f"{nvcc} --version timed out after {VERSION_TIMEOUT_S:g} s", _REMEDY)
    if outcome.returncode != 0 or not outcome.output.strip():
        tail = outcome.output.strip().splitlines()[-1:] or ["no output"]
        raise BuildError(f"{nvcc} --version failed (exit {outcome.returncode}: {tail[0]})", _REMEDY)
    version = outcome.output.strip()
    if "cuda" not in version.lower():
        first = version.splitlines()[0]
        raise BuildError(f"{nvcc} is not nvcc: its --version says {first!r}, not the CUDA compiler's release",
                         NOT_NVCC_REMEDY)
    release = version.splitlines()[-1]
    for line in version.splitlines():
        if "release" in line:
            release = line.split("release", 1)[1].strip()
            break
    return Toolchain(nvcc=nvcc, version=version, release=release)


def run(argv: Sequence[str], *, cwd: Path | None, timeout_s: float,
        live: set[subprocess.Popen[bytes]] | None = None) -> CompileOutcome:
    """Run one process in its own session (:mod:`evotuner.childproc`): its output is read
    until it exits, never until a daemon it left behind closes the pipe; on a timeout, and
    after it exits, its whole process group is killed.

    nvcc forks cicc/ptxas; killing only nvcc would leave them running, so the
    child gets a new session and the group is killed. The new session also keeps
    the terminal's Ctrl-C from reaching it, so the caller may pass ``live``: the
    process is in that set while it runs, for :func:`kill` to end it early.
    """
    try:
        proc = childproc.start(argv, cwd=cwd)
    except OSError as exc:
        raise BuildError(f"cannot run {argv[0]}: {exc.strerror or exc}", _REMEDY) from None
    if live is not None:
        live.add(proc)
    try:
        outcome = childproc.collect(proc, timeout_s)
    finally:
        if live is not None:
            live.discard(proc)
    return CompileOutcome(outcome.returncode, _decode(outcome.output), outcome.seconds, outcome.timed_out)


def kill(procs: set[subprocess.Popen[bytes]]) -> None:
    """End the process groups of still-running compiles (their results read as killed)."""
    for proc in list(procs):
        childproc.kill_group(proc)


def _decode(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", errors="replace")
