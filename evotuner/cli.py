"""The ``evotuner`` command line: thin commands over the library, one error boundary.

    evotuner search  --study NAME --shape B=16,H=16,S=2048,D=64 [--dtype fp16|bf16] [--causal]
                     [--trials 64] [--sampler tpe] [--seed 0] [--jobs N] [--space FILE] [--storage URL]
                     [--full-timing]
    evotuner resume  --study NAME [--trials 96]
    evotuner show    --study NAME [--top 10] [--json]
    evotuner export  --study NAME [--study OTHER ...] --output flashcore_config.h
    evotuner compile --config NAME=VALUE,... --shape D=64 [--dtype ...] [--causal] [--json] [--space FILE]
    evotuner bench   --study NAME [--top 5] [--json] [--budget 1.0] [--no-record] [--storage URL]
    evotuner check   --study NAME [--top 3] [--tools memcheck,...] [--timeout 600] | --config C --shape S
    evotuner profile --study NAME [--top 3] [--no-sdpa] [--timeout 600] | --config C --shape S

This is the only module that prints. Every command parses its options into
frozen values, calls the library, and renders what comes back. ``main`` is the
single error boundary: an :class:`EvotunerError` or a usage error becomes one
line ``error: <message> (<remedy>)`` on stderr and exit status 1 (2 for usage
errors); anything unexpected becomes one line too, with a pointer to
``EVOTUNER_DEBUG=1`` for the traceback.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from contextlib import ExitStack, nullcontext
from pathlib import Path
from typing import Any

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from evotuner import columns
from evotuner.atomicfile import write_text_atomic
from evotuner import events as ev
from evotuner import cli_diagnostics
from evotuner import session
from evotuner.config import KernelConfig
from evotuner.defaults import config_family
from evotuner.bench import BASELINE_NAMES, bench_study
from evotuner.errors import EvotunerError, InterruptedByUser, SpaceError
from evotuner.export import export_header
from evotuner.gate import apply_gate
from evotuner.numbers import json_safe
from evotuner.problem import Problem, Shape
from evotuner.propose import make_sampler
from evotuner.report import make_report
from evotuner.space import load_space, parse_space
from evotuner.textsafe import for_terminal
from evotuner.vocabulary import config_of
from evotuner.cli_options import DEFAULT_STORAGE, STORAGE_ENV  # noqa: F401 -- part of cli's public names
from evotuner.cli_options import (
    app, StudyOpt, StudiesOpt, StorageOpt, ShapeOpt, ResumeShapeOpt,
    DtypeOpt, CausalOpt, TrialsOpt, ResumeTrialsOpt, SamplerOpt, SeedOpt,
    FamilyOpt, JobsOpt, SpaceOpt, ReplayOpt, ReportDirOpt, JsonOpt, TopOpt,
    OutputOpt, ConfigOpt, BenchTopOpt, BudgetOpt, RequireCheckedOpt, RecordOpt,
    CompileShapeOpt, GpusOpt, MixedGpusOpt, StaleAfterOpt, ReplayDelayOpt, TransferOpt, FullTimingOpt, GATE_REJECTED_EXIT,
    consoles, one_line, open_store,
)

try:  # typer >= 0.20 vendors click; older typer uses the click package
    from typer._click.exceptions import ClickException as _UsageError
except ImportError:  # pragma: no cover - depends on the typer version
    from click.exceptions import ClickException as _UsageError  # type: ignore[no-redef]


DEBUG_ENV = "EVOTUNER_DEBUG"
NO_GPU = session.NO_GPU

#: Trials ``resume`` adds when --trials is not given.
RESUME_STEP = 32


# -- commands ------------------------------------------------------------------------------


@app.command()
def search(
    study: StudyOpt,
    shape: ShapeOpt,
    dtype: DtypeOpt = "fp16",
    causal: CausalOpt = False,
    trials: TrialsOpt = 64,
    sampler: SamplerOpt = None,
    seed: SeedOpt = 0,
    jobs: JobsOpt = None,
    space: SpaceOpt = None,
    family: FamilyOpt = None,
    storage: StorageOpt = None,
    replay: ReplayOpt = None,
    gpus: GpusOpt = None,
    mixed_gpus: MixedGpusOpt = False,
    stale_after: StaleAfterOpt = None,
    replay_delay: ReplayDelayOpt = None,
    transfer: TransferOpt = True,
    full_timing: FullTimingOpt = False,
) -> None:
    """Tune the kernel for one problem: run the study until it has --trials finished trials.

    Running it again with the same options does nothing; with a larger --trials it
    continues the study (as `resume` does). Samplers: tpe (FlashCore's default), guided
    (the hopper family's default: its cost model as the prior), tpe-masked, nsga2, cmaes,
    random, grid, and gp where Optuna's GPSampler can run. Several `search` processes
    (on one host or, with a PostgreSQL --storage, on many) may run one study at once:
    together they finish exactly --trials trials and never measure a config twice.
    """
    problem = Problem(Shape.parse(shape), dtype=dtype, causal=causal)
    named = space is not None or family is not None
    search_space, note = session.pick_space(space, family=family, problem=problem) if named else (None, None)
    if search_space is not None:
        make_sampler(session.sampler_name(sampler, search_space), search_space, seed, problem)
    stages = _stages(replay, "search", replay_delay, gpus)   # refuses at once without a GPU (unless replaying)
    store = open_store(storage)
    with ExitStack() as stack:
        stack.callback(store.close)
        if search_space is None:   # the study's own space, else the replayed sweep's, else flash_attention's family
            search_space, note = session.pick_space(problem=problem, replay=replay, store=store, study=study)
        if note:
            cli_diagnostics.say(for_terminal(note), style="dim")
        sampler = session.sampler_name(sampler, search_space)
        make_sampler(sampler, search_space, seed, problem)   # an unknown or unusable sampler is refused here
        exists = session.check_exists(store, study, sampler, seed, problem, search_space)
        builder, measure = stages.stages(problem, search_space, jobs, stack)
        if not exists:
            session.start_study(store, study, problem, search_space, sampler, seed, builder)
        _run(store, study, problem, search_space, sampler, seed, trials, builder, measure,
             stale_after=stale_after, mixed_gpus=mixed_gpus, transfer=transfer, racing=not full_timing)


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
    full_timing: FullTimingOpt = False,
) -> None:
    """Continue a study to --trials finished trials in total (problem, space, sampler from the study)."""
    wanted_shape = Shape.parse(shape) if shape is not None else None
    wanted_space = session.pick_space(space)[0] if space is not None else None
    stages = _stages(replay, "resume", replay_delay, gpus)   # refuses at once without a GPU (unless replaying)
    store = open_store(storage, must_exist=True)
    with ExitStack() as stack:
        stack.callback(store.close)
        resumed = session.resume_study(store, study, shape=wanted_shape, space=wanted_space)
        target = trials if trials is not None else store.count_finished(study) + RESUME_STEP
        builder, measure = stages.stages(resumed.problem, resumed.space, jobs, stack)
        _run(store, study, resumed.problem, resumed.space, resumed.sampler, resumed.seed, target, builder, measure,
             stale_after=stale_after, mixed_gpus=mixed_gpus, racing=not full_timing)


@app.command()
def show(
    study: StudyOpt,
    top: TopOpt = 10,
    as_json: JsonOpt = False,
    storage: StorageOpt = None,
) -> None:
    """Show a study: problem, device, baselines, counts and the best trials."""

    store = open_store(storage, must_exist=True, read_only=True)
    try:
        summary = store.summary(study)
        space = parse_space(store.space_text(study), f"study {study!r} space {summary.space_name!r}")
        diag = cli_diagnostics.load(store, study)
    finally:
        store.close()
    if as_json:
        _print_json({**_decoded_json(summary, space), **diag.as_json()})
        return
    _render_summary(summary, top, space)
    cli_diagnostics.render(diag, tuple(space.names))


@app.command()
def report(
    study: StudyOpt,
    output: ReportDirOpt,
    storage: StorageOpt = None,
) -> None:
    """Write a study's plots: optimization history (SDPA baselines as lines),
    parameter importances, latency against registers and shared memory."""

    store = open_store(storage, must_exist=True, read_only=True)
    try:
        result = make_report(store, study, output)
        diag = cli_diagnostics.load(store, study)
        protect = store.database_files()
    finally:
        store.close()
    for path in result.files:
        cli_diagnostics.say(f"wrote {for_terminal(path)}")
    if diag.profiles:
        path = Path(output) / "ncu_profiles.md"
        write_text_atomic(path, cli_diagnostics.profiles_markdown(diag), protect=protect)
        cli_diagnostics.say(f"wrote {for_terminal(path)}")
        _print_lines(cli_diagnostics.profile_table({s: r.figures for s, r in diag.profiles.items()},
                                         {s: r.seconds for s, r in diag.profiles.items()}))
    for name, why in result.skipped.items():
        cli_diagnostics.say(for_terminal(f"left out {name}: {why}"), style="dim")


@app.command("export")
def export_cmd(
    study: StudiesOpt,
    output: OutputOpt,
    require_checked: RequireCheckedOpt = False,
    storage: StorageOpt = None,
) -> None:
    """Write the best config of each study into a C++ header (one namespace per kernel
    family); each row records whether it passed `evotuner check`."""

    store = open_store(storage, must_exist=True, read_only=True)
    try:
        result = export_header(store, list(study), output, require_checked=require_checked)
    finally:
        store.close()
    _print_lines(_export_lines(result))
    for skipped in result.skipped:
        consoles.err.print(f"skipped: {for_terminal(skipped)}", markup=False, highlight=False)


@app.command("compile")
def compile_cmd(
    config: ConfigOpt,
    shape: CompileShapeOpt,
    dtype: DtypeOpt = "fp16",
    causal: CausalOpt = False,
    as_json: JsonOpt = False,
    space: SpaceOpt = None,
) -> int:
    """Build one config with nvcc (no GPU needed) and show its ptxas report and gate verdict.

    Exit status: 0 when the gate passes it, 3 when it builds but the gate rejects it,
    1 when it cannot be built (the error says why).
    """

    kernel_config = KernelConfig.parse(config)
    problem = Problem(Shape.parse(shape, require=("D",)), dtype=dtype, causal=causal)
    # no --space: the packaged space of the family whose parameters the config names
    search_space = session.pick_space(space, family=None if space is not None else config_family(kernel_config).name,
                                      problem=problem)[0]
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
            f"compile: nvcc failed for {kernel_config}: {one_line(build.error)}",
            f"the whole compiler output is in {log}" if log.is_file() else "fix the kernel or pick another config",
        )
    gate = apply_gate(build, search_space.gate)
    figures = _report_dict(gate.report)
    if as_json:
        _print_json({
            "params": kernel_config.as_dict(), "gate": figures, "passed": gate.passed, "reason": gate.reason,
            "build_seconds": round(build.seconds, 3), "cached": build.cached,
        })
        return 0 if gate.passed else GATE_REJECTED_EXIT
    pairs = [(key, str(value)) for key, value in figures.items()]
    pairs += [("build", f"{build.seconds:.2f} s{' (cached)' if build.cached else ''}"),
              ("cubin", str(build.artifact.cubin) if build.artifact else "-"),
              ("gate", Text("passed", style="green") if gate.passed else Text(f"rejected: {gate.reason}", style="red"))]
    title = f"{kernel_config}  ({problem.dtype}, D={problem.shape.head_dim}{', causal' if problem.causal else ''})"
    _print_lines([Text(line) for line in columns.wrap(title, consoles.out.width, 2)]
                 + columns.kv_lines(pairs, consoles.out.width))
    return 0 if gate.passed else GATE_REJECTED_EXIT


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

    stages = _stages(None, "bench")               # refuses at once without a GPU
    if budget is not None:
        stages = stages.with_budget(budget)
    store = open_store(storage, must_exist=True)
    with ExitStack() as stack:
        stack.callback(store.close)
        space = session.study_space(store, study)  # StorageError naming the study if not found
        builder, measure = stages.stages(store.summary(study).problem, space, 1, stack)
        result = bench_study(store, study, builder=builder, measure=measure, top=top, record_baselines=record)
    if as_json:
        _print_json(result.as_json())
        return
    _print_lines(_bench_lines(result, consoles.out.width, tuple(space.names)))
    for name, why in result.baseline_reasons.items():
        consoles.err.print(f"{name}: not measured: {one_line(why)}", markup=False, highlight=False)


def _bench_lines(result: Any, width: int, order: tuple[str, ...] = ()) -> list[Text]:
    """The configs (one column per parameter, then µs, TFLOPS, the ratio to each SDPA backend
    and the µs the study recorded), then the backends' own figures, then the legend."""
    p = result.problem
    device = _device_text(result.device)
    base = [n for n in BASELINE_NAMES if n in result.baselines] + \
           [n for n in result.baselines if n not in BASELINE_NAMES]
    configs = [dict(row.config.as_dict()) for row in result.rows]
    names = columns.param_names(configs, order)
    short = columns.headers(names)
    cols = [columns.Col("#", right=True), *(columns.Col(short[n], right=True, group=1) for n in names),
            *(columns.Col(h, right=True, group=2)
              for h in ("µs", "TFLOPS", *(n.removeprefix("sdpa_") for n in base), "was"))]
    rows, notes = [], []
    for row, config in zip(result.rows, configs):
        if row.ok:
            figures = [f"{row.median_us:.1f}", f"{row.tflops:.1f}" if row.tflops else "-",
                       *(f"{row.ratios[n]:.2f}x" if row.ratios.get(n) else "-" for n in base)]
        else:
            figures = [Text("failed", style="red"), "-", *(["-"] * len(base))]
        recorded = f"{row.recorded_us:.1f}" if row.recorded_us is not None else "-"
        rows.append([str(row.trial), *columns.cells(config, names), *figures, recorded])
        notes.append(None if row.ok else f"failed: {one_line(row.failure)}")
    title = f"{result.study}: {p.shape} {p.dtype}{' causal' if p.causal else ''} on {device}"
    lines = columns.table_lines(cols, rows, width, notes=notes, title=title)
    sdpa = [[name, f"{us:.1f}" if (us := result.baselines.get(name)) else "cannot run",
             f"{tf:.1f}" if (tf := result.baseline_tflops.get(name)) else "-"] for name in base]
    lines += [Text("")] + columns.table_lines(
        [columns.Col("SDPA backend"), columns.Col("µs", right=True), columns.Col("TFLOPS", right=True)], sdpa, width)
    legend = [f"{'/'.join(n.removeprefix('sdpa_') for n in base)} = that SDPA backend's µs / µs (>1: faster)",
              "was = the µs the study recorded"]
    return lines + [Text(line) for line in columns.legend_lines(short, width, legend)]


# -- the search run and its live view ------------------------------------------------------


def _run(store, study, problem, space, sampler_name, seed, trials, builder, measure, *,
         stale_after=None, mixed_gpus=False, transfer=False, racing=True) -> None:
    view = _SearchView(study, problem)
    try:
        with view.live():
            result = session.run_study(store, study, problem, space, sampler_name, seed, trials, builder, measure,
                                       on_event=view.on_event, stale_after=stale_after,
                                       mixed_gpus=mixed_gpus, transfer=transfer, racing=racing)
    except KeyboardInterrupt:   # typer would turn it into a silent exit 130: say what was kept
        raise _interrupted(store, study, trials) from None
    view.close(result, store.summary(study), space)


def _interrupted(store: Any, study: str, trials: int) -> InterruptedByUser:
    try:
        kept = f"study {study!r} keeps its {store.count_finished(study)} finished trials"
    except (EvotunerError, Exception):  # noqa: BLE001 -- the message must come out whatever the database says
        kept = f"study {study!r} keeps every trial that finished"
    what = "terminated (SIGTERM)" if _signalled["term"] else "interrupted"
    return InterruptedByUser(
        f"{what}: {kept}; trials in flight were marked FAIL (interrupted by user) and run again on resume",
        f"continue with `evotuner resume --study {study} --trials {trials}`",
    )


class _SearchView:
    """Renders loop events: a progress bar, best so far, counts, builds in flight."""

    def __init__(self, study: str, problem: Problem) -> None:
        self.study = study
        self.problem = problem
        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), console=consoles.out, transient=False,
        )
        self.task = self.progress.add_task(escape(for_terminal(study)), total=None)
        self.status = Text("starting")
        self.baselines: dict[str, float | None] = {}
        self.counts: dict[str, int] = {}
        self.best: ev.Best | None = None
        self.in_flight = 0
        self._live: Live | None = None

    def live(self) -> Any:
        """A rich Live display on a terminal; plain lines (no redraws) when piped or captured."""
        if not consoles.out.is_terminal:
            return nullcontext()
        self._live = Live(Group(self.progress, self.status), console=consoles.out, refresh_per_second=4,
                          transient=True, redirect_stdout=False, redirect_stderr=False)
        return self._live

    def on_event(self, event: object) -> None:
        if isinstance(event, ev.SearchStarted):
            self.progress.update(self.task, total=event.target, completed=event.finished)
            if event.zombies:
                self._log(f"failed {len(event.zombies)} trial(s) left running by a killed process "
                          f"({', '.join(map(str, event.zombies))}); their configs are queued again")
        elif isinstance(event, ev.Seeded):
            if event.related:
                where = ", ".join(f"{name} ({problem}, {m} measured)" for name, problem, _, m in event.sources)
                self._log(f"seeded from studies {where}: the sampler weighs their measurements against its "
                          "cost model (--no-transfer to start cold)")
            else:
                where = ", ".join(f"{name} ({problem}: {columns.count(n, 'config')})"
                                  for name, problem, n, _ in event.sources)
                self._log(f"seeded with the best configs of studies {where}, run right after the recommended "
                          "one (--no-transfer to start cold)")
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
            what = one_line(e.reason) or "-"
        dup = f" (= #{e.duplicate_of})" if e.duplicate_of is not None else ""
        if e.stopped_early is not None and e.duplicate_of is None:
            what += f" (stopped early at {e.stopped_early[0]} of {e.stopped_early[1]} reps: clearly slower)"
        return f"#{e.number} {e.state}{dup} {e.config or ''}: {what}"

    def _refresh(self) -> None:
        self.status.plain = self._status_line(max(40, consoles.out.width - 1))

    def _status_line(self, width: int) -> str:
        """Best so far, counts, builds in flight: the longest form that fits ``width``
        (the live line is cut, not wrapped, so the less telling parts go first)."""
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.counts.items()) if v) or "no trials yet"
        best = ratio = tflops = ""
        if self.best is not None:
            best = f"best #{self.best.number} {self.best.median_us:.1f} µs"
            tflops = f" {self.best.tflops:.1f} TFLOPS" if self.best.tflops else ""
            ratio = _ratio(self.baselines, self.best.median_us)
            ratio = f" {ratio}" if ratio else ""
        forms = [
            f"builds in flight {self.in_flight}  |  {counts}  |  {best}{tflops}{ratio}",
            f"building {self.in_flight} | {counts} | {best}{tflops}{ratio}",
            f"building {self.in_flight} | {counts} | {best}{ratio}",
            f"{counts} | {best}{ratio}",
            f"{best}{ratio}",
        ]
        forms = [f.rstrip(" |") for f in forms if f.strip(" |")] or ["no trials yet"]
        return next((f for f in forms if len(f) <= width), forms[-1])

    def _log(self, line: str) -> None:
        cli_diagnostics.say(for_terminal(line))

    def close(self, result: Any, summary: Any, space: Any) -> None:
        outcome = {
            "done": f"study {self.study!r} has {result.finished} finished trials",
            "already_done": f"study {self.study!r} already has {result.finished} finished trials "
                            f"(asked for {result.target}); nothing to do, raise --trials to continue",
            "exhausted": f"space exhausted: every feasible config of the space has been tried "
                         f"({result.feasible if result.feasible is not None else 'all'} configs in "
                         f"{result.finished} finished trials, asked for {result.target}); more trials "
                         f"would only repeat results",
            "stalled": _stalled_text(self.study, result),
        }[result.outcome]
        if not self.counts:      # stopped before any trial ran: the study's counts, not "no trials yet"
            self.counts = dict(summary.counts())
        self._refresh()
        self._log(self.status.plain)
        self._log(outcome)
        if getattr(result, "stopped_early", 0):
            self._log(f"racing: {result.stopped_early} of {result.measured} timings stopped early, clearly slower "
                      "than the study's best so far (--full-timing times every config in full)")
        if result.new_trials and result.timings:
            self._log(_time_split(result))
        _print_lines(_top_table(summary, 10, dict(summary.baselines or self.baselines or {}), space))


