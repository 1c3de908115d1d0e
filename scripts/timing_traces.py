#!/usr/bin/env python3
"""Record whole timing traces (every repetition, in time order) of configs of a recorded sweep,
as the GPU worker times them, to study the racing rule on real repetitions (docs/measurement.md).

    python scripts/timing_traces.py [--sweep tests/data/sweep_h100_hopper_d128_causal.csv] [--top 24]
                                    [--spread 8] [--leads always,chunk,always] [--warmups 10,10,10]
                                    [--budget 0.5]
                                    --output FILE.json

Takes the sweep's ``--top`` fastest configs and ``--spread`` more spread over the rest (by
recorded median), builds them for the sweep's problem, and times each once per pass (one pass
per entry of ``--leads``: ``always``, a host lead before every repetition as the worker
times, or ``chunk``, before the first of each chunk only: ``time_cuda(lead=False)``) in a
shuffled order with ``timing.time_cuda`` (the worker's budget, L2 flushed before each
repetition). Writes ``{problem, device, leads, configs: [{config, recorded_median_us,
passes: [[µs, ...], ...], clocks_mhz: [SM clock after each pass's timing, ...]}]}``. Needs a GPU.
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from pathlib import Path

import torch

from evotuner.compiler.builder import Builder
from evotuner.measure.fingerprint import collect
from evotuner.measure.sweep import read_sweep
from evotuner.runtime import timing
from evotuner.runtime.check import make_inputs
from evotuner.runtime.loader import KernelModule
from evotuner.scriptargs import ArgumentParser


def pick(rows: list, top: int, spread: int) -> list:
    """The ``top`` fastest rows and ``spread`` more evenly spaced over the rest."""
    ordered = sorted(rows, key=lambda r: r.median_us)
    chosen = ordered[:top]
    rest = ordered[top:]
    if spread and rest:
        step = max(1, len(rest) // spread)
        chosen += rest[::step][:spread]
    return chosen


def _sm_clock() -> int | None:
    """The SM clock now (MHz, through NVML), or None where NVML cannot say."""
    try:
        return int(torch.cuda.clock_rate(0))
    except Exception:  # noqa: BLE001 -- a reading for the record only
        return None


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweep", default="tests/data/sweep_h100_hopper_d128_causal.csv")
    ap.add_argument("--top", type=int, default=24)
    ap.add_argument("--spread", type=int, default=8)
    ap.add_argument("--warmups", default="", help="warm-up calls per pass, comma-separated (default 10 each)")
    ap.add_argument("--budget", type=float, default=0.5)
    ap.add_argument("--leads", default="always,chunk,always",
                    help="one pass per entry: a host lead before every repetition (always, as the worker "
                         "times) or before the first of each chunk only (chunk)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output", required=True)
    args = ap.parse_args(argv)
    leads = [x.strip() for x in args.leads.split(",") if x.strip()]
    if not leads or any(x not in ("always", "chunk") for x in leads):
        print(f"error: --leads {args.leads!r}: a comma-separated list of always and chunk", file=sys.stderr)
        return 2
    try:
        warmups = [int(x) for x in args.warmups.split(",")] if args.warmups.strip() else [10] * len(leads)
    except ValueError:
        warmups = []
    if len(warmups) != len(leads) or min(warmups) < 0:
        print(f"error: --warmups {args.warmups!r}: one count >= 0 per pass of --leads", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: timing_traces needs a CUDA GPU", file=sys.stderr)
        return 1
    sweep = read_sweep(args.sweep)
    problem = sweep.problem
    rows = [r for r in sweep.rows.values() if r.status == "ok" and r.median_us]
    chosen = pick(rows, args.top, args.spread)
    t0 = time.perf_counter()
    with Builder("hopper") as builder:
        futures = [(row, builder.submit(row.config, problem)) for row in chosen]
        built = []
        for row, fut in futures:
            result = fut.result()
            if result.ok and result.artifact is not None:
                built.append((row, result.artifact))
            else:
                print(f"skip {row.config}: build failed: {result.error}", file=sys.stderr)
    print(f"built {len(built)} configs in {time.perf_counter() - t0:.1f} s", flush=True)
    q, k, v = make_inputs(problem.shape, problem.dtype, device="cuda", seed=args.seed)
    out = torch.empty_like(q)
    scale = 1.0 / math.sqrt(problem.shape.head_dim)
    modules = [(row, KernelModule.load(art, device=0, cache=False)) for row, art in built]
    traces: dict[int, list[list[float]]] = {i: [] for i in range(len(modules))}
    clocks: dict[int, list[int | None]] = {i: [] for i in range(len(modules))}
    rng = random.Random(args.seed)
    for p, name in enumerate(leads):
        lead = name == "always"
        order = list(range(len(modules)))
        rng.shuffle(order)
        started = time.perf_counter()
        for i in order:
            module = modules[i][1]
            t = timing.time_cuda(lambda m=module: m.launch(q, k, v, out, None, scale), budget_s=args.budget,
                                 lead=lead, warmup=warmups[p])
            traces[i].append(list(t.samples_us))
            clocks[i].append(_sm_clock())
        print(f"pass {p} (lead {name}): {len(order)} configs in {time.perf_counter() - started:.1f} s", flush=True)
    report = {
        "problem": problem.as_dict(), "device": collect(0), "budget_s": args.budget, "leads": leads, "warmups": warmups,
        "configs": [{"config": row.config.as_dict(), "recorded_median_us": row.median_us, "passes": traces[i],
                     "clocks_mhz": clocks[i]}
                    for i, (row, _m) in enumerate(modules)],
    }
    Path(args.output).write_text(json.dumps(report) + "\n", encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
