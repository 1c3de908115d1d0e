#!/usr/bin/env python3
"""Throughput of the tuner itself: a COLD study, then a WARM one (issue 4, item 7).

    python scripts/bench_tuner.py [--trials 64] [--shape B=16,H=16,S=2048,D=64] [--dtype fp16] [--causal]
                                  [--space FILE] [--sampler tpe] [--seed 0] [--jobs N] [--budget 0.5]
                                  [--output bench_tuner.json] [--workdir DIR] [--keep]

cold: an empty build cache (a fresh ``EVOTUNER_CACHE_DIR`` under the work dir) and a
      fresh SQLite study; every config is compiled by nvcc.
warm: the same build cache, a fresh SQLite study, the same sampler and seed, so the
      same configs are proposed and every build is a cache hit.

Each phase runs the library's ``run_search`` with the real Builder (``--jobs``, default
all cores) and GpuMeasure (one worker process), exactly as ``evotuner search`` does,
and reports wall time (everything: store, Builder, worker start, baselines, trials),
trials/min and where the wall time went:

* build      the loop blocked on the oldest build (builds run in a pool of --jobs;
             ``build_cpu_s`` is their summed compile time, ``build_pool_use`` that
             over jobs x wall)
* gate       the ptxas gate;
* correctness / timing   the worker's own phase clocks (``detail["phases"]`` of its
             measure reply: check_s, time_s); ``measure_overhead`` is the rest of the
             measure call (module load, pipe, worker respawns);
* baselines  worker start, device fingerprint and the SDPA baselines;
* sampler / record / setup / other   ask+suggest, study writes, store+Builder creation;
* gpu_idle   wall minus the time the worker spent on the GPU (load + correctness +
             timing + baselines). It overlaps the other shares.

Targets (issue 4): cold <= 3.2 min (>= 20 trials/min) for 64 trials on the 16-core H100
machine; warm <= 1 min. The JSON has them under ``targets``.

``main(argv, measure_factory=...)`` replaces GpuMeasure (the stages are wired by
``evotuner.session``, as the CLI's are), so tests/test_bench.py smoke-tests the script
on a machine with no GPU with tests/scaffold.py's stage.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from evotuner import events as ev
from evotuner import session
from evotuner.compiler import Builder
from evotuner.errors import EvotunerError, NoGpuError
from evotuner.loop import TIMING_KEYS
from evotuner.measure.base import MeasureOutcome, MeasureStage
from evotuner.problem import Problem, Shape

DEFAULT_SHAPE = "B=16,H=16,S=2048,D=64"
#: Issue 4's targets, seconds of wall time for a 64-trial study.
TARGET_TRIALS = 64
COLD_TARGET_S = 3.2 * 60
WARM_TARGET_S = 60.0
PHASES = ("cold", "warm")

#: Share keys, in table order (fractions of the phase's wall time).
SHARE_KEYS = ("build", "gate", "correctness", "timing", "measure_overhead", "baselines",
              "sampler", "record", "setup", "other", "gpu_idle")


@dataclass(frozen=True)
class PhaseReport:
    phase: str
    wall_s: float                     # the whole phase: store, Builder, worker, search
    search_s: float                   # run_search alone
    trials: int                       # trials this phase finished
    trials_per_min: float
    outcome: str
    counts: dict[str, int] = field(hash=False)
    best_us: float | None = None
    best_config: str | None = None
    builds: int = 0                   # builds the loop collected
    cached_builds: int = 0
    build_cpu_s: float = 0.0          # summed seconds of the builds (in parallel, over --jobs)
    build_pool_use: float = 0.0       # build_cpu_s / (jobs * wall_s)
    measured: int = 0                 # measure calls
    loop_s: dict[str, float] = field(default_factory=dict, hash=False)     # SearchResult.timings
    worker_s: dict[str, float] = field(default_factory=dict, hash=False)   # load/check/time sums, device, baselines
    phases_reported: bool = False     # the measure stage reported per-phase durations
    gpu_busy_s: float = 0.0
    gpu_idle_s: float = 0.0
    shares: dict[str, float | None] = field(default_factory=dict, hash=False)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class TimedMeasure(MeasureStage):
    """Wraps a MeasureStage and adds up where its time goes (parent-side wall clocks, and
    the worker's phase clocks from ``last_detail["phases"]`` when the stage reports them)."""

    def __init__(self, inner: MeasureStage) -> None:
        self.inner = inner
        self.calls = 0
        self.measure_s = 0.0
        self.device_s = 0.0
        self.baselines_s = 0.0
        self.phase_sums = {"load_s": 0.0, "check_s": 0.0, "time_s": 0.0}
        self.phase_reports = 0

    def measure(self, artifact: Any, problem: Problem) -> MeasureOutcome:
        started = time.perf_counter()
        try:
            return self.inner.measure(artifact, problem)
        finally:
            self.measure_s += time.perf_counter() - started
            self.calls += 1
            phases = (getattr(self.inner, "last_detail", None) or {}).get("phases")
            if isinstance(phases, dict):
                self.phase_reports += 1
                for key in self.phase_sums:
                    value = phases.get(key)
                    if isinstance(value, (int, float)):
                        self.phase_sums[key] += float(value)

    def baselines(self, problem: Problem) -> dict[str, float | None]:
        started = time.perf_counter()
        try:
            return self.inner.baselines(problem)
        finally:
            self.baselines_s += time.perf_counter() - started

    def device(self) -> dict[str, object] | None:
        started = time.perf_counter()
        try:
            return self.inner.device()
        finally:
            self.device_s += time.perf_counter() - started

    def close(self) -> None:
        self.inner.close()


def run_phase(
    phase: str,
    *,
    problem: Problem,
    space: Any,
    trials: int,
    sampler_name: str,
    seed: int,
    jobs: int,
    cache_dir: Path,
    db_path: Path,
    measure_factory: Callable[[], MeasureStage],
    build_timeout_s: float = 180.0,
) -> PhaseReport:
    """One fresh study of ``trials`` trials against the build cache at ``cache_dir``."""
    builds: list[ev.BuildFinished] = []

    def on_event(event: object) -> None:
        if isinstance(event, ev.BuildFinished):
            builds.append(event)

    study = f"bench_{phase}"
    started = time.perf_counter()
    store = session.open_store(f"sqlite:///{db_path}")
    try:
        with Builder(space.kernel, arch=space.arch, cache_dir=cache_dir, jobs=jobs,
                     timeout_s=build_timeout_s) as builder:
            session.start_study(store, study, problem, space, sampler_name, seed, builder)
            measure = TimedMeasure(measure_factory())
            with measure:
                search_started = time.perf_counter()
                result = session.run_study(store, study, problem, space, sampler_name, seed, trials,
                                           builder, measure, on_event=on_event)
                search_s = time.perf_counter() - search_started
    finally:
        store.close()
    wall = time.perf_counter() - started
    return _report(phase, wall, search_s, result, builds, measure, jobs)


def _report(phase: str, wall: float, search_s: float, result: Any, builds: list[ev.BuildFinished],
            measure: TimedMeasure, jobs: int) -> PhaseReport:
    loop = {k: float(v) for k, v in (getattr(result, "timings", None) or {}).items()}
    have_phases = measure.calls > 0 and measure.phase_reports == measure.calls
    sums = measure.phase_sums
    worker = {**{k: round(v, 4) for k, v in sums.items()},
              "device_s": round(measure.device_s, 4), "baselines_s": round(measure.baselines_s, 4),
              "measure_call_s": round(measure.measure_s, 4)}
    # GPU busy: the worker's own clocks when it reports them, else the whole measure call.
    gpu_measure = (sums["load_s"] + sums["check_s"] + sums["time_s"]) if have_phases else measure.measure_s
    gpu_busy = gpu_measure + measure.baselines_s
    build_cpu = sum(b.seconds for b in builds if not b.cached)

    def share(seconds: float | None) -> float | None:
        return None if seconds is None or wall <= 0 else round(seconds / wall, 4)

    measure_s = loop.get("measure", measure.measure_s)
    correctness = sums["check_s"] if have_phases else None
    timing = sums["time_s"] if have_phases else None
    overhead = measure_s - sums["check_s"] - sums["time_s"] if have_phases else measure_s
    accounted = sum(loop.get(k, 0.0) for k in TIMING_KEYS)
    shares = {
        "build": share(loop.get("build_wait")),
        "gate": share(loop.get("gate")),
        "correctness": share(correctness),
        "timing": share(timing),
        "measure_overhead": share(max(0.0, overhead)),
        "baselines": share(loop.get("baselines")),
        "sampler": share(loop.get("ask")),
        "record": share(loop.get("record")),
        "setup": share(wall - search_s),
        "other": share(max(0.0, search_s - accounted)),
        "gpu_idle": share(max(0.0, wall - gpu_busy)),
    }
    best = result.best
    return PhaseReport(
        phase=phase, wall_s=round(wall, 3), search_s=round(search_s, 3), trials=result.new_trials,
        trials_per_min=round(result.new_trials / (wall / 60.0), 2) if wall > 0 else 0.0,
        outcome=result.outcome, counts=dict(result.counts),
        best_us=best.median_us if best else None, best_config=str(best.config) if best else None,
        builds=len(builds), cached_builds=sum(1 for b in builds if b.cached),
        build_cpu_s=round(build_cpu, 3), build_pool_use=round(build_cpu / (jobs * wall), 4) if wall > 0 else 0.0,
        measured=measure.calls, loop_s={k: round(v, 4) for k, v in loop.items()}, worker_s=worker,
        phases_reported=have_phases, gpu_busy_s=round(gpu_busy, 3), gpu_idle_s=round(max(0.0, wall - gpu_busy), 3),
        shares=shares,
    )


def targets(reports: dict[str, PhaseReport], trials: int) -> dict[str, Any]:
    """Issue 4's targets against these figures (meaningful for --trials 64 on the H100 machine)."""
    out: dict[str, Any] = {"trials": trials, "applies": trials == TARGET_TRIALS}
    if "cold" in reports:
        cold = reports["cold"]
        out["cold"] = {"wall_s": cold.wall_s, "limit_s": COLD_TARGET_S, "trials_per_min": cold.trials_per_min,
                       "met": cold.wall_s <= COLD_TARGET_S and cold.trials_per_min >= 20.0}
    if "warm" in reports:
        warm = reports["warm"]
        out["warm"] = {"wall_s": warm.wall_s, "limit_s": WARM_TARGET_S, "met": warm.wall_s <= WARM_TARGET_S}
    return out


def bench_tuner(
    *,
    problem: Problem,
    space: Any,
    trials: int,
    sampler_name: str | None = None,
    seed: int = 0,
    jobs: int | None = None,
    workdir: Path,
    measure_factory: Callable[[], MeasureStage],
    phases: Sequence[str] = PHASES,
    on_phase: Callable[[PhaseReport], None] | None = None,
) -> dict[str, PhaseReport]:
    """Run the phases in order against one build cache under ``workdir`` (which must hold
    no build cache yet, so the first phase is cold)."""
    jobs = jobs or os.cpu_count() or 1
    sampler_name = session.sampler_name(sampler_name, space)   # default: the family's, as `evotuner search`
    cache_dir = workdir / "build-cache"
    if cache_dir.exists() and any(cache_dir.iterdir()):
        raise EvotunerError(f"bench_tuner: the build cache {cache_dir} is not empty, so the cold phase "
                            "would not be cold", "use a fresh --workdir (or none: a temporary one)")
    cache_dir.mkdir(parents=True, exist_ok=True)
    previous = os.environ.get("EVOTUNER_CACHE_DIR")
    os.environ["EVOTUNER_CACHE_DIR"] = str(cache_dir)   # anything that reads the env sees the same cache
    reports: dict[str, PhaseReport] = {}
    try:
        for phase in phases:
            db = workdir / f"{phase}.db"
            if db.exists():
                db.unlink()
            report = run_phase(phase, problem=problem, space=space, trials=trials, sampler_name=sampler_name,
                               seed=seed, jobs=jobs, cache_dir=cache_dir, db_path=db,
                               measure_factory=measure_factory)
            reports[phase] = report
            if on_phase is not None:
                on_phase(report)
    finally:
        if previous is None:
            os.environ.pop("EVOTUNER_CACHE_DIR", None)
        else:
            os.environ["EVOTUNER_CACHE_DIR"] = previous
    return reports


# -- command line ---------------------------------------------------------------------------


def _gpu_factory(budget_s: float, timeout_s: float) -> Callable[[], MeasureStage]:
    from evotuner.measure import GpuMeasure, gpu_available

    if not gpu_available():
        raise NoGpuError("no CUDA GPU on this machine: bench_tuner measures on one",
                         "run it on the GPU machine (a test injects main(..., measure_factory=...))")
    return lambda: GpuMeasure(timeout_s=timeout_s, budget_s=budget_s)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench_tuner.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=TARGET_TRIALS, help="trials per study (default 64)")
    p.add_argument("--shape", default=DEFAULT_SHAPE, help=f"problem shape (default {DEFAULT_SHAPE})")
    p.add_argument("--dtype", default="fp16", choices=("fp16", "bf16"))
    p.add_argument("--causal", action="store_true")
    p.add_argument("--space", type=Path, default=None, help="search-space TOML (default: packaged default.toml)")
    p.add_argument("--sampler", default=None, help="default: the kernel family's, as evotuner search")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=None, help="parallel nvcc builds (default: all cores)")
    p.add_argument("--budget", type=float, default=0.5, help="GPU timing budget per trial, seconds (default 0.5)")
    p.add_argument("--measure-timeout", type=float, default=60.0, help="seconds per measure request (default 60)")
    p.add_argument("--phases", default=",".join(PHASES), help="comma-separated, in order (default cold,warm)")
    p.add_argument("--output", "-o", type=Path, default=Path("bench_tuner.json"), help="JSON report path")
    p.add_argument("--workdir", type=Path, default=None, help="where the cache and databases go (default: temp)")
    p.add_argument("--keep", action="store_true", help="keep the work dir (default: removed at the end)")
    return p


