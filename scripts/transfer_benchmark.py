#!/usr/bin/env python3
"""Does a new study seeded from the other problems' studies find the optimum sooner? Leave-one-out on replayed sweeps.

    python scripts/transfer_benchmark.py tests/data/sweep_h100_hopper_d64.csv tests/data/sweep_h100_hopper_d128.csv \\
        tests/data/sweep_h100_hopper_d64_causal.csv tests/data/sweep_h100_hopper_d128_bf16.csv \\
        --space search_spaces/hopper_grid.toml --seeds 10 --output transfer.json

For every sweep P (the held-out problem):

1. a fresh SQLite database gets one finished study per OTHER sweep: the default
   search (``session.run_study``: the family's default sampler and recommended start,
   no transfer), ``--source-trials`` trials over that sweep's replay, seed 0 -- what a
   user who tuned those problems before would have in the database (the ten databases
   are built in parallel, one per worker);
2. for every seed, a copy of that database runs a new study of P twice through the
   real loop over P's replay: ``cold`` (``transfer=False``: the default search as
   it was) and ``transfer`` (``transfer=True``: seeded from the nearest studies);
   each run stops once its best is within 2% of P's recorded optimum.

Reported per problem: evaluations (configs compiled, as in sampler_benchmark.py)
until within 2%, median over seeds, for both, and their ratio. The issue's bar:
transfer <= 1/2 of cold on every held-out problem. A run that never gets there
within ``--max-trials`` is censored at the feasible count + 1.

``--correlations`` prints instead what transfer rests on: for every ordered pair of
sweeps of one head dim, the correlation of the cost model's log errors
(``log(measured) - log(estimate)``) over the configs both measured, and over those
within 15% of the first sweep's optimum, with the similarity evotuner.transfer assigns.
"""

from __future__ import annotations

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

from evotuner.scriptargs import ArgumentParser, error_line, output_path, positive

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


def source_db(args: tuple[list[str], str, int, str]) -> str:
    """A database (in folder) holding one finished default study per sweep of ``sweeps``."""
    import optuna

    from evotuner import session

    sweeps, space_path, trials, folder = args
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    db = Path(folder) / "sources.db"
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
    return str(db)


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
                seeded.extend(name for name, *_ in event.sources)
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


def correlations(sweeps: list[str], space_path: str) -> int:
    """The table ``--correlations`` prints (see the module docstring)."""
    import numpy as np

    from evotuner.family import get_family
    from evotuner.measure.replay import read_sweep
    from evotuner.space import load_space
    from evotuner.transfer import similarity

    space = load_space(space_path)
    family = get_family(space.kernel)
    tables = [read_sweep(s) for s in sweeps]
    errors = []
    for table in tables:
        problem = table.problem
        row = {}
        for config, r in table.rows.items():
            if r.status == "ok" and r.median_us and space.admits(config, problem):
                estimate = family.estimate_us(config, problem)
                if estimate is not None and math.isfinite(estimate) and estimate > 0:
                    row[config] = (math.log(r.median_us) - math.log(estimate), r.median_us)
        if not row:
            from evotuner.errors import EvotunerError

            raise EvotunerError(f"{table.path}: no measured config of space {space.name} that the cost model "
                                "estimates", "give sweeps of a family with a cost model, recorded with --space")
        errors.append(row)
    pairs: list[tuple[float, float, float]] = []           # (similarity, corr over all, corr near the optimum)
    print(f"{'sweep':<44}{'other':<44}{'similarity':>11}{'configs':>9}{'corr':>7}{'near opt':>9}{'corr':>7}")
    for a, (ta, ea) in enumerate(zip(tables, errors)):
        best = min(us for _, us in ea.values())
        for b, (tb, eb) in enumerate(zip(tables, errors)):
            if a == b or ta.problem.shape.head_dim != tb.problem.shape.head_dim:
                continue
            both = [c for c in ea if c in eb]
            near = [c for c in both if ea[c][1] <= 1.15 * best]
            corr = [float(np.corrcoef([ea[c][0] for c in cs], [eb[c][0] for c in cs])[0, 1]) if len(cs) > 3
                    else math.nan for cs in (both, near)]
            near_s = similarity(ta.problem, tb.problem)
            pairs.append((near_s, *corr))
            print(f"{ta.path.name:<44}{tb.path.name:<44}{near_s:>11.3f}"
                  f"{len(both):>9}{corr[0]:>7.2f}{len(near):>9}{corr[1]:>7.2f}")
    ranks = [_rank_correlation([p[0] for p in pairs if not math.isnan(p[i])], [p[i] for p in pairs if not math.isnan(p[i])])
             for i in (1, 2)]
    print(f"similarity orders the {len(pairs)} pairs' correlations with rank correlation {ranks[0]:.3f} "
          f"(all configs), {ranks[1]:.3f} (near the optimum)")
    return 0


