"""What a search knows of its study, and what it hands back.

:class:`Tally` keeps the finished trials' counts, the best trial, the result of every config
finished so far (what a repeat of it copies), the incumbent a racing measure stage races
against, and the space's coverage; from these come the rules that end a search early
(``exhausted``, ``stalled``). :class:`SearchResult` is the search's answer, :class:`Stopwatch`
its timings. Pure bookkeeping: no storage, no stage, no coordinator (:mod:`evotuner.loop`
feeds it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterable

from evotuner import events as ev
from evotuner.config import KernelConfig
from evotuner.vocabulary import DEVICE_ATTR, TFLOPS_ATTR, config_of

#: How a search ended: ``done`` (the study has ``trials`` finished trials),
#: ``already_done`` (it had them before this run started; nothing was asked),
#: ``exhausted`` (every feasible config of the space is known: more trials would only
#: repeat results), ``stalled`` (the study's last ``DUPLICATE_STREAK`` trials were all
#: repeats of known configs: the sampler keeps proposing what was tried, though
#: ``SearchResult.untried`` configs may remain).
OUTCOMES = ("done", "already_done", "exhausted", "stalled")

#: Consecutive proposals of already-known configs after which the loop stops
#: with ``exhausted`` instead of spinning (a sampler stuck on a small space).
DUPLICATE_STREAK = 64

#: Spaces up to this many configs are checked for full coverage before each ask.
COVERAGE_LIMIT = 100_000

#: Keys of ``SearchResult.timings``: ``baselines`` (device fingerprint + SDPA baselines,
#: measured once the first builds are under way), ``ask`` (sampler ask + suggest), ``build_wait`` (blocked on the oldest build),
#: ``gate`` (ptxas gate), ``measure`` (the measure stage's call), ``record`` (study writes:
#: build/measurement rows and Optuna's tell).
TIMING_KEYS = ("baselines", "ask", "build_wait", "gate", "measure", "record")


class Stopwatch:
    """Wall seconds per part of the loop's thread (``TIMING_KEYS``): ``SearchResult.timings``."""

    def __init__(self) -> None:
        self.timings = {key: 0.0 for key in TIMING_KEYS}

    def lap(self, key: str, since: float) -> float:
        """Add the wall seconds since ``since`` to ``timings[key]``; returns now."""
        now = time.perf_counter()
        self.timings[key] += now - since
        return now


@dataclass(frozen=True)
class SearchResult:
    study: str
    outcome: str                        # one of OUTCOMES
    target: int
    finished: int                       # finished trials in the study at the end
    new_trials: int                     # trials this run finished (zombies not counted)
    counts: dict[str, int] = field(hash=False)
    best: ev.Best | None = None
    baselines: dict[str, float | None] | None = field(default=None, hash=False)
    zombies: tuple[int, ...] = ()
    #: Statically feasible configs of the space, and how many of them no trial has tried
    #: (None when the space is larger than ``COVERAGE_LIMIT``).
    feasible: int | None = None
    untried: int | None = None
    #: Repeats of known configs at the end of the study (the ``stalled`` rule's count).
    duplicate_streak: int = 0
    #: Wall seconds this run spent in each part of the loop's thread (see ``TIMING_KEYS``);
    #: builds run in a pool, so ``build_wait`` is only the time the loop was blocked on one.
    timings: dict[str, float] = field(default_factory=dict, hash=False, compare=False)
    #: Measurements this run made, and how many of them racing stopped early.
    measured: int = 0
    stopped_early: int = 0
    #: Search threads whose ``timings`` are summed (one per GPU with ``--gpus``).
    threads: int = 1


@dataclass(frozen=True)
class Result:
    """What a finished trial says; what a repeat of its config copies."""

    number: int
    state: str
    value: float | None
    reason: str | None
    attrs: dict[str, Any] = field(default_factory=dict, hash=False)


