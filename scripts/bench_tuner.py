#!/usr/bin/env python3
"""Throughput of the tuner itself: a COLD study, then a WARM one (issue 4, item 7).

    python scripts/bench_tuner.py [--trials 64] [--shape B=16,H=16,S=2048,D=64] [--dtype fp16] [--causal]
                                  [--space FILE] [--sampler tpe] [--seed 0] [--jobs N] [--budget 0.5]
                                  [--output bench_tuner.json] [--workdir DIR] [--keep] [--full-timing]

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

and the figures of issue 28 (search throughput):

* first_measure_s   phase start to the end of the first measurement; ``startup_s`` is the
                    fixed start-up before it (phase start to the first measure call);
* measures_per_min  measurements after the first one, per minute between the first's end
                    and the last's;
* per_trial_s       the loop's time per measurement: build wait, load, check, timing, the
                    rest of the measure call, record;
* racing            timings stopped early, repetitions timed against planned (``saved``);
                    ``--full-timing`` turns racing off for the comparison; as in ``evotuner search``,
                    racing is paired (against this run's fastest timed alternately) unless
                    ``--no-paired-race`` (evotuner/measure/racing.py).

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
from evotuner.measure.base import MeasureOutcome, MeasureStage, PendingMeasure
from evotuner.measure.racing import DEFAULT_RULE, RaceRule
from evotuner.problem import Problem, Shape
from evotuner.scriptargs import ArgumentParser

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
    startup_s: float | None = None            # phase start to the first measure call
    first_measure_s: float | None = None      # phase start to the end of the first measurement
    measures_per_min: float | None = None     # after the first measurement
    per_trial_s: dict[str, float] = field(default_factory=dict, hash=False)
    racing: dict[str, Any] = field(default_factory=dict, hash=False)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class TimedMeasure(MeasureStage):
    """Wraps a MeasureStage and adds up where its time goes (parent-side wall clocks, and
    the worker's phase clocks from ``last_detail["phases"]`` when the stage reports them)."""

    def __init__(self, inner: MeasureStage) -> None:
        self.inner = inner
        self.races = bool(getattr(inner, "races", False))   # the loop races this wrapper as it would the stage
        self.calls = 0
        self.first_call_at: float | None = None     # perf_counter at the first measure call
        self.first_done_at: float | None = None     # ... at its end
        self.last_done_at: float | None = None
        self.stopped = 0
        self.reps_timed = 0
        self.reps_planned = 0
        self.measure_s = 0.0
        self.device_s = 0.0
        self.baselines_s = 0.0
        self.phase_sums = {"load_s": 0.0, "check_s": 0.0, "time_s": 0.0}
        self.phase_reports = 0

    def start(self) -> None:
        start = getattr(self.inner, "start", None)
        if callable(start):
            start()

    def measure(self, artifact: Any, problem: Problem, race: Any = None) -> MeasureOutcome:
        return self.submit(artifact, problem, race).result()

    def submit(self, artifact: Any, problem: Problem, race: Any = None) -> PendingMeasure:
        """The inner stage's submit (the GPU worker times while the loop asks ahead, as in
        ``evotuner search``); the figures are added up when the outcome is read."""
        started = time.perf_counter()
        if self.first_call_at is None:
            self.first_call_at = started
        try:
            pending = self.inner.submit(artifact, problem, race=race)
        except BaseException:
            self._account(started, None)
            raise

        def collect() -> MeasureOutcome:
            outcome: Any = None
            try:
                outcome = pending.result()
                return outcome
            finally:
                self._account(started, outcome)

        wrapped = PendingMeasure(collect)
        if not pending.in_progress:
            wrapped.result()
        return wrapped

    def _account(self, started: float, outcome: Any) -> None:
        done = time.perf_counter()
        self.measure_s += done - started
        self.calls += 1
        self.first_done_at = self.first_done_at or done
        self.last_done_at = done
        reps = getattr(outcome, "repetitions", None)
        if isinstance(reps, int):
            planned = getattr(outcome, "planned_repetitions", None)
            self.reps_timed += reps
            self.reps_planned += planned if isinstance(planned, int) else reps
            self.stopped += bool(getattr(outcome, "stopped_early", False))
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
    racing: RaceRule | None = DEFAULT_RULE,
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
        measure = TimedMeasure(measure_factory())     # started first, as StageFactory.stages does
        with measure:
            measure.start()
            with Builder(space.kernel, arch=space.arch, cache_dir=cache_dir, jobs=jobs,
                         timeout_s=build_timeout_s) as builder:
                session.start_study(store, study, problem, space, sampler_name, seed, builder)
                search_started = time.perf_counter()
                result = session.run_study(store, study, problem, space, sampler_name, seed, trials,
                                           builder, measure, on_event=on_event, racing=racing)
                search_s = time.perf_counter() - search_started
    finally:
        store.close()
    wall = time.perf_counter() - started
    return _report(phase, wall, search_s, result, builds, measure, jobs, started)


def _report(phase: str, wall: float, search_s: float, result: Any, builds: list[ev.BuildFinished],
            measure: TimedMeasure, jobs: int, started: float | None = None) -> PhaseReport:
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
    n = measure.calls
    startup = first = per_min = None
    if started is not None and measure.first_call_at is not None and measure.first_done_at is not None:
        startup = round(measure.first_call_at - started, 3)
        first = round(measure.first_done_at - started, 3)
        span = (measure.last_done_at or measure.first_done_at) - measure.first_done_at
        per_min = round((n - 1) / (span / 60.0), 2) if n > 1 and span > 0 else None
    per_trial: dict[str, float] = {}
    if n:
        per_trial = {"build_wait": loop.get("build_wait", 0.0) / n, "record": loop.get("record", 0.0) / n,
                     "measure": measure_s / n}
        if have_phases:
            per_trial.update(load=sums["load_s"] / n, check=sums["check_s"] / n, timing=sums["time_s"] / n,
                             measure_overhead=max(0.0, measure_s - sums["load_s"] - sums["check_s"]
                                                  - sums["time_s"]) / n)
        per_trial = {k: round(v, 4) for k, v in per_trial.items()}
    racing = {"stopped_early": measure.stopped, "reps_timed": measure.reps_timed,
              "reps_planned": measure.reps_planned,
              "saved": round(1.0 - measure.reps_timed / measure.reps_planned, 4) if measure.reps_planned else 0.0}
    return PhaseReport(
        phase=phase, wall_s=round(wall, 3), search_s=round(search_s, 3), trials=result.new_trials,
        trials_per_min=round(result.new_trials / (wall / 60.0), 2) if wall > 0 else 0.0,
        outcome=result.outcome, counts=dict(result.counts),
        best_us=best.median_us if best else None, best_config=str(best.config) if best else None,
        builds=len(builds), cached_builds=sum(1 for b in builds if b.cached),
        build_cpu_s=round(build_cpu, 3), build_pool_use=round(build_cpu / (jobs * wall), 4) if wall > 0 else 0.0,
        measured=measure.calls, loop_s={k: round(v, 4) for k, v in loop.items()}, worker_s=worker,
        phases_reported=have_phases, gpu_busy_s=round(gpu_busy, 3), gpu_idle_s=round(max(0.0, wall - gpu_busy), 3),
        shares=shares, startup_s=startup, first_measure_s=first, measures_per_min=per_min,
        per_trial_s=per_trial, racing=racing,
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
    racing: RaceRule | None = DEFAULT_RULE,
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
                               measure_factory=measure_factory, racing=racing)
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
                         "run it on the GPU machine")
    return lambda: GpuMeasure(timeout_s=timeout_s, budget_s=budget_s)


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="bench_tuner.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=TARGET_TRIALS, help="trials per study (default 64)")
    p.add_argument("--shape", default=DEFAULT_SHAPE, help=f"problem shape (default {DEFAULT_SHAPE})")
    p.add_argument("--dtype", default="fp16", choices=("fp16", "bf16"))
    p.add_argument("--causal", action="store_true")
    p.add_argument("--space", type=Path, default=None, help="search-space TOML (default: the packaged flashcore.toml)")
    p.add_argument("--sampler", default=None, help="default: the kernel family's, as evotuner search")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=None, help="parallel nvcc builds (default: all cores)")
    p.add_argument("--budget", type=float, default=0.5, help="GPU timing budget per trial, seconds (default 0.5)")
    p.add_argument("--measure-timeout", type=float, default=60.0, help="seconds per measure request (default 60)")
    p.add_argument("--phases", default=",".join(PHASES), help="comma-separated, in order (default cold,warm)")
    p.add_argument("--output", "-o", type=Path, default=Path("bench_tuner.json"), help="JSON report path")
    p.add_argument("--workdir", type=Path, default=None, help="where the cache and databases go (default: temp)")
    p.add_argument("--keep", action="store_true", help="keep the work dir (default: removed at the end)")
    p.add_argument("--full-timing", action="store_true", help="time every config for the whole budget (no racing)")
    p.add_argument("--paired-race", action=argparse.BooleanOptionalAction, default=None,
                   help="race against this run's fastest timed alternately (default: as evotuner search, on "
                        "unless --full-timing)")
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
    row("start-up / first measure", lambda r: "-" if r.first_measure_s is None
        else f"{r.startup_s:.1f} s / {r.first_measure_s:.1f} s")
    row("measures/min", lambda r: "-" if r.measures_per_min is None else f"{r.measures_per_min:.1f}")
    for key in ("build_wait", "load", "check", "timing", "measure_overhead", "record"):
        row(f"per trial: {key}", lambda r, key=key: "n/a" if key not in r.per_trial_s
            else f"{1000 * r.per_trial_s[key]:.0f} ms")
    row("stopped early (reps saved)", lambda r: f"{r.racing.get('stopped_early', 0)} of {r.measured} "
        f"({100 * r.racing.get('saved', 0.0):.0f}%)")
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
        racing = session.race_rule(full_timing=args.full_timing, paired=args.paired_race)   # as `evotuner search`
        meta = {"shape": str(problem.shape), "problem": problem.as_dict(), "space": space.name,
                "sampler": sampler, "seed": args.seed, "jobs": jobs, "trials": args.trials,
                "budget_s": args.budget, "workdir": str(workdir), "cpu_count": os.cpu_count(),
                "racing": racing is not None, "paired_race": racing is not None and racing.paired_margin is not None}

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
                              phases=phases, on_phase=on_phase,
                              racing=racing)
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
