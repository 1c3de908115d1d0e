#!/usr/bin/env python3
"""What a proposal costs as a study grows: the sampler's seconds per trial in a replayed study.

    python scripts/proposal_cost.py tests/data/sweep_h100_hopper_d64.csv \\
        --space search_spaces/hopper_grid.toml --trials 500 [--sampler guided] [--seed 0] \\
        [--ranges 0-50,100-150,400-500] [--output cost.json] [--related OTHER_SWEEP.csv ...]

One cold study (no recommended config, no transfer: the sampler alone, as
scripts/sampler_benchmark.py runs it) goes through the real search loop
(``loop.run_search``) over the sweep's replay, on a fresh SQLite file, one build at a
time. The sampler is wrapped so that every call Optuna makes to it while asking a trial
(``before_trial``, ``infer_relative_search_space``, ``sample_relative``,
``sample_independent``) is timed and charged to that trial: that sum is the trial's
*proposal* time, the sampler's own work including its reads of the study. Per range of
trial numbers (half-open, ``400-500`` = trials 400 to 499) it prints the median, mean,
p90 and maximum proposal time (wall), the median thread CPU time of the same calls (less
sensitive to other processes on a shared machine), and the median wall time per finished
trial (the whole loop: ask, replayed build and measurement, the study's writes) for context.
Every 50 trials it prints the last 50 trials' median to stderr.

The first trial of a guided study includes enumerating the space and the cost model's
estimate of every feasible config (once per sampler).

``--related OTHER.csv`` (repeatable) gives the guided sampler other problems' studies, as a
transfer from a database holding them would (``evotuner.transfer``): each sweep's 64 fastest
measured configs and up to 32 of its compiled failures, at the similarity transfer assigns.
"""

from __future__ import annotations

import os

# One BLAS thread, as scripts/sampler_benchmark.py runs its workers (and as a coordinator
# sharing its host with nvcc builds gets in practice).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import json
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import optuna
from optuna.samplers import BaseSampler

from evotuner.scriptargs import ArgumentParser, error_line, output_path, positive, seed


class TimedSampler(BaseSampler):
    """Delegates to ``inner`` and adds the wall and thread CPU seconds of every ask-time call to
    ``seconds[trial number]`` and ``cpu[trial number]``."""

    def __init__(self, inner: BaseSampler) -> None:
        self.inner = inner
        self.seconds: dict[int, float] = {}
        self.cpu: dict[int, float] = {}

    def _timed(self, number: int, call: Any, *args: Any) -> Any:
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            return call(*args)
        finally:
            self.seconds[number] = self.seconds.get(number, 0.0) + time.perf_counter() - started
            self.cpu[number] = self.cpu.get(number, 0.0) + time.thread_time() - cpu

    def before_trial(self, study, trial):  # type: ignore[no-untyped-def]
        return self._timed(trial.number, self.inner.before_trial, study, trial)

    def infer_relative_search_space(self, study, trial):  # type: ignore[no-untyped-def]
        return self._timed(trial.number, self.inner.infer_relative_search_space, study, trial)

    def sample_relative(self, study, trial, search_space):  # type: ignore[no-untyped-def]
        return self._timed(trial.number, self.inner.sample_relative, study, trial, search_space)

    def sample_independent(self, study, trial, param_name, param_distribution):  # type: ignore[no-untyped-def]
        return self._timed(trial.number, self.inner.sample_independent, study, trial, param_name,
                           param_distribution)

    def after_trial(self, study, trial, state, values):  # type: ignore[no-untyped-def]
        self.inner.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.inner.reseed_rng()


def parse_ranges(text: str) -> list[tuple[int, int]]:
    """``0-50,100-150`` -> [(0, 50), (100, 150)] (half-open ranges of trial numbers); an argparse
    ``type=``: a bad range is a usage error."""
    import argparse

    out = []
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        try:
            lo, hi = int(low), int(high)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not LOW-HIGH (e.g. 400-500)") from None
        if not 0 <= lo < hi:
            raise argparse.ArgumentTypeError(f"{part!r} is empty (LOW must be below HIGH, e.g. 400-500)")
        out.append((lo, hi))
    return out