class Tally:
    """The study as one search sees it: loaded from its finished trials (:meth:`load`), then
    kept up to date with each trial the search tells (:meth:`told`)."""

    def __init__(self, space: Any, problem: Any) -> None:
        self.space = space
        self.problem = problem
        self.known: dict[KernelConfig, Result] = {}
        self.counts = {state: 0 for state in ev.STATES}
        self.finished = 0
        self.new_trials = 0
        self.best: ev.Best | None = None
        self.dup_streak = 0
        #: Racing's incumbents: the best median this run measured, and the best of the study's
        #: earlier trials per GPU model (an incumbent must come from the model that races it).
        self.run_best: float | None = None
        self.history_best: dict[str, float] = {}
        self._unseen: set[KernelConfig] | None = None
        self._feasible: int | None = None

    def load(self, records: Iterable[Any]) -> None:
        """Finished trials so far (``StudyStore.finished_trials``): counts, best, and the
        configs a duplicate copies.

        A trial failed because its run was interrupted (a killed process, or the
        user) is not finished: it does not count towards ``trials`` and its
        config may be proposed and built again.
        """
        for rec in sorted(records, key=lambda r: r.number):
            self.finished += 1
            self.counts[rec.state] = self.counts.get(rec.state, 0) + 1
            # the stall rule's streak, as the loop counts it: repeats in a row, reset by a new config
            self.dup_streak = self.dup_streak + 1 if rec.duplicate_of is not None else 0
            config = config_of(rec.params, self.space)
            if config is None:
                continue
            if rec.duplicate_of is None and config not in self.known:
                attrs = {TFLOPS_ATTR: rec.tflops} if rec.tflops is not None else {}
                self.known[config] = Result(rec.number, rec.state, rec.value, rec.error, attrs)
            if rec.state == "COMPLETE" and rec.value is not None:
                self.offer_best(rec.number, config, rec.value, rec.tflops)
                device = rec.attrs.get(DEVICE_ATTR)
                name = device.get("name") if isinstance(device, dict) else None
                if isinstance(name, str) and rec.value < self.history_best.get(name, float("inf")):
                    self.history_best[name] = rec.value      # an incumbent for racing on this model

    def told(self, number: int, config: KernelConfig | None, state: str, value: float | None,
             reason: str | None, attrs: dict[str, Any], duplicate_of: int | None) -> None:
        """This search finished trial ``number`` (``attrs``: the user attrs it wrote); the
        caller offers a COMPLETE one as the best (:meth:`offer_best`) once it said so."""
        self.finished += 1
        self.new_trials += 1
        self.counts[state] = self.counts.get(state, 0) + 1
        if config is not None and duplicate_of is None and config not in self.known:
            copied = {TFLOPS_ATTR: attrs[TFLOPS_ATTR]} if TFLOPS_ATTR in attrs else {}
            self.known[config] = Result(number, state, value, reason, copied)

    def offer_best(self, number: int, config: KernelConfig, value: float, tflops: float | None) -> None:
        if self.best is None or value < self.best.median_us:
            self.best = ev.Best(number, config, value, tflops)

    # -- racing ----------------------------------------------------------------------------

    def timed(self, median_us: float) -> None:
        """This run measured a config at ``median_us``."""
        if self.run_best is None or median_us < self.run_best:
            self.run_best = median_us

    def incumbent(self, model: str | None) -> float | None:
        """The best median measured on GPU model ``model``: this run's, or the study's earlier
        trials'; None when nothing is known yet."""
        known = [v for v in (self.run_best, self.history_best.get(model) if model else None) if v is not None]
        return min(known) if known else None

    # -- when to stop ----------------------------------------------------------------------

    def stop_reason(self, in_flight: Iterable[KernelConfig]) -> str | None:
        """``exhausted`` when every feasible config is known or ``in_flight``; ``stalled`` after
        ``DUPLICATE_STREAK`` repeats in a row; else None."""
        if self.exhausted(in_flight):
            return "exhausted"
        if self.dup_streak >= DUPLICATE_STREAK:
            return "stalled"
        return None

    def exhausted(self, in_flight: Iterable[KernelConfig]) -> bool:
        """True when every statically feasible config is finished or ``in_flight`` (spaces up to
        ``COVERAGE_LIMIT`` configs; larger ones rely on ``DUPLICATE_STREAK``)."""
        if self.space.size > COVERAGE_LIMIT:
            return False
        if self._unseen is None:   # the configs that can run: static violations never will
            self._unseen = set(self.space.feasible(self.problem))
            self._feasible = len(self._unseen)
        self._unseen -= self.known.keys()
        self._unseen -= set(in_flight)
        return not self._unseen

    def coverage(self, in_flight: Iterable[KernelConfig]) -> tuple[int | None, int | None]:
        """(statically feasible configs, how many no trial has tried); (None, None) for a
        space over ``COVERAGE_LIMIT`` configs."""
        if self.space.size > COVERAGE_LIMIT:
            return None, None
        self.exhausted(in_flight)
        assert self._unseen is not None and self._feasible is not None
        return self._feasible, len(self._unseen)
