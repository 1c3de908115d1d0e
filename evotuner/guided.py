"""GuidedSampler: Bayesian optimisation over a space's feasible configs, with the kernel
family's cost model as the prior (the ``guided`` sampler).

Why: a search that starts cold learns from scratch what the kernel's structure already
says, and on the Hopper family's space (thousands of feasible configs, a few within 2% of
the best) TPE does little better than random search (docs/samplers.md). A family
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
  looking unexplored, which matters most where the model ranks the optimum badly; the
  fit runs at every proposal until REFIT_EVERY_UNTIL points are known (this study's compiled
  configs and the related studies' points), then each time that count has grown by
  REFIT_GROWTH: with two related studies' 128 points a fit at every proposal of a 64-trial
  study made a proposal 9x dearer (148 against 16 ms median) and, beside its builds on the
  H100 machine, a study spend 35-63 s proposing;
* the GP conditions on at most GP_POINTS of the study's known configs (the fastest, the
  newest and a spread of the rest, :func:`conditioning`), so a proposal's cost does not
  grow with the study (a GP over every known config costs the cube of their number); the
  cap binds only past GP_POINTS known configs, after the searches of the recorded sweeps
  are within 2% of the optimum (docs/measurements/proposal_cost/);
* a config that reached the compiler and failed (gate, runtime) counts as measured
  ``FAILURE_PENALTY`` above the worst measured residual; running and waiting configs count
  as measured at the current mean (a constant liar: parallel builds spread out);
* the pick maximises expected improvement over the best measured log time (with nothing
  measured, that is the best estimate); ties go to the seeded random state.

Related studies (``related``, :class:`Related`: transfer from other problems, see
evotuner/transfer.py), nearest first, change two things:

* once the study knows one config (the recommended one, or the model's best, proposed
  first as without related studies: where the model is right, transfer costs nothing),
  the next proposal is the *lead*: of the LEAD_PER_STUDY fastest configs of each related
  study that are candidates here, the one the model rates best here. The winners of
  nearby problems often carry over where the model is wrong (the nearest study's best
  is often within 2% of the optimum where the model's first pick is not), and the model, choosing
  among them, knows this problem's size (a nearby problem's winner may be tiled for 4x
  the query rows). Where the model rates even the best of them more than LEAD_WITHIN_SD
  residual SDs slower than its own best, there is no lead: the sources' winners do not
  fit this problem (their tiles, its waves), and the model's error is not that large;
* the GP takes their measurements as correlated tasks: the model's residual at problem
  *s* is ``a_s g + sqrt(1 - a_s^2) h_s``, with ``g`` the residual here and ``h_s``
  independent of it (a one-factor model: two problems' residuals correlate ``a_s a_t``,
  one problem's with itself 1; ``a_s`` is the study's ``similarity``). Each study's
  residuals are centred on their own mean (its bias is its own); its compiled failures
  count as ours do.

The model's own first pick comes before the lead, not the GP's posterior mean: the model's
errors correlate strongly between problems of one head dim, but not enough to decide 2%
(docs/transfer.md has the leave-one-out figures).

The starting length scale and the residual's spread are round figures, not fitted
(scripts/sampler_benchmark.py moves little over a range of them). The search is as good
as the model's order: with a flat model it is plain GP expected improvement, with a model
that ranks the configs backwards it is worse than random search (docs/samplers.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Sequence

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from evotuner.asking import Proposer
from evotuner.config import KernelConfig
from evotuner.problem import Problem
from evotuner.space import SearchSpace
from evotuner.gpmodel import FAILURE_PENALTY, Observed, Points, Related, Tasks, conditioning, expected_improvement
from evotuner.vocabulary import REASON_ATTR, distributions, is_interrupted, param_key

#: Prior standard deviation of the residual log time (the model's error away from its bias).
SIGNAL_SD = 0.10
#: Length scale of the residual's correlation, in parameter ranges (each scaled to [0, 1]).
LENGTH_SCALE = 0.30
#: Length scales the marginal likelihood chooses among, per parameter, once FIT_AFTER configs are measured.
LENGTH_SCALES = (0.3, 1.0, 3.0)
FIT_AFTER = 3
#: The fit uses at most this many of the GP's points (the lowest residuals first).
FIT_POINTS = 200
#: The length scales are fitted again at every proposal until this many points are known (this
#: study's configs past the compiler, measured or failed, and the related studies' points), then
#: only once that count has grown by REFIT_GROWTH since the last fit: a fit factorises the
#: points' covariance some 50 times.
REFIT_EVERY_UNTIL = 64
REFIT_GROWTH = 0.1
#: The GP conditions on at most this many of this study's known configs: the GP_BEST fastest
#: measured, the GP_RECENT most recently proposed (those in flight first), and the rest spread
#: evenly over the others in proposal order. The related studies' points come on top (at most
#: evotuner.transfer's per-source limits). Every known config stays excluded from the
#: candidates, and the bias and the best measured time are taken over all of them.
GP_POINTS = 128
GP_BEST = 48
GP_RECENT = 32
#: Candidates whose posterior sd is computed at a time, in order of their EI bound (_best_gain).
SD_CHUNK = 256
#: The posterior standard deviation of candidates, by their indices.
SdOf = Callable[[np.ndarray], np.ndarray]
#: Standard deviation of one measurement's log time (run-to-run noise, ~1 %).
NOISE_SD = 0.01
#: Where an estimate of ``inf`` puts a config: this far (log) above the worst finite estimate.
INFEASIBLE_PRIOR = math.log(2.0)
#: The lead (second proposal with related studies) is chosen among this many fastest configs of each.
LEAD_PER_STUDY = 4
#: ... and proposed only when the model rates it at most this many residual standard deviations
#: (SIGNAL_SD, in log time) above its best estimate here (2: 22% slower).
LEAD_WITHIN_SD = 2.0

Estimate = Callable[[KernelConfig], float]


@dataclass(frozen=True)
class GPSettings:
    """The residual GP's fixed settings (see the constants above for what each means)."""

    signal_sd: float = SIGNAL_SD
    length_scale: float = LENGTH_SCALE
    noise_sd: float = NOISE_SD


