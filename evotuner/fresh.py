"""FreshSampler: a sampler wrapper that proposes configs new to the study and
statically feasible for its problem.

Why: a study counts every finished trial against ``--trials``, and a repeat
(finished with a copy of the earlier result) or a statically pruned config
(finished without a compile) teaches the study nothing new. Random search
wrapped so is random search without replacement over the feasible configs; GP,
whose acquisition is deterministic, otherwise stalls proposing one known config
(19 and 25 of 50 benchmark runs stalled). TPE is better left unwrapped (see
``evotuner.propose.FRESH_SAMPLERS`` for the measurement).

How: every proposal is made as one relative sample over the whole index space
(``evotuner.propose.distributions``). The wrapped sampler draws it (its own
``sample_relative`` where it models the space, ``sample_independent`` for the
rest, so TPE's startup draws stay random); a draw whose config is already in the
study (finished, running or waiting) or breaks a static constraint of the
space is drawn again, up to ``tries`` times; then the unseen feasible config
nearest to the last draw is taken. When none is left the last draw is returned and
the loop's exhaustion check ends the search.

Only samplers whose relative draw is a pure function of the study and their
random state can be wrapped (TPE, random, GP); NSGA-II and CMA-ES keep
generation state across draws and grid walks its own list.

:class:`MaskedTPESampler` (the ``tpe-masked`` sampler, wrapped) goes one step further
for TPE: it screens TPE's own candidates before its acquisition picks one, so on a
space most of whose configs break a constraint it still proposes a feasible new config
almost every time; :class:`Novelty` is the seen/feasible bookkeeping both share.
"""

from __future__ import annotations

import itertools
from typing import Any, Sequence

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from evotuner.config import KernelConfig
from evotuner.problem import Problem
from evotuner.space import SearchSpace
from evotuner.vocabulary import REASON_ATTR, distributions, is_interrupted, param_key

#: Draws from the wrapped sampler before falling back to a uniform unseen config.
TRIES = 16


class FreshSampler(BaseSampler):
    def __init__(self, base: BaseSampler, space: SearchSpace, problem: Problem | None, seed: int | None,
                 tries: int = TRIES, *, repeats: bool = False) -> None:
        self.base = base
        self.space = space
        self.problem = problem
        self.tries = tries
        self.repeats = repeats       # True: screen static constraints only; a known config may come again
        self._rng = np.random.RandomState(seed)
        self._dists = distributions(space)
        self._novelty = Novelty(space, problem)
        self._keys = self._novelty.keys
        self._all = list(itertools.product(*(range(len(p.values)) for p in space.params)))

    # -- the proposal ---------------------------------------------------------------------

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self._dists)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        seen = set() if self.repeats else self._novelty.seen(study, trial)
        params: dict[str, Any] = {}
        previous = None
        for _ in range(self.tries):
            params = self._draw(study, trial)
            key = self._novelty.key(params)
            if key not in seen and self._novelty.feasible(key):
                return params
            if key == previous:   # a deterministic model (GP) repeats itself: asking again is wasted work
                break
            previous = key
        unseen = [key for key in self._all if key not in seen and self._novelty.feasible(key)]
        if not unseen:
            return params
        # The sampler keeps drawing known configs: it has converged on a region. Take the
        # unseen feasible config nearest to its last draw (index distance; ties at random),
        # a local step that keeps its guidance, not a uniform random one.
        last = self._novelty.key(params)
        distance = [sum(abs(a - b) for a, b in zip(key, last)) for key in unseen]
        nearest = [key for key, d in zip(unseen, distance) if d == min(distance)]
        pick = nearest[self._rng.randint(len(nearest))]
        return dict(zip(self._keys, pick))

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self.base.sample_independent(study, trial, param_name, param_distribution)

    # -- delegation ---------------------------------------------------------------------------

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.base.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self.base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.base.reseed_rng()
        self._rng.seed()

    # -- helpers ------------------------------------------------------------------------------

    def _draw(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, Any]:
        base_space = self.base.infer_relative_search_space(study, trial)
        params = dict(self.base.sample_relative(study, trial, base_space)) if base_space else {}
        for key in self._keys:
            if key not in params:
                params[key] = self.base.sample_independent(study, trial, key, self._dists[key])
        return params


