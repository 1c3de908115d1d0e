"""The proposal stage: Optuna samplers over a SearchSpace.

Representation (the same for every sampler, so a study's distributions never
change between runs or resumes): each parameter is an Optuna integer
``<NAME>_index`` in ``0 .. len(values) - 1``, the index into the parameter's
ascending value list. Indices keep the values' order, which TPE and CMA-ES
exploit (a middle value lies between its neighbours), and they
let CMA-ES -- which has no categorical support -- search every parameter
instead of falling back to random sampling. The trade-off: Optuna's own
dashboards show indices; ``config_from_params`` maps them back and evotuner's
records store the config itself. An index means the same value only under the
same space, which the study's space fingerprint guarantees on resume.

Several trials may be asked before any is told (builds run in parallel), so
the model-based samplers are set up for pending trials: TPE with
``constant_liar``; NSGA-II and CMA-ES draw a whole generation from one
population or distribution, so pending members are expected; random and grid
do not model. GP (listed only where Optuna's GPSampler and its torch/scipy
dependencies exist) conditions on running trials itself (Optuna 5's GPSampler
reads them in ``sample_relative``); ``guided`` counts them as measured at its
current mean (a constant liar).
"""

from __future__ import annotations

import importlib.util
import warnings
from typing import Any

import optuna

from evotuner.config import KernelConfig
from evotuner.errors import SpaceError
from evotuner.problem import Problem
from evotuner.family import get_family
from evotuner.fresh import FreshSampler, MaskedTPESampler
from evotuner.guided import GuidedSampler
from evotuner.space import SearchSpace
from evotuner.vocabulary import (  # noqa: F401 (the encoding's names, re-exported)
    INDEX_SUFFIX,
    config_from_params,
    distributions,
    param_key,
    params_for,
)

_BASE_SAMPLERS = ("tpe", "nsga2", "cmaes", "random", "grid", "tpe-masked", "guided")
#: Samplers that need the problem and the family's cost model (KernelFamily.estimate_us); they
#: also take other studies' measurements as prior knowledge (transfer, evotuner/transfer.py).
MODEL_SAMPLERS = ("guided",)


def _has_gp() -> bool:
    return hasattr(optuna.samplers, "GPSampler") and all(
        importlib.util.find_spec(m) is not None for m in ("torch", "scipy")
    )


#: Sampler names ``make_sampler`` accepts ("gp" only where Optuna's GPSampler can run).
SAMPLERS: tuple[str, ...] = _BASE_SAMPLERS + (("gp",) if _has_gp() else ())

