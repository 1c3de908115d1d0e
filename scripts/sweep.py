#!/usr/bin/env python3
"""Sweep every config of a search space at one problem and record it for replay.

    python scripts/sweep.py --shape B=16,H=16,S=2048,D=64 --dtype fp16 \\
        --output tests/data/sweep_h100_d64.csv
    python scripts/sweep.py --shape B=8,H=16,S=2048,D=128 --dtype fp16 \\
        --output tests/data/sweep_h100_d128.csv

One CSV row per config of the space (format: evotuner.measure.replay): statically
pruned configs are ``gated`` with the constraint's message, ptxas-gated ones
``gated`` with the gate's reason, compile errors and measure failures ``failed``,
the rest measured. The sidecar ``<csv>.json`` holds the problem, the space
fingerprint, the device fingerprint, the SDPA baselines measured in the same run,
nvcc and evotuner versions and the date.

All builds are submitted to the Builder at once (parallel nvcc, cached), then
configs are measured one at a time on the GPU worker (``--budget-s`` per config).
A failing config is a row, never a crash. Rows are appended as they are
measured, so an interrupted sweep rerun with the same arguments keeps the rows it
has (``--fresh`` starts over) and the finished file is rewritten in space order.
``--limit N`` sweeps only the first N configs (a smoke run).

Several sweeps in one run (``--sweep SHAPE:DTYPE[:causal]:OUTPUT``, repeatable) share
one Builder and one GPU worker: the later sweeps' builds are queued at once, so nvcc
compiles them while the GPU times the first. ``--stop-after-s`` stops measuring at a
time limit and leaves every file resumable (exit status 3: rerun to carry on).
The hopper family's space is too large to time whole; its sweeps cover the sub-grid
``search_spaces/hopper_grid.toml`` (every config of it)::

    python scripts/sweep.py --space search_spaces/hopper_grid.toml --budget-s 0.2 \\
        --sweep B=16,H=16,S=2048,D=64:fp16:tests/data/sweep_h100_hopper_d64.csv \\
        --sweep B=8,H=16,S=2048,D=128:fp16:tests/data/sweep_h100_hopper_d128.csv
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import math
import re
import sys
import time
from concurrent.futures import as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from evotuner.version import evotuner_version
from evotuner.compiler.result import BuildResult
from evotuner.config import KernelConfig
from evotuner.errors import EvotunerError
from evotuner.measure.base import MeasureFailure, Measurement, MeasureStage
from evotuner.measure.sweep import (
    BUILD_KIND,
    GATE_KIND,
    RESULT_COLUMNS,
    ReplayError,
    SweepRow,
    parse_row,
    sidecar_path,
    write_sidecar,
    write_sweep,
)
from evotuner.problem import Problem, Shape
from evotuner.scriptargs import ArgumentParser


@dataclass
class SweepSummary:
    output: Path
    rows: list[SweepRow]
    kept: int                      # rows taken over from an interrupted earlier run
    seconds: float
    counts: dict[str, int] = field(default_factory=dict)
    done: bool = True              # False: stopped at the deadline, rerun to carry on


def _figures(gate: Any) -> dict[str, int | None]:
    report = getattr(gate, "report", None)
    if report is None:
        return {"registers": None, "spill_bytes": None, "smem_bytes": None}
    return {"registers": report.registers, "spill_bytes": report.spill_bytes, "smem_bytes": report.smem}


def _built_row(config: KernelConfig, build: BuildResult, status: str, reason: str, kind: str,
               gate: Any = None, outcome: Any = None) -> SweepRow:
    meta = dict(build.artifact.meta) if build.artifact is not None else {}
    values: dict[str, Any] = dict(_figures(gate))
    if isinstance(outcome, Measurement):
        values.update(median_us=outcome.median_us, p20_us=outcome.p20_us, p80_us=outcome.p80_us,
                      tflops=outcome.tflops, max_error=outcome.max_error, tolerance=outcome.tolerance,
                      repetitions=outcome.repetitions)
    return SweepRow(config=config, status=status, reason=reason, failure_kind=kind, meta=meta,
                    ptxas_log=_entry_log(build.ptxas_log), **values)


def _entry_log(log: str) -> str:
    """The ptxas lines of the build log (what the gate reads), without compiler chatter."""
    lines = [line for line in (log or "").splitlines() if line.startswith("ptxas") or line.startswith("    ")]
    return "\n".join(lines)


def judge(config: KernelConfig, build: BuildResult, space: Any, problem: Problem, measure: MeasureStage) -> SweepRow:
    """One built config -> its row: build failure, gate verdict, or the measure stage's outcome."""
    from evotuner.gate import GateError, apply_gate

    if not build.ok or build.artifact is None:
        return SweepRow(config=config, status="failed", reason=build.error or "no artifact", failure_kind=BUILD_KIND,
                        ptxas_log=_entry_log(build.ptxas_log))
    try:
        gate = apply_gate(build, space.gate)
    except GateError as exc:
        return _built_row(config, build, "failed", f"ptxas report unreadable: {exc}", BUILD_KIND)
    if not gate.passed:
        return _built_row(config, build, "gated", gate.reason or "gated", GATE_KIND, gate)
    outcome = measure.measure(build.artifact, problem)
    if isinstance(outcome, MeasureFailure):
        return _built_row(config, build, "failed", outcome.reason, outcome.kind, gate)
    return _built_row(config, build, "ok", "", "", gate, outcome)


