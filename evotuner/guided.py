"""GuidedSampler: Bayesian optimisation over a space's feasible configs, with the kernel
family's cost model as the prior (the ``guided`` sampler).

Why: a search that starts cold learns from scratch what the kernel's structure already
says, and on the Hopper family's space (5-8 thousand feasible configs, a few within 2% of
the best) TPE needed 0.4-0.7 of random search's evaluations (README, "Samplers"). A family
that can predict its configs' time (:meth:`evotuner.family.KernelFamily.estimate_us`, e.g.
kernels/hopper/cost.py) gives the search its ranking before the first build; the search
then measures where the model is unsure or wrong.

How, per proposal:

* the candidates are the space's configs no static constraint rejects for the problem
  (enumerated once), less those the study already holds (finished, running, waiting);
* the prior mean of a config's log time is the log of the family's estimate (an estimate
  of ``inf`` -- the model predicts the gate rejects it -- sits ``log 2`` above the worst
  finite one: tried last, never excluded);
* a Gaussian process models the residual ``log(measured) - log(estimate)`` over the
  configs' values scaled to [0, 1] (squared-exponential kernel, one length scale per
  parameter): a constant part (the model's overall bias: clock, dtype, anything it leaves
  out, taken as the mean residual of the measured configs) plus a local part, so the
  search trusts the model's *order* and learns where it is wrong nearby;
* once ``FIT_AFTER`` configs are measured, each parameter's length scale is the one of
  ``LENGTH_SCALES`` that maximises the marginal likelihood (coordinate search, two
  passes): a parameter whose changes leave the residual unchanged (a register split,
  the scheduler at one shape) gets a long one, so near-copies of a measured config stop
  looking unexplored (on the held-out sweep B=1,H=16,S=4096,D=64 bf16, where the model
  ranks the optimum's structure 66th, this took the search from 32 evaluations to 6);
* a config that reached the compiler and failed (gate, runtime) counts as measured
  ``FAILURE_PENALTY`` above the worst measured residual; running and waiting configs count
  as measured at the current mean (a constant liar: parallel builds spread out);
* the pick maximises expected improvement over the best measured log time (with nothing
  measured, that is the best estimate); ties go to the seeded random state.

The starting length scale and the residual's spread are round figures, not fitted: the
benchmark's figures moved by at most a few evaluations for 0.2-0.5 and 0.05-0.15
(scripts/sampler_benchmark.py, README "Samplers"). The search is as good as the model's
order: with a flat model it is plain GP expected improvement, with a model that ranks the
configs backwards it is worse than random search (measured, README).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from evotuner.config import KernelConfig
from evotuner.problem import Problem
from evotuner.space import SearchSpace
from evotuner.vocabulary import REASON_ATTR, distributions, is_interrupted, param_key

#: Prior standard deviation of the residual log time (the model's error away from its bias).
SIGNAL_SD = 0.10
#: Length scale of the residual's correlation, in parameter ranges (each scaled to [0, 1]).
LENGTH_SCALE = 0.30
#: Length scales the marginal likelihood chooses among, per parameter, once FIT_AFTER configs are measured.
LENGTH_SCALES = (0.3, 1.0, 3.0)
FIT_AFTER = 3
#: The fit uses at most this many known configs (the best measured first): 48 Cholesky
#: factorisations of their kernel matrix per proposal stay a fraction of a second.
FIT_POINTS = 200
#: Standard deviation of one measurement's log time (run-to-run noise, ~1 %).
NOISE_SD = 0.01
#: A config that failed after it reached the compiler counts this far (log) above the worst measured.
FAILURE_PENALTY = 0.3
#: Where an estimate of ``inf`` puts a config: this far (log) above the worst finite estimate.
INFEASIBLE_PRIOR = math.log(2.0)

Estimate = Callable[[KernelConfig], float]


@dataclass(frozen=True)
class GPSettings:
    """The residual GP's fixed settings (see the constants above for what each means)."""

    signal_sd: float = SIGNAL_SD
    length_scale: float = LENGTH_SCALE
    noise_sd: float = NOISE_SD