# -- rendering helpers ---------------------------------------------------------------------


#: ``SearchResult.timings`` keys as the time line names them.
_TIME_PARTS = (("baselines", "baselines"), ("ask", "sampler"), ("build_wait", "waiting on builds"),
               ("gate", "gate"), ("measure", "measuring"), ("record", "recording"))


def _time_split(result: Any) -> str:
    """Where this run's search loop spent its time (per GPU thread on average with --gpus)."""
    n = max(1, int(getattr(result, "threads", 1)))
    parts = ", ".join(f"{label} {result.timings.get(key, 0.0) / n:.1f} s" for key, label in _TIME_PARTS)
    per = f" (average of {n} GPU threads)" if n > 1 else ""
    return f"time split{per}: {parts}"


def _stalled_text(study: str, result: Any) -> str:
    """Why a search stopped with configs left untried, and what to do."""
    left = (f"; {result.untried} of {result.feasible} feasible configs never tried"
            if result.untried is not None else "")
    return (f"stopped: the sampler proposed only configs the study already tried, "
            f"{result.duplicate_streak} times in a row ({result.finished} finished trials, asked for "
            f"{result.target}{left}); running it again stops here again. To try the rest, start "
            f"another study with --sampler random (it proposes only new configs) or another --seed")


def _ratio(baselines: dict[str, float | None], us: float) -> str:
    """``1.23x SDPA`` against the fastest SDPA backend that can run the shape."""
    known = [v for v in baselines.values() if v]
    return f"{min(known) / us:.2f}x SDPA" if known and us > 0 else ""


