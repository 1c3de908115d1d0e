"""The CLI's ``check`` and ``profile`` commands and the study's diagnostics tables
(shown by ``show`` and ``report``). Part of the CLI (it prints); the work is
:mod:`evotuner.diagnose`'s, the records :mod:`evotuner.storage.diagnostics`'."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.text import Text

from evotuner import columns
from evotuner.cli_options import (
    CausalOpt, DiagSpaceOpt, DtypeOpt, StorageOpt, ToolTimeoutOpt, consoles, one_line, open_store, app,
)
from evotuner.config import KernelConfig
from evotuner.errors import EvotunerError, StudyMismatchError
from evotuner.problem import Problem, Shape
from evotuner.textsafe import for_terminal

OptStudyOpt = Annotated[Optional[str], typer.Option("--study", help="Study whose winners to run (and record into).")]
DiagTopOpt = Annotated[int, typer.Option("--top", min=1, help="How many of the study's best configs.")]
OneConfigOpt = Annotated[Optional[str], typer.Option(
    "--config", help="One config NAME=VALUE,... instead of the study's best (with --study: recorded there).")]
OptShapeOpt = Annotated[Optional[str], typer.Option(
    "--shape", help="With --config and no --study: the problem shape B=..,H=..,S=..,D=.. "
                    "(check needs only D; profile runs at the whole shape).")]
ToolsOpt = Annotated[Optional[str], typer.Option(
    "--tools", help="compute-sanitizer tools, comma-separated [default: memcheck,racecheck,synccheck,initcheck].")]
SdpaOpt = Annotated[bool, typer.Option("--sdpa/--no-sdpa", help="Also profile SDPA's default backend at the shape.")]


@dataclass
class _Selection:
    problem: Problem
    space: Any
    picks: list = field(default_factory=list)       # (trial, KernelConfig, µs)
    study: str | None = None


def _select(store_url: str | None, study: str | None, top: int, config: str | None, shape: str | None,
            dtype: str, causal: bool, space_path: Path | None, require: tuple[str, ...] = ("D",)) -> _Selection:
    from evotuner import session
    from evotuner.bench import best_configs
    from evotuner.space import stored_space

    if study is None:
        _need_target(study, config, shape)
        problem = Problem(Shape.parse(shape, require=require), dtype=dtype, causal=causal)
        cfg = KernelConfig.parse(config)
        # --space: a file or a packaged space's name; none: the space of the family the config names
        space = (session.pick_space(space_path)[0] if space_path is not None
                 else session.space_for_config(cfg, problem))
        space.validate(cfg)
        return _Selection(problem, space, [(None, cfg, None)])
    store = open_store(store_url, must_exist=True)
    try:
        summary = store.summary(study)
        space = stored_space(store.space_text(study), study, summary.space_name)
    finally:
        store.close()
    problem = summary.problem
    if space_path is not None and session.pick_space(space_path)[0].fingerprint() != space.fingerprint():
        raise StudyMismatchError(f"study {study!r} was started with another search space than --space {space_path}",
                                 "drop --space (the study's space is used)")
    if shape is not None and Shape.parse(shape) != problem.shape:
        raise StudyMismatchError(f"study {study!r} tunes shape {problem.shape}, not {Shape.parse(shape)}",
                                 "drop --shape (the study's shape is used)")
    if config is not None:
        cfg = KernelConfig.parse(config)
        space.validate(cfg)
        return _Selection(problem, space, [(None, cfg, None)], study)
    picks = best_configs(summary, space, top)
    if not picks:
        raise EvotunerError(f"study {study!r} has no COMPLETE trial to run", "run `evotuner search` first")
    return _Selection(problem, space, picks, study)


def _need_target(study: str | None, config: str | None, shape: str | None) -> None:
    """What to run: a study, or a config with its shape (checked before any tool is looked up)."""
    if study is None and (config is None or shape is None):
        raise EvotunerError("name --study S (its best configs), or --config C with --shape B=..,H=..,S=..,D=..",
                            "e.g. `evotuner check --study d64 --top 3`")


def check(
    study: OptStudyOpt = None,
    top: DiagTopOpt = 3,
    config: OneConfigOpt = None,
    shape: OptShapeOpt = None,
    dtype: DtypeOpt = "fp16",
    causal: CausalOpt = False,
    tools: ToolsOpt = None,
    timeout: ToolTimeoutOpt = 600.0,
    space: DiagSpaceOpt = None,
    storage: StorageOpt = None,
) -> None:
    """Run the study's best configs under compute-sanitizer (memcheck, racecheck, synccheck,
    initcheck) at small ragged shapes and record each tool's verdict in the study.

    Each (config, tool) runs in its own GPU worker under the tool, with --timeout. Exit
    status 1 when a config did not pass; `export --require-checked` reads the verdicts.
    """
    from evotuner import diagnose
    from evotuner.storage import diagnostics
    from evotuner.tools import sanitizer

    wanted = diagnose.parse_tools(tools)
    _need_target(study, config, shape)
    exe = sanitizer.executable()                 # ToolMissingError: one line naming compute-sanitizer
    diagnose.require_gpu("check")                # NoGpuError: one line
    sel = _select(storage, study, top, config, shape, dtype, causal, space)
    targets = diagnose.build_targets(sel.space, sel.problem, sel.picks)
    p = sel.problem
    say(f"checking {columns.count(len(targets), 'config')} at {p.dtype} D={p.shape.head_dim}"
        f"{' causal' if p.causal else ''} with {', '.join(wanted)} ({exe})")
    store = open_store(storage, must_exist=True) if sel.study else None
    results: dict[str, dict[str, Any]] = {}
    try:
        for target, outcome in diagnose.iter_checks(targets, p, wanted, exe=exe, timeout_s=timeout):
            results.setdefault(outcome.config, {})[outcome.tool] = outcome
            if store is not None:
                diagnostics.record_check(store, sel.study, outcome.config, outcome.tool, passed=outcome.passed,
                                         errors=outcome.errors, warnings=outcome.warnings, complete=outcome.complete,
                                         findings=outcome.findings, shapes=outcome.shapes, seconds=outcome.seconds,
                                         tool_version=outcome.tool_version)
            where = f"#{target.trial} " if target.trial is not None else ""
            verdict = "clean" if outcome.passed else f"FAILED ({outcome.errors} error(s))"
            line = f"{where}{outcome.config} {outcome.tool}: {verdict}, {outcome.seconds:.1f} s"
            if not outcome.passed and outcome.findings:
                line += f": {one_line(outcome.findings[0])}"
            say(line)
    finally:
        if store is not None:
            store.close()
    failed = [c for c, by in results.items() if not all(o.passed for o in by.values())]
    recorded = f"; recorded in study {sel.study!r}" if sel.study else " (not recorded: no --study)"
    say(f"{len(results) - len(failed)} of {columns.count(len(results), 'config')} clean{recorded}")
    if failed:
        raise EvotunerError(f"check: {len(failed)} of {len(results)} config(s) did not pass: {', '.join(failed)}",
                            "see the findings above (or `evotuner show --study S`)")


def profile(
    study: OptStudyOpt = None,
    top: DiagTopOpt = 3,
    config: OneConfigOpt = None,
    shape: OptShapeOpt = None,
    dtype: DtypeOpt = "fp16",
    causal: CausalOpt = False,
    sdpa: SdpaOpt = True,
    timeout: ToolTimeoutOpt = 600.0,
    space: DiagSpaceOpt = None,
    storage: StorageOpt = None,
) -> None:
    """Profile the study's best configs (and SDPA's default backend) with Nsight Compute at the
    study's shape; record occupancy, tensor-pipe use, DRAM/L2 throughput, shared-memory bank
    conflicts, registers and the top warp stall reasons."""
    from evotuner import diagnose
    from evotuner.storage import diagnostics
    from evotuner.tools import ncu

    _need_target(study, config, shape)
    exe = ncu.executable()                       # ToolMissingError: one line naming ncu
    diagnose.require_gpu("profile")
    sel = _select(storage, study, top, config, shape, dtype, causal, space, require=("B", "H", "S", "D"))
    targets = diagnose.build_targets(sel.space, sel.problem, sel.picks)
    version = diagnose.tool_version(exe)
    device = _device_name()
    say(f"profiling {len(targets)} config(s){' and SDPA' if sdpa else ''} at {sel.problem.shape} "
        f"{sel.problem.dtype}{' causal' if sel.problem.causal else ''} ({exe})")
    store = open_store(storage, must_exist=True) if sel.study else None
    outcomes = []
    try:
        for target in [*targets, *([None] if sdpa else [])]:
            outcome = diagnose.profile(sel.problem, exe=exe, target=target, version=version, timeout_s=timeout)
            outcomes.append(outcome)
            if outcome.figures is None:
                say(f"{outcome.subject}: no profile ({one_line(outcome.error)}), {outcome.seconds:.1f} s")
                continue
            say(f"{outcome.subject}: {outcome.figures.get('kernel')} profiled in {outcome.seconds:.1f} s")
            if store is not None:
                diagnostics.record_profile(store, sel.study, outcome.subject, outcome.kind,
                                           problem=sel.problem.as_dict(), figures=outcome.figures,
                                           seconds=outcome.seconds, tool_version=version, device=device)
    finally:
        if store is not None:
            store.close()
    rows = {o.subject: o for o in outcomes if o.figures is not None}
    if rows:
        print_lines(profile_table({s: o.figures for s, o in rows.items()},
                                  {s: o.seconds for s, o in rows.items()}, f"ncu at {sel.problem.shape}"))
    if len(rows) < len(outcomes):
        raise EvotunerError(f"profile: {len(outcomes) - len(rows)} of {len(outcomes)} run(s) gave no profile",
                            "see the reasons above")


def _device_name() -> str:
    try:
        from evotuner import childproc

        out = childproc.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"], timeout_s=20)
        text = out.output.decode("utf-8", errors="replace").strip()
        return text.splitlines()[0] if out.returncode == 0 and text else ""
    except (OSError, IndexError, Exception):  # noqa: BLE001 -- the name is informative only
        return ""


# -- show / report -------------------------------------------------------------------------


@dataclass
class Diagnostics:
    checks: dict = field(default_factory=dict)     # config -> tool -> CheckRecord
    profiles: dict = field(default_factory=dict)   # subject -> ProfileRecord

    def as_json(self) -> dict[str, Any]:
        return {"checks": {c: {t: r.as_dict() for t, r in by.items()} for c, by in self.checks.items()},
                "profiles": {s: r.as_dict() for s, r in self.profiles.items()}}


def load(store: Any, study: str) -> Diagnostics:
    from evotuner.storage import diagnostics

    return Diagnostics(diagnostics.latest_checks(store, study), diagnostics.latest_profiles(store, study))


def checks_table(checks: dict, order: tuple[str, ...] = ()) -> list[Text]:
    """One row per checked config (a column per parameter), each tool's verdict; the first
    finding of a config that failed is wrapped under its row."""
    from evotuner.export import CHECK_TOOLS
    from evotuner.storage.diagnostics import verdict

    configs = {c: _config_dict(c) for c in checks}
    names = columns.param_names([d for d in configs.values() if d is not None], order)
    short = columns.headers(names)
    cols = [*(columns.Col(short[n], right=True, tight=True) for n in names),
            *(columns.Col(h, right=True, group=1) for h in (*CHECK_TOOLS, "verdict"))]
    rows, notes = [], []
    for config, by in checks.items():
        cells: list[Any] = []
        for tool in CHECK_TOOLS:
            r = by.get(tool)
            cells.append("-" if r is None else Text("clean", style="green") if r.passed
                         else Text(f"{r.errors} err" + ("" if r.complete else "+"), style="red"))
        first = next((r.findings[0] for t in CHECK_TOOLS if (r := by.get(t)) and not r.passed and r.findings), "")
        v = verdict(by, CHECK_TOOLS)
        params = configs[config]
        rows.append([*columns.cells(params, names), *cells,
                     Text(v, style={"passed": "green", "failed": "red"}.get(v, "yellow"))])
        unparsed = "" if params is not None else f"config {config}"
        notes.append("; ".join(filter(None, [unparsed, f"first finding: {one_line(first)[:300]}" if first else ""])))
    width = consoles.out.width
    lines = columns.table_lines(cols, rows, width, notes=notes,
                                title="evotuner check (compute-sanitizer, latest run per tool)")
    return lines + [Text(line) for line in columns.legend_lines(short, width)]


def _config_dict(text: str) -> dict[str, int] | None:
    try:
        return KernelConfig.parse(text).as_dict()
    except (EvotunerError, ValueError):
        return None


def profile_table(figures: dict, seconds: dict | None = None, title: str = "ncu profiles (latest per config)") -> list[Text]:
    """One row per figure, one column per subject (the configs, then SDPA's kernel); subjects
    that do not fit beside the others make a further table with the figure names again."""
    from evotuner.diagnose import PROFILE_COLUMNS, SDPA_SUBJECT

    configs = [s for s in figures if s != SDPA_SUBJECT]
    order = configs + [s for s in figures if s == SDPA_SUBJECT]
    heads = {s: (f"config {i + 1}" if s != SDPA_SUBJECT else "SDPA") for i, s in enumerate(order)}
    legend = [f"config {i + 1} = {s}" for i, s in enumerate(configs)]
    if SDPA_SUBJECT in figures:
        legend.append(f"SDPA = default backend: {figures[SDPA_SUBJECT].get('kernel', '?')}")
    rows = [[head, *(_fmt(figures[s].get(key)) for s in order)] for key, head in PROFILE_COLUMNS]
    for rank in range(3):
        cells = []
        for s in order:
            stalls = figures[s].get("top_stalls") or []
            cells.append(f"{stalls[rank][0]} {stalls[rank][1]:g}" if rank < len(stalls) else "-")
        rows.append([f"stall #{rank + 1} (warps/issue)", *cells])
    if seconds:
        rows.append(["ncu run, s", *(f"{seconds.get(s, 0.0):.1f}" for s in order)])
    cols = [columns.Col("figure", key=True), *(columns.Col(heads[s], right=True, group=i) for i, s in enumerate(order))]
    width = consoles.out.width
    lines = columns.table_lines(cols, rows, width, title=title)
    return lines + [Text(part) for line in legend for part in columns.wrap(line, width, 2)]


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.1f}" if abs(v) < 1e5 else f"{v:.3g}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def render(diag: Diagnostics, order: tuple[str, ...] = ()) -> None:
    """The study's check verdicts and profiles (``order``: the space's parameter names)."""
    if diag.checks:
        print_lines(checks_table(diag.checks, order))
    if diag.profiles:
        print_lines(profile_table({s: r.figures for s, r in diag.profiles.items()},
                                  {s: r.seconds for s, r in diag.profiles.items()}))


def waiting(message: str) -> None:
    """A wait for another process's study creation (evotuner.storage.start.await_study), told once."""
    say(for_terminal(message), style="dim")


