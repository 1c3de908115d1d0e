#!/usr/bin/env python3
"""The guided sampler's proposal cost for a study seeded from real studies, on the full space.

    python scripts/proposal_cost_seeded.py --storage sqlite:///bars.db --study g3 [--sources g2,g1,g4] \\
        [--trials 48] [--device "NVIDIA H100 80GB HBM3"] [--seed 0]
    python scripts/proposal_cost_seeded.py --shape B=4,H=64,HKV=8,S=2048,D=128 [--causal] \\
        --space OLD.toml --space search_spaces/hopper.toml [--trials 48]

The second form compares space files (e.g. a space before and after it grew a knob: ``git
show REV:search_spaces/hopper.toml > OLD.toml``) at one problem, cold: each space's feasible
configs and its proposals' cost.

scripts/proposal_cost.py replays a recorded sweep, so its space is the sweep's (hopper_grid,
645-855 configs); a study a user seeds runs on its family's full space (hopper.toml: about 5000
feasible configs at D=128), where the GP's posterior over every candidate costs more. This
script takes a study's problem and space from a database (``--study``), its related studies
as ``search`` would load them (``evotuner.transfer``: ``--sources``, default the sources the
study recorded), and asks ``--trials`` proposals of the guided sampler twice, cold and seeded,
in an in-memory Optuna study told the cost model's estimate times a fixed noise (no GPU, no
builds: the sampler's own cost). Prints per run the first proposal (it enumerates the space
and estimates every config), the median and the maximum of the rest, and the total.

One BLAS thread, as ``evotuner search`` runs (evotuner.launch), unless OPENBLAS_NUM_THREADS
is set. The database of the session that found the cost (``docs/measurements/gqa/
bars_h100_1126i/bars.db.gz``, gunzipped) holds studies g1-g4 (GQA) and w1-w2 (D=256).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import re
import statistics
import sys
import time

import numpy as np
import optuna

from evotuner.scriptargs import ArgumentParser, error_line, positive, seed


def proposals(space, problem, estimate, related, trials: int, seed: int) -> list[float]:
    """Seconds per proposal of ``trials`` guided proposals, each told its noisy estimate."""
    from evotuner.guided import GuidedSampler
    from evotuner.propose import suggest

    study = optuna.create_study(sampler=GuidedSampler(space, problem, estimate, seed, related=related))
    rng = np.random.default_rng(seed)
    seconds = []
    for _ in range(trials):
        started = time.perf_counter()
        trial = study.ask()
        config = suggest(trial, space)
        seconds.append(time.perf_counter() - started)
        us = estimate(config)
        if np.isfinite(us):
            study.tell(trial, us * (1.0 + 0.05 * rng.standard_normal()))
        else:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    return seconds


def _shape(text: str):
    """An argparse ``type=`` for ``--shape``: a :class:`~evotuner.problem.Shape` (a usage error
    names what cannot be read)."""
    from evotuner.errors import EvotunerError
    from evotuner.problem import Shape

    try:
        return Shape.parse(text)
    except EvotunerError as exc:
        raise argparse.ArgumentTypeError(re.sub(r"^(--shape|shape): ", "", str(exc))) from None


def _names(text: str) -> tuple[str, ...]:
    """An argparse ``type=`` for ``--sources``: study names, comma-separated, none empty."""
    names = tuple(name.strip() for name in text.split(","))
    if not all(names):
        raise argparse.ArgumentTypeError(f"{text!r}: an empty study name (e.g. --sources g2,g1)")
    return names


def main(argv: list[str] | None = None) -> int:
    from evotuner.errors import EvotunerError

    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--storage", help="the study database (a SQLAlchemy URL)")
    ap.add_argument("--study", help="the study whose problem and space are used")
    ap.add_argument("--shape", type=_shape,
                    help="instead of a study: this problem (B=..,H=..,[HKV=..,]S=..,D=..), cold")
    ap.add_argument("--causal", action="store_true", help="with --shape: a causal problem")
    ap.add_argument("--space", action="append", default=[], help="with --shape: a space file; repeatable")
    ap.add_argument("--sources", type=_names, default=None,
                    help="related studies, comma-separated (default: the study's recorded)")
    ap.add_argument("--device", default="NVIDIA H100 80GB HBM3", help="the GPU model the sources were measured on")
    ap.add_argument("--trials", type=positive, default=48)
    ap.add_argument("--seed", type=seed, default=0)
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.shape:
        if not args.space:
            ap.error("--shape needs one or more --space files to compare")
        if args.storage or args.study or args.sources:
            ap.error("give --storage and --study, or --shape and --space, not both")
    elif args.space or args.causal:
        ap.error("--space and --causal go with --shape (a study brings its own)")
    elif not (args.storage and args.study):
        ap.error("give --storage and --study, or --shape and --space")
    try:
        return _spaces(args) if args.shape else _study(args)
    except EvotunerError as exc:
        print(error_line(exc), file=sys.stderr)
        return 1


def _study(args: argparse.Namespace) -> int:
    """Cold and seeded proposals for ``--study``."""
    from evotuner.errors import EvotunerError
    from evotuner.family import get_family
    from evotuner.session import study_space
    from evotuner.storage import StudyStore
    from evotuner.transfer import plan_transfer, related

    with StudyStore(args.storage, read_only=True) as store:
        problem = store.study_info(args.study).problem
        space = study_space(store, args.study)
        names = args.sources or store.transfer_sources(args.study)
        missing = [name for name in names if not store.study_exists(name)]
        if missing:
            known = ", ".join(repr(info.name) for info in store.list_studies())
            raise EvotunerError(f"--sources: no study {missing[0]!r} in {store.display_url}; "
                                f"existing studies: {known}", "name studies of this database")
        plan = plan_transfer(store, args.study, problem, space, {"name": args.device}, studies=len(names), only=names)
        family = get_family(space.kernel)
        _needs_model(family, space, problem, args.study)
        seeded = related(plan.sources, family.estimate_us)
    print(f"{args.study}: {problem}, space {space.name}; related: "
          + (", ".join(f"{r.name} ({len(r.points)} points)" for r in seeded) or "none"))
    estimate = lambda config: family.estimate_us(config, problem)   # noqa: E731
    for label, rel in (("cold", ()), ("seeded", seeded)):
        ms = [1e3 * s for s in proposals(space, problem, estimate, rel, args.trials, args.seed)]
        rest = ms[1:] or ms
        print(f"  {label:6s}: first {ms[0]:.0f} ms, then median {statistics.median(rest):.1f} ms, "
              f"max {max(rest):.1f} ms; {args.trials} proposals in {sum(ms) / 1e3:.1f} s")
    return 0


def _needs_model(family, space, problem, where: str) -> None:
    """SpaceError unless ``family`` has a cost model at ``problem`` (the guided sampler needs one)."""
    from evotuner.errors import SpaceError

    if family.estimate_us(next(space.configs()), problem) is None:
        raise SpaceError(f"{where}: the guided sampler needs a cost model, and the {family.title or family.name} "
                         f"family has none for {problem}", "give a space of a family with one, e.g. "
                         "search_spaces/hopper.toml")


def _spaces(args: argparse.Namespace) -> int:
    """Cold proposals at ``--shape`` on each ``--space`` file: feasible configs and cost."""
    from evotuner.family import get_family
    from evotuner.problem import Problem
    from evotuner.space import load_space

    problem = Problem(args.shape, "fp16", args.causal)
    spaces = [load_space(path) for path in args.space]      # every file read before the first run
    for path, space in zip(args.space, spaces):
        _needs_model(get_family(space.kernel), space, problem, path)
    for path, space in zip(args.space, spaces):
        family = get_family(space.kernel)
        estimate = lambda config: family.estimate_us(config, problem)   # noqa: E731
        feasible = sum(1 for _ in space.feasible(problem))
        ms = [1e3 * s for s in proposals(space, problem, estimate, (), args.trials, args.seed)]
        rest = ms[1:] or ms
        print(f"{problem} {path}: {feasible} feasible; first {ms[0]:.0f} ms, then median "
              f"{statistics.median(rest):.1f} ms, max {max(rest):.1f} ms; {args.trials} proposals in "
              f"{sum(ms) / 1e3:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