def _config_text(record: Any, space: Any) -> str:
    """A trial's config as values, whichever way its params were recorded."""

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


def _top_table(summary: Any, top: int, baselines: dict[str, float | None], space: Any = None) -> list[Text]:
    """The best trials: one column per parameter under its fixed short header, the figures, the legend."""
    done = sorted((t for t in summary.trials
                   if t.state == "COMPLETE" and t.value is not None and t.duplicate_of is None),
                  key=lambda t: t.value)[:top]
    configs = [_config_values(t, space) for t in done]
    names = columns.param_names(configs, tuple(space.names) if space is not None else ())
    short = columns.headers(names)
    fastest = min((v for v in baselines.values() if v), default=None)
    cols = [columns.Col("#", right=True), *(columns.Col(for_terminal(short[n]), right=True, group=1) for n in names),
            *(columns.Col(h, right=True, group=2) for h in ("µs", "TFLOPS", "vs SDPA"))]
    rows = [[str(t.number), *columns.cells(config, names), f"{t.value:.1f}", f"{t.tflops:.1f}" if t.tflops else "-",
             f"{fastest / t.value:.2f}x" if fastest else "-"] for t, config in zip(done, configs)]
    width = consoles.out.width
    lines = columns.table_lines(cols, rows, width, title=f"best {len(done)} of {len(summary.trials)} trials")
    return lines + [Text(line) for line in columns.legend_lines(short, width)]


