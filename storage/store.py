"""StudyStore: the one place evotuner reads and writes its study database.

The Optuna study lives in Optuna's own schema (``optuna.storages.RDBStorage``)
in the same database as evotuner's ``evotuner_*`` tables, so
``optuna.load_study(study_name=..., storage=url)`` and optuna-dashboard read
what evotuner writes.

Threads: the loop is the one writer *process*. Builds finish in worker
threads and may call ``record_build`` from there: every method opens its own
short session from a pooled engine (SQLite connections are created with
``check_same_thread=False``; WAL mode and a busy timeout let SQLite serialise
the writes), so methods are safe to call from several threads at once.
Optuna's RDBStorage keeps a thread-local session of its own.

Trial state transitions (COMPLETE / PRUNED / FAIL) are the loop's, through the
``optuna.Study`` this store returns. The loop stores the one-line reason of a
PRUNED/FAIL trial as the user attribute ``reason`` (:data:`REASON_ATTR`);
``summary()`` reads it back as ``TrialRecord.error``.
"""

from __future__ import annotations

from evotuner.storage.recording import LOG_TAIL_CHARS, PTXAS_FIGURES, Recording, ptxas_figures
from evotuner.storage.summary import Summaries

__all__ = ["LOG_TAIL_CHARS", "PTXAS_FIGURES", "StudyStore", "ptxas_figures"]


class StudyStore(Recording, Summaries):
    """The study database at ``url`` (default ``$EVOTUNER_STORAGE`` or ``sqlite:///evotuner.db``
    in the current directory).

    Opening validates everything first and raises :class:`StorageError` (nothing
    written, nothing lost) for an unreadable URL, unknown dialect, missing driver,
    unreachable server (connect timeout :data:`~evotuner.storage.connect.CONNECT_TIMEOUT_S`),
    a file that is not a database or is corrupt, a read-only file or directory, or
    an evotuner schema newer than this version. Then it creates Optuna's tables
    and evotuner's (``evotuner_*``) if missing. With ``create=False`` (``show``,
    ``export``) a SQLite file that does not exist is an error instead of a new
    database. With ``read_only=True`` (``show``, ``export``, ``report``; implies
    ``create=False``) nothing is written and the database may be read-only for this
    user (:mod:`evotuner.storage.readonly`); the record methods then fail. A
    database holding another application's tables is refused. ``named_by`` is what
    named the database, as every remedy says it (the CLI's ``--storage / $EVOTUNER_STORAGE``,
    the default; ``evotuner.use_tuned() / $EVOTUNER_TUNED``). Use as a context manager or
    call :meth:`close`.

    Composed by concern: opening and the one session (:mod:`~evotuner.storage.opening`),
    the Optuna bridge of studies and trials (:mod:`~evotuner.storage.bridge`), the records
    of builds, measurements, devices and baselines (:mod:`~evotuner.storage.recording`) and
    summaries (:mod:`~evotuner.storage.summary`).
    """
