#!/usr/bin/env python3
"""What a user gets from ``evotuner.flash_attention``: host time per call, eager time and
graph time, next to SDPA (and the production extension, when built), in one process.

    python scripts/bench_runtime.py                          # the standard and mid-size shapes
    python scripts/bench_runtime.py --shapes 1,8,512,64,0 --rounds 5 --output out/runtime
    python scripts/bench_runtime.py --extension build/hopper_ext   # + the production extension
    python scripts/bench_runtime.py --set gqa                # grouped-query shapes (SDPA with enable_gqa)
    python scripts/bench_runtime.py --shapes 1,32,4096,128,0,8      # B,H,S,D,CAUSAL[,HKV]

Per shape (fp16 unless --dtype), after one correctness check of each callee against the
fp32 reference (fresh random inputs):

* **host µs/call**: wall time of 200 back-to-back calls with no synchronisation, divided by
  200 (the public call as a user makes it: validation or plan look-up, allocation, launch),
  through the C++ fast path (``evotuner.runtime.fastpath``, built here first if it is not
  cached; ``EVOTUNER_FASTPATH=0`` turns it off) and, in the "py" column, the same public call
  with the fast path switched off for the 200 calls (the Python path);
* **eager µs**: CUDA events around 200 back-to-back calls, divided by 200 (no L2 flush): a
  call whose host time exceeds its kernel time shows here as the host time;
* **graph µs**: one call captured in a CUDA graph, its replays timed by
  ``evotuner.runtime.timing.time_cuda`` (L2 flushed before each, median): the kernel alone.

Each figure is the median over ``--rounds`` rounds (callees alternate inside a round); the
ratios are SDPA's time over ours, per round, then the median. Writes OUTPUT.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

import evotuner
from evotuner.problem import Problem, Shape
from evotuner.runtime import check as C
from evotuner.runtime import fastpath
from evotuner.runtime.timing import time_eager, time_graph
from evotuner.atomicfile import write_text_atomic
from evotuner.errors import EvotunerError
from evotuner.scriptargs import ArgumentParser, output_stem, positive

#: (B, H, S, D, causal): the six standard shapes, then mid-size ones (8k-64k query rows).
SHAPES = (
    (16, 16, 2048, 64, False), (1, 8, 512, 64, False), (4, 16, 4096, 64, True),
    (8, 16, 2048, 128, False), (4, 32, 4096, 128, True), (1, 32, 8192, 128, False),
    (1, 8, 1024, 128, False), (1, 16, 1024, 64, False), (2, 16, 1024, 64, False),
    (1, 16, 2048, 128, False), (4, 16, 1024, 64, True), (2, 16, 2048, 128, True),
)
#: Grouped-query prefill shapes (B, H, S, D, causal, HKV): Llama-3-8B-like and -70B-like heads.
GQA_SHAPES = (
    (1, 32, 4096, 128, False, 8), (4, 64, 2048, 128, False, 8), (2, 32, 8192, 128, True, 8),
    (8, 32, 1024, 128, False, 4), (16, 32, 512, 128, True, 8), (1, 32, 2048, 64, True, 1),
)
SETS = {"standard": SHAPES, "gqa": GQA_SHAPES}
CALLS = 200
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def parse_shape(text: str) -> tuple:
    """B,H,S,D,CAUSAL[,HKV]: positive sizes, H a multiple of HKV, CAUSAL 0 or 1."""
    what = f"{text!r} is not B,H,S,D,CAUSAL[,HKV] (e.g. 4,16,4096,64,1)"
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}: every item must be an integer") from None
    if len(values) not in (5, 6):
        raise argparse.ArgumentTypeError(what)
    b, h, s, d, c = values[:5]
    hkv = values[5] if len(values) == 6 else h
    if min(b, h, s, d, hkv) < 1:
        raise argparse.ArgumentTypeError(f"{what}: every size must be at least 1")
    if c not in (0, 1):
        raise argparse.ArgumentTypeError(f"{what}: CAUSAL must be 1 or 0")
    if h % hkv:
        raise argparse.ArgumentTypeError(f"{what}: H {h} must be a multiple of HKV {hkv}")
    return (b, h, s, d, bool(c), *values[5:])


def host_us(fn: Callable[[], object]) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(CALLS):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / CALLS * 1e6


def python_path_host_us(fn: Callable[[], object]) -> float:
    """host_us of ``fn`` with the C++ fast path switched off (the Python path)."""
    native, fastpath.run = fastpath.run, None
    try:
        fn()
        return host_us(fn)
    finally:
        fastpath.run = native


def check(name: str, out: torch.Tensor, q, k, v, causal: bool, scale: float) -> float:
    ref, _ = C.reference(q, k, v, causal, scale)
    tol = C.tolerance(C.torch_low_precision(q, k, v, causal, scale), ref)
    err = float((out.float() - ref).abs().max())
    if not (math.isfinite(err) and err <= tol):
        raise SystemExit(f"error: {name} is wrong at this shape: max error {err:.3g} > tolerance {tol:.3g}")
    return err


def bench_shape(shape, dtype: str, args: argparse.Namespace, ext) -> dict:
    B, H, S, D, causal = shape[:5]
    Hkv = shape[5] if len(shape) > 5 else H
    dt = DTYPES[dtype]
    q = torch.randn(B, H, S, D, device="cuda", dtype=dt)
    k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=dt) for _ in range(2))
    scale = 1.0 / math.sqrt(D)
    gqa = {"enable_gqa": True} if Hkv != H else {}   # SDPA's own grouped heads, no expanded copy
    out, choice = evotuner.flash_attention(q, k, v, causal=causal, return_choice=True)
    callees: dict[str, Callable[[], object]] = {
        "evotuner": lambda: evotuner.flash_attention(q, k, v, causal=causal),
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, **gqa),
    }
    errors = {"evotuner": check("evotuner", out, q, k, v, causal, scale),
              "sdpa": check("sdpa", callees["sdpa"](), q, k, v, causal, scale)}
    if ext is not None and ext.select(D, dtype, causal, S, B * H * S) >= 0:
        callees["extension"] = lambda: ext.attention(q, k, v, causal, scale)
        errors["extension"] = check("the extension", callees["extension"](), q, k, v, causal, scale)
    rounds: dict[str, dict[str, list[float]]] = {n: {"host": [], "eager": [], "graph": []} for n in callees}
    python_host: list[float] = []
    for fn in callees.values():                    # warm-up: module loads, plans, cuDNN's plan cache
        for _ in range(20):
            fn()
    # Python's garbage collector off while timing (a collection inside one callee's 200 calls
    # showed as a 2x eager time on the H100 machine), on again between shapes.
    gc.collect()
    gc.disable()
    try:
        for _ in range(args.rounds):
            for name, fn in callees.items():
                rounds[name]["host"].append(host_us(fn))
                rounds[name]["eager"].append(time_eager(fn, CALLS))
                rounds[name]["graph"].append(time_graph(fn, args.reps))
            python_host.append(python_path_host_us(callees["evotuner"]))
    finally:
        gc.enable()
    row: dict = {"shape": [B, H, S, D], "heads_kv": Hkv, "causal": causal, "dtype": dtype, "family": choice.family,
                 "config": str(choice.config), "why": choice.why, "max_error": errors, "rounds": rounds,
                 "python_host_us": statistics.median(python_host), "python_host_rounds": python_host}
    for name, r in rounds.items():
        for what in ("host", "eager", "graph"):
            row[f"{name}_{what}_us"] = statistics.median(r[what])
    for name in callees:
        if name == "sdpa":
            continue
        for what in ("eager", "graph"):
            row[f"{name}_{what}_x"] = statistics.median(
                s / m for s, m in zip(rounds["sdpa"][what], rounds[name][what]))
    row["tflops_graph"] = Problem(Shape(B, H, S, S, D), dtype, causal).tflops(row["evotuner_graph_us"])
    return row


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", type=parse_shape, action="append", help="B,H,S,D,CAUSAL[,HKV]; repeatable")
    ap.add_argument("--set", choices=sorted(SETS), default="standard", help="the shapes when --shapes is not given")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp16")
    ap.add_argument("--rounds", type=positive, default=9,
                    help="rounds per shape (default 9: one round's ratio to SDPA spread by up to 25%% on the "
                         "H100, docs/measurements/gqa/bars_h100_1126i)")
    ap.add_argument("--reps", type=positive, default=50, help="graph replays timed per round")
    ap.add_argument("--extension", type=Path, default=None, help="folder holding a built *_ext.so (optional)")
    ap.add_argument("--output", type=output_stem(".json", example="out/runtime"), default=None, help="write OUTPUT.json")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: bench_runtime needs a CUDA GPU (run it on the GPU machine)", file=sys.stderr)
        return 1
    ext = None
    if args.extension is not None:
        from bench_extension import load_extension   # scripts/ is on sys.path when a script runs

        ext = load_extension(args.extension)
        if ext is None:
            return 1
    rows = []
    print(f"fast path: {fastpath.build()}")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.dtype}, {args.rounds} rounds; "
          f"x = SDPA time / ours (median of per-round ratios)")
    head = f"{'shape':20s} {'host µs ev/py/sdpa/ext':>27s} {'eager µs ev/sdpa':>17s} {'eager x':>7s} " \
           f"{'graph µs ev/sdpa':>17s} {'graph x':>7s}"
    print(head)
    with torch.no_grad():
        for shape in args.shapes or SETS[args.set]:
            r = bench_shape(shape, args.dtype, args, ext)
            rows.append(r)
            B, H, S, D = r["shape"]
            H = f"{H}/{r['heads_kv']}" if r["heads_kv"] != H else H
            ext_host = f"{r['extension_host_us']:.1f}" if "extension_host_us" in r else "-"
            print(f"{f'{B},{H},{S},{D}' + (' c' if r['causal'] else ''):20s} "
                  f"{r['evotuner_host_us']:6.1f}/{r['python_host_us']:5.1f}/{r['sdpa_host_us']:5.1f}/{ext_host:>6s}  "
                  f"{r['evotuner_eager_us']:8.1f}/{r['sdpa_eager_us']:8.1f} {r['evotuner_eager_x']:7.3f} "
                  f"{r['evotuner_graph_us']:8.1f}/{r['sdpa_graph_us']:8.1f} {r['evotuner_graph_x']:7.3f}", flush=True)
    hosts = [r["evotuner_host_us"] for r in rows]
    py = [r["python_host_us"] for r in rows]
    print(f"evotuner host µs/call: median {statistics.median(hosts):.1f}, max {max(hosts):.1f} "
          f"(Python path: median {statistics.median(py):.1f}, max {max(py):.1f})")
    if args.output:
        try:
            write_text_atomic(args.output.with_suffix(".json"), json.dumps(
                {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "fastpath": fastpath.status(),
                 "rows": rows}, indent=1))
        except (OSError, EvotunerError) as exc:
            print(f"error: cannot write {args.output.with_suffix('.json')}: {exc} (the rows printed above have "
                  "the figures; give another --output)", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