def _table(reports: dict[str, PhaseReport], jobs: int) -> Any:
    from rich.table import Table

    table = Table(title=f"evotuner throughput ({jobs} build jobs)", title_justify="left")
    table.add_column("")
    for phase in reports:
        table.add_column(phase, justify="right")

    def row(label: str, fn: Callable[[PhaseReport], str]) -> None:
        table.add_row(label, *(fn(r) for r in reports.values()))

    row("wall", lambda r: f"{r.wall_s:.1f} s")
    row("trials", lambda r: f"{r.trials} ({r.outcome})")
    row("trials/min", lambda r: f"{r.trials_per_min:.1f}")
    row("states", lambda r: ", ".join(f"{k} {v}" for k, v in sorted(r.counts.items()) if v))
    row("builds (cached)", lambda r: f"{r.builds} ({r.cached_builds})")
    row("build cpu / pool use", lambda r: f"{r.build_cpu_s:.1f} s / {100 * r.build_pool_use:.0f}%")
    row("best", lambda r: f"{r.best_us:.1f} µs" if r.best_us is not None else "-")
    for key in SHARE_KEYS:
        row(f"share: {key}", lambda r, key=key: "n/a" if r.shares.get(key) is None else f"{100 * r.shares[key]:.1f}%")
    return table