def _rank_correlation(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation (ties ranked by their order: the similarities tie often)."""
    import numpy as np

    ranks = [np.argsort(np.argsort(np.asarray(v), kind="stable")) for v in (a, b)]
    return float(np.corrcoef(*ranks)[0, 1]) if len(a) > 2 else math.nan


def check_inputs(sweeps: list[str], space_path: str) -> None:
    """Read the space and every sweep (and check it was recorded with that space) before any
    worker starts: EvotunerError naming the first that is not."""
    for sweep in sweeps:
        with ExitStack() as stack:
            _stages(sweep, space_path, stack)


def main(argv: list[str] | None = None) -> int:
    from evotuner.errors import EvotunerError

    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweeps", nargs="+", help="sweep CSVs of one space (at least 2)")
    ap.add_argument("--space", required=True, help="the space the sweeps were recorded with: a file or a packaged "
                    "space's name, e.g. hopper_grid")
    ap.add_argument("--seeds", type=positive, default=10)
    ap.add_argument("--source-trials", type=positive, default=64, help="trials of each source study (default 64)")
    ap.add_argument("--max-trials", type=positive, default=2000, help="trials before a run counts as censored")
    ap.add_argument("--workers", type=positive, default=None)
    ap.add_argument("--output", type=output_path, default="transfer_benchmark.json",
                    help="the JSON results (default transfer_benchmark.json; checked before any run)")
    ap.add_argument("--correlations", action="store_true",
                    help="print the cost model's error correlations between the sweeps and exit")
    args = ap.parse_args(argv)
    if len(args.sweeps) < 2:
        ap.error("leave-one-out needs at least two sweeps")
    names = [Path(s).name for s in args.sweeps]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        ap.error(f"two sweeps named {twice}: the results name each held-out sweep by its file name "
                 "(give each sweep once)")
    try:
        from evotuner.session import _space_path

        args.space = str(_space_path(args.space))       # a file or a packaged space's name, as `search --space`
        check_inputs(args.sweeps, args.space)
        if args.correlations:
            return correlations(args.sweeps, args.space)
        return _benchmark(args)
    except EvotunerError as exc:
        print(error_line(exc), file=sys.stderr)
        return 1


def _benchmark(args: Any) -> int:
    """The leave-one-out runs, their table and ``--output``."""
    from evotuner.atomicfile import write_text_atomic

    results: dict[str, Any] = {"space": args.space, "seeds": args.seeds, "source_trials": args.source_trials,
                               "target": TARGET, "problems": {}}
    with tempfile.TemporaryDirectory(prefix="transfer-sources-") as tmp, \
            ProcessPoolExecutor(max_workers=args.workers) as pool:
        builds = []
        for held in args.sweeps:
            folder = Path(tmp) / f"{len(builds)}-{Path(held).stem}"
            folder.mkdir()
            builds.append(([s for s in args.sweeps if s != held], args.space, args.source_trials, str(folder)))
        dbs = list(pool.map(source_db, builds))
        jobs = [(held, args.space, db, seed, transfer, args.max_trials)
                for held, db in zip(args.sweeps, dbs) for seed in range(args.seeds) for transfer in (False, True)]
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
    write_text_atomic(args.output, json.dumps(results, indent=2))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
