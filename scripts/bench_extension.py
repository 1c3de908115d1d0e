#!/usr/bin/env python3
"""Time a built production extension (scripts/build_extension.py) against SDPA in one run.

    python scripts/bench_extension.py --module build/hopper_ext --rounds 3 --output out/bench_ext
    python scripts/bench_extension.py --module build/flashcore_ext --shapes 16,16,2048,64,0 --dtypes fp16
    python scripts/bench_extension.py --module build/hopper_ext --shapes 16,32,8192,128,0,8,1   # GQA decode

A shape is B,H,S,D,CAUSAL[,HKV[,SQ]]: S keys per sequence, HKV K/V heads (default H; fewer:
grouped-query, SDPA then runs with enable_gqa), SQ query rows (default S; 1: decoding).

For every shape and dtype a row of the module serves (its ``select()``), the module's
``attention()`` is checked against fp32 SDPA on fresh random inputs, then it and SDPA's
default backend are timed in turn (``evotuner.runtime.timing.time_cuda``: CUDA events, L2
flushed before each repetition), ``--rounds`` times; the figures are medians over rounds
and the ratio is the median of the per-round ratios. What it measures is the whole call a
user makes: the binding's checks, the row's tensor-map encoding and the launch.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from evotuner.problem import Problem, Shape
from evotuner.runtime.timing import time_cuda
from evotuner.atomicfile import write_text_atomic
from evotuner.errors import EvotunerError
from evotuner.scriptargs import ArgumentParser, one_of_list, output_stem

SHAPES = ((16, 16, 2048, 64, False), (1, 8, 512, 64, False), (4, 16, 4096, 64, True),
          (8, 16, 2048, 128, False), (4, 32, 4096, 128, True), (1, 32, 8192, 128, False))
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def parse_shape(text: str) -> tuple[int, int, int, int, bool, int, int]:
    """B,H,S,D,CAUSAL[,HKV[,SQ]] -> (B, H, S, D, causal, HKV, SQ)."""
    try:
        vals = [int(x) for x in text.split(",")]
    except ValueError:
        vals = []
    if len(vals) in (5, 6, 7):
        b, h, s, d, c = vals[:5]
        hkv = vals[5] if len(vals) > 5 else h
        sq = vals[6] if len(vals) > 6 else s
        if min(b, h, s, d, hkv, sq) >= 1 and h % hkv == 0:
            return b, h, s, d, bool(c), hkv, sq
    raise argparse.ArgumentTypeError(f"{text!r} is not B,H,S,D,CAUSAL[,HKV[,SQ]] with positive sizes and H a "
                                     "multiple of HKV (e.g. 4,16,4096,64,1 or 16,32,8192,128,0,8,1)")


def bench(mod, shape: tuple[int, int, int, int, bool, int, int], dtype: str, args: argparse.Namespace) -> dict | None:
    B, H, S, D, causal, Hkv, Sq = shape
    row = mod.select(D, dtype, causal, S, B * H * Sq)
    if row < 0:
        return None
    dt = DTYPES[dtype]
    q = torch.randn(B, H, Sq, D, device="cuda", dtype=dt)
    k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=dt) for _ in range(2))
    scale = 1.0 / math.sqrt(D)
    gqa = Hkv != H
    o = mod.attention(q, k, v, causal, scale)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal, scale=scale,
                                         enable_gqa=gqa)
    err = (o.float() - ref).abs().max().item()
    ours, theirs = [], []
    for _ in range(args.rounds):
        theirs.append(time_cuda(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                                                        enable_gqa=gqa), reps=args.reps).median_us)
        ours.append(time_cuda(lambda: mod.attention(q, k, v, causal, scale), reps=args.reps).median_us)
    problem = Problem(Shape(B, H, Sq, S, D, Hkv), dtype, causal)
    us = statistics.median(ours)
    return {"shape": [B, H, S, D], "heads_kv": Hkv, "seqlen_q": Sq, "causal": causal, "dtype": dtype, "row": row,
            "kernel": mod.configs()[row]["kernel"], "max_error": err, "median_us": us, "tflops": problem.tflops(us),
            "sdpa_default_us": statistics.median(theirs), "round_us": ours, "sdpa_round_us": theirs,
            "speedup_vs_sdpa_default": statistics.median(t / m for t, m in zip(theirs, ours))}


def load_extension(folder: Path):
    """The one ``*_ext`` module scripts/build_extension.py built in ``folder`` (None, after a
    one-line error, when the folder holds none or several)."""
    sos = sorted(p for p in folder.glob("*_ext*.so") if p.name.split(".")[0].endswith("_ext"))
    if len(sos) != 1:
        print(f"error: {folder} holds {len(sos)} *_ext.so modules; give the folder build_extension wrote",
              file=sys.stderr)
        return None
    sys.path.insert(0, str(folder))
    return importlib.import_module(sos[0].name.split(".")[0])


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--module", required=True, type=Path, help="the build folder holding <module>.so")
    ap.add_argument("--shapes", type=parse_shape, action="append", help="B,H,S,D,CAUSAL[,HKV[,SQ]]; repeatable")
    ap.add_argument("--dtypes", type=one_of_list(DTYPES), default=list(DTYPES), help="fp16,bf16 (default both)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--output", type=output_stem(".json", example="out/bench_ext"), default=None, help="write OUTPUT.json (its folder must exist)")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.reps < 1:
        ap.error(f"--rounds {args.rounds}, --reps {args.reps}: each must be at least 1")
    if not args.module.is_dir():
        ap.error(f"--module {args.module}: not a folder; give the folder scripts/build_extension.py wrote")
    if not torch.cuda.is_available():
        print("error: bench_extension needs a CUDA GPU (run it on the GPU machine)", file=sys.stderr)
        return 1
    mod = load_extension(args.module)
    if mod is None:
        return 1
    rows = []
    print(f"{mod.__name__} on {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'shape':24s} {'dtype':5s} {'kernel':14s} {'µs':>9s} {'TFLOPS':>7s} {'SDPA µs':>9s} {'xdef':>5s} {'err':>8s}")
    for shape in args.shapes or [(*s, s[1], s[2]) for s in SHAPES]:
        for dtype in args.dtypes:
            r = bench(mod, shape, dtype, args)
            if r is None:
                print(f"{str(shape):24s} {dtype:5s} (no row serves it)")
                continue
            rows.append(r)
            B, H, S, D = r["shape"]
            name = f"{B},{H}" + (f"/{r['heads_kv']}" if r["heads_kv"] != H else "") + f",{S},{D}"
            name += (f" sq={r['seqlen_q']}" if r["seqlen_q"] != S else "") + (" causal" if r["causal"] else "")
            print(f"{name:24s} {dtype:5s} {r['kernel']:14s} "
                  f"{r['median_us']:9.1f} {r['tflops']:7.1f} {r['sdpa_default_us']:9.1f} "
                  f"{r['speedup_vs_sdpa_default']:5.2f} {r['max_error']:8.1e}")
    if args.output:
        try:
            write_text_atomic(args.output.with_suffix(".json"), json.dumps(rows, indent=1))
        except (OSError, EvotunerError) as exc:
            print(f"error: cannot write {args.output.with_suffix('.json')}: {exc} (the rows printed above have "
                  "the figures; give another --output)", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