def _config_values(record: Any, space: Any) -> dict[str, int]:
    """A trial's config as {name: value}, whichever way its params were recorded."""
    text = _config_text(record, space)
    try:
        return KernelConfig.parse(text).as_dict()
    except (EvotunerError, ValueError):
        return {str(k): v for k, v in (record.params or {}).items()}


def _device_text(device: Any) -> str:
    """The device a study's (or a bench run's) figures come from; a replayed study says that no
    GPU measured it here: its figures are a recorded sweep's."""
    device = device or {}
    name = str(device.get("name", "never measured"))
    return f"{name} (replayed from a recorded sweep)" if device.get("replayed") else name


def _render_summary(summary: Any, top: int, space: Any) -> None:
    p = summary.problem
    pairs = [
        ("study", for_terminal(summary.study)),
        ("problem", f"{p.shape} {p.dtype}{' causal' if p.causal else ''}"),
        ("space", for_terminal(f"{summary.space_name} ({summary.space_fingerprint[:12]})")),
        ("sampler", f"{summary.sampler} seed={summary.seed}"),
        ("device", for_terminal(_device_text(summary.device))),
        ("baselines", ", ".join(f"{k} {v:.1f} µs" for k, v in summary.baselines.items() if v) or "-"),
        ("trials", ", ".join(f"{k} {v}" for k, v in sorted(summary.counts().items())) or "none"),
    ]
    _print_lines(columns.kv_lines([(k, Text(v)) for k, v in pairs], consoles.out.width))
    _print_lines(_top_table(summary, top, dict(summary.baselines), space))


