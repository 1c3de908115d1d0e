"""The guided sampler's Gaussian-process pieces that need no sampler: what a study has seen
(:class:`Observed`) and which of it the GP conditions on (:func:`conditioning`), the
training points (:class:`Points`), other studies' points as tasks (:class:`Related`,
:class:`Tasks`) and the acquisition (:func:`expected_improvement`). The sampler that uses
them, and the reasoning behind each choice, is :mod:`evotuner.guided`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Sequence

import numpy as np

from evotuner.config import KernelConfig

#: A config that failed after it reached the compiler counts this far (log) above the worst measured.
FAILURE_PENALTY = 0.3


@dataclass(frozen=True)
class Related:
    """What another study measured, for the GP (see the module docstring): ``points`` are
    (config, median µs or None for a failure past the compiler, the cost model's estimate
    of the config at that study's problem in µs); ``similarity`` in (0, 1] is the
    correlation assumed between the model's errors there and here."""

    name: str
    similarity: float
    points: tuple[tuple[KernelConfig, float | None, float], ...]


@dataclass
class Observed:
    """This study's known configs by candidate row: measured log times, rows that failed past
    the compiler, rows in flight, and each known row's first trial number (its proposal order)."""

    measured: dict[int, float] = field(default_factory=dict)
    failed: set[int] = field(default_factory=set)
    pending: set[int] = field(default_factory=set)
    number: dict[int, int] = field(default_factory=dict)


def conditioning(seen: Observed, limit: int, best: int, recent: int) -> list[int]:
    """The known rows the GP conditions on, sorted: all of them up to ``limit``; past it the
    ``best`` fastest measured, the ``recent`` most recently proposed (in flight first: they are
    what keeps parallel proposals apart) and, to fill ``limit``, the others evenly spread in
    proposal order. This bounds the GP's cost by construction: a proposal factorises at most
    ``limit`` of this study's points however long the study runs (a factorisation's cost grows
    with the cube of its points, the posterior's with their square times the candidates). The
    fastest configs keep the posterior sharp where expected improvement looks, the recent ones
    where the search has just been, and the spread keeps a coarse picture of the rest."""
    known = set(seen.measured) | seen.failed | seen.pending
    if len(known) <= limit:
        return sorted(known)
    keep = set(sorted(seen.measured, key=lambda r: (seen.measured[r], seen.number[r]))[:best])
    newest = sorted(seen.pending, key=lambda r: -seen.number[r])
    newest += sorted(known - seen.pending, key=lambda r: -seen.number[r])
    keep.update([r for r in newest if r not in keep][:recent])
    rest = sorted(known - keep, key=lambda r: seen.number[r])
    room = limit - len(keep)
    if room > 0 and rest:
        keep.update(rest[int(i)] for i in np.linspace(0, len(rest) - 1, room).round())
    return sorted(keep)


@dataclass(frozen=True)
class Points:
    """GP training points: scaled configs, residuals, each one's task (0: this study) and the
    task's correlation with this study (1 for its own points)."""

    x: np.ndarray
    y: np.ndarray
    task: np.ndarray
    weight: np.ndarray

    def subset(self, keep: np.ndarray) -> "Points":
        return Points(self.x[keep], self.y[keep], self.task[keep], self.weight[keep])

    @cached_property
    def correlation(self) -> np.ndarray:
        """Task correlation of every pair: 1 within a task, the product of their weights across two
        (computed once: the length-scale fit factorises the same points some 60 times)."""
        same = self.task[:, None] == self.task[None, :]
        return np.where(same, 1.0, self.weight[:, None] * self.weight[None, :])


@dataclass(frozen=True)
class Tasks:
    """The related studies' points, ready to join this study's (see :class:`Related`)."""

    points: Points
    measured: int                    # how many of them are measurements (the rest failures)

    @staticmethod
    def none(dims: int) -> "Tasks":
        empty = np.zeros(0)
        return Tasks(Points(np.zeros((0, dims)), empty, empty.astype(int), empty), 0)

    @staticmethod
    def of(related: Sequence[Related], scaled: Callable[[KernelConfig], list[float] | None], dims: int) -> "Tasks":
        """Each study's residuals ``log(measured) - log(estimate)`` centred on their mean; its
        failures FAILURE_PENALTY above its worst residual; points of configs with no finite
        estimate, or not expressible in this space, left out."""
        x: list[list[float]] = []
        y: list[float] = []
        task: list[int] = []
        weight: list[float] = []
        measured = 0
        for number, study in enumerate(related, start=1):
            ok = [(v, math.log(us) - math.log(est)) for c, us, est in study.points
                  if us is not None and us > 0 and math.isfinite(est) and est > 0 and (v := scaled(c)) is not None]
            if not ok:
                continue
            centre = sum(r for _, r in ok) / len(ok)
            worst = max(r for _, r in ok) - centre
            bad = [v for c, us, _ in study.points if us is None and (v := scaled(c)) is not None]
            for v, r in ok:
                x.append(v)
                y.append(r - centre)
            x.extend(bad)
            y.extend([worst + FAILURE_PENALTY] * len(bad))
            task.extend([number] * (len(ok) + len(bad)))
            weight.extend([study.similarity] * (len(ok) + len(bad)))
            measured += len(ok)
        if not y:
            return Tasks.none(dims)
        return Tasks(Points(np.array(x, dtype=float), np.array(y), np.array(task, dtype=int),
                              np.array(weight, dtype=float)), measured)

    def after(self, x: np.ndarray, y: np.ndarray) -> Points:
        """This study's points (task 0, weight 1) followed by the related ones."""
        return Points(np.vstack([x, self.points.x]), np.concatenate([y, self.points.y]),
                       np.concatenate([np.zeros(len(y), dtype=int), self.points.task]),
                       np.concatenate([np.ones(len(y)), self.points.weight]))


_ERF = np.vectorize(math.erf, otypes=[float])


def expected_improvement(best: float, mean: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """E[max(best - f, 0)] for f ~ N(mean, sd^2) (minimisation)."""
    z = (best - mean) / sd
    cdf = 0.5 * (1.0 + _ERF(z / math.sqrt(2.0)))
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return (best - mean) * cdf + sd * pdf

