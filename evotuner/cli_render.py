"""The command line's rendering: the live search view, the tables (best trials, bench, export),
the study summary and strict JSON. Part of the CLI, the only layer that prints; the commands
in :mod:`evotuner.cli` stay thin."""

from __future__ import annotations

import json
from contextlib import nullcontext
from typing import Any

from rich.console import Group
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from evotuner import cli_diagnostics, columns
from evotuner import events as ev
from evotuner.bench import BASELINE_NAMES
from evotuner.cli_options import consoles, one_line, study_args
from evotuner.config import KernelConfig
from evotuner.errors import EvotunerError
from evotuner.numbers import json_safe
from evotuner.problem import Problem
from evotuner.textsafe import for_terminal
from evotuner.vocabulary import STOPPED_ATTR, config_of

# -- the search run's live view --------------------------------------------------------------


class SearchView:
    """Renders loop events: a progress bar, best so far, counts, builds in flight."""

    def __init__(self, study: str, problem: Problem, storage: str | None = None) -> None:
        self.study = study
        self.storage = storage       # the command's --storage, for the commands it prints
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
        if result.stopped_early:
            self._log(f"racing: {result.stopped_early} of {result.measured} timings stopped early, clearly slower "
                      "than the study's best so far (--full-timing times every config in full)")
        if result.new_trials and result.timings:
            self._log(_time_split(result))
        print_lines(_top_table(summary, 10, dict(summary.baselines or self.baselines or {}), space))
        timed = len(_timed_trials(summary))
        if result.new_trials and timed > 1:
            # the best is a selection: the fastest of many timings, each of which moves between runs
            self._log(f"the best's µs is the fastest of {timed} timings, and one config's timing moves up to ~10% "
                      f"between runs: `evotuner bench {study_args(self.study, self.storage)}` re-times the best 5 beside SDPA in one run")


# -- rendering helpers ---------------------------------------------------------------------


#: ``SearchResult.timings`` keys as the time line names them.
_TIME_PARTS = (("baselines", "baselines"), ("ask", "sampler"), ("build_wait", "waiting on builds"),
               ("gate", "gate"), ("measure", "measuring"), ("record", "recording"))


def _time_split(result: Any) -> str:
    """Where this run's search loop spent its time (per GPU thread on average with --gpus)."""
    n = max(1, result.threads)
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


def decoded_json(summary: Any, space: Any) -> dict[str, Any]:
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


def _timed_trials(summary: Any) -> list[Any]:
    """The study's trials with a timing of their own (COMPLETE, a value, not a duplicate)."""
    return [t for t in summary.trials if t.state == "COMPLETE" and t.value is not None and t.duplicate_of is None]


def _top_table(summary: Any, top: int, baselines: dict[str, float | None], space: Any = None) -> list[Text]:
    """The best trials: one column per parameter under its fixed short header, the figures, the
    legend. A parameter the space allows one value of gets no column: the legend names its value."""
    done = sorted(_timed_trials(summary), key=lambda t: t.value)[:top]
    configs = [_config_values(t, space) for t in done]
    fixed = {p.name: p.values[0] for p in space.params if len(p.values) == 1} if space is not None else {}
    names = [n for n in columns.param_names(configs, tuple(space.names) if space is not None else ())
             if not (n in fixed and all(c.get(n, fixed[n]) == fixed[n] for c in configs))]
    short = columns.headers(names)
    fastest = min((v for v in baselines.values() if v), default=None)
    cols = [columns.Col("#", right=True), *(columns.Col(for_terminal(short[n]), right=True, group=1, tight=True)
              for n in names),
            *(columns.Col(h, right=True, group=2) for h in ("µs", "TFLOPS", "vs SDPA"))]
    stopped = [bool((t.attrs or {}).get(STOPPED_ATTR)) for t in done]
    rows = [[str(t.number), *columns.cells(config, names), f"{t.value:.1f}" + ("*" if cut else ""),
             f"{t.tflops:.1f}" if t.tflops else "-", f"{fastest / t.value:.2f}x" if fastest else "-"]
            for t, config, cut in zip(done, configs, stopped)]
    width = consoles.out.width
    lines = columns.table_lines(cols, rows, width, title=f"best {len(done)} of {len(summary.trials)} trials")
    lines += [Text(line) for line in columns.legend_lines(short, width)]
    held = [f"{n}={v}" for n, v in fixed.items() if n not in names]
    if held and done:
        lines += [Text(line) for line in columns.wrap("every config here: " + ", ".join(held), width, 2)]
    if any(stopped):   # racing stopped these early: their median is of fewer repetitions
        lines += [Text(line) for line in columns.wrap(
            "* timing stopped early (racing): clearly slower than the best, median of fewer repetitions", width, 2)]
    return lines


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


def render_summary(summary: Any, top: int, space: Any) -> None:
    p = summary.problem
    pairs = [
        ("study", for_terminal(summary.study)),
        *_problem_pairs(p),
        ("space", for_terminal(f"{summary.space_name} ({summary.space_fingerprint[:12]})")),
        ("sampler", f"{summary.sampler} seed={summary.seed}"),
        ("device", for_terminal(_device_text(summary.device))),
        ("baselines", ", ".join(f"{k} {v:.1f} µs" for k, v in summary.baselines.items() if v) or "-"),
        ("trials", ", ".join(f"{k} {v}" for k, v in sorted(summary.counts().items())) or "none"),
    ]
    print_lines(columns.kv_lines([(k, Text(v)) for k, v in pairs], consoles.out.width))
    print_lines(_top_table(summary, top, dict(summary.baselines), space))


#: Sequence lengths ``show`` lists one by one; ``show --json`` has them all.
SHOWN_LENGTHS = 64


