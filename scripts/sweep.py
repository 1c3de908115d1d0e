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
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from evotuner.compiler.instantiate import evotuner_version
from evotuner.compiler.result import BuildResult
from evotuner.config import KernelConfig
from evotuner.errors import EvotunerError
from evotuner.measure.base import MeasureFailure, Measurement, MeasureStage
from evotuner.measure.replay import (
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


@dataclass
class SweepSummary:
    output: Path
    rows: list[SweepRow]
    kept: int                      # rows taken over from an interrupted earlier run
    seconds: float
    counts: dict[str, int] = field(default_factory=dict)


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
) -> SweepSummary:
    """Sweep ``space`` at ``problem``; write ``output`` and its sidecar; return the rows in space order."""
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
        for config, future in futures.items():
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

    ordered = [rows[c] for c in configs]
    header["complete"] = limit is None or limit >= space.size
    header["seconds"] = round(time.monotonic() - started, 1)
    counts: dict[str, int] = {}
    for r in ordered:
        counts[r.status] = counts.get(r.status, 0) + 1
    header["counts"] = counts
    write_sweep(output, names, ordered, header)
    return SweepSummary(output, ordered, len(kept), time.monotonic() - started, counts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", required=True, help="B=16,H=16,S=2048,D=64")
    ap.add_argument("--dtype", default="fp16", choices=("fp16", "bf16"))
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--output", required=True, type=Path)
    ap.add_argument("--space", default=None, help="space TOML (default: the packaged default.toml)")
    ap.add_argument("--limit", type=int, default=None, help="sweep only the first N configs (smoke run)")
    ap.add_argument("--jobs", type=int, default=None, help="parallel nvcc builds (default: CPU count)")
    ap.add_argument("--budget-s", type=float, default=0.4, help="GPU timing budget per config")
    ap.add_argument("--fresh", action="store_true", help="ignore rows of an interrupted earlier run")
    args = ap.parse_args(argv)

    from evotuner.compiler import Builder
    from evotuner.measure.gpu import GpuMeasure
    from evotuner.space import load_space

    try:
        problem = Problem(Shape.parse(args.shape), dtype=args.dtype, causal=args.causal)
        space = load_space(args.space)

        def progress(i: int, n: int, row: SweepRow, seconds: float) -> None:
            what = f"{row.median_us:9.1f} us {row.tflops or 0:6.1f} TFLOPS" if row.status == "ok" else row.reason[:90]
            print(f"[{i:4d}/{n}] {row.config}  {row.status:6s} {what}  ({seconds:.2f} s)", flush=True)

        print(f"sweep {space.name} ({space.size} configs) at {problem.shape} {problem.dtype}"
              f"{' causal' if problem.causal else ''} -> {args.output}", flush=True)
        with Builder(space.kernel, arch=space.arch, jobs=args.jobs) as builder, \
                GpuMeasure(budget_s=args.budget_s) as measure:
            summary = run_sweep(space=space, problem=problem, builder=builder, measure=measure,
                                output=args.output, limit=args.limit, fresh=args.fresh, on_row=progress)
    except EvotunerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    best = min((r for r in summary.rows if r.status == "ok"), key=lambda r: r.median_us, default=None)
    print(f"done in {summary.seconds:.0f} s ({summary.kept} rows kept from an earlier run): "
          + ", ".join(f"{k} {v}" for k, v in sorted(summary.counts.items())))
    if best is not None:
        print(f"best {best.config}: {best.median_us:.1f} us, {best.tflops:.1f} TFLOPS")
    print(f"wrote {summary.output} and {sidecar_path(summary.output).name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
