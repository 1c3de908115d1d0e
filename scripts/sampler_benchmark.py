#!/usr/bin/env python3
"""Which sampler finds the optimum in the fewest evaluations? Measured on replayed sweeps.

    python scripts/sampler_benchmark.py tests/data/sweep_h100_d64.csv tests/data/sweep_h100_d128.csv \\
        --seeds 50 --output-dir bench/          # table on stdout, samplers.png, samplers.json, samplers.md

For every sweep, sampler and seed the real search loop runs (``evotuner.loop``,
wired by ``evotuner.session`` as ``evotuner search --replay SWEEP`` wires it) on a
study in a temporary SQLite file: ``ReplayMeasure`` and its builder answer the
builds and measurements from the sweep, so the loop's own rules apply:

* a config already finished in the study is told again with its earlier result
  and costs nothing (``duplicate_of``);
* a config a static constraint rejects is told PRUNED and costs nothing (the
  loop never compiles it);
* every other config costs ONE EVALUATION -- a compile plus, when the ptxas gate
  passes, a GPU measurement -- and is told what the sweep recorded (COMPLETE
  with the median µs, PRUNED by the gate, FAIL).

The loop's events (``TrialFinished`` without ``duplicate_of``, for a config the
sweep compiled) are the evaluations. ``name+start`` runs ``session.run_study``,
the CLI's search with its warm start (the family's recommended configs first);
every other spec runs ``run_search`` with :func:`build_sampler`'s sampler and no
warm start.

So "evaluations" counts distinct configs that reach the build stage, and the
space's size for the budgets is the number of such configs (the statically
feasible ones). ``--batch B`` is the loop's build batch (B builds in flight, as
with ``--jobs B``; default 1: one at a time).

Reported per sweep and sampler, over the seeds (plus a ``random-exact`` row:
random search without replacement computed exactly, the baseline the issue's
"1/3 of random search's median evaluations" is measured against):

* evaluations until the best latency found is within 2% of the sweep's optimum
  (median and p90). A run that never gets there is *censored* and counts as the
  number of feasible configs + 1: the loop ended it (``stalled``: too many
  proposals of known configs in a row, a sampler stuck on its favourite;
  ``exhausted``) or it reached 20 trials per config of the space;
* the P-score at budgets of 10%, 25% and 50% of the feasible configs, after the
  autotuning-methodology paper (Willemsen et al. 2024): mean over seeds of
  ``(E_random[b] - best[b]) / (E_random[b] - optimum)``, where E_random[b] is
  the exact expected best of b configs drawn without replacement (configs with
  no latency count as the worst latency): 0 = as good as random search, 1 =
  the optimum. Before a run finds any latency its best is the worst latency.
"""

from __future__ import annotations

import os

# One BLAS thread per process: the benchmark runs one replayed search per worker process,
# and the guided sampler's small matrix algebra in every worker at once on a shared
# thread pool each ran 7x slower (2 workers, 2 cores).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import json
import math
import statistics
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import optuna

from evotuner.scriptargs import ArgumentParser, output_folder, positive

TARGET = 1.02
BUDGETS = (0.10, 0.25, 0.50)


@dataclass(frozen=True)
class Run:
    sweep: str
    sampler: str
    seed: int
    evals_to_target: int | None     # None: censored
    best_at_budget: tuple[float, ...]
    evals: int
    asks: int
    seconds: float
    trace: tuple[float, ...]        # best-so-far latency after each evaluation (inf before any)


# --------------------------------------------------------------------------- samplers


