"""The ``evotuner`` command's entry point (the console script, ``python -m evotuner`` and
``python -m evotuner.cli``).

It imports the CLI inside an error boundary of its own: loading the CLI's modules (torch,
Optuna, SQLAlchemy) takes about a second, and a Ctrl-C meanwhile would otherwise print the
traceback of whatever import it landed in. It comes out as the one line any later Ctrl-C
gives, with exit status 130. This module imports nothing heavy itself; for ``search`` and ``resume`` on a GPU machine it
first spawns the GPU worker (:mod:`evotuner.prestart`).
"""

from __future__ import annotations

import sys

#: Exit status after Ctrl-C (128 + SIGINT), as evotuner.cli's.
INTERRUPTED_EXIT = 130


def main(argv: list[str] | None = None) -> int:
    """Run ``evotuner ARGV`` (``sys.argv[1:]`` when None); returns the exit status."""
    from evotuner import prestart

    try:
        # a command that measures gets its GPU worker now: its torch import and CUDA context
        # (seconds) come up while the CLI's modules load (evotuner.prestart)
        prestart.start_early(sys.argv[1:] if argv is None else argv)
        from evotuner.cli import main as cli_main

        return cli_main(argv)
    except KeyboardInterrupt:    # only while starting: evotuner.cli's boundary handles the rest
        try:
            sys.stderr.write("error: interrupted by user (while starting; nothing was done)\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        return INTERRUPTED_EXIT
    finally:
        prestart.discard()       # an early worker the command did not take ends with it