def say(line: str, style: str = "") -> None:
    """One message, wrapped at word boundaries to the console's width (later lines indented)."""
    print_lines([Text(part, style=style) for part in columns.wrap(line, consoles.out.width, 4)])


def print_lines(lines: list[Text]) -> None:
    """Lines laid out by :mod:`evotuner.columns`: printed as they are, never re-wrapped or cut."""
    for line in lines:
        consoles.out.print(line, soft_wrap=True, highlight=False)


def profiles_markdown(diag: Diagnostics) -> str:
    """The profiles as a Markdown table (``report`` writes it next to the plots)."""
    from evotuner.diagnose import PROFILE_COLUMNS, SDPA_SUBJECT

    heads = ["subject", *(h for _, h in PROFILE_COLUMNS), "top stalls", "device", "ncu"]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    order = [s for s in diag.profiles if s != SDPA_SUBJECT] + [s for s in diag.profiles if s == SDPA_SUBJECT]
    for s in order:
        r = diag.profiles[s]
        f = r.figures
        stalls = ", ".join(f"{k} {v:g}" for k, v in f.get("top_stalls") or [])
        name = f"{s} ({f.get('kernel')})" if s == SDPA_SUBJECT else s
        lines.append("| " + " | ".join([name, *(_fmt(f.get(k)) for k, _ in PROFILE_COLUMNS), stalls, r.device,
                                        r.tool_version]) + " |")
    return "\n".join(lines) + "\n"
