"""Racing: stop timing a config once it is clearly slower than the study's best so far.

A measure request may carry a :class:`Race`: the incumbent (the study's best median so
far, µs, on this GPU model) and the :class:`RaceRule`. The worker times the config in
chunks; at each *look* (``RaceRule.looks``: 16, 32, 64, ... repetitions) it asks
:meth:`RaceRule.stops` whether a conservative lower confidence bound of the config's
median already exceeds ``incumbent * (1 + margin)``. If so, the timing stops there and
the config is recorded with its median so far and the repetitions it had
(``Measurement.stopped_early``); a config stopped in a paired race, with its pair ratios'
quantiles times the incumbent's recorded median (:func:`paired_figures`). Otherwise it
gets the whole budget. A config that may
beat the incumbent is never stopped: it is a contender and gets the full budget.

The rule (docs/measurement.md has the derivation, the simulation on recorded sweeps and
the check on recorded GPU traces):

* the bound is an order statistic, distribution free: with ``n`` samples sorted
  ``x(1) <= ... <= x(n)``, ``P(x(k) > m) = P(Binomial(n, 1/2) <= k - 1)`` for the true
  median ``m`` of any continuous distribution of independent repetitions. ``k`` is the
  largest rank whose probability is at most ``alpha / len(LOOKS)``;
* a Bonferroni split over every look the schedule can make, so the chance that a config
  whose timing window's median is at or below ``incumbent * (1 + margin)`` is ever stopped
  is at most ``alpha`` (0.1% by default), whatever the timing distribution's shape;
* ``margin`` (15%) is the GPU's drift between and within timing windows: on the H100 the
  same config timed in windows seconds apart read medians up to 10.5% apart, and a window's
  first repetitions up to 12% off its own median (SM clocks moving between 1485 and 1980 MHz
  under the kernel's power draw). The bound is a statement about the repetitions so far, so
  only a gap past the drift says the config is slower, not that it was timed at a slow moment.
  On 320 recorded windows of 32 configs (scripts/timing_traces.py, three machine starts,
  docs/measurements/racing/traces_h100_1126f*.json), raced against an incumbent 1% faster
  than the config's best window: 0 stopped at 15%, 3-5 at 10-12%, 11 of 64 (one set) with
  the earlier 1% rule and its AR(1) effective sample size.

Paired racing (``RaceRule.paired_margin``; on by default, ``--no-paired-race`` races against
the best figure alone and ``--full-timing`` turns racing off): the request also carries the incumbent's
artifact; the worker loads it beside the config and, up to ``paired_reps`` repetitions,
times the two alternately, repetition by repetition, in the same window. The ratio of
each adjacent pair (config / incumbent) cancels the drift both saw, so its median's
order-statistic lower bound (the same ``alpha / len(LOOKS)`` per look) may be held against
a far smaller margin: the config stops once that bound exceeds ``1 + paired_margin``. The
unpaired rule stays in force beside it, so the chance of ever stopping a config within
both margins is at most ``alpha`` plus ``alpha / 8`` for each paired look (16, 32, 64:
``1.375 * alpha``). Why: a config 3-15% slower than the best cannot be told from drift by
the unpaired rule and gets the full budget, and those are most of a guided study's configs
(docs/measurement.md).

In a paired race the unpaired rule's stop needs the window's pairs to agree
(:meth:`Race.pairs_disagree`): a window in which the host launched late can read a config
15% over the best while the incumbent beside it reads as slow, and such a stop, recorded on
the incumbent's scale, once made a config 25% slower the study's best. A config the
unpaired rule stops keeps its own figures (``worker.recorded_figures``).

Pure Python, no torch: the loop, the worker and the tests share it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import Any, Sequence

#: Repetition counts at which the worker looks (a config is timed in chunks up to these).
LOOKS = (16, 32, 64, 128, 256, 512, 1024, 2048)


def binom_cdf_half(n: int, k: int) -> float:
    """P(Binomial(n, 1/2) <= k), exactly (integer arithmetic, one division at the end)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return float(Fraction(sum(math.comb(n, i) for i in range(k + 1)), 2 ** n))


def pair_ratios(samples: Sequence[float], incumbent_samples: Sequence[float]) -> list[float]:
    """Config / incumbent of each pair of repetitions timed alternately (the same order)."""
    return [c / i for c, i in zip(samples, incumbent_samples) if i > 0]