class GuidedSampler(BaseSampler, Proposer):
    """Expected improvement over a GP on the cost model's residuals (see the module docstring).

    ``estimate(config)`` is the predicted time in µs (``math.inf``: predicted to fail the
    gate); it is called once per feasible config, on the first proposal. ``related`` (or a
    callable returning it, called then too, after the study's start is enqueued) are other
    studies' measurements, joined as correlated tasks. ``picks``: how many configs
    :meth:`propose` picks from one read of the study (one per GPU of a ``--gpus`` search: the
    GPUs then share a read and its posterior instead of queueing for one each); each pick
    after the first counts those before it as in flight.
    """

    def __init__(self, space: SearchSpace, problem: Problem, estimate: Estimate, seed: int | None, *,
                 settings: GPSettings = GPSettings(),
                 related: Sequence[Related] | Callable[[], Sequence[Related]] = (), picks: int = 1) -> None:
        self.space, self.problem, self.estimate, self.settings = space, problem, estimate, settings
        #: Proposals made from one read of the study (:meth:`propose`; one per GPU of a ``--gpus`` search).
        self.picks = max(1, int(picks))
        self._queued: list[int] = []                            # rows picked, not yet proposed
        self._related_source = related
        self.related: tuple[Related, ...] | None = None          # loaded on the first proposal
        self._rng = np.random.RandomState(seed)
        self._dists = distributions(space)
        self._keys = [param_key(p.name) for p in space.params]
        self._rows: dict[tuple[int, ...], int] | None = None   # index tuple -> candidate row
        self._index: np.ndarray | None = None                   # candidate rows' index tuples
        self._x: np.ndarray | None = None                       # candidate rows' scaled values
        self._prior: np.ndarray | None = None                   # candidate rows' log estimate
        self._tasks = Tasks.none(len(self._keys))              # the related studies' points
        self._lead: int | None = None                           # the related studies' lead (second proposal)
        self._scales: np.ndarray | None = None                  # the last fitted length scales ...
        self._scales_at = 0                                     # ... and the known count they were fitted at

    # -- Optuna's sampler interface ----------------------------------------------------------

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self._dists)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not search_space:
            return {}
        return self._row_params(self._rows_picked(study.get_trials(deepcopy=False), trial.number, 1)[0])

    def propose(self, study: optuna.Study) -> dict[str, Any] | None:
        """The next trial's parameters (evotuner.asking): the next of the picks made from the
        last read of the study while any is left, else ``picks`` new ones from one read; None
        while the study has WAITING trials (the configs enqueued to go first)."""
        if not self._queued:
            trials = study.get_trials(deepcopy=False)
            if any(t.state == TrialState.WAITING for t in trials):
                return None
            self._queued = self._rows_picked(trials, None, self.picks)
        return self._row_params(self._queued.pop(0))

    def _rows_picked(self, trials: Sequence[FrozenTrial], asking: int | None, picks: int) -> list[int]:
        """Up to ``picks`` candidate rows picked given the study's ``trials`` (trial number
        ``asking``, the one being asked, left out), each after the first counting those before
        it as in flight, as a running trial counts; fewer once every feasible config is known.
        [-1] where the space has no feasible config (:meth:`_row_params` gives index 0s)."""
        self._enumerate()
        assert self._index is not None
        if len(self._index) == 0:         # no feasible config: the loop prunes whatever comes
            return [-1]
        seen = self._observations(trials, asking)
        rows = [self._pick(seen)]
        while len(rows) < picks:
            seen.number[rows[-1]] = max(seen.number.values(), default=-1) + 1
            seen.pending.add(rows[-1])
            row = self._pick(seen)
            if row in seen.pending or row in seen.failed or row in seen.measured:
                break                     # every feasible config is known
            rows.append(row)
        return rows

    def _row_params(self, row: int) -> dict[str, Any]:
        """A candidate row's parameters (row -1: index 0 of every parameter)."""
        assert self._index is not None
        if row < 0:
            return {k: 0 for k in self._keys}
        return dict(zip(self._keys, (int(i) for i in self._index[row])))

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        low, high = param_distribution.low, param_distribution.high  # type: ignore[attr-defined]
        return int(self._rng.randint(low, high + 1))

    def reseed_rng(self) -> None:
        self._rng.seed()

    # -- the candidates ------------------------------------------------------------------------

    def _key(self, config: KernelConfig) -> tuple[int, ...] | None:
        """The config's value indices (None: not a config of this space)."""
        values = config.as_dict()
        try:
            return tuple(p.index(values[p.name]) for p in self.space.params)
        except (KeyError, ValueError):
            return None

    def _scaled(self, config: KernelConfig) -> list[float] | None:
        """The config's values scaled by the space's value ranges (None: it lacks a parameter)."""
        values = config.as_dict()
        if any(p.name not in values for p in self.space.params):
            return None
        return [(values[p.name] - min(p.values)) / (max(p.values) - min(p.values)) if len(p.values) > 1 else 0.0
                for p in self.space.params]

    def _enumerate(self) -> None:
        if self._index is not None:
            return
        index, x, prior = [], [], []
        for config in self.space.feasible(self.problem):
            index.append(self._key(config))
            x.append(self._scaled(config))
            prior.append(float(self.estimate(config)))
        self._index = np.array(index, dtype=int).reshape(len(index), len(self._keys))
        self._x = np.array(x, dtype=float).reshape(len(index), len(self._keys))
        finite = [p for p in prior if math.isfinite(p) and p > 0]
        worst = math.log(max(finite)) if finite else 0.0
        self._prior = np.array([math.log(p) if math.isfinite(p) and p > 0 else worst + INFEASIBLE_PRIOR
                                for p in prior])
        self._rows = {tuple(int(i) for i in key): row for row, key in enumerate(self._index)}
        source = self._related_source
        self.related = tuple(r for r in (source() if callable(source) else source)   # similarity 0: unrelated
                             if 0.0 < r.similarity <= 1.0)
        self._tasks = Tasks.of(self.related, self._scaled, len(self._keys))
        self._lead = self._lead_row()

    def _lead_row(self) -> int | None:
        """The lead's candidate row (see the module docstring; None: no related study, none of
        their configs is a candidate here, or the best of them is more than LEAD_WITHIN_SD
        residual SDs slower than the model's best here). Ties go to the nearer study, then the
        faster config."""
        assert self._rows is not None and self._prior is not None and self.related is not None
        rows: list[int] = []
        for study in self.related:
            taken = 0
            for config, _, _ in sorted((p for p in study.points if p[1] is not None), key=lambda p: p[1]):
                key = self._key(config)
                row = None if key is None else self._rows.get(key)
                if row is not None:
                    rows.append(row)
                    taken += 1
                    if taken == LEAD_PER_STUDY:
                        break
        if not rows:
            return None
        lead = min(rows, key=lambda r: self._prior[r])
        if self._prior[lead] - float(self._prior.min()) > LEAD_WITHIN_SD * self.settings.signal_sd:
            return None                   # the model sees why the sources' winners lose here
        return lead

    # -- the pick ------------------------------------------------------------------------------

    def _observations(self, trials: Sequence[FrozenTrial], asking: int | None) -> "Observed":
        """What the study's ``trials`` know, by candidate row (trial number ``asking``, being
        asked, left out)."""
        assert self._rows is not None
        seen = Observed()
        for t in trials:
            params = t.params or t.system_attrs.get("fixed_params") or {}
            if t.number == asking or not all(k in params for k in self._keys):
                continue
            row = self._rows.get(tuple(int(params[k]) for k in self._keys))
            if row is None:               # statically infeasible (pruned before the compiler)
                continue
            if t.state == TrialState.COMPLETE and t.value is not None and t.value > 0:
                seen.measured.setdefault(row, math.log(t.value))
            elif t.state in (TrialState.PRUNED, TrialState.FAIL):
                if is_interrupted(t.state, t.user_attrs.get(REASON_ATTR)):
                    continue
                seen.failed.add(row)
            elif t.state in (TrialState.RUNNING, TrialState.WAITING):
                seen.pending.add(row)
            else:
                continue
            seen.number[row] = min(seen.number.get(row, t.number), t.number)
        seen.failed -= set(seen.measured)
        seen.pending -= set(seen.measured) | seen.failed
        return seen

    def _pick(self, seen: "Observed") -> int:
        assert self._x is not None and self._prior is not None and self._index is not None
        measured = seen.measured
        known = set(measured) | seen.failed | seen.pending
        jitter = self._rng.uniform(0.0, 1e-9, len(self._prior))
        free = np.ones(len(self._prior), dtype=bool)
        free[list(known)] = False
        if not free.any():                # every feasible config is known: the loop's exhaustion check ends it
            return int(np.argmin(self._prior + jitter))
        if not known:
            return int(np.argmin(np.where(free, self._prior + jitter, np.inf)))
        if self._lead is not None and free[self._lead]:
            return self._lead             # the related studies' lead (see the module docstring)
        try:
            mean, sd_of = self._predict(seen, free)
        except np.linalg.LinAlgError:     # a covariance numerically singular: take the model's next best
            return int(np.argmin(np.where(free, self._prior + jitter, np.inf)))
        best = min(measured.values()) if measured else float(mean.min())
        rows = np.flatnonzero(free)
        return int(rows[self._best_gain(best, mean, sd_of, jitter[rows])])

    def _best_gain(self, best: float, mean: np.ndarray, sd_of: SdOf, jitter: np.ndarray) -> int:
        """The index of the largest expected improvement (plus ``jitter``) over the candidates
        of posterior ``mean``, the first of equals, as an argmax over all of them would give;
        their posterior sd (``sd_of(indices)``, the dear part: its cost is the GP's points
        squared per candidate) is computed only where it can matter. EI grows with the sd and no
        posterior sd exceeds the prior's, so a candidate whose EI at the prior sd is below the
        best EI found cannot win: candidates go in order of that bound, SD_CHUNK at a time,
        until the best found beats the next bound."""
        bound = expected_improvement(best, mean, np.full(len(mean), self.settings.signal_sd)) + jitter
        order = np.argsort(-bound, kind="stable")
        top, top_gain = -1, -math.inf
        for start in range(0, len(order), SD_CHUNK):
            if top >= 0 and top_gain > bound[order[start]]:
                break
            idx = np.sort(order[start:start + SD_CHUNK])
            gain = expected_improvement(best, mean[idx], sd_of(idx)) + jitter[idx]
            i = int(np.argmax(gain))                 # the first of equals within the chunk
            if gain[i] > top_gain or (gain[i] == top_gain and idx[i] < top):
                top, top_gain = int(idx[i]), float(gain[i])
        return top

    def _predict(self, seen: "Observed", free: np.ndarray) -> tuple[np.ndarray, SdOf]:
        """Posterior mean of the log time of every free candidate (rows where ``free``), and
        their standard deviation by index into those candidates, given what the study (at most
        GP_POINTS of its known configs, see :func:`conditioning`) and the related studies know."""
        assert self._x is not None and self._prior is not None
        measured, failed = seen.measured, seen.failed
        residual = {row: value - self._prior[row] for row, value in measured.items()}
        bias = float(np.mean(list(residual.values()))) if residual else 0.0
        worst = max((r - bias for r in residual.values()), default=0.0)
        rows = conditioning(seen, GP_POINTS, GP_BEST, GP_RECENT)
        y = np.array([residual[r] - bias if r in residual else (worst + FAILURE_PENALTY if r in failed else 0.0)
                      for r in rows])
        points = self._tasks.after(self._x[rows], y)
        if len(measured) + self._tasks.measured >= FIT_AFTER:
            scales = self._length_scales(points, len(measured) + len(failed) + len(self._tasks.points.y))
        else:
            scales = np.full(points.x.shape[1], self.settings.length_scale)
        mean, sd_of = self._posterior(points, scales, self._x[free])
        return self._prior[free] + bias + mean, sd_of

    def _length_scales(self, points: "Points", known: int) -> np.ndarray:
        """The length scales fitted on ``points`` (their FIT_POINTS lowest residuals), or the last
        fit's while the ``known`` count (the study's measured + failed configs and the related
        studies' points) is past REFIT_EVERY_UNTIL and has grown by less than REFIT_GROWTH since:
        the scales settle as the evidence grows, and a fit (some 50 factorisations) at every
        proposal would be most of a proposal's cost."""
        if (self._scales is None or known < REFIT_EVERY_UNTIL
                or known >= self._scales_at * (1.0 + REFIT_GROWTH)):
            best_first = np.argsort(points.y)[:FIT_POINTS]
            self._scales = self._fit_length_scales(points.subset(best_first))
            self._scales_at = known
        return self._scales

    def _fit_length_scales(self, points: "Points") -> np.ndarray:
        """Per-parameter length scales from LENGTH_SCALES by marginal likelihood (coordinate
        search, two passes; one parameter's candidate scales are factorised in one batch, from
        squared distances computed once per fit)."""
        scales = np.full(points.x.shape[1], self.settings.length_scale)
        diff2 = (points.x[:, None, :] - points.x[None, :, :]) ** 2       # (n, n, parameters)
        noise = self.settings.noise_sd ** 2 * np.eye(len(points.y))
        var = self.settings.signal_sd ** 2
        rhs = np.broadcast_to(points.y[:, None], (len(LENGTH_SCALES), len(points.y), 1))
        for _ in range(2):
            for d in range(len(scales)):
                if np.ptp(points.x[:, d]) == 0:
                    continue             # the known configs share this value: no evidence either way
                tried = np.repeat(scales[None, :], len(LENGTH_SCALES), axis=0)
                tried[:, d] = LENGTH_SCALES
                d2 = np.tensordot(1.0 / tried ** 2, diff2, axes=([1], [2]))    # (candidates, n, n)
                chol = np.linalg.cholesky(var * np.exp(-0.5 * d2) * points.correlation + noise)
                z = np.linalg.solve(chol, rhs)[..., 0]
                nll = 0.5 * (z * z).sum(axis=1) + np.log(np.diagonal(chol, axis1=1, axis2=2)).sum(axis=1)
                scales[d] = min(zip(nll.tolist(), LENGTH_SCALES))[1]
        return scales

    def _posterior(self, points: "Points", scales: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, SdOf]:
        """GP posterior mean of the residual here at the scaled configs ``x``, and their posterior
        standard deviation by index into ``x`` (computed when asked: n^2 per config)."""
        var = self.settings.signal_sd ** 2
        chol = self._cholesky(points, scales)
        # L^-1 once (n^3, n <= GP_POINTS + the related points), then products: a general solve
        # against the candidates' (n, m) block factorised L again and ran two triangular sweeps
        # over m = thousands of columns, half this proposal's cost on hopper.toml's 5064 configs.
        chol_inv = np.linalg.inv(chol)
        alpha = chol_inv.T @ (chol_inv @ points.y)
        k_cross = self._kernel(x, points.x, scales) * points.weight[None, :]

        def sd_of(idx: np.ndarray) -> np.ndarray:
            v = chol_inv @ k_cross[idx].T
            return np.sqrt(np.clip(var - (v * v).sum(axis=0), 1e-12, None))

        return k_cross @ alpha, sd_of

    def _cholesky(self, points: "Points", scales: np.ndarray) -> np.ndarray:
        """Cholesky factor of the points' covariance (kernel times task correlation, plus measurement noise)."""
        noise = self.settings.noise_sd ** 2 * np.eye(len(points.y))
        return np.linalg.cholesky(self._kernel(points.x, points.x, scales) * points.correlation + noise)

    def _kernel(self, a: np.ndarray, b: np.ndarray, scales: np.ndarray) -> np.ndarray:
        a, b = a / scales, b / scales
        d2 = np.clip((a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T, 0.0, None)
        return self.settings.signal_sd ** 2 * np.exp(-0.5 * d2)