class GuidedSampler(BaseSampler):
    """Expected improvement over a GP on the cost model's residuals (see the module docstring).

    ``estimate(config)`` is the predicted time in µs (``math.inf``: predicted to fail the
    gate); it is called once per feasible config, on the first proposal.
    """

    def __init__(self, space: SearchSpace, problem: Problem, estimate: Estimate, seed: int | None, *,
                 settings: GPSettings = GPSettings()) -> None:
        self.space, self.problem, self.estimate, self.settings = space, problem, estimate, settings
        self._rng = np.random.RandomState(seed)
        self._dists = distributions(space)
        self._keys = [param_key(p.name) for p in space.params]
        self._rows: dict[tuple[int, ...], int] | None = None   # index tuple -> candidate row
        self._index: np.ndarray | None = None                   # candidate rows' index tuples
        self._x: np.ndarray | None = None                       # candidate rows' scaled values
        self._prior: np.ndarray | None = None                   # candidate rows' log estimate

    # -- Optuna's sampler interface ----------------------------------------------------------

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self._dists)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not search_space:
            return {}
        self._enumerate()
        assert self._index is not None
        if len(self._index) == 0:         # no feasible config: the loop prunes whatever comes
            return {k: 0 for k in self._keys}
        row = self._pick(study, trial)
        return dict(zip(self._keys, (int(i) for i in self._index[row])))

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        low, high = param_distribution.low, param_distribution.high  # type: ignore[attr-defined]
        return int(self._rng.randint(low, high + 1))

    def reseed_rng(self) -> None:
        self._rng.seed()

    # -- the candidates ------------------------------------------------------------------------

    def _enumerate(self) -> None:
        if self._index is not None:
            return
        index, x, prior = [], [], []
        spans = [(min(p.values), max(p.values)) for p in self.space.params]
        for config in self.space.feasible(self.problem):
            values = config.as_dict()
            index.append(tuple(p.index(values[p.name]) for p in self.space.params))
            x.append([(values[p.name] - lo) / (hi - lo) if hi > lo else 0.0
                      for p, (lo, hi) in zip(self.space.params, spans)])
            prior.append(float(self.estimate(config)))
        self._index = np.array(index, dtype=int).reshape(len(index), len(self._keys))
        self._x = np.array(x, dtype=float).reshape(len(index), len(self._keys))
        finite = [p for p in prior if math.isfinite(p) and p > 0]
        worst = math.log(max(finite)) if finite else 0.0
        self._prior = np.array([math.log(p) if math.isfinite(p) and p > 0 else worst + INFEASIBLE_PRIOR
                                for p in prior])
        self._rows = {tuple(int(i) for i in key): row for row, key in enumerate(self._index)}

    # -- the pick ------------------------------------------------------------------------------

    def _observations(self, study: optuna.Study, trial: FrozenTrial) -> tuple[dict[int, float], set[int], set[int]]:
        """{row: measured log time}, rows that failed past the compiler, rows in flight."""
        assert self._rows is not None
        measured: dict[int, float] = {}
        failed: set[int] = set()
        pending: set[int] = set()
        for t in study.get_trials(deepcopy=False):
            params = t.params or t.system_attrs.get("fixed_params") or {}
            if t.number == trial.number or not all(k in params for k in self._keys):
                continue
            row = self._rows.get(tuple(int(params[k]) for k in self._keys))
            if row is None:               # statically infeasible (pruned before the compiler)
                continue
            if t.state == TrialState.COMPLETE and t.value is not None and t.value > 0:
                measured.setdefault(row, math.log(t.value))
            elif t.state in (TrialState.PRUNED, TrialState.FAIL):
                if not is_interrupted(t.state, t.user_attrs.get(REASON_ATTR)):
                    failed.add(row)
            elif t.state in (TrialState.RUNNING, TrialState.WAITING):
                pending.add(row)
        failed -= set(measured)
        pending -= set(measured) | failed
        return measured, failed, pending

    def _pick(self, study: optuna.Study, trial: FrozenTrial) -> int:
        assert self._x is not None and self._prior is not None and self._index is not None
        measured, failed, pending = self._observations(study, trial)
        known = set(measured) | failed | pending
        jitter = self._rng.uniform(0.0, 1e-9, len(self._prior))
        free = np.ones(len(self._prior), dtype=bool)
        free[list(known)] = False
        if not free.any():                # every feasible config is known: the loop's exhaustion check ends it
            return int(np.argmin(self._prior + jitter))
        if not known:
            return int(np.argmin(np.where(free, self._prior + jitter, np.inf)))
        try:
            gain = self._gain(measured, failed, known, free) + jitter
        except np.linalg.LinAlgError:     # a covariance numerically singular: take the model's next best
            return int(np.argmin(np.where(free, self._prior + jitter, np.inf)))
        gain[~free] = -np.inf
        return int(np.argmax(gain))

    def _gain(self, measured: dict[int, float], failed: set[int], known: set[int], free: np.ndarray) -> np.ndarray:
        """Expected improvement of every candidate given what the study knows."""
        assert self._x is not None and self._prior is not None
        residual = {row: value - self._prior[row] for row, value in measured.items()}
        bias = float(np.mean(list(residual.values()))) if residual else 0.0
        worst = max((r - bias for r in residual.values()), default=0.0)
        rows = sorted(known)
        y = np.array([residual[r] - bias if r in residual else (worst + FAILURE_PENALTY if r in failed else 0.0)
                      for r in rows])
        x_known = self._x[rows]
        if len(measured) >= FIT_AFTER:
            best_first = np.argsort(y)[:FIT_POINTS]
            scales = self._fit_length_scales(x_known[best_first], y[best_first])
        else:
            scales = np.full(x_known.shape[1], self.settings.length_scale)
        mean, sd = self._posterior(x_known, y, scales)
        mean = self._prior + bias + mean
        best = min(measured.values()) if measured else float(mean[free].min())
        return _expected_improvement(best, mean, sd)

    def _fit_length_scales(self, x_known: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Per-parameter length scales from LENGTH_SCALES by marginal likelihood (coordinate search)."""
        scales = np.full(x_known.shape[1], self.settings.length_scale)
        for _ in range(2):
            for d in range(len(scales)):
                if np.ptp(x_known[:, d]) == 0:
                    continue             # the known configs share this value: no evidence either way
                fits = []
                for candidate in LENGTH_SCALES:
                    tried = scales.copy()
                    tried[d] = candidate
                    fits.append((self._neg_log_likelihood(x_known, y, tried), candidate))
                scales[d] = min(fits)[1]
        return scales

    def _neg_log_likelihood(self, x_known: np.ndarray, y: np.ndarray, scales: np.ndarray) -> float:
        chol = self._cholesky(x_known, scales)
        z = np.linalg.solve(chol, y)
        return float(0.5 * z @ z + np.log(np.diag(chol)).sum())

    def _posterior(self, x_known: np.ndarray, y: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """GP posterior mean and standard deviation of the residual at every candidate."""
        assert self._x is not None
        var = self.settings.signal_sd ** 2
        chol = self._cholesky(x_known, scales)
        alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, y))
        k_cross = self._kernel(self._x, x_known, scales)
        mean = k_cross @ alpha
        v = np.linalg.solve(chol, k_cross.T)
        sd = np.sqrt(np.clip(var - (v * v).sum(axis=0), 1e-12, None))
        return mean, sd

    def _cholesky(self, x_known: np.ndarray, scales: np.ndarray) -> np.ndarray:
        """Cholesky factor of the known configs' covariance (kernel plus measurement noise)."""
        noise = self.settings.noise_sd ** 2 * np.eye(len(x_known))
        return np.linalg.cholesky(self._kernel(x_known, x_known, scales) + noise)

    def _kernel(self, a: np.ndarray, b: np.ndarray, scales: np.ndarray) -> np.ndarray:
        a, b = a / scales, b / scales
        d2 = np.clip((a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T, 0.0, None)
        return self.settings.signal_sd ** 2 * np.exp(-0.5 * d2)


_ERF = np.vectorize(math.erf, otypes=[float])


def _expected_improvement(best: float, mean: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """E[max(best - f, 0)] for f ~ N(mean, sd^2) (minimisation)."""
    z = (best - mean) / sd
    cdf = 0.5 * (1.0 + _ERF(z / math.sqrt(2.0)))
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return (best - mean) * cdf + sd * pdf