def paired_figures(samples: Sequence[float], incumbent_samples: Sequence[float], incumbent_us: float
                   ) -> tuple[float, float, float] | None:
    """(median, p20, p80) µs of a config stopped in a paired race, on the scale of full-budget
    timings: the quantiles of its adjacent-pair ratios times ``incumbent_us``, the median
    recorded for the incumbent it was paired with. None without pairs.

    Why not its own median: a paired stop comes after 16-64 repetitions, whose absolute
    level drifts with the window (+-5% and more on the H100) although their ratio does not;
    the study's best is the minimum over many such short figures, so raw ones let configs
    3-10% slower read below the incumbent and shadow it (two H100 studies recorded 927 and
    941 µs for configs that re-timed at 1011 and 1040 µs beside a 958 µs best;
    docs/measurement.md). The ratio's median is above the stop's ``1 + paired_margin``
    whenever the paired rule stopped it, so such a figure never reads below its incumbent."""
    ratios = sorted(pair_ratios(samples, incumbent_samples))
    if not ratios:
        return None
    return tuple(quantile(ratios, q) * incumbent_us for q in (0.5, 0.2, 0.8))  # type: ignore[return-value]


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of already sorted values (every timing's figures)."""
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@lru_cache(maxsize=None)
def lower_rank(n: int, level: float) -> int:
    """The largest rank ``k`` (1-based) with ``P(x(k) > median) <= level`` among ``n``
    independent samples, i.e. ``P(Binomial(n, 1/2) <= k - 1) <= level``; 0 when even the
    minimum is not a bound at that level. Exact: integer sums against ``level * 2**n``."""
    limit = Fraction(level) * 2 ** n
    k, cumulative, term = 0, 0, 1          # term = C(n, k)
    while k < n:
        cumulative += term                 # sum_{i <= k} C(n, i)
        if cumulative > limit:
            break
        k += 1
        term = term * (n - k + 1) // k
    return k


@dataclass(frozen=True)
class RaceRule:
    """When a config's timing may stop: at a look of ``LOOKS`` (from ``min_reps`` on), once
    the order-statistic lower bound of its median (false-stop level ``alpha`` over all
    looks) exceeds ``incumbent * (1 + margin)``."""

    alpha: float = 1e-3
    margin: float = 0.15
    min_reps: int = 16
    #: None: no paired race; else the margin on the config/incumbent ratio of adjacent
    #: repetitions timed alternately (module docstring).
    paired_margin: float | None = None
    #: Repetitions of the config timed alternately with the incumbent's (a look of LOOKS);
    #: a config not stopped by then runs alone to its budget.
    paired_reps: int = 64

    def __post_init__(self) -> None:
        if not (0.0 < self.alpha < 1.0 and math.isfinite(self.alpha)):
            raise ValueError(f"RaceRule.alpha={self.alpha!r}: not in (0, 1)")
        if not (0.0 <= self.margin < 1.0 and math.isfinite(self.margin)):
            raise ValueError(f"RaceRule.margin={self.margin!r}: not in [0, 1)")
        if self.min_reps < 1:
            raise ValueError(f"RaceRule.min_reps={self.min_reps!r}: not a positive count")
        if self.paired_margin is not None and not (0.0 <= self.paired_margin < 1.0 and math.isfinite(self.paired_margin)):
            raise ValueError(f"RaceRule.paired_margin={self.paired_margin!r}: not in [0, 1)")
        if self.paired_margin is not None and (self.paired_reps not in LOOKS or self.paired_reps < self.min_reps):
            raise ValueError(f"RaceRule.paired_reps={self.paired_reps!r}: not a look of {LOOKS} from min_reps on")

    @property
    def level(self) -> float:
        """The false-stop level of one look (Bonferroni over every look of the schedule)."""
        return self.alpha / len(LOOKS)

    def looks(self) -> tuple[int, ...]:
        return tuple(n for n in LOOKS if n >= self.min_reps)

    def bound(self, samples: Sequence[float]) -> float | None:
        """The lower confidence bound of the median of ``samples``, or None when there are
        too few for one at this rule's level."""
        n = len(samples)
        if n < self.min_reps:
            return None
        k = lower_rank(n, self.level)
        if k < 1:
            return None
        return sorted(samples)[k - 1]

    def threshold(self, incumbent_us: float) -> float:
        return incumbent_us * (1.0 + self.margin)

    def stops(self, samples: Sequence[float], incumbent_us: float) -> bool:
        """True when the config is clearly slower than ``incumbent_us``."""
        bound = self.bound(samples)
        return bound is not None and bound > self.threshold(incumbent_us)

    def stops_paired(self, samples: Sequence[float], incumbent_samples: Sequence[float]) -> bool:
        """True when the config's repetitions ``samples`` are clearly slower than the
        incumbent's timed alternately with them (``incumbent_samples``, the same order):
        the lower bound of the median of the adjacent pairs' ratios exceeds ``1 +
        paired_margin``. False when the rule does not pair."""
        if self.paired_margin is None:
            return False
        bound = self.bound(pair_ratios(samples, incumbent_samples))
        return bound is not None and bound > 1.0 + self.paired_margin

    def describe(self) -> str:
        text = (f"order-statistic lower bound of the median above the best x {1 + self.margin:g} "
                f"(alpha {self.alpha:g} over looks at {','.join(map(str, self.looks()))} reps)")
        if self.paired_margin is not None:
            text += (f", or of the median ratio to the best timed alternately above {1 + self.paired_margin:g} "
                     f"(up to {self.paired_reps} reps)")
        return text

    def to_wire(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "margin": self.margin, "min_reps": self.min_reps,
                "paired_margin": self.paired_margin, "paired_reps": self.paired_reps}

    @classmethod
    def from_wire(cls, value: Any) -> "RaceRule":
        if not isinstance(value, dict):
            raise ValueError(f"race rule is a {type(value).__name__}, not an object")
        paired = value.get("paired_margin")
        return cls(alpha=float(value.get("alpha", cls.alpha)), margin=float(value.get("margin", cls.margin)),
                   min_reps=int(value.get("min_reps", cls.min_reps)),
                   paired_margin=None if paired is None else float(paired),
                   paired_reps=int(value.get("paired_reps", cls.paired_reps)))


#: The rule ``evotuner search`` races with unless ``--full-timing`` is given.
DEFAULT_RULE = RaceRule()
#: The margin ``--paired-race`` pairs with: above the ratio spread of adjacent repetitions
#: (a 1 ms kernel's p20-p80 spread within a window is about 1%).
PAIRED_MARGIN = 0.03


@dataclass(frozen=True)
class Race:
    """What a measure request carries when racing is on: the incumbent and the rule; for a
    paired race also ``incumbent_artifact``, the wire form of the incumbent's artifact
    (the measure request's cubin/entry/meta/key/sha256/family fields) that the worker loads
    to time alternately with the config."""

    incumbent_us: float
    rule: RaceRule = DEFAULT_RULE
    incumbent_artifact: Mapping[str, Any] | None = field(default=None, compare=False)
    #: The median recorded for ``incumbent_artifact`` (its full-budget timing): the scale a
    #: paired-stopped config's figures are given on (:func:`paired_figures`).
    incumbent_artifact_us: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.incumbent_us) and self.incumbent_us > 0):
            raise ValueError(f"Race.incumbent_us={self.incumbent_us!r}: not a positive time")
        if self.incumbent_artifact is not None and not isinstance(self.incumbent_artifact.get("cubin"), str):
            raise ValueError(f"Race.incumbent_artifact has no cubin path: {dict(self.incumbent_artifact)!r:.200}")
        us = self.incumbent_artifact_us
        if (self.incumbent_artifact is None) != (us is None) or (
                us is not None and not (isinstance(us, (int, float)) and math.isfinite(us) and us > 0)):
            raise ValueError(f"Race.incumbent_artifact_us={us!r}: a paired race names the incumbent's artifact "
                             "and its recorded median (a positive time), an unpaired one neither")

    @property
    def paired(self) -> bool:
        """The worker times the config alternately with the incumbent's artifact."""
        return self.rule.paired_margin is not None and self.incumbent_artifact is not None

    def stops(self, samples: Sequence[float], incumbent_samples: Sequence[float] = ()) -> bool:
        """True when the config is clearly slower. In a paired race the unpaired rule's stop
        needs the same window's pairs to agree (:meth:`pairs_disagree`)."""
        if bool(incumbent_samples) and self.rule.stops_paired(samples, incumbent_samples):
            return True
        return self.rule.stops(samples, self.incumbent_us) and not self.pairs_disagree(samples, incumbent_samples)

    def pairs_disagree(self, samples: Sequence[float], incumbent_samples: Sequence[float]) -> bool:
        """Whether the pairs timed so far say the config is not clearly slower than the
        incumbent (their median config/incumbent ratio at most ``1 + paired_margin``), so an
        unpaired stop would rest on a slow window, not on the config: on the H100 the host
        launching late under a search's nvcc jobs read the config's repetitions 15% over the
        study's best while the incumbent beside them read as slow (ratio 0.96), and a
        config 25% slower than its incumbent came with a ratio of 0.81; both were stopped
        and recorded below the incumbent, becoming the study's best (docs/measurement.md)."""
        if self.rule.paired_margin is None or not incumbent_samples:
            return False
        ratios = sorted(pair_ratios(samples, incumbent_samples))
        return bool(ratios) and quantile(ratios, 0.5) <= 1.0 + self.rule.paired_margin

    def to_wire(self) -> dict[str, Any]:
        wire = {"incumbent_us": self.incumbent_us, **self.rule.to_wire()}
        if self.incumbent_artifact is not None:
            wire["incumbent_artifact"] = dict(self.incumbent_artifact)
            wire["incumbent_artifact_us"] = self.incumbent_artifact_us
        return wire

    @classmethod
    def from_wire(cls, value: Any) -> "Race | None":
        """The request's race (None when the request carries none)."""
        if value is None:
            return None
        if not isinstance(value, dict):
            raise ValueError(f"race is a {type(value).__name__}, not an object")
        artifact = value.get("incumbent_artifact")
        if artifact is not None and not isinstance(artifact, dict):
            raise ValueError(f"race's incumbent_artifact is a {type(artifact).__name__}, not an object")
        us = value.get("incumbent_artifact_us")
        if us is not None and (isinstance(us, bool) or not isinstance(us, (int, float))):
            raise ValueError(f"race's incumbent_artifact_us is a {type(us).__name__}, not a number")
        return cls(float(value["incumbent_us"]), RaceRule.from_wire(value), artifact,
                   None if us is None else float(us))
