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
from typing import Callable, Iterable, NoReturn


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


def at_least(low: int, note: str = "") -> Callable[[str], int]:
    """An argparse ``type=``: an integer of at least ``low``; ``note`` says what the least means
    (``"0: every config"``)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} must be at least {low}" + (f" ({note})" if note else ""))
        return value
    return parse


#: An argparse ``type=``: an integer of at least 1 (rounds, repetitions, sizes, trials).
positive = at_least(1)


def positive_list(text: str) -> list[int]:
    """An argparse ``type=``: comma-separated integers of at least 1, no empty item."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: each value must be at least 1")
    return values


def one_of_list(choices: Iterable[str]) -> Callable[[str], list[str]]:
    """An argparse ``type=`` factory: comma-separated items, each one of ``choices`` (an empty
    item is named as such)."""
    allowed = tuple(choices)

    def parse(text: str) -> list[str]:
        items = [item.strip() for item in text.split(",")]
        for item in items:
            if item not in allowed:
                raise argparse.ArgumentTypeError(f"{text!r}: {'an empty item' if not item else repr(item)} is not "
                                                 f"one of {', '.join(allowed)}")
        return items

    return parse


def output_stem(*suffixes: str, example: str) -> Callable[[str], Path]:
    """An argparse ``type=`` factory for ``--output STEM`` where the script writes STEM plus each
    of ``suffixes``: the stem and every file made from it are checked at parse time, as
    :func:`output_path` checks one (an --output that cannot be written once lost a finished
    benchmark); ``example`` is a stem to suggest."""
    from evotuner.atomicfile import check_target
    from evotuner.errors import EvotunerError

    def parse(text: str) -> Path:
        path = output_path(text)
        if text.endswith(("/", "\\")) or path.name in ("", ".", ".."):
            raise argparse.ArgumentTypeError(f"{text!r} names a folder; give a file stem such as {example}")
        for suffix in suffixes:
            try:
                check_target(path.with_suffix(suffix))
            except ValueError:
                raise argparse.ArgumentTypeError(f"{text!r}: no file name to add {suffix} to") from None
            except EvotunerError as exc:
                raise argparse.ArgumentTypeError(str(exc)) from None
        return path

    return parse


def output_folder(use: str, files: Iterable[str] = (), option: str = "--output") -> Callable[[str], Path]:
    """An argparse ``type=`` factory for a folder a script writes in (made later if missing):
    refused when empty, a link (even a dangling one) or anything but a folder; each of ``files``
    in it is checked as :func:`output_path` checks a file. ``use`` says what the folder is for,
    in the remedy (e.g. "a folder to build into")."""
    from evotuner.atomicfile import check_target
    from evotuner.errors import EvotunerError

    names = tuple(files)

    def parse(text: str) -> Path:
        if not text.strip():
            raise argparse.ArgumentTypeError("the path is empty")
        path = Path(text)
        if path.is_symlink():
            raise argparse.ArgumentTypeError(f"{text}: it is a symbolic link, which evotuner never writes through "
                                             "(give the folder itself)")
        if path.exists() and not path.is_dir():
            raise argparse.ArgumentTypeError(f"{text} exists and is not a folder (give {use})")
        for name in names:
            try:
                check_target(path / name, option=option)
            except EvotunerError as exc:
                raise argparse.ArgumentTypeError(str(exc)) from None
        return path

    return parse


def seed(text: str) -> int:
    """An argparse ``type=`` for ``--seed``: an integer from 0 to 2**32 - 1, as the CLI's
    ``--seed`` (numpy and Optuna refuse any other, deep in a run)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= value <= 2**32 - 1:
        raise argparse.ArgumentTypeError(f"{value} is not a seed from 0 to 2**32-1")
    return value


def error_line(exc: BaseException) -> str:
    """A library error (an :class:`evotuner.errors.EvotunerError`) as a script's one stderr line,
    ``error: <what> (<remedy>)``; the replay's messages start with the CLI's ``--replay``, which a
    script that takes its sweeps as arguments has not, so that is left out."""
    text = " ".join(str(exc).split())
    return "error: " + (text[len("--replay "):] if text.startswith("--replay ") else text)


def work_folder(given: Path | None, prefix: str) -> Path | None:
    """A script's work folder: ``given`` (made if missing), else a new temporary one named
    ``prefix...``; None, the error line printed, where it cannot be made."""
    import tempfile

    try:
        work = given or Path(tempfile.mkdtemp(prefix=prefix))
        work.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"error: cannot create the work folder: {exc.strerror or exc} (give a --workdir you can write)",
              file=sys.stderr)
        return None
    return work