def _read_partial(path: Path, names: tuple[str, ...]) -> dict[KernelConfig, SweepRow]:
    """Rows of an interrupted sweep (a torn last line is dropped)."""
    if not path.is_file():
        return {}
    out: dict[KernelConfig, SweepRow] = {}
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        head = next(reader, None)
        if head != list(names) + list(RESULT_COLUMNS):
            return {}
        for lineno, cells in enumerate(reader, start=2):
            if len(cells) != len(head):
                continue
            try:
                row = parse_row(path, lineno, names, cells)
            except ReplayError:
                continue
            out[row.config] = row
    return out


def run_sweep(
    *,
    space: Any,
    problem: Problem,
    builder: Any,
    measure: MeasureStage,
    output: str | Path,
    limit: int | None = None,
    fresh: bool = False,
    extra_header: dict[str, Any] | None = None,
    on_row: Callable[[int, int, SweepRow, float], None] | None = None,
    deadline: float | None = None,
) -> SweepSummary:
    """Sweep ``space`` at ``problem``; write ``output`` and its sidecar; return the rows in space order.

    ``deadline`` (a ``time.monotonic()`` value): measure no config after it; the file then
    holds the rows so far, in the order measured, its sidecar says ``complete: false``,
    and a rerun with the same arguments carries on from there."""
    started = time.monotonic()
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    names = space.names
    configs = list(space.configs())[: limit if limit else None]
    kept: dict[KernelConfig, SweepRow] = {}
    side = sidecar_path(output)
    if not fresh and side.is_file():
        import json

        try:
            old = json.loads(side.read_text())
        except ValueError:
            old = {}
        if old.get("problem") == problem.as_dict() and old.get("space_fingerprint") == space.fingerprint():
            kept = _read_partial(output, names)
    device = measure.device()
    baselines = measure.baselines(problem)
    header = {
        "problem": problem.as_dict(),
        "shape": str(problem.shape),
        "dtype": problem.dtype,
        "causal": problem.causal,
        "space_name": space.name,
        "space_fingerprint": space.fingerprint(),
        "device": device,
        "baselines": baselines,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "evotuner_version": evotuner_version(),
        "nvcc_version": builder.nvcc_version(),
        "source_hash": builder.source_hash(),
        "configs": len(configs),
        "complete": False,
    }
    header.update(extra_header or {})
    write_sidecar(output, header)

    rows: dict[KernelConfig, SweepRow] = {}
    futures = {}
    for config in configs:
        if config in kept:
            rows[config] = kept[config]
            continue
        constraint = space.violated(config, problem)
        if constraint is not None:
            rows[config] = SweepRow(config=config, status="gated", reason=constraint.message)
        else:
            futures[config] = builder.submit(config, problem)

    with open(output, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(list(names) + list(RESULT_COLUMNS))
        for row in rows.values():
            writer.writerow(row.as_csv(names))
        f.flush()
        done = len(rows)
        # Measured in the order the builds finish (no row waits behind a slow compile);
        # the finished file is rewritten in space order.
        waiting = {future: config for config, future in futures.items()}
        for future in as_completed(waiting):
            config = waiting[future]
            if deadline is not None and time.monotonic() > deadline:
                break
            t0 = time.monotonic()
            try:
                row = judge(config, future.result(), space, problem, measure)
            except Exception as exc:  # noqa: BLE001 -- one config's failure is a row, never a crash
                row = SweepRow(config=config, status="failed", reason=f"{type(exc).__name__}: {exc}",
                               failure_kind=BUILD_KIND)
            rows[config] = row
            writer.writerow(row.as_csv(names))
            f.flush()
            done += 1
            if on_row is not None:
                on_row(done, len(configs), row, time.monotonic() - t0)

    if len(rows) < len(configs):                 # stopped at the deadline: keep the rows as written
        header["seconds"] = round(time.monotonic() - started, 1)
        write_sidecar(output, header)
        partial = list(rows.values())
        return SweepSummary(output, partial, len(kept), time.monotonic() - started, _count(partial), done=False)
    ordered = [rows[c] for c in configs]
    header["complete"] = limit is None or limit >= space.size
    header["seconds"] = round(time.monotonic() - started, 1)
    counts = _count(ordered)
    header["counts"] = counts
    write_sweep(output, names, ordered, header)
    return SweepSummary(output, ordered, len(kept), time.monotonic() - started, counts)


def _count(rows: list[SweepRow]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    return counts


@dataclass(frozen=True)
class SweepJob:
    problem: Problem
    output: Path


def _problem(shape: str, dtype: str, causal: bool, flag: str) -> Problem:
    """The problem a sweep times; ArgumentTypeError naming ``flag`` (what the user wrote)."""
    if dtype not in ("fp16", "bf16"):
        raise argparse.ArgumentTypeError(f"{flag}: dtype {dtype!r} is not fp16 or bf16")
    try:
        return Problem(Shape.parse(shape), dtype=dtype, causal=causal)
    except EvotunerError as exc:
        message = re.sub(r"^(--shape|shape): ", "", str(exc))
        raise argparse.ArgumentTypeError(f"{flag}: {message}") from None


def _job_output(text: str, flag: str) -> Path:
    """A sweep's CSV (and its sidecar): not empty, not a link, a folder or a database, in a folder
    that exists."""
    from evotuner.atomicfile import check_target

    if not text.strip():
        raise argparse.ArgumentTypeError(f"{flag}: the output path is empty")
    path = Path(text)
    try:
        check_target(path, option=flag)
        check_target(sidecar_path(path), option=flag)       # the sidecar is written beside it
    except EvotunerError as exc:
        raise argparse.ArgumentTypeError(f"{flag}: {exc}") from None
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{flag} {path}: the folder {path.parent} does not exist (create it first)")
    return path


def parse_job(text: str) -> SweepJob:
    """``SHAPE:DTYPE[:causal]:OUTPUT``, e.g. ``B=4,H=16,S=4096,D=64:fp16:causal:out.csv``."""
    parts = text.split(":")
    if len(parts) not in (3, 4) or (len(parts) == 4 and parts[2] != "causal"):
        raise argparse.ArgumentTypeError(f"{text!r}: write SHAPE:DTYPE[:causal]:OUTPUT "
                                         "(an OUTPUT with ':' in its name: give it with --shape/--output)")
    flag = repr(text)       # argparse names --sweep itself
    return SweepJob(_problem(parts[0], parts[1], len(parts) == 4, flag), _job_output(parts[-1], flag))


def resume_refusal(job: SweepJob, space: Any, fresh: bool) -> str | None:
    """Why ``job.output`` exists but this run would not resume it (and so would truncate it); None
    when it is absent, resumable, or --fresh asks to start over."""
    import json

    output = job.output
    if fresh or not output.exists():
        return None
    side = sidecar_path(output)
    if not side.is_file():
        return f"{output} exists and has no sidecar {side.name}, so it is no sweep this run can resume"
    try:
        old = json.loads(side.read_text())
    except (OSError, ValueError):
        return f"{output} exists and its sidecar {side.name} is unreadable"
    if not isinstance(old, dict) or old.get("problem") != job.problem.as_dict():
        return f"{output} holds a sweep of another problem ({old.get('shape') if isinstance(old, dict) else '?'})"
    if old.get("space_fingerprint") != space.fingerprint():
        return f"{output} holds a sweep of another search space ({old.get('space_name')})"
    try:
        with open(output, newline="", encoding="utf-8") as f:
            head = next(csv.reader(f), None)
    except (OSError, UnicodeDecodeError, csv.Error):
        head = None
    if head != list(space.names) + list(RESULT_COLUMNS):
        return f"{output} exists and is not a sweep CSV of this space (its header differs)"
    return None


def prefetch(space: Any, job: SweepJob, builder: Any, fresh: bool) -> int:
    """Queue the builds a later sweep will need (not those an earlier run recorded), so nvcc
    works while the GPU times the current sweep. Returns how many were queued."""
    kept = {} if fresh else _read_partial(job.output, space.names)
    n = 0
    for config in space.configs():
        if config not in kept and space.violated(config, job.problem) is None:
            builder.submit(config, job.problem)
            n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", help="B=16,H=16,S=2048,D=64")
    ap.add_argument("--dtype", default="fp16", choices=("fp16", "bf16"))
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--output", type=Path, help="the sweep CSV (with --shape; its sidecar is <csv>.json)")
    ap.add_argument("--sweep", type=parse_job, action="append", default=[], metavar="SHAPE:DTYPE[:causal]:OUTPUT",
                    help="one sweep of several run in turn (repeatable; instead of --shape/--output): "
                         "every sweep's builds are queued at once, so nvcc never waits on the GPU")
    ap.add_argument("--space", default=None, help="space TOML (default: the packaged flashcore.toml)")
    ap.add_argument("--limit", type=int, default=None, help="sweep only the first N configs (smoke run)")
    ap.add_argument("--jobs", type=int, default=None, help="parallel nvcc builds (default: CPU count)")
    ap.add_argument("--budget-s", type=float, default=0.4, help="GPU timing budget per config")
    ap.add_argument("--fresh", action="store_true", help="ignore rows of an interrupted earlier run")
    ap.add_argument("--stop-after-s", type=float, default=None,
                    help="measure nothing after this many seconds; the files stay resumable (rerun to carry on)")
    args = ap.parse_args(argv)
    jobs = list(args.sweep)
    if args.shape or args.output:
        if not (args.shape and args.output):
            ap.error("--shape and --output go together")
        try:
            problem = _problem(args.shape, args.dtype, args.causal, f"--shape {args.shape!r}")
            output = _job_output(str(args.output), "--output")
        except argparse.ArgumentTypeError as exc:
            ap.error(str(exc))
        jobs.insert(0, SweepJob(problem, output))
    if not jobs:
        ap.error("give --shape and --output, or one or more --sweep")

    from evotuner.compiler import Builder
    from evotuner.measure.gpu import GpuMeasure
    from evotuner.space import load_space

    started = time.monotonic()
    deadline = started + args.stop_after_s if args.stop_after_s else None
    summaries: list[SweepSummary] = []
    try:
        space = load_space(args.space)
        for job in jobs:           # before the GPU and nvcc start: never truncate a file it cannot resume
            why = resume_refusal(job, space, args.fresh)
            if why is not None:
                print(f"error: {why}: this run would overwrite it (give another output, delete it, or pass "
                      f"--fresh to start it over)", file=sys.stderr)
                return 1

        def progress(i: int, n: int, row: SweepRow, seconds: float) -> None:
            what = f"{row.median_us:9.1f} us {row.tflops or 0:6.1f} TFLOPS" if row.status == "ok" else row.reason[:90]
            print(f"[{i:4d}/{n}] {row.config}  {row.status:6s} {what}  ({seconds:.2f} s, "
                  f"t={time.monotonic() - started:.0f} s)", flush=True)

        with Builder(space.kernel, arch=space.arch, jobs=args.jobs) as builder, \
                GpuMeasure(budget_s=args.budget_s) as measure:
            # Start the GPU worker before nvcc takes every core: on the 16-core H100 machine a
            # worker started under 14-16 compiles took 200-340 s to import torch and make its
            # CUDA context (three sweep runs, 2026-11-23); started first it takes seconds.
            measure.device()
            if args.limit is None:
                for job in (jobs if len(jobs) > 1 else []):
                    print(f"queued {prefetch(space, job, builder, args.fresh)} builds for {job.output}", flush=True)
            for job in jobs:
                problem = job.problem
                print(f"sweep {space.name} ({space.size} configs) at {problem.shape} {problem.dtype}"
                      f"{' causal' if problem.causal else ''} -> {job.output}", flush=True)
                summary = run_sweep(space=space, problem=problem, builder=builder, measure=measure,
                                    output=job.output, limit=args.limit, fresh=args.fresh, on_row=progress,
                                    deadline=deadline)
                summaries.append(summary)
                _report(summary)
                if not summary.done:
                    print(f"stopped after {args.stop_after_s:g} s: rerun the same command to carry on", flush=True)
                    return 3
    except EvotunerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _report(summary: SweepSummary) -> None:
    best = min((r for r in summary.rows if r.status == "ok"), key=lambda r: r.median_us or math.inf, default=None)
    print(f"{'done' if summary.done else 'stopped'} in {summary.seconds:.0f} s ({summary.kept} rows kept from an "
          f"earlier run): " + ", ".join(f"{k} {v}" for k, v in sorted(summary.counts.items())))
    if best is not None:
        print(f"best {best.config}: {best.median_us:.1f} us, {best.tflops:.1f} TFLOPS")
    print(f"wrote {summary.output} and {sidecar_path(summary.output).name}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
