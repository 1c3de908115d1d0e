"""The ``evotuner`` command's entry point (the console script, ``python -m evotuner`` and
``python -m evotuner.cli``).

It imports the CLI inside an error boundary of its own: loading the CLI's modules (torch,
Optuna, SQLAlchemy) takes about a second, and a Ctrl-C meanwhile would otherwise print the
traceback of whatever import it landed in. It comes out as the one line any later Ctrl-C
gives, with exit status 130. This module imports nothing heavy itself. For ``search`` and
``resume`` it first sets numpy's BLAS to one thread (:func:`one_blas_thread`) and, on a GPU
machine, spawns the GPU worker (:mod:`evotuner.prestart`).
"""

from __future__ import annotations

import os
import sys

#: Exit status after Ctrl-C (128 + SIGINT), as evotuner.cli's.
INTERRUPTED_EXIT = 130
#: OpenBLAS's thread count for the commands that search (unless the environment sets one).
BLAS_THREADS_ENV = "OPENBLAS_NUM_THREADS"


def one_blas_thread(argv: list[str]) -> None:
    """``search`` and ``resume``: numpy's OpenBLAS runs one thread, unless ``OPENBLAS_NUM_THREADS``
    says otherwise. The guided sampler's linear algebra runs in the search process while nvcc
    builds take the host's cores; OpenBLAS's own threads then wait on them (a replayed seeded
    study on two busy cores: 19 s against 7 s with one thread, its slowest proposal 8.7 s
    against 0.17 s; docs/measurements/proposal_cost/README.md). Set before numpy loads (it
    reads the variable once) and before the GPU worker is spawned, so the worker the search
    adopts runs in the same environment."""
    from evotuner.prestart import measuring

    if measuring(argv):
        os.environ.setdefault(BLAS_THREADS_ENV, "1")


def main(argv: list[str] | None = None) -> int:
    """Run ``evotuner ARGV`` (``sys.argv[1:]`` when None); returns the exit status."""
    from evotuner import prestart

    args = sys.argv[1:] if argv is None else argv
    try:
        one_blas_thread(args)
        # a command that measures gets its GPU worker now: its torch import and CUDA context
        # (seconds) come up while the CLI's modules load (evotuner.prestart)
        prestart.start_early(args)
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