class Novelty:
    """Which index tuples (one index per parameter of ``space``) a study already holds, and
    which are statically feasible for ``problem`` (all of them when ``problem`` is None)."""

    def __init__(self, space: SearchSpace, problem: Problem | None) -> None:
        self.space = space
        self.problem = problem
        self.keys = [param_key(p.name) for p in space.params]
        self._feasible_cache: dict[tuple[int, ...], bool] = {}

    def key(self, params: dict[str, Any]) -> tuple[int, ...]:
        return tuple(int(params[k]) for k in self.keys)

    def seen(self, study: optuna.Study, trial: FrozenTrial) -> set[tuple[int, ...]]:
        """The configs of the study's trials other than ``trial``: finished, running or
        waiting (an enqueued trial holds its config in Optuna's fixed_params); interrupted
        ones do not count (the loop builds their config again)."""
        seen = set()
        for t in study.get_trials(deepcopy=False):
            params = t.params or t.system_attrs.get("fixed_params") or {}
            if t.number == trial.number or not all(k in params for k in self.keys):
                continue
            if is_interrupted(t.state, t.user_attrs.get(REASON_ATTR)):
                continue
            seen.add(self.key(params))
        return seen

    def feasible(self, key: tuple[int, ...]) -> bool:
        if self.problem is None:
            return True
        if key not in self._feasible_cache:
            config = KernelConfig.of({p.name: p.values[i] for p, i in zip(self.space.params, key)})
            self._feasible_cache[key] = self.space.violated(config, self.problem) is None
        return self._feasible_cache[key]


class MaskedTPESampler(optuna.samplers.TPESampler):
    """TPE whose candidates are screened before its acquisition picks one.

    Why: on a space whose knobs interact through static constraints (the Hopper family's
    register split: the producer's and the consumers' register counts times the number of
    consumer warpgroups must fit the register pool), most of TPE's candidates break one
    (4 in 5 configs of hopper_grid.toml do), and plain TPE spends most of a study's
    ``--trials`` on statically pruned proposals.

    How: TPE draws ``n_ei_candidates`` from its model of the good trials and keeps the one
    with the best likelihood ratio; here a candidate that breaks a static constraint of the
    problem or is already in the study scores minus infinity. With enough candidates one
    almost always survives; when none does TPE returns an arbitrary one and the
    :class:`FreshSampler` around this sampler (:func:`evotuner.propose.make_sampler`)
    replaces it. Startup draws are TPE's own (independent random); the wrapper screens those.
    ``repeats=True`` screens static constraints only (a known config keeps its score).

    Overrides ``TPESampler._sample`` and ``_compute_acquisition_func``: private methods of
    Optuna's TPE (stable from 3.x to 5.0); tests/test_fresh.py pins the behaviour.
    """

    def __init__(self, space: SearchSpace, problem: Problem | None, *, repeats: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.repeats = repeats       # True: screen static constraints only (known configs keep their score)
        self._novelty = Novelty(space, problem)
        self._single = {param_key(p.name) for p in space.params if len(p.values) == 1}
        self._seen_now: set[tuple[int, ...]] = set()

    def _sample(self, study: optuna.Study, trial: FrozenTrial,
                search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        self._seen_now = set() if self.repeats else self._novelty.seen(study, trial)
        return super()._sample(study, trial, search_space)

    def _compute_acquisition_func(self, samples: dict[str, np.ndarray], mpe_below: Any, mpe_above: Any) -> np.ndarray:
        values = np.asarray(super()._compute_acquisition_func(samples, mpe_below, mpe_above), dtype=float)
        keys = self._novelty.keys
        if any(k not in samples and k not in self._single for k in keys):
            return values            # a partial space (e.g. a grouped draw): nothing to screen
        columns = [np.rint(samples[k]).astype(int) if k in samples else np.zeros(len(values), dtype=int)
                   for k in keys]
        for i, key in enumerate(zip(*(c.tolist() for c in columns))):
            if key in self._seen_now or not self._novelty.feasible(key):
                values[i] = -np.inf
        return values