def _export_lines(result: Any) -> list[Text]:
    """The exported rows, one table per kernel family (each its own parameters), then the legend."""
    width = consoles.out.width
    lines = [Text(line) for line in columns.wrap(f"{result.path}  ({columns.count(len(result.rows), 'config')})", width, 2)]
    families = list(dict.fromkeys(r.family for r in result.rows))
    shorts: dict[str, str] = {}
    for family in families:
        rows = [(i, r) for i, r in enumerate(result.rows) if r.family == family]
        names = columns.param_names([dict(r.params) for _, r in rows], rows[0][1].order)
        short = columns.headers(names)
        shorts.update(short)
        cols = [*(columns.Col(h, right=h in ("#", "D", "µs")) for h in ("#", "dtype", "D", "causal", "S≤", "chk", "µs")),
                *(columns.Col(short[n], right=True, group=1) for n in names), columns.Col("study", group=2)]
        studies = [for_terminal(f"{r.study} #{r.trial}") + (" (replayed)" if r.replayed else "") for _, r in rows]
        long = max(len(s) for s in studies) > width // 2
        cells = [_export_cells(i, r, names) + ([] if long else [study]) for (i, r), study in zip(rows, studies)]
        lines += [Text("")] + columns.table_lines(cols[:-1] if long else cols, cells, width,
                                                  notes=[f"study {s}" for s in studies] if long else (),
                                                  title=f"{family} ({columns.count(len(rows), 'row')})")
    extra = ["S≤ = the max seqlen_k a row serves", "chk = evotuner check: ok, FAIL or - (unchecked)"]
    return lines + [Text("")] + [Text(line) for line in columns.legend_lines(shorts, width, extra)]


