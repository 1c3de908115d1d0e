"""argparse for the scripts under ``scripts/``: a usage error is one line, as the CLI's are.

    from evotuner.scriptargs import ArgumentParser
    ap = ArgumentParser(description=__doc__.split("\\n\\n")[0])

argparse prints its whole usage block before the error; a script's user then reads the error
on the last of several lines, with the option's name twice when a ``type=`` function names it
too. This parser prints ``error: <what> (see <script> --help)`` and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn


class ArgumentParser(argparse.ArgumentParser):
    """:class:`argparse.ArgumentParser` whose usage errors are one line on stderr, exit status 2."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def output_path(text: str) -> Path:
    """An argparse ``type=`` for a file a script writes (``type=output_path``): refused at parse
    time, before any work, as the CLI refuses its outputs (:func:`evotuner.atomicfile.check_target`):
    an empty path (``--output "$F"`` with F unset), ``-``, a folder, a link, a database, a path in
    a folder that does not exist. Write it with :func:`evotuner.atomicfile.write_text_atomic`."""
    from evotuner.atomicfile import check_target
    from evotuner.errors import EvotunerError

    if not text.strip():
        raise argparse.ArgumentTypeError("the path is empty")
    if text == "-":
        raise argparse.ArgumentTypeError("'-': this script writes a file, not to standard output (./- names a file)")
    path = Path(text)
    try:
        check_target(path)
    except EvotunerError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{path}: the folder {path.parent} does not exist (create it first)")
    return path