def main(argv: Sequence[str] | None = None, *, measure_factory: Callable[[], MeasureStage] | None = None) -> int:
    from rich.console import Console

    from evotuner.space import load_space

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)   # the phase lines and the table are the report
    out, err = Console(file=sys.stdout), Console(file=sys.stderr)
    args = _parser().parse_args(argv)
    workdir: Path | None = None
    cleanup = False
    try:
        if args.trials < 1:
            raise EvotunerError(f"--trials: {args.trials} is not a positive number of trials", "e.g. --trials 64")
        phases = [p.strip() for p in args.phases.split(",") if p.strip()]
        unknown = [p for p in phases if p not in PHASES]
        if not phases or unknown:
            raise EvotunerError(f"--phases: {','.join(unknown) or '(none)'} not known", "use cold,warm or cold")
        problem = Problem(Shape.parse(args.shape), dtype=args.dtype, causal=args.causal)
        space = load_space(args.space)
        if measure_factory is None:
            measure_factory = _gpu_factory(args.budget, args.measure_timeout)
        jobs = args.jobs or os.cpu_count() or 1
        if args.workdir is None:
            workdir = Path(tempfile.mkdtemp(prefix="evotuner-bench-tuner-"))
            cleanup = not args.keep
        else:
            workdir = args.workdir
            workdir.mkdir(parents=True, exist_ok=True)
        sampler = session.sampler_name(args.sampler, space)   # default: the family's, as `evotuner search`
        meta = {"shape": str(problem.shape), "problem": problem.as_dict(), "space": space.name,
                "sampler": sampler, "seed": args.seed, "jobs": jobs, "trials": args.trials,
                "budget_s": args.budget, "workdir": str(workdir), "cpu_count": os.cpu_count()}

        def write(reports: dict[str, PhaseReport]) -> None:
            data = {**meta, "phases": {k: r.as_dict() for k, r in reports.items()},
                    "targets": targets(reports, args.trials)}
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(json.dumps(data, indent=2) + "\n")

        done: dict[str, PhaseReport] = {}

        def on_phase(report: PhaseReport) -> None:   # the JSON is current after every phase
            done[report.phase] = report
            write(done)
            err.print(f"{report.phase}: {report.trials} trials in {report.wall_s:.1f} s "
                      f"({report.trials_per_min:.1f} trials/min)", markup=False, highlight=False, soft_wrap=True)

        reports = bench_tuner(problem=problem, space=space, trials=args.trials, sampler_name=sampler,
                              seed=args.seed, jobs=jobs, workdir=workdir, measure_factory=measure_factory,
                              phases=phases, on_phase=on_phase)
        out.print(_table(reports, jobs))
        goal = targets(reports, args.trials)
        for phase in ("cold", "warm"):
            if phase in goal:
                t = goal[phase]
                verdict = "met" if t["met"] else "MISSED"
                note = "" if goal["applies"] else f" (target is for {TARGET_TRIALS} trials)"
                out.print(f"{phase} target <= {t['limit_s']:.0f} s: {verdict}{note}", markup=False,
                          highlight=False, soft_wrap=True)
        out.print(f"wrote {args.output}", markup=False, highlight=False, soft_wrap=True)
        return 0
    except EvotunerError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        return 1
    except KeyboardInterrupt:
        err.print("error: interrupted by user", markup=False, highlight=False)
        return 130
    finally:
        if cleanup and workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
