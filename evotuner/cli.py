"""The ``evotuner`` command line: thin commands over the library, one error boundary.

    evotuner search  --study NAME --shape B=16,H=16,S=2048,D=64 [--dtype fp16|bf16] [--causal]
                     [--trials 64] [--sampler tpe] [--seed 0] [--jobs N] [--space FILE] [--storage URL]
                     [--full-timing]
    evotuner search  --study NAME --shape H=32,HKV=8,D=128 --lengths random:16:128..8192:seed=0 [--lengths-k ...]
    evotuner resume  --study NAME [--trials 96]
    evotuner show    --study NAME [--top 10] [--json]
    evotuner report  --study NAME --output DIR
    evotuner export  --study NAME [--study OTHER ...] --output flashcore_config.h
    evotuner compile --config NAME=VALUE,... --shape D=64 [--dtype ...] [--causal] [--varlen] [--json] [--space FILE]
    evotuner bench   --study NAME [--top 5] [--json] [--budget 1.0] [--no-record] [--storage URL]
    evotuner check   --study NAME [--top 3] [--tools memcheck,...] [--timeout 600] | --config C --shape S
    evotuner profile --study NAME [--top 3] [--no-sdpa] [--timeout 600] | --config C --shape S

The CLI is the only layer that prints (this module, :mod:`evotuner.cli_render`, which
renders, and :mod:`evotuner.cli_diagnostics`). Every command parses its options into
frozen values, calls the library, and renders what comes back. ``main`` is the
single error boundary: an :class:`EvotunerError` or a usage error becomes one
line ``error: <message> (<remedy>)`` on stderr and exit status 1 (2 for usage
errors); anything unexpected becomes one line too, with a pointer to
``EVOTUNER_DEBUG=1`` for the traceback.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":  # pragma: no cover
    # `python -m evotuner.cli` is `python -m evotuner` (evotuner.launch), run before this
    # module's imports: a Ctrl-C while they load is one line there. It imports this module
    # again as evotuner.cli and exits.
    import runpy

    runpy.run_module("evotuner", run_name="__main__", alter_sys=True)

import logging
import os
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.text import Text

from evotuner import columns
from evotuner.atomicfile import write_text_atomic
from evotuner import cli_diagnostics
from evotuner import session
from evotuner import stopping
from evotuner.config import KernelConfig
from evotuner.bench import bench_study
from evotuner.errors import EvotunerError, InterruptedByUser, SpaceError
from evotuner.export import export_header
from evotuner.gate import apply_gate
from evotuner.lengths import problem_of_options
from evotuner.problem import Problem, Shape, parse_shape_values
from evotuner.propose import make_sampler
from evotuner.report import make_report
from evotuner.space import load_space, stored_space
from evotuner.textsafe import for_terminal
from evotuner.cli_render import (
    SearchView, bench_lines, decoded_json, export_lines, print_json, print_lines, render_summary, report_dict,
)
from evotuner.cli_options import DEFAULT_STORAGE, STORAGE_ENV  # noqa: F401 -- part of cli's public names
from evotuner.cli_options import (
    app, study_args, StudyOpt, StudiesOpt, StorageOpt, ShapeOpt, ResumeShapeOpt, LengthsOpt, LengthsKOpt, VarlenOpt,
    DtypeOpt, CausalOpt, TrialsOpt, ResumeTrialsOpt, SamplerOpt, SeedOpt,
    FamilyOpt, JobsOpt, SpaceOpt, ResumeSpaceOpt, CompileSpaceOpt, ReplayOpt, ReportDirOpt, JsonOpt, TopOpt,
    OutputOpt, ConfigOpt, BenchTopOpt, BudgetOpt, RequireCheckedOpt, RecordOpt,
    CompileShapeOpt, GpusOpt, MixedGpusOpt, StaleAfterOpt, ReplayDelayOpt, TransferOpt, FullTimingOpt, PairedRaceOpt,
    GATE_REJECTED_EXIT,
    consoles, one_line, open_store, say_skipped,
)

try:  # typer >= 0.20 vendors click; older typer uses the click package
    from typer._click.exceptions import ClickException as _UsageError
except ImportError:  # pragma: no cover - depends on the typer version
    from click.exceptions import ClickException as _UsageError  # type: ignore[no-redef]


DEBUG_ENV = "EVOTUNER_DEBUG"
#: What turns $EVOTUNER_DEBUG off, as unset does (``EVOTUNER_DEBUG=0`` must not show tracebacks).
_OFF = ("", "0", "false", "no", "off")
NO_GPU = session.NO_GPU

#: Trials ``resume`` adds when --trials is not given.
RESUME_STEP = 32


# -- commands ------------------------------------------------------------------------------


@app.command()
def search(
    study: StudyOpt,
    shape: ShapeOpt,
    lengths: LengthsOpt = None,
    lengths_k: LengthsKOpt = None,
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
    paired_race: PairedRaceOpt = None,
) -> None:
    """Tune the kernel for one problem: run the study until it has --trials finished trials.

    Running it again with the same options does nothing; with a larger --trials it
    continues the study (as `resume` does). Samplers: tpe (FlashCore's default), guided
    (the hopper family's default: its cost model as the prior), tpe-masked, nsga2, cmaes,
    random, grid, and gp where Optuna's GPSampler can run. Several `search` processes
    (on one host or, with a PostgreSQL --storage, on many) may run one study at once:
    together they finish exactly --trials trials and never measure a config twice.
    With --lengths it tunes flash_attention_varlen for a packed batch of those sequences
    (e.g. --shape H=32,HKV=8,D=128 --lengths random:16:128..8192:seed=0).
    """
    problem = problem_of_options(shape, lengths, lengths_k, dtype=dtype, causal=causal)
    racing = session.race_rule(full_timing=full_timing, paired=paired_race)
    named = space is not None or family is not None
    search_space, note = session.pick_space(space, family=family, problem=problem) if named else (None, None)
    if search_space is not None:
        make_sampler(session.sampler_name(sampler, search_space), search_space, seed, problem)
    stages = _stages(replay, "search", replay_delay, gpus)   # refuses at once without a GPU (unless replaying)
    if session.creates_database(storage):   # no study to read: check it all before the file is made
        if search_space is None:
            search_space, note = session.pick_space(problem=problem, replay=replay)
        make_sampler(session.sampler_name(sampler, search_space), search_space, seed, problem)
        stages.check(problem, search_space)
    with ExitStack() as stack:
        started = stages.start(stack)      # the GPU worker comes up while the study opens
        store = open_store(storage)
        stack.callback(store.close)
        if search_space is None:   # the study's own space, else the replayed sweep's, else flash_attention's family
            search_space, note = session.pick_space(problem=problem, replay=replay, store=store, study=study,
                                                    on_wait=cli_diagnostics.waiting)
        if note:
            cli_diagnostics.say(for_terminal(note), style="dim")
        sampler, wait = session.sampler_name(sampler, search_space), cli_diagnostics.waiting
        make_sampler(sampler, search_space, seed, problem)   # an unknown or unusable sampler is refused here
        exists = session.check_exists(store, study, sampler, seed, problem, search_space, on_wait=wait)
        builder, measure = stages.stages(problem, search_space, jobs, stack, started)
        if not exists:
            session.start_study(store, study, problem, search_space, sampler, seed, builder, on_wait=wait)
        _run(store, study, problem, search_space, sampler, seed, trials, builder, measure,
             stale_after=stale_after, mixed_gpus=mixed_gpus, transfer=transfer, racing=racing, storage=storage)


@app.command()
def resume(
    study: StudyOpt,
    trials: ResumeTrialsOpt = None,
    jobs: JobsOpt = None,
    shape: ResumeShapeOpt = None,
    space: ResumeSpaceOpt = None,
    storage: StorageOpt = None,
    replay: ReplayOpt = None,
    gpus: GpusOpt = None,
    mixed_gpus: MixedGpusOpt = False,
    stale_after: StaleAfterOpt = None,
    replay_delay: ReplayDelayOpt = None,
    full_timing: FullTimingOpt = False,
    paired_race: PairedRaceOpt = None,
) -> None:
    """Continue a study to --trials finished trials in total (problem, space, sampler from the study)."""
    racing = session.race_rule(full_timing=full_timing, paired=paired_race)
    wanted_shape = parse_shape_values(shape) if shape is not None else None   # the sizes given: a packed study has no B, S
    wanted_space = session.pick_space(space)[0] if space is not None else None
    stages = _stages(replay, "resume", replay_delay, gpus)   # refuses at once without a GPU (unless replaying)
    store = open_store(storage, must_exist=True)
    with ExitStack() as stack:
        stack.callback(store.close)
        started = stages.start(stack)      # the GPU worker comes up while the study is read
        resumed = session.resume_study(store, study, shape=wanted_shape, space=wanted_space)
        target = trials if trials is not None else store.count_finished(study) + RESUME_STEP
        builder, measure = stages.stages(resumed.problem, resumed.space, jobs, stack, started)
        _run(store, study, resumed.problem, resumed.space, resumed.sampler, resumed.seed, target, builder, measure,
             stale_after=stale_after, mixed_gpus=mixed_gpus, racing=racing, storage=storage)


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
        space = stored_space(store.space_text(study), study, summary.space_name)
        diag = cli_diagnostics.load(store, study)
    finally:
        store.close()
    if as_json:
        print_json({**decoded_json(summary, space), **diag.as_json()})
        return
    render_summary(summary, top, space)
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
        print_lines(cli_diagnostics.profile_table({s: r.figures for s, r in diag.profiles.items()},
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
        result = export_header(store, list(study), output, require_checked=require_checked,
                               study_args=lambda name: study_args(name, storage))   # a remedy names the database
    finally:
        store.close()
    print_lines(export_lines(result))
    say_skipped(result.skipped)


@app.command("compile")
def compile_cmd(
    config: ConfigOpt,
    shape: CompileShapeOpt,
    dtype: DtypeOpt = "fp16",
    causal: CausalOpt = False,
    varlen: VarlenOpt = False,
    as_json: JsonOpt = False,
    space: CompileSpaceOpt = None,
) -> int:
    """Build one config with nvcc (no GPU needed) and show its ptxas report and gate verdict.

    Exit status: 0 when the gate passes it, 3 when it builds but the gate rejects it,
    1 when it cannot be built (the error says why).
    """

    kernel_config = KernelConfig.parse(config)
    problem = Problem(Shape.parse(shape, require=("D",)), dtype=dtype, causal=causal, varlen=varlen)
    # no --space: the packaged space of the family whose parameters the config names
    search_space = (session.pick_space(space)[0] if space is not None
                    else session.space_for_config(kernel_config, problem))
    search_space.validate(kernel_config)
    constraint = search_space.violated(kernel_config, problem)
    if constraint is not None:
        heads = "; or give the heads in --shape (e.g. H=32,HKV=8,D=128)" if "KV_GROUP" in constraint.expr.names else ""
        raise SpaceError(f"--config {kernel_config}: breaks constraint {constraint.name}: {constraint.message}",
                         "no config of this space runs this problem: give another --shape or --dtype, or a --space "
                         "that takes it" if search_space.refused_problem(problem) is not None
                         else f"pick values the space's [[constraints]] allow{heads}")
    with ExitStack() as stack:
        builder = _builder(search_space, 1, stack)
        build = builder.build(kernel_config, problem)
    if not build.ok:
        log = builder.cache.entry_dir(build.key) / "ptxas.log"
        remedy = f"the whole compiler output is in {log}" if log.is_file() else "fix the kernel or pick another config"
        raise EvotunerError(f"compile: nvcc failed for {kernel_config}: {one_line(build.error)}", remedy)
    gate = apply_gate(build, search_space.gate)
    figures = report_dict(gate.report)
    if as_json:
        print_json({
            "params": kernel_config.as_dict(), "gate": figures, "passed": gate.passed, "reason": gate.reason,
            "build_seconds": round(build.seconds, 3), "cached": build.cached,
        })
        return 0 if gate.passed else GATE_REJECTED_EXIT
    pairs = [(key, str(value)) for key, value in figures.items()]
    pairs += [("build", f"{build.seconds:.2f} s{' (cached)' if build.cached else ''}"),
              ("cubin", str(build.artifact.cubin) if build.artifact else "-"),
              ("gate", Text("passed", style="green") if gate.passed else Text(f"rejected: {gate.reason}", style="red"))]
    title = (f"{kernel_config}  ({problem.dtype}, D={problem.shape.head_dim}{', causal' if problem.causal else ''}"
             f"{', packed variable-length' if problem.varlen else ''})")
    print_lines([Text(line) for line in columns.wrap(title, consoles.out.width, 2)]
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
        print_json(result.as_json())
        return
    print_lines(bench_lines(result, consoles.out.width, tuple(space.names)))
    for name, why in result.baseline_reasons.items():
        consoles.err.print(f"{name}: not measured: {one_line(why)}", markup=False, highlight=False)


# -- the search run (its live view: evotuner.cli_render) ----------------------------------


def _run(store, study, problem, space, sampler_name, seed, trials, builder, measure, *,
         stale_after=None, mixed_gpus=False, transfer=False, racing=session.DEFAULT_RULE, storage=None) -> None:
    view = SearchView(study, problem, storage)
    try:
        with view.live():
            result = session.run_study(store, study, problem, space, sampler_name, seed, trials, builder, measure,
                                       on_event=view.on_event, stale_after=stale_after,
                                       mixed_gpus=mixed_gpus, transfer=transfer, racing=racing)
    except KeyboardInterrupt:   # typer would turn it into a silent exit 130: say what was kept
        raise _interrupted(store, study, trials, storage) from None
    view.close(result, store.summary(study), space)


def _interrupted(store: Any, study: str, trials: int, storage: str | None) -> InterruptedByUser:
    kept = f"study {study!r} keeps every trial that finished"
    # The interrupt may have landed inside one of this store's transactions: count through a
    # fresh connection to the same database when the store itself cannot answer.
    for count in (lambda: store.count_finished(study), lambda: _count_fresh(store.url, study)):
        try:
            kept = f"study {study!r} keeps its {count()} finished trials"
            break
        except (EvotunerError, Exception):  # noqa: BLE001 -- the message must come out whatever the database says
            continue
    what = stopping.stopped_by("interrupted")
    return InterruptedByUser(
        f"{what}: {kept}; trials in flight run again on resume (marked FAIL as interrupted, or reaped if left RUNNING)",
        f"continue with `evotuner resume {study_args(study, storage)} --trials {trials}`",
    )


def _count_fresh(url: str, study: str) -> int:
    store = session.open_store(url, must_exist=True)
    try:
        return store.count_finished(study)
    finally:
        store.close()


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


def _interrupt_exit() -> int:
    """128 + the stopping signal's number, as a shell reports it: 130 after Ctrl-C (SIGINT, 2),
    143 after SIGTERM, 129 after SIGHUP."""
    return 128 + (stopping.signal_number() or 2)


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
    debug = os.environ.get(DEBUG_ENV, "").strip().lower() not in _OFF
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)   # the CLI reports progress itself
    # Optuna's storage and psycopg warn in several lines (a retried read, a failed cancel): the CLI's line says it.
    for name in ("optuna.storages._rdb.storage", "psycopg"):     # psycopg: "query cancellation failed", ...
        logging.getLogger(name).setLevel(logging.ERROR)
    with stopping.signals_stop():
        return _main(argv, debug)


def _main(argv: list[str] | None, debug: bool) -> int:
    try:
        result = app(args=argv if argv is not None else sys.argv[1:], prog_name="evotuner", standalone_mode=False)
        if result == 130:   # typer turned a Ctrl-C into a bare exit status
            _error_line(stopping.stopped_by("interrupted by user"))
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
        _error_line(f"{one_line(message)} (see `{getattr(exc.ctx, 'command_path', '') or 'evotuner'} --help`)")
        return int(getattr(exc, "exit_code", 2) or 2)
    except typer.Abort:
        _error_line(stopping.stopped_by("aborted"))
        return _interrupt_exit()
    except KeyboardInterrupt:
        what = stopping.stopped_by("interrupted by user")
        _error_line(f"{what} (trials in flight run again on `evotuner resume`)")
        return _interrupt_exit()
    except Exception as exc:  # noqa: BLE001 -- the one boundary for everything unexpected
        if debug:
            raise
        _error_line(f"unexpected {type(exc).__name__}: {one_line(str(exc))} "
                    f"(run with {DEBUG_ENV}=1 for the traceback)")
        return 1
