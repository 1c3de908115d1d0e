"""Errors a user can act on.

Every error evotuner raises on purpose is an :class:`EvotunerError`: a one-line
message that names what is wrong (the file, the key, the dimension) and, where
there is one, a remedy. The CLI's single error boundary prints ``message`` (and
the remedy) on one line and exits non-zero; library callers get the exception.
"""

from __future__ import annotations


class EvotunerError(Exception):
    """A user-facing error: ``message`` says what is wrong, ``remedy`` what to do."""

    def __init__(self, message: str, remedy: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.remedy = remedy

    def __str__(self) -> str:
        return f"{self.message} ({self.remedy})" if self.remedy else self.message


class SpaceError(EvotunerError):
    """The search-space file is malformed or a config is outside it."""


class ShapeError(EvotunerError):
    """A problem shape or tensor argument is invalid; names the dimension."""


class StorageError(EvotunerError):
    """The study database cannot be opened, read or written."""


class StudyMismatchError(StorageError):
    """A study is resumed with a different shape, dtype, causal flag or space."""


class BuildError(EvotunerError):
    """nvcc could not be run at all (missing, not executable)."""


class ExportError(EvotunerError):
    """The studies cannot be exported (missing, empty, inconsistent, or holding invalid values),
    or a header given to read back is not one ``evotuner export`` wrote."""


class NoGpuError(EvotunerError):
    """A stage that needs a CUDA GPU was asked for on a machine without one."""


class InterruptedByUser(EvotunerError):
    """Ctrl-C: the message says what was saved and how to continue (the CLI exits 130)."""
