"""The trials a search has asked and not told yet, and what becomes of them when it cannot go on.

A trial is, until the loop tells it, in exactly one place: being asked (``current``), building
(a :class:`Flight`, oldest first, with the trials that proposed the same config meanwhile as
its ``followers``), or followed (its config is another search's: :class:`Followed`). When the
search's place is taken (:meth:`InFlight.drop`) they are forgotten, untold: their new owners
tell them. When the search is interrupted they are failed (:func:`fail_stranded`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import optuna
from optuna.trial import TrialState

from evotuner.config import KernelConfig
from evotuner.vocabulary import REASON_ATTR


@dataclass
class Flight:
    """A config building for ``trial``; ``followers`` proposed it meanwhile and copy its result."""

    trial: optuna.trial.Trial
    config: KernelConfig
    future: Any                         # concurrent.futures.Future[BuildResult]
    followers: list[optuna.trial.Trial] = field(default_factory=list)


@dataclass
class Followed:
    """A trial whose config another search owns: finished with its result when done."""

    trial: optuna.trial.Trial
    config: KernelConfig


class InFlight:
    def __init__(self) -> None:
        self.pending: deque[Flight] = deque()           # building, in proposal order
        self.by_config: dict[KernelConfig, Flight] = {}
        self.followed: list[Followed] = []
        self.current: optuna.trial.Trial | None = None   # asked, not yet placed anywhere

    def build(self, trial: optuna.trial.Trial, config: KernelConfig, future: Any) -> None:
        """``trial`` builds ``config`` (``future``); it is placed."""
        flight = Flight(trial, config, future)
        self.pending.append(flight)
        self.by_config[config] = flight
        self.placed(trial)

    def placed(self, trial: optuna.trial.Trial) -> None:
        """``trial`` is somewhere now (building, following, or told): no longer being asked."""
        if self.current is trial:
            self.current = None

    def configs(self) -> set[KernelConfig]:
        """Configs asked and not finished yet: building here, or followed."""
        return set(self.by_config) | {f.config for f in self.followed}

    def building(self) -> int:
        """Builds not done yet."""
        return sum(1 for p in self.pending if not p.future.done())

    def drop(self) -> int:
        """Forget every building and followed trial, untold (cancelling queued builds);
        returns how many trials that was."""
        lost = len(self.followed)
        for flight in self.pending:
            flight.future.cancel()
            lost += 1 + len(flight.followers)
        self.pending.clear()
        self.by_config.clear()
        self.followed.clear()
        return lost

    def strand(self) -> list[optuna.trial.Trial]:
        """Every trial asked and not told (cancelling queued builds), and forget them all."""
        stranded: list[optuna.trial.Trial] = []
        if self.current is not None:
            stranded.append(self.current)
        for flight in self.pending:
            flight.future.cancel()
            stranded.append(flight.trial)
            stranded.extend(flight.followers)
        stranded.extend(f.trial for f in self.followed)
        self.followed.clear()
        self.pending.clear()
        self.by_config.clear()
        self.current = None
        return stranded


def fail_stranded(study: optuna.Study, storage: Any, stranded: list[optuna.trial.Trial], reason: str,
                  alone: Callable[[], bool]) -> None:
    """Fail ``stranded`` trials with ``reason`` (best effort: a trial told meanwhile stays as
    told). The interrupt may have struck inside Optuna's ask (the trial row made, not yet handed
    back) or between a tell's writes: a trial no list holds. Alone on the study (``alone()``),
    every RUNNING trial is this process's, so none is left RUNNING for the next resume.
    ``storage`` is the study's Optuna storage."""
    for trial in stranded:
        try:
            trial.set_user_attr(REASON_ATTR, reason)
            study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
        except Exception:  # noqa: BLE001 -- best effort; the next run takes over the rest
            pass
    try:
        left = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)) if alone() else []
    except Exception:  # noqa: BLE001 -- best effort; the next run takes over the rest
        left = []
    for t in left:
        try:
            storage.set_trial_user_attr(t._trial_id, REASON_ATTR, reason)
            storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        except Exception:  # noqa: BLE001 -- finished meanwhile, or a busy database: the next run's
            pass
