"""The record stage: evotuner's study database (the only package that touches SQL).

``StudyStore(url)`` opens (and validates) the database; the Optuna study lives
in Optuna's own schema beside evotuner's ``evotuner_*`` tables. See
:mod:`evotuner.storage.store` for the API contracts and
:mod:`evotuner.storage.schema` for the tables.
"""

from evotuner.storage.connect import CONNECT_TIMEOUT_S, DEFAULT_URL, ENV_VAR
from evotuner.storage.records import (
    DUPLICATE_ATTR,
    GATE_ATTR,
    INTERRUPTED_PREFIX,
    INTERRUPTED_REASON,
    REASON_ATTR,
    TFLOPS_ATTR,
    StudyInfo,
    StudyRecord,
    StudySummary,
    TrialRecord,
    Zombie,
)
from evotuner.storage.schema import SCHEMA_VERSION
from evotuner.storage.store import PTXAS_FIGURES, StudyStore, ptxas_figures

__all__ = [
    "CONNECT_TIMEOUT_S",
    "DEFAULT_URL",
    "DUPLICATE_ATTR",
    "ENV_VAR",
    "GATE_ATTR",
    "INTERRUPTED_PREFIX",
    "INTERRUPTED_REASON",
    "PTXAS_FIGURES",
    "REASON_ATTR",
    "SCHEMA_VERSION",
    "TFLOPS_ATTR",
    "StudyInfo",
    "StudyRecord",
    "StudyStore",
    "StudySummary",
    "TrialRecord",
    "Zombie",
    "ptxas_figures",
]