def _problem_pairs(p: Problem) -> list[tuple[str, str]]:
    """``show``'s problem line (a dense problem's as always), and a packed problem's lengths."""
    if not p.lengths_q:
        return [("problem", f"{p.shape} {p.dtype}{' causal' if p.causal else ''}")]

    def listed(lengths: tuple[int, ...]) -> str:
        more = len(lengths) - SHOWN_LENGTHS
        return ", ".join(map(str, lengths[:SHOWN_LENGTHS])) + (f" ... ({more} more: show --json)" if more > 0 else "")

    pairs = [("problem", f"{p.heads_text()} {p.dtype}{' causal' if p.causal else ''} packed, {p.lengths_text()}"),
             ("lengths", listed(p.lengths_q))]
    if p.lengths_k != p.lengths_q:
        pairs.append(("key lengths", listed(p.lengths_k)))
    return pairs


def export_lines(result: Any) -> list[Text]:
    """The exported rows, one table per kernel family (each its own parameters), then the legend."""
    width = consoles.out.width
    head = f"{for_terminal(result.path)}  ({columns.count(len(result.rows), 'config')})"   # a name may hold ESC
    lines = [Text(line) for line in columns.wrap(head, width, 2)]
    families = list(dict.fromkeys(r.family for r in result.rows))
    shorts: dict[str, str] = {}
    for family in families:
        rows = [(i, r) for i, r in enumerate(result.rows) if r.family == family]
        names = columns.param_names([dict(r.params) for _, r in rows], rows[0][1].order)
        short = columns.headers(names)
        shorts.update(short)
        heads = ("#", "dtype", "D", "causal", "Q≤", "S≤", "chk", "µs")
        cols = [*(columns.Col(h, right=h in ("#", "D", "µs")) for h in heads),
                *(columns.Col(short[n], right=True, group=1, tight=True) for n in names), columns.Col("study", group=2)]
        studies = [for_terminal(f"{r.study} #{r.trial}") + (" (replayed)" if r.replayed else "") for _, r in rows]
        long = max(len(s) for s in studies) > width // 2
        cells = [_export_cells(i, r, names) + ([] if long else [study]) for (i, r), study in zip(rows, studies)]
        lines += [Text("")] + columns.table_lines(cols[:-1] if long else cols, cells, width,
                                                  notes=[f"study {s}" for s in studies] if long else (),
                                                  title=f"{family} ({columns.count(len(rows), 'row')})")
    extra = ["Q≤ = a row serves calls whose query rows B*H*Sq lie in (Q/2, Q]",
             "S≤ = the max seqlen_k a row serves", "chk = evotuner check: ok, FAIL or - (unchecked)"]
    return lines + [Text("")] + [Text(line) for line in columns.legend_lines(shorts, width, extra)]


def print_lines(lines: list[Text]) -> None:
    cli_diagnostics.print_lines(lines)


def _export_cells(i: int, row: Any, names: list[str]) -> list[Any]:
    max_seqlen = "any" if row.max_seqlen >= 2**31 - 1 else str(row.max_seqlen)
    return [str(i), row.dtype, str(row.head_dim), "yes" if row.causal else "no", f"2^{row.query_rows_bucket}",
            max_seqlen, _CHECK_MARK.get(row.checked, row.checked), f"{row.median_us:.1f}",
            *columns.cells(dict(row.params), names)]


#: The export table's ``chk`` cell per `evotuner check` verdict (short: the table fits 80 columns).
_CHECK_MARK = {"passed": "ok", "failed": "FAIL", "unchecked": "-"}


def report_dict(report: Any) -> dict[str, Any]:
    if report is None:
        return {}
    if hasattr(report, "as_dict"):
        return dict(report.as_dict())
    from dataclasses import asdict, is_dataclass

    return asdict(report) if is_dataclass(report) else dict(report)


def print_json(obj: Any) -> None:
    """Strict JSON: a value that is not finite (a damaged row) is null, never NaN or Infinity."""
    consoles.out.file.write(json.dumps(json_safe(obj), indent=2, sort_keys=False, default=str, allow_nan=False) + "\n")
    consoles.out.file.flush()


def bench_lines(result: Any, width: int, order: tuple[str, ...] = ()) -> list[Text]:
    """The configs (one column per parameter, then µs, TFLOPS, the ratio to each SDPA backend
    and the µs the study recorded), then the backends' own figures, then the legend."""
    p = result.problem
    device = _device_text(result.device)
    base = [n for n in BASELINE_NAMES if n in result.baselines] + \
           [n for n in result.baselines if n not in BASELINE_NAMES]
    configs = [dict(row.config.as_dict()) for row in result.rows]
    names = columns.param_names(configs, order)
    short = columns.headers(names)
    cols = [columns.Col("#", right=True), *(columns.Col(short[n], right=True, group=1, tight=True) for n in names),
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
    what = f"{p.shape} {p.dtype}{' causal' if p.causal else ''}" if not p.lengths_q else str(p)
    title = f"{result.study}: {what} on {device}"
    lines = columns.table_lines(cols, rows, width, notes=notes, title=title)
    sdpa = [[name, f"{us:.1f}" if (us := result.baselines.get(name)) else "cannot run",
             f"{tf:.1f}" if (tf := result.baseline_tflops.get(name)) else "-"] for name in base]
    lines += [Text("")] + columns.table_lines(
        [columns.Col("SDPA backend"), columns.Col("µs", right=True), columns.Col("TFLOPS", right=True)], sdpa, width)
    legend = [f"{'/'.join(n.removeprefix('sdpa_') for n in base)} = that SDPA backend's µs / µs (>1: faster)",
              "was = the µs the study recorded"]
    return lines + [Text(line) for line in columns.legend_lines(short, width, legend)]
