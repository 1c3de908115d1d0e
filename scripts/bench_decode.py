#!/usr/bin/env python3
"""Decoding and split-KV on the GPU: evotuner.flash_attention against every SDPA backend,
one process, same run (GPU needed).

Per shape (a few query rows against a long key/value cache, MHA or GQA): each SDPA backend
that takes the inputs (flash, efficient, cudnn; math only where the others fail), timed
graph-captured (one call in a CUDA graph, replayed under a timer that clears L2); evotuner's
own choice through the public call (graph and eager, as a user calls it); and a grid of
hopper configs through the same public call (``config=``): consumer warpgroups, BLOCK_N,
ring depth, SPLITS and (grouped heads) PACK_GQA. Every evotuner output is checked against the fp32 reference
(fresh random inputs) where the reference fits; a wrong one stops the run.

    python3 scripts/bench_decode.py [--sq 1,4,16] [--sk 4096,32768,131072] [--batch 1,16]
        [--heads 32] [--groups 1,8] [--rounds 3] [--bases NAME,...|none] [--tuned STORAGE] [--output DIR]

``--tuned STORAGE`` also times the best config of every study in that database whose problem
is the shape's (``evotuner search --shape B=..,H=..,HKV=..,SQ=..,SK=..,D=..``): the search's
result beside the recommended config it started from, same run ("tuned x" and "tuned/rec").

Prints one line per shape: the fastest SDPA backend, evotuner's choice (graph, eager),
the grid's best config, and the ratios fastest-SDPA / ours (graph-timed, median of
per-round ratios); "no split x" is the grid's best with SPLITS=1 and PACK_GQA=0. Writes DIR/bench_decode.json with every timing.
"""

from __future__ import annotations

import gc
import json
import math
import statistics
import sys
import warnings
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import evotuner
from evotuner.atomicfile import write_text_atomic
from evotuner.errors import EvotunerError
from evotuner.problem import Problem, Shape
from evotuner.runtime import check as C
from evotuner.runtime.timing import time_eager, time_graph
from evotuner.tuned import study_bests
from evotuner.scriptargs import ArgumentParser, output_folder, positive, positive_list

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
#: The grid's bases (D=128 register budgets: one warpgroup holds 256, two 240).
BASES = {
    "1wg-n128-s2": dict(BLOCK_N=128, CONSUMER_WGS=1, STAGES=2, REG_PROD=24, REG_CONS=256, OVERLAP=1, PINGPONG=0),
    "1wg-n128-s3": dict(BLOCK_N=128, CONSUMER_WGS=1, STAGES=3, REG_PROD=24, REG_CONS=256, OVERLAP=1, PINGPONG=0),
    "1wg-n64-s4": dict(BLOCK_N=64, CONSUMER_WGS=1, STAGES=4, REG_PROD=24, REG_CONS=256, OVERLAP=1, PINGPONG=0),
    "2wg-n128-s2": dict(BLOCK_N=128, CONSUMER_WGS=2, STAGES=2, REG_PROD=24, REG_CONS=240, OVERLAP=1, PINGPONG=1),
}
SPLITS = (1, 2, 4, 8, 16, 32)
#: Back-to-back calls of one eager timing.
EAGER_CALLS = 100
#: Largest K (bytes) whose fp32 reference the check computes (its K/V go to fp32 for every
#: query head: 2 GiB ran out of the H100's memory; larger shapes are timed only, and
#: tests/gpu/test_split_kv.py covers Sk=131072 for correctness).
CHECK_LIMIT = 1 << 30


def sdpa_callees(q, k, v, scale) -> dict[str, Callable[[], object]]:
    gqa = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
    out: dict[str, Callable[[], object]] = {}
    for name, backend in BACKENDS.items():
        def call(backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, scale=scale, **gqa)
        try:
            call()
            torch.cuda.synchronize()
        except RuntimeError:
            continue
        if name == "math" and out:
            continue
        out[f"sdpa-{name}"] = call
    return out


