"""Replacing a file atomically without changing who may read it.

``tempfile.mkstemp`` creates its file with mode 0600; renaming that over an
existing 0644 header would leave a file that a build running as another user
cannot read. :func:`write_text_atomic` gives the new file the existing file's
permission bits (and owner, where this process may set it), or for a new file
the mode ``open()`` would give it (0666 less the umask), before the rename.
Every OS failure becomes an :class:`~evotuner.errors.EvotunerError` naming the
path and a remedy.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from evotuner.errors import EvotunerError


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _explain(exc: OSError, path: Path) -> EvotunerError:
    reason = exc.strerror or type(exc).__name__
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        remedy = f"make {path.parent} writable, or write to another --output"
    elif exc.errno == errno.ENOSPC:
        remedy = "free some disk space"
    else:
        remedy = "write to another --output"
    return EvotunerError(f"cannot write {path}: {reason}", remedy)


def write_text_atomic(path: Path, text: str, *, encoding: str = "utf-8") -> None:
    """Write ``text`` to ``path`` through a temp file in the same folder and a rename.

    The result has the existing file's mode (and owner when allowed), else
    ``0666 & ~umask``. A failure leaves the previous file, or none, never a partial one.
    """
    path = Path(path)
    try:
        old = path.stat()
    except FileNotFoundError:
        old = None
    except OSError as exc:
        raise _explain(exc, path) from None
    if old is not None and not stat.S_ISREG(old.st_mode):
        raise EvotunerError(f"cannot write {path}: it exists and is not a regular file",
                            "give the path of a file")
    if old is not None and not os.access(path, os.W_OK):
        raise EvotunerError(f"cannot write {path}: the file is read-only",
                            f"make it writable (chmod u+w {path}) or write to another --output")
    mode = stat.S_IMODE(old.st_mode) if old is not None else 0o666 & ~_umask()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _explain(exc, path) from None
    try:
        with os.fdopen(fd, "w", encoding=encoding, newline="\n") as f:
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), mode)
            if old is not None and (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
                try:
                    os.fchown(f.fileno(), old.st_uid, old.st_gid)
                except OSError:
                    pass   # not ours to give away; the mode still lets the owner's group/others read
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise _explain(exc, path) from None
        raise