def _print_lines(lines: list[Text]) -> None:
    cli_diagnostics.print_lines(lines)


def _export_cells(i: int, row: Any, names: list[str]) -> list[Any]:
    max_seqlen = "any" if row.max_seqlen >= 2**31 - 1 else str(row.max_seqlen)
    return [str(i), row.dtype, str(row.head_dim), "yes" if row.causal else "no", max_seqlen,
            _CHECK_MARK.get(row.checked, row.checked), f"{row.median_us:.1f}", *columns.cells(dict(row.params), names)]


#: The export table's ``chk`` cell per `evotuner check` verdict (short: the table fits 80 columns).
_CHECK_MARK = {"passed": "ok", "failed": "FAIL", "unchecked": "-"}


def _report_dict(report: Any) -> dict[str, Any]:
    if report is None:
        return {}
    if hasattr(report, "as_dict"):
        return dict(report.as_dict())
    from dataclasses import asdict, is_dataclass

    return asdict(report) if is_dataclass(report) else dict(report)


def _print_json(obj: Any) -> None:
    """Strict JSON: a value that is not finite (a damaged row) is null, never NaN or Infinity."""
    consoles.out.file.write(json.dumps(json_safe(obj), indent=2, sort_keys=False, default=str, allow_nan=False) + "\n")
    consoles.out.file.flush()