def related_study(sweep: Path, target: Any) -> Any:
    """Sweep ``sweep`` as a related study of problem ``target``: its 64 fastest measured configs
    and up to 32 compiled failures (what a finished 64-trial study of it would hand over)."""
    from evotuner.family import get_family
    from evotuner.gpmodel import Related
    from evotuner.measure.replay import read_sweep
    from evotuner.transfer import similarity

    table = read_sweep(sweep)
    family = get_family("hopper")
    ok = sorted((r for r in table.rows.values() if r.status == "ok"), key=lambda r: r.median_us)[:64]
    failed = [r for r in table.rows.values() if r.status != "ok" and r.compiled][:32]
    points = tuple((r.config, r.median_us if r.status == "ok" else None, family.estimate_us(r.config, table.problem))
                   for r in ok + failed)
    return Related(sweep.stem, similarity(target, table.problem), points)


def _check_related(path: Path, space: Any) -> None:
    """EvotunerError naming ``--related path`` unless it is a readable sweep of ``space``."""
    from evotuner.errors import EvotunerError
    from evotuner.measure.replay import read_sweep

    try:
        table = read_sweep(path)
    except EvotunerError as exc:
        raise EvotunerError("--related " + exc.message.removeprefix("--replay "), exc.remedy) from None
    if table.header.get("space_fingerprint") != space.fingerprint():
        raise EvotunerError(f"--related {path}: recorded with space {table.header.get('space_name', '?')}, "
                            f"not {space.name}", "give related sweeps of the sweep's --space")


def run(sweep: Path, space_path: str | None, sampler_name: str, seed: int,
        trials: int, related: tuple[Path, ...] = ()) -> tuple[TimedSampler, dict[int, float]]:
    """One replayed study; returns the timed sampler and {trial number: finished at (s)}."""
    from evotuner import events as ev
    from evotuner import session
    from evotuner.loop import run_search
    from evotuner.measure.replay import ReplayMeasure, read_sweep
    from evotuner.propose import make_sampler
    from evotuner.space import load_space

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_space(session._space_path(space_path) if space_path is not None else None)   # a file or a name
    problem = read_sweep(sweep).problem
    ReplayMeasure(sweep, problem, space)        # refuses a sweep of another space before the sampler is made
    for path in related:
        _check_related(path, space)
    others = tuple(related_study(path, problem) for path in related)
    sampler = TimedSampler(make_sampler(sampler_name, space, seed, problem, related=others))
    finished: dict[int, float] = {}
    started = time.perf_counter()

    def on_event(event: object) -> None:
        if isinstance(event, ev.TrialFinished):
            finished[event.number] = time.perf_counter() - started
            if len(finished) % 50 == 0:
                last = [sampler.seconds[n] for n in range(event.number - 49, event.number + 1) if n in sampler.seconds]
                if last:
                    print(f"  {len(finished)} trials, {finished[event.number]:.0f} s: median proposal of the last 50 "
                          f"{1e3 * statistics.median(last):.1f} ms", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="proposal-cost-") as tmp, ExitStack() as stack:
        store = session.open_store(f"sqlite:///{Path(tmp) / 'study.db'}")
        stack.callback(store.close)
        builder, measure = session.StageFactory(replay=sweep).stages(problem, space, 1, stack)
        session.start_study(store, "cost", problem, space, sampler_name, seed, builder)
        run_search(store=store, study_name="cost", problem=problem, space=space, sampler=sampler, seed=seed,
                   trials=trials, builder=builder, measure=measure, on_event=on_event, batch=1)
    return sampler, finished


