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
                 tries: int = TRIES) -> None:
        self.base = base
        self.space = space
        self.problem = problem
        self.tries = tries
        self._rng = np.random.RandomState(seed)
        self._dists = distributions(space)
        self._keys = [param_key(p.name) for p in space.params]
        self._all = list(itertools.product(*(range(len(p.values)) for p in space.params)))
        self._feasible_cache: dict[tuple[int, ...], bool] = {}

    # -- the proposal ---------------------------------------------------------------------

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self._dists)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        seen = self._seen(study, trial)
        params: dict[str, Any] = {}
        previous = None
        for _ in range(self.tries):
            params = self._draw(study, trial)
            key = self._key(params)
            if key not in seen and self._feasible(key):
                return params
            if key == previous:   # a deterministic model (GP) repeats itself: asking again is wasted work
                break
            previous = key
        unseen = [key for key in self._all if key not in seen and self._feasible(key)]
        if not unseen:
            return params
        # The sampler keeps drawing known configs: it has converged on a region. Take the
        # unseen feasible config nearest to its last draw (index distance; ties at random),
        # a local step that keeps its guidance, not a uniform random one.
        last = self._key(params)
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

    def _key(self, params: dict[str, Any]) -> tuple[int, ...]:
        return tuple(int(params[k]) for k in self._keys)

    def _seen(self, study: optuna.Study, trial: FrozenTrial) -> set[tuple[int, ...]]:
        seen = set()
        for t in study.get_trials(deepcopy=False):
            # an enqueued (WAITING) trial holds its config in Optuna's fixed_params
            params = t.params or t.system_attrs.get("fixed_params") or {}
            if t.number == trial.number or not all(k in params for k in self._keys):
                continue
            reason = t.user_attrs.get(REASON_ATTR)
            if is_interrupted(t.state, reason):
                continue   # an interrupted run: the loop builds its config again
            seen.add(self._key(params))
        return seen

    def _feasible(self, key: tuple[int, ...]) -> bool:
        if self.problem is None:
            return True
        if key not in self._feasible_cache:
            config = KernelConfig.of({p.name: p.values[i] for p, i in zip(self.space.params, key)})
            self._feasible_cache[key] = self.space.violated(config, self.problem) is None
        return self._feasible_cache[key]
