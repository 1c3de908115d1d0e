"""Opening a study database without writing to it, and refusing other applications' databases.

Read-only commands (``show``, ``export``, ``report``) open SQLite with
``mode=ro``, so a database that is read-only for this user (a chmod'ed file or
folder, an immutable file, a read-only mount) can still be read, and nothing is
written even where it could be: no WAL switch, no tables created, no
schema-version row, no side files. SQLite's read-only mode still creates the
``-wal``/``-shm`` files a WAL database needs and leaves them behind, and cannot
create them in a read-only folder, so:

* no ``-wal`` file next to the database (no writer has it open; everything is in
  the main file): open it ``immutable=1``, which reads the file without locks or
  side files and leaves the folder exactly as found;
* a ``-wal`` file exists (a search is writing it now, or one was killed): open it
  ``mode=ro`` so the reader sees the log's pages; only where the file or folder is
  not writable is it ``immutable=1`` (the log cannot be read then; the main file can).

Opening refuses a SQLite file that already holds tables but neither Optuna's nor
evotuner's: ``--storage`` pointing at another application's SQLite file must not get
37 tables added to it. (A server database is often shared by several applications,
each in its own tables, so there the check does not apply.)
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import quote

from sqlalchemy.engine import URL, make_url

from evotuner.errors import StorageError

#: Tables whose presence marks an Optuna RDB storage.
OPTUNA_MARKERS = frozenset({"studies", "version_info"})
#: evotuner's own tables all start with this.
EVOTUNER_PREFIX = "evotuner_"


def sqlite_writable(path: Path) -> bool:
    """Whether this process may write ``path`` and create its side files next to it."""
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK | os.X_OK)


def readonly_url(url: URL) -> URL:
    """``url`` opened read-only: SQLite as a ``mode=ro`` (or ``immutable=1``) URI; servers as given."""
    if url.get_backend_name() != "sqlite" or not url.database:
        return url
    path = Path(url.database)
    live_wal = Path(f"{path}-wal").exists()
    flag = "mode=ro" if live_wal and sqlite_writable(path) else "immutable=1"
    return make_url(f"{url.drivername}:///file:{quote(str(path), safe='/')}?{flag}&uri=true")


def refuse_foreign(tables: Iterable[str], where: object, named_by: str = "--storage / $EVOTUNER_STORAGE") -> None:
    """Raise StorageError when ``tables`` is neither empty, nor Optuna's, nor evotuner's
    (``named_by``: what named the database, for the remedy)."""
    names = sorted(t for t in tables if not t.startswith("sqlite_"))
    if not names:
        return
    if OPTUNA_MARKERS <= set(names) or any(n.startswith(EVOTUNER_PREFIX) for n in names):
        return
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    from evotuner.storage.urlmask import mask_url

    where_text = mask_url(where) if isinstance(where, URL) else str(where)
    if isinstance(where, URL) and where.get_backend_name() == "sqlite":
        where_text = str(where.database)
    raise StorageError(
        f"database {where_text} belongs to another application ({len(names)} tables: {shown}) "
        "and holds no evotuner or Optuna study",
        f"point {named_by} at an evotuner database or a new file; evotuner adds its tables only "
        "to an empty or Optuna database",
    )