def build_sampler(spec: str, space: Any, seed: int, problem: Any = None) -> optuna.samplers.BaseSampler:
    """``name`` is ``make_sampler(name, problem=...)`` as the loop uses it; ``name:plain`` is the
    same sampler without evotuner.fresh's wrapper; ``tpe:startup=N``, ``tpe:univariate``,
    ``tpe:ei=N``, ``tpe:fresh`` (wrapped), ``tpe:masked`` (evotuner.fresh.MaskedTPESampler,
    wrapped; ``/repeats``: both screen static constraints only, known configs may come again), ``nsga2:pop=N``, ``cmaes:startup=N`` are variants with settings changed
    (several joined by ``/``: ``tpe:masked/startup=8``)."""
    from evotuner.fresh import FreshSampler, MaskedTPESampler
    from evotuner.propose import make_sampler, startup_trials

    name, _, opts = spec.partition(":")
    if not opts:
        return make_sampler(name, space, seed, problem)
    if opts == "plain":
        return make_sampler(name, space, seed, problem, fresh=False)
    settings = dict(o.partition("=")[::2] for o in opts.split("/"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if name == "tpe":
            common = dict(seed=seed, n_startup_trials=int(settings.get("startup", startup_trials(space))),
                          multivariate="univariate" not in settings, constant_liar=True)
            if "masked" in settings:
                repeats = "repeats" in settings
                masked = MaskedTPESampler(space, problem, n_ei_candidates=int(settings.get("ei", 64)),
                                          repeats=repeats, **common)
                return FreshSampler(masked, space, problem, seed, repeats=repeats)
            tpe = optuna.samplers.TPESampler(n_ei_candidates=int(settings.get("ei", 24)), **common)
            return FreshSampler(tpe, space, problem, seed) if "fresh" in settings else tpe
        if name == "nsga2":
            return optuna.samplers.NSGAIISampler(seed=seed, population_size=int(settings["pop"]))
        if name == "cmaes":
            return optuna.samplers.CmaEsSampler(
                seed=seed, n_startup_trials=int(settings["startup"]), with_margin=True,
                independent_sampler=optuna.samplers.RandomSampler(seed=seed),
            )
    raise SystemExit(f"unknown sampler variant {spec!r}")


_SETTINGS = {"tpe": {"startup": int, "ei": int, "univariate": None, "fresh": None, "masked": None, "repeats": None},
             "nsga2": {"pop": int}, "cmaes": {"startup": int}}
_REQUIRED = {"nsga2": "pop", "cmaes": "startup"}


def spec_problem(spec: str, samplers: tuple[str, ...]) -> str | None:
    """Why ``spec`` is not a sampler spec :func:`simulate` runs (None when it is)."""
    sampler_spec, plus, warm = spec.partition("+")
    name, colon, opts = sampler_spec.partition(":")
    if name not in samplers:
        return f"{spec!r}: unknown sampler {name!r} (one of {', '.join(samplers)})"
    if plus and (warm != "start" or colon):
        return f"{spec!r}: the only warm start is NAME+start, on a plain sampler name"
    if not colon or opts == "plain":
        return None
    known = _SETTINGS.get(name)
    if known is None:
        return f"{spec!r}: {name} has no variants but {name}:plain"
    settings = dict(o.partition("=")[::2] for o in opts.split("/"))
    for key, value in settings.items():
        if key not in known:
            return f"{spec!r}: {name} has no setting {key!r} (its settings: {', '.join(known)})"
        if known[key] is int and not (value.isdigit() and int(value) >= 1):
            return f"{spec!r}: {name}:{key}= needs a positive integer"
    if name in _REQUIRED and _REQUIRED[name] not in settings:
        return f"{spec!r}: {name}:{_REQUIRED[name]}=N is required"
    return None


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{value} must be a fraction of the feasible configs, in (0, 1]")
    return value


def _replay_error(exc: Exception) -> str:
    """A library error as this script's one line (the replay's errors name the CLI's --replay)."""
    text = str(exc)
    return text[len("--replay "):] if text.startswith("--replay ") else text


# --------------------------------------------------------------------------- one run


def _load(path: str, space_path: str | None):
    """The sweep's space (``space_path``, else the packaged space the sweep was recorded with, as
    ``search --replay`` picks it, else the packaged default) and its replay."""
    from evotuner.measure.replay import ReplayMeasure, read_sweep
    from evotuner.session import pick_space
    from evotuner.space import load_space

    table = read_sweep(path)
    space = load_space(space_path) if space_path is not None else pick_space(replay=Path(path))[0]
    replay = ReplayMeasure(path, table.problem, space)
    return space, replay


_CACHE: dict[tuple[str, str | None], Any] = {}


class _Enough(BaseException):
    """Raised from the event callback to end a run once its scores are known (a BaseException,
    so the loop's per-trial ``except Exception`` never mistakes it for a stage error)."""


def simulate(path: str, spec: str, seed: int, *, space_path: str | None = None, batch: int = 1,
             max_asks: int | None = None, stop_at_budget: bool = True,
             budgets: tuple[float, ...] = BUDGETS) -> Run:
    """One seeded run of sampler ``spec`` on sweep ``path``: the real search loop over the replay.

    The study lives in a fresh SQLite file of a temporary directory (opened with
    ``session.open_store``, created with ``session.start_study``); the stages come from
    ``session.StageFactory(replay=path)`` as ``evotuner search --replay`` builds them. A plain
    ``name+start`` runs ``session.run_study`` -- exactly the CLI's search, warm start included;
    any other spec runs ``loop.run_search`` with :func:`build_sampler`'s sampler and no warm start.
    The events say which trials cost an evaluation (module docstring).
    """
    import tempfile
    from contextlib import ExitStack

    from evotuner import events as ev
    from evotuner import session
    from evotuner.loop import run_search

    key = (path, space_path)
    if key not in _CACHE:
        _CACHE[key] = _load(path, space_path)
    space, replay = _CACHE[key]
    problem = replay.problem
    n = sum(1 for c in space.configs() if replay.lookup(c).evaluated)
    optimum = replay.table.optimum().median_us
    stop_evals = math.ceil(max(budgets) * n)
    max_asks = max_asks or 20 * space.size
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler_spec, _, warm = spec.partition("+")
    name = sampler_spec.partition(":")[0]

    best = math.inf
    trace: list[float] = []
    reached: int | None = None
    asks = 0

    def on_event(event: object) -> None:
        nonlocal best, reached, asks
        if isinstance(event, ev.TrialStarted):
            asks += 1
        if not isinstance(event, ev.TrialFinished) or event.duplicate_of is not None:
            return
        if not replay.lookup(event.config).evaluated:      # statically pruned: never compiled
            return
        if event.state == "COMPLETE" and event.value is not None:
            best = min(best, event.value)
        trace.append(best)
        if reached is None and best <= TARGET * optimum:
            reached = len(trace)
        if reached is not None and (not stop_at_budget or len(trace) >= stop_evals):
            raise _Enough

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sampler-bench-") as tmp, ExitStack() as stack:
        store = session.open_store(f"sqlite:///{Path(tmp) / 'study.db'}")
        stack.callback(store.close)
        builder, measure = session.StageFactory(replay=Path(path)).stages(problem, space, batch, stack)
        session.start_study(store, "bench", problem, space, name, seed, builder)
        try:
            if warm == "start" and sampler_spec == name:
                session.run_study(store, "bench", problem, space, name, seed, max_asks, builder, measure,
                                  on_event=on_event)
            else:
                if warm:
                    raise SystemExit(f"unknown warm start {warm!r} in {spec!r} (only name+start)")
                run_search(store=store, study_name="bench", problem=problem, space=space,
                           sampler=build_sampler(sampler_spec, space, seed, problem), seed=seed,
                           trials=max_asks, builder=builder, measure=measure, on_event=on_event, batch=batch)
        except _Enough:
            pass
    worst = max(r.median_us for r in replay.table.rows.values() if r.median_us is not None)
    at_budget = []
    for frac in budgets:
        b = math.ceil(frac * n)
        got = trace[b - 1] if len(trace) >= b else (trace[-1] if trace else math.inf)
        at_budget.append(worst if math.isinf(got) else got)
    return Run(Path(path).name, spec, seed, reached, tuple(at_budget), len(trace), asks,
               time.perf_counter() - started, tuple(trace))


# --------------------------------------------------------------------------- scores


def random_expectation(values: list[float], n: int, b: int) -> float:
    """Expected minimum of ``b`` of ``n`` configs drawn without replacement; ``values`` holds the
    latencies of the configs that have one, the other ``n - len(values)`` count as the worst."""
    worst = max(values)
    w = sorted(values) + [worst] * (n - len(values))
    total = math.comb(n, b)
    return sum(w[k] * (math.comb(n - k, b) - math.comb(n - k - 1, b)) / total for k in range(n))


def random_hits(n: int, good: int, q: float) -> int:
    """Exact q-quantile of the evaluations random search without replacement needs to draw one
    of ``good`` configs among ``n``: the smallest t with P(hit within t) >= q."""
    for t in range(1, n + 1):
        if 1 - math.comb(n - good, t) / math.comb(n, t) >= q:
            return t
    return n


def random_exact(path: str, space_path: str | None, budgets: tuple[float, ...] = BUDGETS) -> dict[str, Any]:
    """The 'random-exact' row: random search without replacement, computed, not sampled."""
    space, replay = _CACHE.get((path, space_path)) or _load(path, space_path)
    n = sum(1 for c in space.configs() if replay.lookup(c).evaluated)
    values = [r.median_us for r in replay.table.rows.values() if r.status == "ok" and r.median_us is not None]
    good = sum(1 for v in values if v <= TARGET * min(values))
    return {"seeds": 0, "feasible": n, "optimum_us": min(values), "worst_us": max(values), "good": good,
            "median_evals": random_hits(n, good, 0.5), "p90_evals": random_hits(n, good, 0.9), "censored": 0,
            "mean_evals": (n + 1) / (good + 1), "p_score": {f"{int(f * 100)}%": 0.0 for f in budgets},
            "budgets": [math.ceil(f * n) for f in budgets], "seconds_per_run": 0.0}


def summarize(runs: list[Run], path: str, space_path: str | None,
              budgets: tuple[float, ...] = BUDGETS) -> dict[str, Any]:
    space, replay = _CACHE.get((path, space_path)) or _load(path, space_path)
    values = [r.median_us for r in replay.table.rows.values() if r.status == "ok" and r.median_us is not None]
    n = sum(1 for c in space.configs() if replay.lookup(c).evaluated)
    optimum = min(values)
    expected = [random_expectation(values, n, math.ceil(f * n)) for f in budgets]
    hits = [r.evals_to_target if r.evals_to_target is not None else n + 1 for r in runs]
    p_scores, p_errors = [], []
    for i, e in enumerate(expected):
        scores = [(e - r.best_at_budget[i]) / (e - optimum) if e > optimum else 1.0 for r in runs]
        p_scores.append(statistics.fmean(scores))
        p_errors.append(statistics.stdev(scores) / math.sqrt(len(scores)) if len(scores) > 1 else math.nan)
    return {
        "seeds": len(runs), "feasible": n, "optimum_us": optimum, "worst_us": max(values),
        "median_evals": statistics.median(hits), "p90_evals": _quantile(hits, 0.9),
        "censored": sum(1 for r in runs if r.evals_to_target is None),
        "p_score": dict(zip((f"{int(f * 100)}%" for f in budgets), p_scores)),
        "p_score_stderr": dict(zip((f"{int(f * 100)}%" for f in budgets), p_errors)),
        "budgets": [math.ceil(f * n) for f in budgets],
        "seconds_per_run": statistics.fmean(r.seconds for r in runs),
    }


def _quantile(xs: list[int], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _job(args: tuple[str, str, int, str | None, int, tuple[float, ...]]) -> Run:
    path, spec, seed, space_path, batch, budgets = args
    return simulate(path, spec, seed, space_path=space_path, batch=batch, budgets=budgets)


def table_text(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    lines = []
    for sweep, by_sampler in results.items():
        any_row = next(iter(by_sampler.values()))
        lines.append(f"{sweep}: {any_row['feasible']} feasible configs, optimum {any_row['optimum_us']:.1f} us, "
                     f"budgets {any_row['budgets']} evaluations")
        budgets = list(any_row["p_score"])
        lines.append("| sampler | evals to 2% (median) | p90 | censored | "
                     + " | ".join(f"P@{b}" for b in budgets) + " | s/run |")
        lines.append("|---|---:|---:|---:|" + "---:|" * len(budgets) + "---:|")
        for spec, s in by_sampler.items():
            p = " | ".join(f"{s['p_score'][b]:.2f}" for b in budgets)
            lines.append(f"| {spec} | {s['median_evals']:.1f} | {s['p90_evals']:.1f} | {s['censored']}/{s['seeds']} "
                         f"| {p} | {s['seconds_per_run']:.2f} |")
        lines.append("")
    return "\n".join(lines)


def plot(runs: dict[str, list[Run]], results: dict[str, Any], output: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweeps = list(results)
    fig, axes = plt.subplots(1, len(sweeps), figsize=(6.5 * len(sweeps), 4.6), squeeze=False)
    for ax, sweep in zip(axes[0], sweeps):
        optimum = next(iter(results[sweep].values()))["optimum_us"]
        worst = next(iter(results[sweep].values()))["worst_us"]
        for spec in results[sweep]:
            if spec == "random-exact":
                continue
            traces = [[v if math.isfinite(v) else worst for v in r.trace] for r in runs[f"{sweep}|{spec}"]]
            length = max(len(t) for t in traces)
            xs = list(range(1, length + 1))
            ys = [statistics.median(t[i] if i < len(t) else t[-1] for t in traces if t) / optimum for i in xs]
            ax.plot(xs, ys, label=spec, drawstyle="steps-post")
        ax.axhline(TARGET, color="grey", linestyle=":", linewidth=1, label="optimum + 2%")
        for b in next(iter(results[sweep].values()))["budgets"]:
            ax.axvline(b, color="lightgrey", linewidth=0.8)
        ax.set_ylim(0.98, min(2.0, ax.get_ylim()[1]))
        ax.set_xlabel("evaluations (distinct compiled configs)")
        ax.set_ylabel("median over seeds of best latency / optimum")
        ax.set_title(sweep)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(output, dpi=120)
    plt.close(fig)
    return output


def main(argv: list[str] | None = None) -> int:
    from evotuner.propose import SAMPLERS

    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweeps", nargs="+", help="sweep CSVs (scripts/sweep.py)")
    ap.add_argument("--samplers", default=",".join(SAMPLERS),
                    help=f"comma-separated, default {','.join(SAMPLERS)}; variants: tpe:startup=N, nsga2:pop=N")
    ap.add_argument("--seeds", type=positive, default=50)
    ap.add_argument("--batch", type=positive, default=1, help="trials asked before telling (the loop's build batch)")
    ap.add_argument("--space", default=None, help="the space the sweeps were made with: a file or a packaged "
                    "space's name, e.g. hopper_grid (default: the packaged space each sweep was recorded "
                    "with, else the packaged default)")
    ap.add_argument("--workers", type=positive, default=None, help="processes (default: CPU count)")
    ap.add_argument("--output-dir", default=Path("sampler_benchmark"),
                    type=output_folder("a folder; samplers.md, samplers.json and samplers.png are written in it",
                                       ["samplers.md", "samplers.json", "samplers.png"], option="--output-dir"))
    ap.add_argument("--max-budget", type=_fraction, default=max(BUDGETS),
                    help="end each run at this fraction of the feasible configs; P-scores only up to it "
                         f"(default {max(BUDGETS)})")
    args = ap.parse_args(argv)
    budgets = tuple(b for b in BUDGETS if b <= args.max_budget + 1e-9) or (args.max_budget,)

    specs = [s.strip() for s in args.samplers.split(",")]
    if not all(specs):
        ap.error(f"--samplers {args.samplers!r}: an empty item")
    for spec in specs:
        why = spec_problem(spec, tuple(SAMPLERS))
        if why:
            ap.error(f"--samplers {why}")
    defaulted = args.samplers == ",".join(SAMPLERS)
    from evotuner.errors import EvotunerError
    from evotuner.measure.replay import read_sweep
    from evotuner.session import _space_path

    try:
        if args.space is not None:
            args.space = str(_space_path(args.space))
        for p in args.sweeps:
            _CACHE[(p, args.space)] = _load(p, args.space)
            problem = read_sweep(p).problem
            space = _CACHE[(p, args.space)][0]
            for spec in list(specs):       # a sampler this sweep's family cannot run (guided: no cost model)
                try:
                    build_sampler(spec.partition("+")[0], space, 0, problem)
                except EvotunerError as exc:
                    if not defaulted:
                        raise
                    print(f"note: leaving out {spec} ({Path(p).name}): {exc}", file=sys.stderr)
                    specs.remove(spec)
    except EvotunerError as exc:
        print(f"error: {_replay_error(exc)}", file=sys.stderr)
        return 1
    try:
        args.output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"error: cannot create --output-dir {args.output_dir}: {exc.strerror or exc} (give another folder)",
              file=sys.stderr)
        return 1
    jobs = [(p, spec, seed, args.space, args.batch, budgets)
            for p in args.sweeps for spec in specs for seed in range(args.seeds)]
    runs: dict[str, list[Run]] = {}
    started = time.time()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for i, run in enumerate(pool.map(_job, jobs, chunksize=1), start=1):
            runs.setdefault(f"{run.sweep}|{run.sampler}", []).append(run)
            if i % max(1, len(jobs) // 20) == 0 or i == len(jobs):
                print(f"  {i}/{len(jobs)} runs, {time.time() - started:.0f} s", file=sys.stderr, flush=True)
    results: dict[str, dict[str, Any]] = {}
    for p in args.sweeps:
        name = Path(p).name
        results[name] = {"random-exact": random_exact(p, args.space, budgets)}
        results[name].update({spec: summarize(runs[f"{name}|{spec}"], p, args.space, budgets) for spec in specs})
    text = table_text(results)
    print(text)
    (args.output_dir / "samplers.md").write_text(text + "\n")
    (args.output_dir / "samplers.json").write_text(json.dumps(
        {"results": results, "batch": args.batch, "seeds": args.seeds,
         "runs": [asdict(r) | {"trace": None} for rs in runs.values() for r in rs]}, indent=1, default=str))
    png = plot(runs, results, args.output_dir / "samplers.png")
    print(f"wrote {png}, samplers.md, samplers.json in {args.output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
