"""The ``evotuner`` command line: thin commands over the library, one error boundary.

    evotuner search  --study NAME --shape B=16,H=16,S=2048,D=64 [--dtype fp16|bf16] [--causal]
                     [--trials 64] [--sampler tpe] [--seed 0] [--jobs N] [--space FILE] [--storage URL]
    evotuner resume  --study NAME [--trials 96]
    evotuner show    --study NAME [--top 10] [--json]
    evotuner export  --study NAME [--study OTHER ...] --output flashcore_config.h
    evotuner compile --config BLOCK_M=128,... --shape D=64 [--dtype ...] [--causal] [--json] [--space FILE]
    evotuner bench   --study NAME [--top 5] [--json] [--budget 1.0] [--no-record] [--storage URL]

This is the only module that prints. Every command parses its options into
frozen values, calls the library, and renders what comes back. ``main`` is the
single error boundary: an :class:`EvotunerError` or a usage error becomes one
line ``error: <message> (<remedy>)`` on stderr and exit status 1 (2 for usage
errors); anything unexpected becomes one line too, with a pointer to
``EVOTUNER_DEBUG=1`` for the traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from contextlib import ExitStack, nullcontext
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from evotuner import events as ev
from evotuner.config import KernelConfig
from evotuner.errors import EvotunerError, NoGpuError, SpaceError, StudyMismatchError
from evotuner.measure.base import MeasureStage
from evotuner.problem import DTYPES, Problem, Shape

try:  # typer >= 0.20 vendors click; older typer uses the click package
    from typer._click.exceptions import ClickException as _UsageError
except ImportError:  # pragma: no cover - depends on the typer version
    from click.exceptions import ClickException as _UsageError  # type: ignore[no-redef]


#: The study database when neither --storage nor $EVOTUNER_STORAGE is given.
DEFAULT_STORAGE = "sqlite:///evotuner.db"
STORAGE_ENV = "EVOTUNER_STORAGE"
DEBUG_ENV = "EVOTUNER_DEBUG"
#: TEST-ONLY hook: ``path/to/file.py:factory`` or ``module:factory`` returning a
#: MeasureStage, used by ``search``/``resume`` instead of the GPU (tests/scaffold.py).
#: Never documented for users; it exists so the CLI can be tested on machines with no GPU.
TEST_MEASURE_ENV = "EVOTUNER_TEST_MEASURE"

NO_GPU = NoGpuError(
    "no CUDA GPU on this machine: evotuner search needs one to measure; `evotuner compile` works here",
    "run search/resume on a machine with an NVIDIA Hopper GPU",
)

app = typer.Typer(
    name="evotuner",
    help="Optuna-driven autotuner for the FlashCore attention kernel on NVIDIA Hopper (sm_90a).",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

# -- shared options ------------------------------------------------------------------------

StudyOpt = Annotated[str, typer.Option("--study", help="Study name (one study = one problem + one space).")]
StudiesOpt = Annotated[list[str], typer.Option("--study", help="Study to export; repeat for several.")]
StorageOpt = Annotated[
    Optional[str],
    typer.Option("--storage", envvar=STORAGE_ENV, show_envvar=True,
                 help=f"SQLAlchemy URL of the study database [default: {DEFAULT_STORAGE}]."),
]
ShapeOpt = Annotated[str, typer.Option("--shape", help="Problem shape B=..,H=..,S=..,D=.. (SQ/SK may replace S).")]
ResumeShapeOpt = Annotated[
    Optional[str], typer.Option("--shape", help="Must equal the study's shape (resume reads it from the study).")
]
DtypeOpt = Annotated[str, typer.Option("--dtype", help=f"Element type: {' or '.join(DTYPES)}.")]
CausalOpt = Annotated[bool, typer.Option("--causal", help="Causal (top-left) masking, as SDPA's is_causal.")]
TrialsOpt = Annotated[int, typer.Option("--trials", min=1, help="Finished trials the study should hold in total.")]
ResumeTrialsOpt = Annotated[
    Optional[int],
    typer.Option("--trials", min=1, help="Finished trials in total [default: the study's count + 32]."),
]
SamplerOpt = Annotated[
    str, typer.Option("--sampler", help="Optuna sampler: tpe, nsga2, cmaes, random, grid (gp where available).")
]
SeedOpt = Annotated[int, typer.Option("--seed", help="Sampler seed; the same seed reproduces a study.")]
JobsOpt = Annotated[
    Optional[int], typer.Option("--jobs", min=1, help="Parallel nvcc builds [default: the number of CPUs].")
]
SpaceOpt = Annotated[Optional[Path], typer.Option("--space", help="Search-space TOML [default: the packaged default.toml].")]
ReplayOpt = Annotated[
    Optional[Path],
    typer.Option("--replay", help="Answer builds and measurements from a recorded sweep CSV (scripts/sweep.py); needs no GPU or nvcc."),
]
ReportDirOpt = Annotated[Path, typer.Option("--output", "-o", help="Folder for the report's PNG (and HTML) files.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]
TopOpt = Annotated[int, typer.Option("--top", min=1, help="How many of the best trials to list.")]
OutputOpt = Annotated[Path, typer.Option("--output", "-o", help="The C++ header to write.")]
ConfigOpt = Annotated[str, typer.Option("--config", help="Kernel config NAME=VALUE,... (every space parameter).")]
BenchTopOpt = Annotated[int, typer.Option("--top", min=1, help="How many of the best configs to re-measure.")]
BudgetOpt = Annotated[
    Optional[float],
    typer.Option("--budget", min=0.05, help="Timing budget per config and per SDPA backend, seconds "
                                            "[default: the measure stage's, 0.5]."),
]
GpusOpt = Annotated[
    Optional[str],
    typer.Option("--gpus", help="Measure on these GPUs at once: one coordinator (sampler, budget, builds) and one "
                                "measure worker per GPU, e.g. 0,1,2,3 or all [default: GPU 0 only]."),
]
MixedGpusOpt = Annotated[
    bool, typer.Option("--mixed-gpus", help="Allow GPUs of different models in one study at once (--gpus, or "
                                            "other workers'); timings then mix."),
]
StaleAfterOpt = Annotated[
    Optional[float],
    typer.Option("--stale-after", min=0.5, help="Seconds without a heartbeat after which other workers on the "
                                               "study take this one's trials over [default: 60]."),
]
ReplayDelayOpt = Annotated[
    Optional[str],
    typer.Option("--replay-delay", help="With --replay: seconds each build and each measurement takes, BUILD,MEASURE "
                                        "(rehearse timing-dependent setups such as several workers)."),
]
RecordOpt = Annotated[
    bool, typer.Option("--record/--no-record", help="Store this run's device and SDPA baselines with the study."),
]

#: Trials ``resume`` adds when --trials is not given.
RESUME_STEP = 32


class _Out:
    """The two consoles; created per invocation so redirected streams are honoured."""

    out: Console
    err: Console


_io = _Out()


def _storage_url(storage: str | None) -> str:
    return storage or os.environ.get(STORAGE_ENV) or DEFAULT_STORAGE


# -- commands ------------------------------------------------------------------------------


@app.command()
def search(
    study: StudyOpt,
    shape: ShapeOpt,
    dtype: DtypeOpt = "fp16",
    causal: CausalOpt = False,
    trials: TrialsOpt = 64,
    sampler: SamplerOpt = "tpe",
    seed: SeedOpt = 0,
    jobs: JobsOpt = None,
    space: SpaceOpt = None,
    storage: StorageOpt = None,
    replay: ReplayOpt = None,
    gpus: GpusOpt = None,
    mixed_gpus: MixedGpusOpt = False,
    stale_after: StaleAfterOpt = None,
    replay_delay: ReplayDelayOpt = None,
) -> None:
    """Tune the kernel for one problem: run the study until it has --trials finished trials.

    Running it again with the same options does nothing; with a larger --trials it
    continues the study (as `resume` does). Samplers: tpe (default), nsga2, cmaes,
    random, grid, and gp where Optuna's GPSampler can run. Several `search` processes
    (on one host or, with a PostgreSQL --storage, on many) may run one study at once:
    together they finish exactly --trials trials and never measure a config twice.
    """
    from evotuner.propose import make_sampler
    from evotuner.space import load_space
    from evotuner.storage.start import ensure_study, wait_for_study

    problem = Problem(Shape.parse(shape), dtype=dtype, causal=causal)
    search_space = load_space(space)
    make_sampler(sampler, search_space, seed)     # an unknown sampler is refused here
    devices = _gpu_list(gpus, replay)
    stages = _stages(replay, replay_delay, devices)   # refuses at once without a GPU (unless replaying)
    store = _open_store(storage)

    def check_existing() -> None:
        store.load_study(study, problem=problem, space=search_space)   # refuses a mismatch
        recorded = store.study_info(study)
        if (recorded.sampler, recorded.seed) != (sampler, seed):
            raise StudyMismatchError(
                f"study {study!r} runs sampler {recorded.sampler} with seed {recorded.seed}, "
                f"not {sampler} with seed {seed}",
                f"continue it with `evotuner resume --study {study}`, or choose another --study name "
                f"(every worker of a study passes the study's --seed; each runs its own seed derived from it)",
            )

    with ExitStack() as stack:
        stack.callback(store.close)
        exists = store.study_exists(study)
        if exists:
            wait_for_study(store, study)          # its creator may not have written evotuner's row yet
            check_existing()
        builder, measure = stages(problem, search_space, jobs, stack)
        if not exists and not ensure_study(store, study, lambda: store.create_study(
                study, problem, search_space, sampler, seed,
                source_hash=builder.source_hash(), nvcc_version=builder.nvcc_version())):
            check_existing()                      # another worker created it meanwhile
        _run(store, study, problem, search_space, sampler, seed, trials, builder, measure,
             stale_after=stale_after, mixed_gpus=mixed_gpus)


@app.command()
def resume(
    study: StudyOpt,
    trials: ResumeTrialsOpt = None,
    jobs: JobsOpt = None,
    shape: ResumeShapeOpt = None,
    space: SpaceOpt = None,
    storage: StorageOpt = None,
    replay: ReplayOpt = None,
    gpus: GpusOpt = None,
    mixed_gpus: MixedGpusOpt = False,
    stale_after: StaleAfterOpt = None,
    replay_delay: ReplayDelayOpt = None,
) -> None:
    """Continue a study to --trials finished trials in total (problem, space, sampler from the study)."""
    from evotuner.space import load_space, parse_space

    wanted_shape = Shape.parse(shape) if shape is not None else None
    wanted_space = load_space(space) if space is not None else None
    stages = _stages(replay, replay_delay, _gpu_list(gpus, replay))   # refuses at once without a GPU (unless replaying)
    store = _open_store(storage, must_exist=True)
    with ExitStack() as stack:
        stack.callback(store.close)
        info = store.summary(study)                 # StorageError naming the study if not found
        problem = info.problem
        search_space = parse_space(store.space_text(study), f"study {study!r} space {info.space_name!r}")
        if wanted_shape is not None and wanted_shape != problem.shape:
            raise StudyMismatchError(
                f"study {study!r} tunes shape {problem.shape}, not {wanted_shape}",
                f"drop --shape (resume reads it from the study), or start a new study with "
                f"`evotuner search --study NEW --shape {wanted_shape}`",
            )
        if wanted_space is not None and wanted_space.fingerprint() != search_space.fingerprint():
            raise StudyMismatchError(
                f"study {study!r} was started with another search space than {wanted_space.path}",
                "drop --space (resume reads it from the study), or start a new study",
            )
        target = trials if trials is not None else store.count_finished(study) + RESUME_STEP
        builder, measure = stages(problem, search_space, jobs, stack)
        _run(store, study, problem, search_space, info.sampler, info.seed, target, builder, measure,
             stale_after=stale_after, mixed_gpus=mixed_gpus)


@app.command()
def show(
    study: StudyOpt,
    top: TopOpt = 10,
    as_json: JsonOpt = False,
    storage: StorageOpt = None,
) -> None:
    """Show a study: problem, device, baselines, counts and the best trials."""
    from evotuner.space import parse_space

    store = _open_store(storage, must_exist=True)
    try:
        summary = store.summary(study)
        space = parse_space(store.space_text(study), f"study {study!r} space {summary.space_name!r}")
    finally:
        store.close()
    if as_json:
        _print_json(_decoded_json(summary, space))
        return
    _render_summary(summary, top, space)


@app.command()
def report(
    study: StudyOpt,
    output: ReportDirOpt,
    storage: StorageOpt = None,
) -> None:
    """Write a study's plots: optimization history (SDPA baselines as lines),
    parameter importances, latency against registers and shared memory."""
    from evotuner.report import make_report

    store = _open_store(storage, must_exist=True)
    try:
        result = make_report(store, study, output)
    finally:
        store.close()
    for path in result.files:
        _io.out.print(f"wrote {path}")
    for name, why in result.skipped.items():
        _io.out.print(f"[dim]left out {name}: {why}[/dim]")


@app.command("export")
def export_cmd(
    study: StudiesOpt,
    output: OutputOpt,
    storage: StorageOpt = None,
) -> None:
    """Write the best config of each study into a C++ header (flashcore::tuned)."""
    from evotuner.export import export_header

    store = _open_store(storage, must_exist=True)
    try:
        result = export_header(store, list(study), output)
    finally:
        store.close()
    table = Table(title=f"{result.path}  ({len(result.rows)} configs)", title_justify="left")
    for col in ("#", "dtype", "D", "causal", "max seqlen", "config", "µs", "study"):
        table.add_column(col)
    for i, row in enumerate(result.rows):
        table.add_row(*(_export_cells(i, row)))
    _io.out.print(table)
    for skipped in result.skipped:
        _io.err.print(f"skipped: {skipped}", markup=False, highlight=False)


@app.command("compile")
def compile_cmd(
    config: ConfigOpt,
    shape: ShapeOpt,
    dtype: DtypeOpt = "fp16",
    causal: CausalOpt = False,
    as_json: JsonOpt = False,
    space: SpaceOpt = None,
) -> None:
    """Build one config with nvcc (no GPU needed) and show its ptxas report and gate verdict."""
    from evotuner.gate import apply_gate
    from evotuner.space import load_space

    kernel_config = KernelConfig.parse(config)
    problem = Problem(Shape.parse(shape, require=("D",)), dtype=dtype, causal=causal)
    search_space = load_space(space)
    search_space.validate(kernel_config)
    constraint = search_space.violated(kernel_config, problem)
    if constraint is not None:
        raise SpaceError(
            f"--config {kernel_config}: breaks constraint {constraint.name}: {constraint.message}",
            "pick values the space's [[constraints]] allow",
        )
    with ExitStack() as stack:
        builder = _builder(search_space, 1, stack)
        build = builder.build(kernel_config, problem)
    if not build.ok:
        log = builder.cache.entry_dir(build.key) / "ptxas.log"
        raise EvotunerError(
            f"compile: nvcc failed for {kernel_config}: {_one_line(build.error)}",
            f"the whole compiler output is in {log}" if log.is_file() else "fix the kernel or pick another config",
        )
    gate = apply_gate(build, search_space.gate)
    figures = _report_dict(gate.report)
    if as_json:
        _print_json({
            "params": kernel_config.as_dict(), "gate": figures, "passed": gate.passed, "reason": gate.reason,
            "build_seconds": round(build.seconds, 3), "cached": build.cached,
        })
        return
    table = Table(title=f"{kernel_config}  ({problem.dtype}, D={problem.shape.head_dim}"
                        f"{', causal' if problem.causal else ''})", title_justify="left", show_header=False)
    table.add_column("figure")
    table.add_column("value", justify="right", overflow="fold")
    for key, value in figures.items():
        table.add_row(key, str(value))
    table.add_row("build", f"{build.seconds:.2f} s{' (cached)' if build.cached else ''}")
    table.add_row("cubin", str(build.artifact.cubin) if build.artifact else "-")
    verdict = Text("passed", style="green") if gate.passed else Text(f"rejected: {gate.reason}", style="red")
    table.add_row("gate", verdict)
    _io.out.print(table)


@app.command()
def bench(
    study: StudyOpt,
    top: BenchTopOpt = 5,
    as_json: JsonOpt = False,
    budget: BudgetOpt = None,
    record: RecordOpt = True,
    storage: StorageOpt = None,
) -> None:
    """Re-measure the study's best configs and SDPA's backends side by side in one run on this GPU.

    ratio = SDPA µs / our µs (above 1: faster than that SDPA backend). Configs are
    rebuilt through the build cache (hits when the study ran on this machine).
    """
    from evotuner.bench import bench_study
    from evotuner.space import parse_space

    measure_factory = _measure_factory()          # refuses at once without a GPU
    if budget is not None:
        measure_factory = _with_budget(measure_factory, budget)
    store = _open_store(storage, must_exist=True)
    with ExitStack() as stack:
        stack.callback(store.close)
        summary = store.summary(study)            # StorageError naming the study if not found
        space = parse_space(store.space_text(study), f"study {study!r} space {summary.space_name!r}")
        builder = _builder(space, 1, stack)
        measure = stack.enter_context(measure_factory())
        result = bench_study(store, study, builder=builder, measure=measure, top=top, record_baselines=record)
    if as_json:
        _print_json(result.as_json())
        return
    _io.out.print(_bench_table(result))
    for name, why in result.baseline_reasons.items():
        _io.err.print(f"{name}: not measured: {_one_line(why)}", markup=False, highlight=False)


def _with_budget(factory: Callable[[], MeasureStage], budget: float) -> Callable[[], MeasureStage]:
    """The GPU stage with ``budget_s``; a test-only hook factory takes no options and is kept as is."""
    from evotuner.measure import GpuMeasure

    if isinstance(factory, type) and issubclass(factory, GpuMeasure):
        return lambda: factory(budget_s=budget)
    return factory


def _bench_table(result: Any) -> Table:
    from rich import box

    from evotuner.bench import BASELINE_NAMES

    p = result.problem
    device = (result.device or {}).get("name", "unknown device")
    names = [n for n in BASELINE_NAMES if n in result.baselines] + \
            [n for n in result.baselines if n not in BASELINE_NAMES]
    table = Table(title=f"{result.study}: {p.shape} {p.dtype}{' causal' if p.causal else ''} on {device}",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, caption_justify="left",
                  caption=f"{', '.join(n.removeprefix('sdpa_') for n in names)}: ratio = SDPA µs / µs "
                          "(>1: faster than that SDPA backend); was: the µs the study recorded")
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("config", overflow="fold", min_width=16, ratio=1)   # folds on a narrow terminal
    for col in ("µs", "TFLOPS", *(n.removeprefix("sdpa_") for n in names), "was"):
        table.add_column(col, justify="right", no_wrap=True)
    for row in result.rows:
        if row.ok:
            cells = [f"{row.median_us:.1f}", f"{row.tflops:.1f}" if row.tflops else "-",
                     *(f"{row.ratios[n]:.2f}x" if row.ratios.get(n) else "-" for n in names)]
        else:
            cells = [Text("failed", style="red"), "-", *(["-"] * len(names))]
        recorded = f"{row.recorded_us:.1f}" if row.recorded_us is not None else "-"
        config = str(row.config) if row.ok else f"{row.config}\nfailed: {_one_line(row.failure)}"
        table.add_row(str(row.trial), config, *cells, recorded)
    table.add_section()
    for name in names:
        us = result.baselines.get(name)
        tflops = result.baseline_tflops.get(name)
        table.add_row("", name, f"{us:.1f}" if us else "cannot run", f"{tflops:.1f}" if tflops else "-",
                      *(["1.00x" if n == name and us else "-" for n in names]), "-")
    return table


# -- the search run and its live view ------------------------------------------------------


def _run(store, study, problem, space, sampler_name, seed, trials, builder, measure, *,
         stale_after=None, mixed_gpus=False) -> None:
    from evotuner.defaults import recommended
    from evotuner.loop import run_search
    from evotuner.multigpu import run_multi
    from evotuner.propose import make_sampler

    def sampler(worker_seed: int | None) -> Any:   # each worker's own seed, derived from the study's
        return make_sampler(sampler_name, space, worker_seed, problem)

    view = _SearchView(study, problem)
    common = dict(store=store, study_name=study, problem=problem, space=space, trials=trials, builder=builder,
                  on_event=view.on_event, start=recommended(problem))
    with view.live():
        if isinstance(measure, list):             # --gpus: one measure stage per GPU
            result = run_multi(measures=measure, sampler_for=sampler, seed=seed, stale_after=stale_after,
                               allow_mixed=mixed_gpus, **common)
        else:
            result = run_search(sampler=sampler, seed=seed, measure=measure, stale_after=stale_after,
                                allow_mixed_gpus=mixed_gpus, **common)
    view.close(result, store.summary(study), space)


class _SearchView:
    """Renders loop events: a progress bar, best so far, counts, builds in flight."""

    def __init__(self, study: str, problem: Problem) -> None:
        self.study = study
        self.problem = problem
        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), console=_io.out, transient=False,
        )
        self.task = self.progress.add_task(f"{study}", total=None)
        self.status = Text("starting")
        self.baselines: dict[str, float | None] = {}
        self.counts: dict[str, int] = {}
        self.best: ev.Best | None = None
        self.in_flight = 0
        self._live: Live | None = None

    def live(self) -> Any:
        """A rich Live display on a terminal; plain lines (no redraws) when piped or captured."""
        if not _io.out.is_terminal:
            return nullcontext()
        self._live = Live(Group(self.progress, self.status), console=_io.out, refresh_per_second=4,
                          transient=True, redirect_stdout=False, redirect_stderr=False)
        return self._live

    def on_event(self, event: object) -> None:
        if isinstance(event, ev.SearchStarted):
            self.progress.update(self.task, total=event.target, completed=event.finished)
            if event.zombies:
                self._log(f"failed {len(event.zombies)} trial(s) left running by a killed process "
                          f"({', '.join(map(str, event.zombies))}); their configs are queued again")
        elif isinstance(event, ev.DeviceChanged):
            self._log(f"warning: this study was measured on another device before; now on "
                      f"{event.device} (both are recorded; compare its timings with care)")
        elif isinstance(event, ev.BaselinesMeasured):
            self.baselines = dict(event.baselines)
            known = ", ".join(f"{k} {v:.1f} µs" for k, v in event.baselines.items() if v is not None)
            self._log(f"SDPA baselines: {known or 'none can run this shape'}")
        elif isinstance(event, (ev.BuildStarted, ev.BuildFinished)):
            self.in_flight = event.in_flight
        elif isinstance(event, ev.TrialFinished):
            self._log(self._trial_line(event))
        elif isinstance(event, ev.Progress):
            self.counts, self.best, self.in_flight = dict(event.counts), event.best, event.in_flight
            self.progress.update(self.task, completed=event.finished, total=event.target)
        self._refresh()

    def _trial_line(self, e: ev.TrialFinished) -> str:
        if e.state == "COMPLETE" and e.value is not None:
            what = f"{e.value:.1f} µs" + (f", {e.tflops:.1f} TFLOPS" if e.tflops else "")
        else:
            what = _one_line(e.reason) or "-"
        dup = f" (= #{e.duplicate_of})" if e.duplicate_of is not None else ""
        return f"#{e.number} {e.state}{dup} {e.config or ''}: {what}"

    def _refresh(self) -> None:
        parts = [f"{k} {v}" for k, v in sorted(self.counts.items())]
        line = f"builds in flight {self.in_flight}  |  " + (", ".join(parts) or "no trials yet")
        if self.best is not None:
            line += f"  |  best #{self.best.number} {self.best.median_us:.1f} µs"
            if self.best.tflops:
                line += f" {self.best.tflops:.1f} TFLOPS"
            ratio = _ratio(self.baselines, self.best.median_us)
            if ratio:
                line += f" {ratio}"
        self.status.plain = line

    def _log(self, line: str) -> None:
        _io.out.print(line, markup=False, highlight=False, soft_wrap=True)

    def close(self, result: Any, summary: Any, space: Any) -> None:
        outcome = {
            "done": f"study {self.study!r} has {result.finished} finished trials",
            "already_done": f"study {self.study!r} already has {result.finished} finished trials "
                            f"(asked for {result.target}); nothing to do, raise --trials to continue",
            "exhausted": f"space exhausted: every config of the space has been tried "
                         f"({result.finished} finished trials, asked for {result.target})",
        }[result.outcome]
        self._refresh()
        self._log(self.status.plain)
        self._log(outcome)
        _io.out.print(_top_table(summary, 10, dict(summary.baselines or self.baselines or {}), space))


# -- rendering helpers ---------------------------------------------------------------------


def _ratio(baselines: dict[str, float | None], us: float) -> str:
    """``1.23x SDPA`` against the fastest SDPA backend that can run the shape."""
    known = [v for v in baselines.values() if v]
    return f"{min(known) / us:.2f}x SDPA" if known and us > 0 else ""


def _config_text(record: Any, space: Any) -> str:
    """A trial's config as values, whichever way its params were recorded."""
    from evotuner.loop import config_of

    try:
        config = config_of(record.params, space) if space is not None else None
    except EvotunerError:
        config = None
    return str(config) if config is not None else record.config


