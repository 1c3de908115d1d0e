"""The one rule for every file evotuner writes on request (``export -o``, ``report -o``, ...).

A writer names a target path; :func:`output_file` (and :func:`write_text_atomic` /
:func:`write_bytes_atomic` on top of it) decides whether it may be replaced and
writes it safely:

* never a **symbolic link** (``report -o rep`` with ``rep/history.png`` linked to
  ``/etc/passwd`` must not clobber the link's target): the target is examined with
  ``lstat`` and the new file is made with ``O_CREAT | O_EXCL`` (which does not follow
  links) and renamed over the name, which replaces a directory entry, never a link's
  target;
* never a **non-regular file** (a folder, a FIFO, a device);
* never the **study database in use** nor one of its side files (``-wal``, ``-shm``,
  ``-journal``): compared by device and inode and by resolved path, so
  ``./x/../db.db`` and a hard link are caught too (the writer passes the store's
  files, :meth:`StudyStore.database_files`), nor any other file that holds an
  **SQLite database** (its first 16 bytes);
* written through a temporary file in the target's folder, flushed, ``fsync``-ed and
  ``rename``-d: a failure leaves the previous file, or none, never a partial one.

The new file gets the existing file's permission bits (and owner, where this
process may set it), or for a new file the mode ``open()`` would give it (0666 less
the umask): ``tempfile.mkstemp``'s 0600 would leave a header that a build running
as another user cannot read. Every refusal and OS failure is an
:class:`~evotuner.errors.EvotunerError` naming the path and a remedy.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from evotuner.errors import EvotunerError

#: The first bytes of every SQLite database file.
SQLITE_MAGIC = b"SQLite format 3\x00"
#: How much of the target's name the temporary file's name keeps (NAME_MAX is 255 on Linux).
_TMP_NAME_CHARS = 48


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _explain(exc: OSError, path: Path, option: str) -> EvotunerError:
    reason = exc.strerror or type(exc).__name__
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        remedy = f"make {path.parent} writable, or write to another {option}"
    elif exc.errno == errno.ENOSPC:
        remedy = "free some disk space"
    elif exc.errno == errno.ENAMETOOLONG:
        remedy = f"give a shorter {option} file name"
    else:
        remedy = f"write to another {option}"
    return EvotunerError(f"cannot write {path}: {reason}", remedy)


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return Path(os.path.abspath(path))


def check_target(path: str | os.PathLike[str], *, protect: Iterable[str | os.PathLike[str]] = (),
                 option: str = "--output") -> os.stat_result | None:
    """Refuse ``path`` as an output unless it is absent or a plain regular file that is not
    a database; ``protect``: files that must never be replaced (the study database and its
    side files). Returns the target's ``lstat`` (None when it does not exist yet)."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise _explain(exc, path, option) from None
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise EvotunerError(f"cannot write {path}: it is a symbolic link, which evotuner never writes through",
                            f"remove the link or write to another {option}")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise EvotunerError(f"cannot write {path}: it exists and is not a regular file",
                            f"give the path of a file, or write to another {option}")
    target = _resolved(path)
    for guarded in protect:
        guarded = Path(guarded)
        same = _resolved(guarded) == target
        if not same and st is not None:
            try:
                same = _identity(os.stat(guarded)) == _identity(st)
            except OSError:
                same = False
        if same:
            raise EvotunerError(f"cannot write {path}: it is the study database in use ({guarded})",
                                f"write to another {option}; the database keeps every study")
    if st is not None and st.st_size >= len(SQLITE_MAGIC):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            try:
                head = os.read(fd, len(SQLITE_MAGIC))
            finally:
                os.close(fd)
        except OSError:
            head = b""
        if head == SQLITE_MAGIC:
            raise EvotunerError(f"cannot write {path}: it holds an SQLite database",
                                f"write to another {option}; evotuner never replaces a database")
    return st


def _unwritable(path: Path, st: os.stat_result, option: str) -> EvotunerError:
    """Why an existing ``path`` cannot be written. Its mode bits say so, or they grant this user
    write access and the system refuses it anyway (an immutable or append-only attribute, a
    read-only mount, an ACL), where chmod cannot help."""
    mode = stat.S_IMODE(st.st_mode)
    if os.geteuid() == 0 or st.st_uid == os.geteuid():
        granted = bool(mode & stat.S_IWUSR) or os.geteuid() == 0
    elif st.st_gid in (os.getegid(), *os.getgroups()):
        granted = bool(mode & stat.S_IWGRP)
    else:
        granted = bool(mode & stat.S_IWOTH)
    if granted:
        return EvotunerError(f"cannot write {path}: its mode ({mode:o}) allows writing but the system refuses it "
                             f"(an immutable or append-only attribute, a read-only mount or an ACL)",
                             f"see `lsattr {path}` and `findmnt -T {path}`, or write to another {option}")
    return EvotunerError(f"cannot write {path}: the file is read-only",
                         f"make it writable (chmod u+w {path}) or write to another {option}")


@contextmanager
def output_file(path: str | os.PathLike[str], *, protect: Iterable[str | os.PathLike[str]] = (),
                option: str = "--output") -> Iterator[BinaryIO]:
    """``with output_file(p) as f: f.write(b"...")``: a binary file that replaces ``p`` (under
    :func:`check_target`'s rule) only when the block ends without an exception."""
    path = Path(path)
    protect = tuple(protect)
    old = check_target(path, protect=protect, option=option)
    if old is not None and not os.access(path, os.W_OK):
        raise _unwritable(path, old, option)
    mode = stat.S_IMODE(old.st_mode) if old is not None else 0o666 & ~_umask()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:_TMP_NAME_CHARS]}.", suffix=".tmp",
                                   dir=path.parent if str(path.parent) else ".")
    except OSError as exc:
        raise _explain(exc, path, option) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.raw.name = tmp          # what the file is, for messages (os.fdopen names it by its fd)
            yield f
            f.flush()
            os.fchmod(f.fileno(), mode)
            if old is not None and (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
                try:
                    os.fchown(f.fileno(), old.st_uid, old.st_gid)
                except OSError:
                    pass   # not ours to give away; the mode still lets the owner's group/others read
            os.fsync(f.fileno())
        check_target(path, protect=protect, option=option)   # what the name is now, just before the rename
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise _explain(exc, path, option) from None
        raise


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes, *,
                       protect: Iterable[str | os.PathLike[str]] = (), option: str = "--output") -> None:
    """Write ``data`` to ``path`` under the output rule (see the module docstring)."""
    with output_file(path, protect=protect, option=option) as f:
        f.write(data)


def write_text_atomic(path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8",
                      protect: Iterable[str | os.PathLike[str]] = (), option: str = "--output") -> None:
    """Write ``text`` to ``path`` under the output rule (see the module docstring).

    The result has the existing file's mode (and owner when allowed), else
    ``0666 & ~umask``. A failure leaves the previous file, or none, never a partial one.
    """
    write_bytes_atomic(path, text.encode(encoding), protect=protect, option=option)