# -- wiring --------------------------------------------------------------------------------


def _builder(space: Any, jobs: int | None, stack: ExitStack) -> Any:
    return session.StageFactory().builder(space, jobs, stack)


#: The measure stage ``main`` was handed (tests inject theirs); None: the GPU worker.
_injected: dict[str, session.MeasureFactory | None] = {"measure": None}


def _stages(replay: Path | None, command: str, replay_delay: str | None = None,
            gpus: str | None = None) -> session.StageFactory:
    """The stage factory for search/resume/bench: nvcc + the GPU worker (or the measure stage
    ``main`` was handed), or a recorded sweep (``--replay``, ``--replay-delay``), which needs
    neither; ``--gpus``: one measure stage per GPU. Without a GPU this refuses at once,
    before any database is opened."""
    delay = session.replay_delay(replay_delay, replay)
    devices = session.gpu_list(gpus, replay)
    return session.StageFactory(measure_factory=_injected["measure"], replay=replay, delay=delay,
                                gpus=devices).ready(command)


# check / profile are evotuner.cli_diagnostics' commands, registered here after the others
# (the order `evotuner --help` lists them in).
app.command()(cli_diagnostics.check)
app.command()(cli_diagnostics.profile)

# -- the error boundary ---------------------------------------------------------------------