def _decoded_json(summary: Any, space: Any) -> dict[str, Any]:
    """``summary.as_json()`` with every trial's ``params`` as config values."""
    data = summary.as_json()
    by_number = {t.number: t for t in summary.trials}
    for item in [*data["trials"], *([data["best"]] if data.get("best") else [])]:
        record = by_number.get(item["number"])
        if record is None or not record.params:
            continue
        text = _config_text(record, space)
        if text != record.config:
            item["params"] = KernelConfig.parse(text).as_dict()
            item["config"] = text
    return data


def _top_table(summary: Any, top: int, baselines: dict[str, float | None], space: Any = None) -> Table:
    done = sorted((t for t in summary.trials
                   if t.state == "COMPLETE" and t.value is not None and t.duplicate_of is None),
                  key=lambda t: t.value)[:top]
    table = Table(title=f"best {len(done)} of {len(summary.trials)} trials", title_justify="left")
    for col, just in (("#", "right"), ("config", "left"), ("µs", "right"), ("TFLOPS", "right"), ("vs SDPA", "right")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    fastest = min((v for v in baselines.values() if v), default=None)
    for t in done:
        table.add_row(str(t.number), _config_text(t, space), f"{t.value:.1f}",
                      f"{t.tflops:.1f}" if t.tflops else "-",
                      f"{fastest / t.value:.2f}x" if fastest else "-")
    return table


def _render_summary(summary: Any, top: int, space: Any) -> None:
    p = summary.problem
    head = Table(show_header=False, box=None, pad_edge=False)
    head.add_column(style="bold")
    head.add_column()
    head.add_row("study", summary.study)
    head.add_row("problem", f"{p.shape} {p.dtype}{' causal' if p.causal else ''}")
    head.add_row("space", f"{summary.space_name} ({summary.space_fingerprint[:12]})")
    head.add_row("sampler", f"{summary.sampler} seed={summary.seed}")
    device = summary.device or {}
    head.add_row("device", str(device.get("name", "never measured")))
    head.add_row("baselines", ", ".join(f"{k} {v:.1f} µs" for k, v in summary.baselines.items() if v) or "-")
    head.add_row("trials", ", ".join(f"{k} {v}" for k, v in sorted(summary.counts().items())) or "none")
    _io.out.print(head)
    _io.out.print(_top_table(summary, top, dict(summary.baselines), space))


def _export_cells(i: int, row: Any) -> list[str]:
    max_seqlen = "any" if row.max_seqlen >= 2**31 - 1 else str(row.max_seqlen)
    config = ",".join(f"{k}={v}" for k, v in row.params)
    return [str(i), row.dtype, str(row.head_dim), "yes" if row.causal else "no", max_seqlen, config,
            f"{row.median_us:.1f}", f"{row.study} #{row.trial}"]


def _report_dict(report: Any) -> dict[str, Any]:
    if report is None:
        return {}
    if hasattr(report, "as_dict"):
        return dict(report.as_dict())
    from dataclasses import asdict, is_dataclass

    return asdict(report) if is_dataclass(report) else dict(report)


def _one_line(text: str | None) -> str:
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    if not lines:
        return ""
    return lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"


def _print_json(obj: Any) -> None:
    _io.out.file.write(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
    _io.out.file.flush()


# -- wiring --------------------------------------------------------------------------------


def _open_store(storage: str | None, *, must_exist: bool = False) -> Any:
    """The study database; ``must_exist``: refuse (creating nothing) when a SQLite file is missing."""
    from evotuner.errors import StorageError
    from evotuner.storage import StudyStore
    from evotuner.storage.connect import resolve_url, sqlite_path

    url = _storage_url(storage)
    path = sqlite_path(resolve_url(url))
    if must_exist and path is not None and not path.exists():
        raise StorageError(
            f"no study database at {path}",
            "run `evotuner search` first, or point --storage / $EVOTUNER_STORAGE at the database",
        )
    return StudyStore(url)


def _builder(space: Any, jobs: int | None, stack: ExitStack) -> Any:
    from evotuner.build import Builder

    return stack.enter_context(Builder(space.kernel, arch=space.arch, jobs=jobs))


Stages = Callable[[Problem, Any, Optional[int], ExitStack], tuple[Any, MeasureStage]]


def _gpu_list(gpus: str | None, replay: Path | None) -> list[int] | None:
    """--gpus as device indices (None: not given); ``all`` with --replay means GPU 0."""
    if gpus is None:
        return None
    from evotuner.multigpu import parse_gpus

    return parse_gpus(gpus, (lambda: 1) if replay is not None else None)


def _replay_delay(text: str | None) -> tuple[float, float]:
    if text is None:
        return 0.0, 0.0
    try:
        build_s, measure_s = (float(part) for part in text.split(","))
    except ValueError:
        raise EvotunerError(f"--replay-delay {text!r}: not BUILD,MEASURE seconds", "e.g. --replay-delay 0.05,0.02") from None
    if build_s < 0 or measure_s < 0:
        raise EvotunerError(f"--replay-delay {text!r}: delays cannot be negative", "e.g. --replay-delay 0.05,0.02")
    return build_s, measure_s


def _stages(replay: Path | None, replay_delay: str | None = None, gpus: list[int] | None = None) -> Stages:
    """The (builder, measure) pair for search/resume, made once the study's problem and
    space are known: nvcc + the GPU worker, or a recorded sweep (``--replay``), which
    needs neither. With ``gpus`` the measure is a list: one stage per GPU index. Without
    a GPU and without --replay this refuses at once, before any database is opened."""
    build_s, measure_s = _replay_delay(replay_delay)
    if replay_delay is not None and replay is None:
        raise EvotunerError("--replay-delay needs --replay FILE", "drop --replay-delay, or replay a sweep")
    if replay is not None:
        def replayed(problem: Problem, space: Any, jobs: int | None, stack: ExitStack) -> tuple[Any, Any]:
            from evotuner.measure.replay import ReplayMeasure

            def one(index: int | None) -> ReplayMeasure:
                return stack.enter_context(ReplayMeasure(replay, problem, space, build_s=build_s,
                                                         measure_s=measure_s, device_index=index))
            measure = one(gpus[0] if gpus else None)
            builder = stack.enter_context(measure.builder(jobs or os.cpu_count() or 1))
            if gpus is None:
                return builder, measure
            return builder, [measure, *(one(i) for i in gpus[1:])]
        return replayed
    measure_factory = _measure_factory()

    def real(problem: Problem, space: Any, jobs: int | None, stack: ExitStack) -> tuple[Any, Any]:
        builder = _builder(space, jobs, stack)
        if gpus is None:
            return builder, stack.enter_context(measure_factory())
        from evotuner.measure import GpuMeasure

        make = (lambda i: GpuMeasure(device_index=i)) if measure_factory is GpuMeasure else (lambda i: measure_factory())
        return builder, [stack.enter_context(make(i)) for i in gpus]
    return real


def _measure_factory() -> Callable[[], MeasureStage]:
    """The measure stage for search/resume: the GPU worker, or the test-only hook.

    The seam for other stages (``--replay FILE`` -> ReplayMeasure) is here: they
    return a factory the same way, and need no GPU.
    """
    hook = os.environ.get(TEST_MEASURE_ENV)
    if hook:
        return _load_test_hook(hook)
    from evotuner.measure import GpuMeasure, gpu_available

    if not gpu_available():
        raise NO_GPU
    return GpuMeasure


def _load_test_hook(spec: str) -> Callable[[], MeasureStage]:
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise EvotunerError(f"{TEST_MEASURE_ENV}={spec!r} is not module:factory", f"unset {TEST_MEASURE_ENV}")
    if target.endswith(".py"):
        module_spec = importlib.util.spec_from_file_location("_evotuner_test_measure", target)
        if module_spec is None or module_spec.loader is None:
            raise EvotunerError(f"{TEST_MEASURE_ENV}: cannot load {target}", f"unset {TEST_MEASURE_ENV}")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    return getattr(module, attr)


# -- the error boundary ---------------------------------------------------------------------


def _error_line(message: str) -> None:
    _io.err.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``evotuner`` console script; returns the exit status."""
    _io.out = Console(file=sys.stdout)
    _io.err = Console(file=sys.stderr)
    debug = bool(os.environ.get(DEBUG_ENV))
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)   # the CLI reports progress itself
    try:
        result = app(args=argv if argv is not None else sys.argv[1:], prog_name="evotuner", standalone_mode=False)
        return result if isinstance(result, int) else 0
    except EvotunerError as exc:
        if debug:
            raise
        _error_line(str(exc))
        return 1
    except _UsageError as exc:
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        if type(exc).__name__ == "NoArgsIsHelpError":   # plain `evotuner`: the help is the answer
            _io.out.print(message, markup=False, highlight=False)
            return 0
        _error_line(f"{_one_line(message)} (see `evotuner --help`)")
        return int(getattr(exc, "exit_code", 2) or 2)
    except typer.Abort:
        _error_line("aborted")
        return 130
    except KeyboardInterrupt:
        _error_line("interrupted by user (trials in flight were marked FAIL; `evotuner resume` continues)")
        return 130
    except Exception as exc:  # noqa: BLE001 -- the one boundary for everything unexpected
        if debug:
            raise
        _error_line(f"unexpected {type(exc).__name__}: {_one_line(str(exc))} "
                    f"(run with {DEBUG_ENV}=1 for the traceback)")
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
