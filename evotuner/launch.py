"""The ``evotuner`` command's entry point (the console script, ``python -m evotuner`` and
``python -m evotuner.cli``).

It imports the CLI inside an error boundary of its own: loading the CLI's modules (torch,
Optuna, SQLAlchemy) takes about a second, and a Ctrl-C meanwhile would otherwise print the
traceback of whatever import it landed in. It comes out as the one line any later Ctrl-C
gives, with exit status 130. This module imports nothing heavy itself.
"""

from __future__ import annotations

import sys

#: Exit status after Ctrl-C (128 + SIGINT), as evotuner.cli's.
INTERRUPTED_EXIT = 130


def main(argv: list[str] | None = None) -> int:
    """Run ``evotuner ARGV`` (``sys.argv[1:]`` when None); returns the exit status."""
    try:
        from evotuner.cli import main as cli_main

        return cli_main(argv)
    except KeyboardInterrupt:    # only while starting: evotuner.cli's boundary handles the rest
        try:
            sys.stderr.write("error: interrupted by user (while starting; nothing was done)\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        return INTERRUPTED_EXIT