#: Exit status after SIGTERM (128 + 15, what a shell reports for a process it terminated).
TERMINATED_EXIT = 143
#: Whether this invocation received SIGTERM.
_signalled = {"term": False}


def _on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM (kill, systemd, a batch scheduler's time limit) ends a command as Ctrl-C does:
    the loop marks the trials in flight FAIL (interrupted) and the CLI says what was kept.
    A second SIGTERM while that is done is ignored (SIGKILL remains)."""
    if _signalled["term"]:
        return
    _signalled["term"] = True
    raise KeyboardInterrupt


def _interrupt_exit() -> int:
    return TERMINATED_EXIT if _signalled["term"] else 130


def _error_line(message: str) -> None:
    consoles.err.print(f"error: {for_terminal(message)}", markup=False, highlight=False, soft_wrap=True)


def _never_raise(stream: Any) -> None:
    """A character the terminal's encoding cannot hold (``µs`` under ``LANG=C`` or
    ``PYTHONIOENCODING=ascii``, a name's stray byte) is written as an escape such as
    ``\\xb5``, never a UnicodeEncodeError; the encoding itself is left as it is."""
    reconfigure = getattr(stream, "reconfigure", None)
    if callable(reconfigure):
        try:
            reconfigure(errors="backslashreplace")
        except (ValueError, OSError, TypeError):
            pass   # a stream that cannot change (tests' capture, a closed pipe): as it is


def main(argv: list[str] | None = None, *, measure_factory: session.MeasureFactory | None = None) -> int:
    """Entry point of the ``evotuner`` console script; returns the exit status.

    ``measure_factory`` replaces the GPU worker for this call (tests, benchmarks)."""
    _injected["measure"] = measure_factory
    for stream in (sys.stdout, sys.stderr):
        _never_raise(stream)
    consoles.out = Console(file=sys.stdout)
    consoles.err = Console(file=sys.stderr)
    debug = bool(os.environ.get(DEBUG_ENV))
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)   # the CLI reports progress itself
    _signalled["term"] = False
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _main(argv, debug)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _main(argv: list[str] | None, debug: bool) -> int:
    try:
        result = app(args=argv if argv is not None else sys.argv[1:], prog_name="evotuner", standalone_mode=False)
        if result == 130:   # typer turned a Ctrl-C into a bare exit status
            _error_line("terminated (SIGTERM)" if _signalled["term"] else "interrupted by user")
            return _interrupt_exit()
        return result if isinstance(result, int) else 0
    except InterruptedByUser as exc:
        _error_line(str(exc))
        return _interrupt_exit()
    except EvotunerError as exc:
        if debug:
            raise
        _error_line(str(exc))
        return 1
    except _UsageError as exc:
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        if type(exc).__name__ == "NoArgsIsHelpError":   # plain `evotuner`: the help is the answer
            consoles.out.print(message, markup=False, highlight=False)
            return 0
        _error_line(f"{one_line(message)} (see `evotuner --help`)")
        return int(getattr(exc, "exit_code", 2) or 2)
    except typer.Abort:
        _error_line("terminated (SIGTERM)" if _signalled["term"] else "aborted")
        return _interrupt_exit()
    except KeyboardInterrupt:
        what = "terminated (SIGTERM)" if _signalled["term"] else "interrupted by user"
        _error_line(f"{what} (trials in flight were marked FAIL; `evotuner resume` continues)")
        return _interrupt_exit()
    except Exception as exc:  # noqa: BLE001 -- the one boundary for everything unexpected
        if debug:
            raise
        _error_line(f"unexpected {type(exc).__name__}: {one_line(str(exc))} "
                    f"(run with {DEBUG_ENV}=1 for the traceback)")
        return 1


if __name__ == "__main__":  # pragma: no cover
    # `python -m evotuner.cli`: run the imported module's main, not this __main__ copy's.
    from evotuner.cli import main as _main

    sys.exit(_main())
