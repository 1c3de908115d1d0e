#!/usr/bin/env python3
"""Does a new study seeded from the other problems' studies find the optimum sooner? Leave-one-out on replayed sweeps.

    python scripts/transfer_benchmark.py tests/data/sweep_h100_hopper_d64.csv tests/data/sweep_h100_hopper_d128.csv \\
        tests/data/sweep_h100_hopper_d64_causal.csv tests/data/sweep_h100_hopper_d128_bf16.csv \\
        --space search_spaces/hopper_grid.toml --seeds 10 --output transfer.json

For every sweep P (the held-out problem):

1. a fresh SQLite database gets one finished study per OTHER sweep: the default
   search (``session.run_study``: TPE, the family's recommended start, no transfer),
   ``--source-trials`` trials over that sweep's replay, seed 0 -- what a user who
   tuned those problems before would have in the database;
2. for every seed, a copy of that database runs a new study of P twice through the
   real loop over P's replay: ``cold`` (``transfer=False``: the default search as
   it was) and ``transfer`` (``transfer=True``: seeded from the nearest studies);
   each run stops once its best is within 2% of P's recorded optimum.

Reported per problem: evaluations (configs compiled, as in sampler_benchmark.py)
until within 2%, median over seeds, for both, and their ratio. The issue's bar:
transfer <= 1/2 of cold on every held-out problem. A run that never gets there
within ``--max-trials`` is censored at the feasible count + 1.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

TARGET = 1.02


class _Reached(BaseException):
    """Ends a run once it is within 2% (a BaseException: the loop must not record it)."""


def _stages(sweep: str, space_path: str, stack: ExitStack) -> tuple[Any, Any, Any, Any]:
    from evotuner import session
    from evotuner.measure.replay import read_sweep
    from evotuner.space import load_space

    space = load_space(space_path)
    problem = read_sweep(sweep).problem
    builder, measure = session.StageFactory(replay=Path(sweep)).stages(problem, space, 1, stack)
    return space, problem, builder, measure


def source_db(sweeps: list[str], space_path: str, trials: int, folder: Path) -> Path:
    """A database holding one finished default study per sweep of ``sweeps``."""
    from evotuner import session

    db = folder / "sources.db"
    store = session.open_store(f"sqlite:///{db}")
    try:
        for i, sweep in enumerate(sweeps):
            with ExitStack() as stack:
                space, problem, builder, measure = _stages(sweep, space_path, stack)
                name, sampler = f"src{i}_{Path(sweep).stem}", session.sampler_name(None, space)
                session.start_study(store, name, problem, space, sampler, 0, builder)
                session.run_study(store, name, problem, space, sampler, 0, trials, builder, measure, transfer=False)
    finally:
        store.close()
    return db


def one_run(args: tuple[str, str, str, int, bool, int]) -> dict[str, Any]:
    """One new study of ``sweep`` on a copy of ``db``; evaluations until within 2%."""
    import optuna

    from evotuner import events as ev
    from evotuner import session

    sweep, space_path, db, seed, transfer, max_trials = args
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="transfer-bench-") as tmp, ExitStack() as stack:
        copy = Path(tmp) / "study.db"
        shutil.copy(db, copy)
        space, problem, builder, measure = _stages(sweep, space_path, stack)
        optimum = measure.table.optimum().median_us
        store = session.open_store(f"sqlite:///{copy}")
        stack.callback(store.close)
        sampler = session.sampler_name(None, space)   # the family's default, as `evotuner search`
        session.start_study(store, "new", problem, space, sampler, seed, builder)
        evals, best, seeded = 0, math.inf, []

        def on_event(event: object) -> None:
            nonlocal evals, best
            if isinstance(event, ev.Seeded):
                seeded.extend(name for name, _, _ in event.sources)
            if not isinstance(event, ev.TrialFinished) or event.duplicate_of is not None:
                return
            if not measure.lookup(event.config).evaluated:
                return
            evals += 1
            if event.state == "COMPLETE" and event.value is not None:
                best = min(best, event.value)
            if best <= TARGET * optimum:
                raise _Reached

        started = time.perf_counter()
        reached = False
        try:
            session.run_study(store, "new", problem, space, sampler, seed, max_trials, builder, measure,
                              on_event=on_event, transfer=transfer)
        except _Reached:
            reached = True
        feasible = sum(1 for c in space.configs() if measure.lookup(c).evaluated)
    return {"sweep": Path(sweep).name, "seed": seed, "transfer": transfer, "reached": reached,
            "evals": evals if reached else feasible + 1, "seeded_from": seeded,
            "seconds": round(time.perf_counter() - started, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweeps", nargs="+", help="sweep CSVs of one space (at least 2)")
    ap.add_argument("--space", required=True, help="the space the sweeps were recorded with")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--source-trials", type=int, default=64, help="trials of each source study (default 64)")
    ap.add_argument("--max-trials", type=int, default=2000, help="trials before a run counts as censored")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--output", type=Path, default=Path("transfer_benchmark.json"))
    args = ap.parse_args(argv)
    if len(args.sweeps) < 2:
        ap.error("leave-one-out needs at least two sweeps")

    results: dict[str, Any] = {"space": args.space, "seeds": args.seeds, "source_trials": args.source_trials,
                               "target": TARGET, "problems": {}}
    with tempfile.TemporaryDirectory(prefix="transfer-sources-") as tmp:
        jobs = []
        for held in args.sweeps:
            folder = Path(tmp) / Path(held).stem
            folder.mkdir()
            db = source_db([s for s in args.sweeps if s != held], args.space, args.source_trials, folder)
            for seed in range(args.seeds):
                for transfer in (False, True):
                    jobs.append((held, args.space, str(db), seed, transfer, args.max_trials))
        with ProcessPoolExecutor(max_workers=args.workers) as pool:
            runs = list(pool.map(one_run, jobs))
    print(f"{'held-out sweep':<36}{'cold':>8}{'transfer':>10}{'ratio':>8}  seeded from")
    for held in args.sweeps:
        name = Path(held).name
        cold = [r["evals"] for r in runs if r["sweep"] == name and not r["transfer"]]
        warm = [r["evals"] for r in runs if r["sweep"] == name and r["transfer"]]
        sources = sorted({s for r in runs if r["sweep"] == name for s in r["seeded_from"]})
        row = {"cold_median": statistics.median(cold), "transfer_median": statistics.median(warm),
               "cold": cold, "transfer": warm, "seeded_from": sources}
        row["ratio"] = row["transfer_median"] / row["cold_median"]
        results["problems"][name] = row
        print(f"{name:<36}{row['cold_median']:>8.1f}{row['transfer_median']:>10.1f}{row['ratio']:>8.2f}  "
              f"{', '.join(sources)}")
    results["runs"] = runs
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