def bench_shape(B, H, Hkv, Sq, Sk, D, args) -> dict:
    torch.manual_seed(B * 7 + Sq * 13 + Sk)
    q = torch.randn(B, H, Sq, D, device="cuda", dtype=torch.float16)
    k = torch.randn(B, Hkv, Sk, D, device="cuda", dtype=torch.float16)
    v = torch.randn(B, Hkv, Sk, D, device="cuda", dtype=torch.float16)
    scale = 1.0 / math.sqrt(D)
    check = k.numel() * 2 <= CHECK_LIMIT
    torch.cuda.empty_cache()   # the last shape's blocks: the reference needs the room
    if check:
        ref, _ = C.reference(q, k, v, False, scale)
        tol = C.tolerance(C.torch_low_precision(q, k, v, False, scale), ref)
    callees = sdpa_callees(q, k, v, scale)
    _, choice = evotuner.flash_attention(q, k, v, return_choice=True)
    ours: dict[str, Callable[[], object]] = {"evotuner": lambda: evotuner.flash_attention(q, k, v)}
    configs = {"evotuner": str(choice.config)}
    problem = Problem(Shape(B, H, Sq, Sk, D, Hkv), "fp16", False)
    for study, cfg in args.tuned.get((problem, "hopper"), []):
        label = f"tuned:{study}"
        ours[label] = lambda cfg=cfg: evotuner.flash_attention(q, k, v, config=cfg)
        configs[label] = str(cfg)
    blocks = -(-Sk // 128)
    for base_name in args.bases:
        base = BASES[base_name]
        for n in SPLITS:
            for pack in ((0, 1) if Hkv < H else (0,)):
                if n > 1 and blocks < n:
                    continue
                cfg = {**base, "SCHED": 0, "RESCALE_LOG2": 0, "EXP_EMU": 0, "SPLITS": n, "PACK_GQA": pack}
                label = f"{base_name}-x{n}" + ("-pack" if pack else "")
                ours[label] = lambda cfg=cfg: evotuner.flash_attention(q, k, v, config=cfg)
                configs[label] = ",".join(f"{a}={b}" for a, b in sorted(cfg.items()))
    for name, fn in ours.items():
        out = fn()
        torch.cuda.synchronize()
        if check:
            ok, err, reason, _ = C.compare(out, ref, tol)
            if not ok:
                raise SystemExit(f"error: {name} ({configs[name]}) is wrong at B={B} H={H}/{Hkv} Sq={Sq} "
                                 f"Sk={Sk}: {reason}")
    if check:
        del ref
    everything = {**callees, **ours}
    rounds: dict[str, list[float]] = {n: [] for n in everything}
    eager = {"evotuner": [], **{n: [] for n in callees}}
    gc.collect()
    gc.disable()
    try:
        for _ in range(args.rounds):
            for name, fn in everything.items():
                rounds[name].append(time_graph(fn, args.reps))
            for name in eager:
                eager[name].append(time_eager(everything[name], EAGER_CALLS))
    finally:
        gc.enable()
    sdpa_best = [min(rounds[n][r] for n in callees) for r in range(args.rounds)]
    med = {n: statistics.median(t) for n, t in rounds.items()}
    fastest_sdpa = min(callees, key=lambda n: med[n])
    grid = [n for n in ours if n != "evotuner" and not n.startswith("tuned:")]
    grid_best = min(grid, key=lambda n: med[n]) if grid else None
    tuned = [n for n in ours if n.startswith("tuned:")]
    tuned_best = min(tuned, key=lambda n: med[n]) if tuned else None

    def ratio(name: str) -> float:
        return statistics.median(s / t for s, t in zip(sdpa_best, rounds[name]))

    eager_sdpa_best = [min(eager[n][r] for n in callees) for r in range(args.rounds)]
    row = {"shape": dict(B=B, H=H, Hkv=Hkv, Sq=Sq, Sk=Sk, D=D), "checked": check, "choice": configs["evotuner"],
           "why": choice.why, "graph_us": med, "rounds": rounds, "eager_rounds": eager,
           "fastest_sdpa": fastest_sdpa, "grid_best": grid_best,
           "grid_best_config": configs[grid_best] if grid_best else None,
           "choice_graph_x": ratio("evotuner"), "grid_best_graph_x": ratio(grid_best) if grid_best else None,
           "choice_eager_x": statistics.median(s / t for s, t in zip(eager_sdpa_best, eager["evotuner"])),
           "split1_best_graph_x": ratio(min((n for n in grid if n.endswith("-x1")), key=lambda n: med[n]))
           if any(n.endswith("-x1") for n in grid) else None,
           "tuned_best": tuned_best, "tuned_best_config": configs[tuned_best] if tuned_best else None,
           "tuned_graph_x": ratio(tuned_best) if tuned_best else None,
           # the search's gain over the recommended config it started from, same run
           "tuned_over_recommended": statistics.median(
               c / t for c, t in zip(rounds["evotuner"], rounds[tuned_best])) if tuned_best else None}
    del q, k, v
    torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sq", type=positive_list, default=[1, 4, 16])
    ap.add_argument("--sk", type=positive_list, default=[4096, 32768, 131072])
    ap.add_argument("--batch", type=positive_list, default=[1, 16])
    ap.add_argument("--heads", type=positive, default=32)
    ap.add_argument("--groups", type=positive_list, default=[1, 8], help="query heads per key/value head (1: MHA)")
    ap.add_argument("--head-dim", type=positive, default=128)
    ap.add_argument("--rounds", type=positive, default=3)
    ap.add_argument("--reps", type=positive, default=20)
    ap.add_argument("--bases", default=",".join(BASES), help=f"grid bases, of {', '.join(BASES)}; none: no grid")
    ap.add_argument("--tuned", metavar="STORAGE", default=None,
                    help="also time each study's best config at the shape it tuned (a study database)")
    ap.add_argument("--output", type=output_folder("a folder; bench_decode.json is written in it", ["bench_decode.json"]),
                    default=None, help="a folder: writes DIR/bench_decode.json")
    args = ap.parse_args(argv)
    if any(args.heads % g for g in args.groups):
        ap.error(f"--groups {','.join(map(str, args.groups))}: each must divide --heads {args.heads}")
    bases = [b for b in args.bases.split(",") if b and b != "none"]
    unknown = [b for b in bases if b not in BASES]
    if unknown:
        ap.error(f"--bases {unknown[0]!r} is not one of {', '.join(BASES)}")
    args.bases = bases
    try:
        args.tuned = study_bests(args.tuned) if args.tuned else {}
    except EvotunerError as exc:
        print(f"error: --tuned: {exc}", file=sys.stderr)
        return 1
    warnings.filterwarnings("ignore", category=UserWarning)   # SDPA's notes on backends that decline
    if not torch.cuda.is_available():
        print("error: bench_decode needs a CUDA GPU (run it on the GPU machine)", file=sys.stderr)
        return 1
    dev = torch.cuda.get_device_name()
    print(f"{dev}, torch {torch.__version__}, fp16 D={args.head_dim}, {args.rounds} rounds; x = fastest SDPA "
          f"backend / ours (graph-timed, median of per-round ratios)")
    print(f"{'B':>3} {'H/Hkv':>6} {'Sq':>3} {'Sk':>7}  {'fastest SDPA':>18}  {'choice µs':>9} {'x':>6} {'eager x':>7}"
          f"  {'grid best':>18} {'µs':>8} {'x':>6}  {'no split x':>10}  {'tuned x':>7} {'tuned/rec':>9}")
    rows = []
    for B in args.batch:
        for g in args.groups:
            for Sk in args.sk:
                for Sq in args.sq:
                    row = bench_shape(B, args.heads, args.heads // g, Sq, Sk, args.head_dim, args)
                    rows.append(row)
                    m = row["graph_us"]
                    gb = row["grid_best"]
                    grid = (f"{gb:>18} {m[gb]:>8.1f} {row['grid_best_graph_x']:>6.3f}" if gb else f"{'-':>18} {'':>8} {'':>6}")
                    split1 = row["split1_best_graph_x"]
                    tuned = (f"{row['tuned_graph_x']:>7.3f} {row['tuned_over_recommended']:>9.3f}"
                             if row["tuned_best"] else f"{'-':>7} {'-':>9}")
                    print(f"{B:>3} {args.heads:>3}/{args.heads // g:<2} {Sq:>3} {Sk:>7}  "
                          f"{row['fastest_sdpa']:>10} {m[row['fastest_sdpa']]:>7.1f}  {m['evotuner']:>9.1f} "
                          f"{row['choice_graph_x']:>6.3f} {row['choice_eager_x']:>7.3f}  {grid}  "
                          f"{'-' if split1 is None else format(split1, '.3f'):>10}  {tuned}", flush=True)
    if args.output is not None:
        try:
            args.output.mkdir(parents=True, exist_ok=True)
            write_text_atomic(args.output / "bench_decode.json", json.dumps(
                {"device": dev, "torch": torch.__version__, "rows": rows}, indent=1))
        except (OSError, EvotunerError) as exc:
            print(f"error: cannot write {args.output / 'bench_decode.json'}: {exc} (the rows printed above have "
                  "the figures; give another --output)", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
