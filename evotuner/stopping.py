"""A stop asked for from outside the loop: SIGTERM, SIGHUP or Ctrl-C, as one process-wide flag.

Python turns a signal into an exception raised wherever the main thread happens to be. When
that is a finaliser (SQLAlchemy's ``InstanceState._cleanup``, any ``__del__``, a weakref
callback) Python prints "Exception ignored in ..." and carries on, so a search told to stop
would run to its end. The CLI's signal handlers therefore also call :func:`request`; the
search loop calls :func:`check` once per step, which raises the ``KeyboardInterrupt`` that
was lost. ``--gpus`` threads, where no signal is ever delivered, stop through it too.

Contract: :func:`request` only sets a flag (safe inside a signal handler); :func:`check`
raises ``KeyboardInterrupt`` while the flag is set; :func:`signals_stop` (one per CLI
invocation) clears the flag, installs the handlers and puts the previous ones back;
:func:`terminated` says whether the stop came from SIGTERM or SIGHUP (a closed terminal, an
ssh session dropped; left alone where it is ignored, as under ``nohup``), and :func:`signal_name`
which.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

_requested = threading.Event()
#: The terminating signal (SIGTERM or SIGHUP) heard during the current :func:`signals_stop`, if any.
_heard: dict[str, int | None] = {"signal": None}


def request() -> None:
    """Ask every search loop of this process to stop at its next step."""
    _requested.set()


def requested() -> bool:
    return _requested.is_set()


def clear() -> None:
    _requested.clear()


def check() -> None:
    """Raise ``KeyboardInterrupt`` if a stop was asked for (the loop's way out)."""
    if _requested.is_set():
        raise KeyboardInterrupt


def terminated() -> bool:
    """Whether the stop came from SIGTERM or SIGHUP (the CLI then exits 128 + its number, not 130)."""
    return _heard["signal"] is not None


def signal_name() -> str | None:
    """``SIGTERM`` or ``SIGHUP`` when :func:`terminated`, else None."""
    heard = _heard["signal"]
    return None if heard is None else signal.Signals(heard).name


def stopped_by(otherwise: str) -> str:
    """What stopped the command, for its message: ``terminated (SIGTERM)`` / ``terminated
    (SIGHUP)`` when :func:`terminated`, else ``otherwise`` (Ctrl-C's words)."""
    return f"terminated ({signal_name()})" if terminated() else otherwise


def signal_number() -> int | None:
    """The number of the terminating signal when :func:`terminated`, else None."""
    return _heard["signal"]


def _on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM (kill, systemd, a batch scheduler's time limit) or SIGHUP (the terminal went
    away) ends a command as Ctrl-C does: the loop marks the trials in flight FAIL
    (interrupted) and the CLI says what was kept. A second one while that is done is
    ignored (SIGKILL remains)."""
    if _heard["signal"] is not None:
        return
    _heard["signal"] = signum
    request()   # the loop raises it again if a finaliser swallows the one below
    raise KeyboardInterrupt


def _on_sigint(signum: int, frame: Any) -> None:
    """Ctrl-C: Python's own behaviour (KeyboardInterrupt, each time), plus the stop flag the
    loop checks, for when the exception lands in a finaliser and is lost."""
    request()
    raise KeyboardInterrupt


@contextlib.contextmanager
def signals_stop() -> Iterator[None]:
    """SIGTERM, SIGHUP and Ctrl-C stop the searches of this block (main thread only; elsewhere
    the process's handlers are left alone). Ctrl-C and SIGHUP keep their handlers where they
    were set to something other than the default (SIGHUP ignored under ``nohup``, say)."""
    _heard["signal"] = None
    clear()
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, _on_sigterm)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            previous[signal.SIGINT] = signal.signal(signal.SIGINT, _on_sigint)
        hup = getattr(signal, "SIGHUP", None)
        if hup is not None and signal.getsignal(hup) == signal.SIG_DFL:
            previous[hup] = signal.signal(hup, _on_sigterm)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