def summarize(sampler: TimedSampler, finished: dict[int, float], lo: int, hi: int) -> dict[str, Any]:
    costs = [sampler.seconds[n] for n in range(lo, hi) if n in sampler.seconds]
    cpu = [sampler.cpu[n] for n in range(lo, hi) if n in sampler.cpu]
    walls = [finished[n] - finished[n - 1] for n in range(max(lo, 1), hi) if n in finished and n - 1 in finished]
    if not costs:
        return {"range": f"{lo}-{hi}", "trials": 0}
    ordered = sorted(costs)
    return {"range": f"{lo}-{hi}", "trials": len(costs),
            "median_ms": 1e3 * statistics.median(costs), "mean_ms": 1e3 * statistics.fmean(costs),
            "p90_ms": 1e3 * ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
            "max_ms": 1e3 * ordered[-1], "cpu_median_ms": 1e3 * statistics.median(cpu),
            "trial_wall_median_ms": 1e3 * statistics.median(walls) if walls else None}


def main(argv: list[str] | None = None) -> int:
    from evotuner.errors import EvotunerError
    from evotuner.propose import SAMPLERS

    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep", type=Path, help="a recorded sweep CSV (scripts/sweep.py)")
    ap.add_argument("--space", default=None, help="the space the sweep was made with: a file or a packaged space's "
                    "name, e.g. hopper_grid (default: the packaged default)")
    ap.add_argument("--sampler", default="guided", choices=tuple(SAMPLERS))
    ap.add_argument("--seed", type=seed, default=0)
    ap.add_argument("--trials", type=positive, default=500)
    ap.add_argument("--ranges", type=parse_ranges, default="0-50,100-150,400-500",
                    help="trial-number ranges, half-open")
    ap.add_argument("--output", type=output_path, default=None,
                    help="also write the figures as JSON here (checked before the study)")
    ap.add_argument("--related", type=Path, action="append", default=[],
                    help="another problem's sweep, as a related study (guided; repeatable)")
    args = ap.parse_args(argv)
    ranges = args.ranges

    started = time.perf_counter()
    try:
        sampler, finished = run(args.sweep, args.space, args.sampler, args.seed, args.trials, tuple(args.related))
    except EvotunerError as exc:
        print(error_line(exc), file=sys.stderr)
        return 1
    wall = time.perf_counter() - started
    rows = [summarize(sampler, finished, lo, hi) for lo, hi in ranges]
    with_related = f", {len(args.related)} related studies" if args.related else ""
    print(f"{args.sweep.name}, {args.sampler}, seed {args.seed}{with_related}: {len(finished)} trials in {wall:.0f} s")
    print("| trials | n | proposal median ms | mean | p90 | max | CPU median ms | trial wall median ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if not r["trials"]:
            print(f"| {r['range']} | 0 | - | - | - | - | - | - |")
            continue
        tw = "-" if r["trial_wall_median_ms"] is None else f"{r['trial_wall_median_ms']:.0f}"
        print(f"| {r['range']} | {r['trials']} | {r['median_ms']:.1f} | {r['mean_ms']:.1f} | {r['p90_ms']:.1f} "
              f"| {r['max_ms']:.1f} | {r['cpu_median_ms']:.1f} | {tw} |")
    if args.output is not None:
        from evotuner.atomicfile import write_text_atomic

        text = json.dumps({"sweep": str(args.sweep), "space": args.space, "sampler": args.sampler,
                           "related": [str(p) for p in args.related],
                           "seed": args.seed, "trials": len(finished), "wall_s": wall, "ranges": rows,
                           "per_trial_ms": {n: 1e3 * s for n, s in sorted(sampler.seconds.items())},
                           "per_trial_cpu_ms": {n: 1e3 * s for n, s in sorted(sampler.cpu.items())}}, indent=1)
        try:
            write_text_atomic(args.output, text)
        except EvotunerError as exc:
            print(error_line(exc), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
