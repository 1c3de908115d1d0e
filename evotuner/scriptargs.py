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
from typing import NoReturn


class ArgumentParser(argparse.ArgumentParser):
    """:class:`argparse.ArgumentParser` whose usage errors are one line on stderr, exit status 2."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)
