"""Asking a trial: the proposal written in one transaction where the sampler can propose a
whole config before its trial exists.

Optuna's ``study.ask()`` creates an empty RUNNING trial (first reading the study's unfinished
trials, to pop a WAITING one), and each ``suggest_*`` then commits one parameter: on the
hopper space that is one commit for the trial and fifteen for its parameters, and two reads of
every trial in flight. With a sampler that is a :class:`Proposer`, :func:`ask` has it propose
the config from one read of the study and writes the trial with its parameters in one
transaction (:meth:`~evotuner.storage.StudyStore.begin_trial`); ``suggest`` then finds every
parameter already set. Any other sampler, and any study with WAITING trials (configs enqueued
to go first), goes through ``study.ask()`` as before.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import optuna

from evotuner.space import SearchSpace
from evotuner.vocabulary import distributions


class Proposer(ABC):
    """A sampler that can propose a whole trial's parameters before the trial exists."""

    @abstractmethod
    def propose(self, study: optuna.Study) -> dict[str, Any] | None:
        """The parameters (Optuna's internal values, one for each of the space's
        distributions) of the study's next trial, as the sampler would suggest them for a
        trial asked now; None when the study has WAITING trials (they are asked first) or the
        sampler cannot propose without a trial. Reads the study; writes nothing."""


def ask(study: optuna.Study, store: Any, optuna_study_id: int, space: SearchSpace) -> optuna.trial.Trial:
    """A new RUNNING trial of ``study`` (Optuna study ``optuna_study_id`` in ``store``),
    its parameters set where its sampler is a :class:`Proposer` that proposes them, else
    ``study.ask()``'s trial, whose parameters ``suggest`` sets. A proposal that raises takes
    the second way, so the error comes from ``suggest`` and fails that trial alone, as
    ``study.ask()``'s lazy sampling made it."""
    sampler = study.sampler
    if isinstance(sampler, Proposer):
        try:
            params = sampler.propose(study)
        except Exception:  # noqa: BLE001 -- study.ask()'s suggest meets it again: that trial fails, not the search
            params = None
        if params is not None:
            trial_id = store.begin_trial(optuna_study_id, params, distributions(space))
            return optuna.trial.Trial(study, trial_id)
    return study.ask()