def startup_trials(space: SearchSpace) -> int:
    """Random trials before TPE/GP/CMA-ES model the space: about a tenth of it, 8..24."""
    return max(8, min(24, space.size // 10))


#: Samplers proposed through :class:`evotuner.fresh.FreshSampler` (new, feasible configs only).
#: Chosen by scripts/sampler_benchmark.py on the H100 sweeps (docs/samplers.md): it makes
#: random search draw without replacement and keeps GP from stalling on repeats, but costs
#: TPE evaluations (median evaluations to 2% of the optimum, 50 seeds: 14.5 wrapped vs 12 plain
#: at D=64, 15 vs 9.5 at D=128): TPE's repeats are free (copied, never rebuilt) and steer it.
#: ``tpe-masked`` (TPE screening its own candidates, always wrapped) is the other way to
#: keep TPE on feasible configs; it lost to plain TPE on FlashCore too (15-23.5 and 12-15
#: evaluations, 30 seeds) and on the Hopper family, where ``guided`` (evotuner/guided.py:
#: the family's cost model as the prior, new feasible configs only) needs far fewer
#: evaluations (docs/samplers.md).
FRESH_SAMPLERS = ("random", "gp")
#: tpe-masked: candidates TPE draws per proposal before the screen (Optuna's default is 24),
#: enough that one survives when 4 in 5 break a constraint (hopper_grid.toml) ...
MASKED_EI_CANDIDATES = 64
#: ... and its random startup trials: each one is an evaluation here, where plain TPE's
#: startup trials are mostly statically pruned (about 5 of its 24 are built on the Hopper
#: grid). 10 beat 24 in a 6-seed pilot (20 vs 23.5 evaluations at D=64, 57 vs 112 at D=128 bf16).
MASKED_STARTUP = 10


def make_sampler(name: str, space: SearchSpace, seed: int | None, problem: Problem | None = None,
                 *, fresh: bool = True, related: Any = (), picks: int = 1) -> optuna.samplers.BaseSampler:
    """An Optuna sampler over ``space``'s index representation; ``seed`` makes it reproducible.

    With ``fresh`` (the default) random, GP and tpe-masked propose only configs new to
    the study and, given ``problem``, statically feasible (see :mod:`evotuner.fresh`;
    tpe-masked also screens TPE's candidates before its acquisition picks one);
    ``fresh=False`` gives the samplers without the wrapper. ``related`` (other studies'
    measurements, or a callable returning them: :class:`evotuner.guided.Related`) is
    taken by the samplers of :data:`MODEL_SAMPLERS` and ignored by the rest; so is ``picks``,
    the configs proposed from one read of the study (:class:`evotuner.guided.GuidedSampler`).
    """
    if name == "guided":
        return _guided_sampler(space, seed, problem, related, picks)
    if name == "tpe-masked":
        masked = MaskedTPESampler(space, problem, seed=seed, n_startup_trials=MASKED_STARTUP, multivariate=True,
                                  constant_liar=True, n_ei_candidates=MASKED_EI_CANDIDATES)
        return FreshSampler(masked, space, problem, seed) if fresh else masked
    base = _base_sampler(name, space, seed)
    if fresh and name in FRESH_SAMPLERS:
        return FreshSampler(base, space, problem, seed)
    return base


def _guided_sampler(space: SearchSpace, seed: int | None, problem: Problem | None, related: Any,
                    picks: int = 1) -> GuidedSampler:
    family = get_family(space.kernel)
    if problem is None:
        raise SpaceError("sampler 'guided' needs the problem (its cost model predicts a config's time at a shape)",
                         "give the search a --shape, or pick another --sampler")
    probe = next(space.configs())   # any config says whether the family has a model here (no scan)
    if family.estimate_us(probe, problem) is None:
        raise SpaceError(f"sampler 'guided' needs a cost model, and the {family.title or family.name} family has none"
                         f" for {problem}", "pick another --sampler (tpe, tpe-masked)")
    return GuidedSampler(space, problem, lambda config: family.estimate_us(config, problem), seed, related=related,
                         picks=picks)


def _base_sampler(name: str, space: SearchSpace, seed: int | None) -> optuna.samplers.BaseSampler:
    n_startup = startup_trials(space)
    with warnings.catch_warnings():
        # multivariate/constant_liar/GP are marked experimental; evotuner uses them on purpose.
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if name == "tpe":
            return optuna.samplers.TPESampler(
                seed=seed, n_startup_trials=n_startup, multivariate=True, constant_liar=True,
            )
        if name == "nsga2":
            # Single-objective NSGA-II is a genetic algorithm: a population a few
            # times smaller than the feasible space keeps several generations affordable.
            population = max(8, min(32, space.size // 8))
            return optuna.samplers.NSGAIISampler(seed=seed, population_size=population)
        if name == "cmaes":
            if importlib.util.find_spec("cmaes") is None:
                raise SpaceError("sampler 'cmaes' needs the cmaes package, which is not installed",
                                 "pip install cmaes, or pick another --sampler")
            return optuna.samplers.CmaEsSampler(
                seed=seed, n_startup_trials=n_startup, with_margin=True,
                independent_sampler=optuna.samplers.RandomSampler(seed=seed),
            )
        if name == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        if name == "grid":
            grid = {param_key(p.name): list(range(len(p.values))) for p in space.params}
            return GridSweepSampler(grid, seed=seed)
        if name == "gp" and "gp" in SAMPLERS:
            return optuna.samplers.GPSampler(seed=seed, n_startup_trials=n_startup)
    if name == "gp":
        missing = [m for m in ("scipy", "torch") if importlib.util.find_spec(m) is None]
        if not hasattr(optuna.samplers, "GPSampler"):
            raise SpaceError(f"sampler gp needs Optuna's GPSampler (optuna {optuna.__version__} has none)",
                             "pip install -U 'optuna>=3.6'")
        raise SpaceError(f"sampler gp needs {' and '.join(missing)}, which is not installed",
                         f"pip install {' '.join(missing)} (or pip install -e '.[gp]' in the checkout)")
    raise SpaceError(f"unknown sampler {name!r}", f"use one of {', '.join(SAMPLERS)}")


class GridSweepSampler(optuna.samplers.GridSampler):
    """Optuna's GridSampler for ask/tell studies.

    GridSampler calls ``study.stop()`` once the last grid point is told, which
    raises RuntimeError outside ``study.optimize``; evotuner drives studies by
    ask/tell, so this sampler never stops the study itself: the loop stops once
    every feasible config is known (or ``exhausted`` says the grid is covered).
    After exhaustion Optuna re-proposes visited points.
    """

    def after_trial(self, study, trial, state, values) -> None:  # noqa: D102 - see the class docstring
        return None


def exhausted(study: optuna.Study) -> bool:
    """True once a grid study has proposed every point (never for the other samplers)."""
    sampler = study.sampler
    return isinstance(sampler, optuna.samplers.GridSampler) and sampler.is_exhausted(study)


def suggest(trial: optuna.trial.BaseTrial, space: SearchSpace) -> KernelConfig:
    """Ask ``trial`` for one config of ``space`` (parameters in file order)."""
    values = {}
    for p in space.params:
        index = trial.suggest_int(param_key(p.name), 0, len(p.values) - 1)
        values[p.name] = p.values[index]
    return KernelConfig.of(values)
