#!/usr/bin/env python3
"""Benchmark kernel-family configs against PyTorch SDPA at the standard shapes.

For each shape (B, H, S, D, causal) and dtype, for each kernel family (--family,
repeatable; default: every registered family that supports the problem, e.g.
flashcore and hopper): one correctness check per config
(FA2's rule, fresh inputs), then CUDA-event timing (warm-up, L2 flushed before
every repetition, median) of each config and of SDPA's default, flash and
memory-efficient backends, all in the same process. Prints a table; writes
JSON and CSV to --output.

    python scripts/bench_attention.py                      # recommended defaults
    python scripts/bench_attention.py --config BLOCK_M=128,BLOCK_N=64,NUM_WARPS=4,STAGES=2,MIN_BLOCKS=1
    python scripts/bench_attention.py --shapes 1,8,512,64,0 --dtypes fp16 --output out/bench
    python scripts/bench_attention.py --family hopper --shapes 1,32,4096,128,0,8   # GQA 32/8 (SDPA enable_gqa)
    python scripts/bench_attention.py --family hopper           # hopper's recommended configs vs SDPA
    python scripts/bench_attention.py --family hopper --config BLOCK_N=128,CONSUMER_WGS=2,SCHED=1
                                    # a partial config overrides the recommended one's keys

A --config is tried on every selected family whose parameters it names (a family
whose names it does not use skips it, with a note).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from evotuner.config import KernelConfig
from evotuner.errors import EvotunerError
from evotuner.family import families, get_family
from evotuner.problem import Problem, Shape
from evotuner.runtime import attention as A
from evotuner.runtime import check as C
from evotuner.runtime.timing import time_cuda
from evotuner.tuned import study_bests
from evotuner.atomicfile import check_target, write_text_atomic
from evotuner.scriptargs import ArgumentParser, one_of_list, output_stem, positive

#: (B, H, S, D, causal): the issue's standard shapes.
STANDARD_SHAPES = (
    (16, 16, 2048, 64, False),
    (1, 8, 512, 64, False),
    (4, 16, 4096, 64, True),
    (8, 16, 2048, 128, False),
    (4, 32, 4096, 128, True),
    (1, 32, 8192, 128, False),
)
BASELINES = {"sdpa_default": None, "sdpa_flash": SDPBackend.FLASH_ATTENTION,
             "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}


def alternate(timed: list[tuple[dict[str, object], Any]], sdpa: Any, problem: Problem,
              args: argparse.Namespace) -> None:
    """Re-time SDPA's default and each config in turn, ``args.rounds`` rounds (after every
    correctness check, so no check sits between a config and its SDPA); rewrite each row's
    median_us/tflops/speedup_vs_sdpa_default with the medians (per-round figures kept)."""
    ours: list[list[float]] = [[] for _ in timed]
    theirs: list[float] = []
    for _ in range(args.rounds):
        theirs.append(time_cuda(sdpa, warmup=args.warmup, reps=args.reps).median_us)
        for i, (_, launch) in enumerate(timed):
            ours[i].append(time_cuda(launch, warmup=args.warmup, reps=args.reps).median_us)
    for (row, _), mine in zip(timed, ours):
        us = statistics.median(mine)
        row.update(median_us=us, tflops=problem.tflops(us), rounds=len(mine), round_us=mine, sdpa_round_us=theirs,
                   sdpa_default_us=statistics.median(theirs),
                   speedup_vs_sdpa_default=statistics.median(t / m for t, m in zip(theirs, mine)))


_CAUSAL = {"1": True, "true": True, "yes": True, "causal": True, "0": False, "false": False, "no": False}
DTYPES = ("fp16", "bf16")


def parse_shape(text: str) -> tuple[int, int, int, int, bool, int]:
    """B,H,S,D,CAUSAL[,HKV]: HKV < H is grouped-query attention (K/V with HKV heads; SDPA is
    called with ``enable_gqa``), the default HKV = H. CAUSAL: 1/0 (true/false, yes/no)."""
    parts = [p.strip() for p in text.split(",")]
    what = f"{text!r} is not B,H,S,D,CAUSAL[,HKV] (e.g. 4,16,4096,64,1)"
    if len(parts) not in (5, 6):
        raise argparse.ArgumentTypeError(what)
    b, h, s, d, c = parts[:5]
    try:
        sizes = [int(x) for x in (b, h, s, d, parts[5] if len(parts) == 6 else h)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}: the sizes must be integers") from None
    if c.lower() not in _CAUSAL:
        raise argparse.ArgumentTypeError(f"{what}: CAUSAL {c!r} must be 1 or 0")
    if min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{what}: every size must be at least 1")
    b_, h_, s_, d_, hkv = sizes
    if h_ % hkv:
        raise argparse.ArgumentTypeError(f"{what}: H {h_} must be a multiple of HKV {hkv}")
    return b_, h_, s_, d_, _CAUSAL[c.lower()], hkv


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", action="append", default=[], help="kernel config NAME=V,...; repeatable "
                    "(default: the family's recommended config for the problem, as flash_attention picks it)")
    ap.add_argument("--family", action="append", default=[], help="kernel family; repeatable "
                    "(default: every registered family supporting the problem)")
    ap.add_argument("--shapes", type=parse_shape, action="append",
                    help="B,H,S,D,CAUSAL[,HKV] (HKV < H: grouped-query); repeatable")
    ap.add_argument("--dtypes", type=one_of_list(DTYPES), default=list(DTYPES), help="fp16,bf16 (default both)")
    ap.add_argument("--warmup", type=positive, default=10)
    ap.add_argument("--reps", type=positive, default=50)
    ap.add_argument("--output", type=output_stem(".json", ".csv", example="out/bench"), default=None,
                    help="writes OUTPUT.json/.csv (default out/bench_attention, its folder created)")
    ap.add_argument("--rounds", type=positive, default=1,
                    help="time SDPA's default and every config of a shape in turn, this many rounds; the figures "
                         "become the median over rounds and xdef the median of the per-round ratios (a config "
                         "timed right after a heavy correctness check or another kernel can lose 10%%)")
    ap.add_argument("--tuned", metavar="STORAGE", action="append", default=[],
                    help="a study database: at each shape and dtype, also time the best COMPLETE config of every "
                         "study of that exact problem there (source tuned:STUDY, or tuned:STUDY@STORAGE when "
                         "several are given), beside the recommended one; repeatable")
    args = ap.parse_args(argv)
    try:
        user_configs = [KernelConfig.parse(c) for c in args.config]
        selected = [get_family(f) for f in args.family] or list(families())
    except EvotunerError as exc:
        ap.error(str(exc))
    if args.output is None:
        args.output = Path("out/bench_attention")
        for suffix in (".json", ".csv"):
            try:
                check_target(args.output.with_suffix(suffix))
            except EvotunerError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
    if not torch.cuda.is_available():
        print("error: bench_attention needs a CUDA GPU (run it on the GPU machine)", file=sys.stderr)
        return 1
    tuned: dict = {}
    try:
        for url in args.tuned:
            for key, bests in study_bests(url).items():
                tuned.setdefault(key, []).extend((study if len(args.tuned) == 1 else f"{study}@{url}", c)
                                                 for study, c in bests)
    except EvotunerError as exc:
        print(f"error: --tuned: {exc}", file=sys.stderr)
        return 1
    shapes = args.shapes or [(*sh, sh[1]) for sh in STANDARD_SHAPES]
    dtypes = args.dtypes
    props = torch.cuda.get_device_properties(0)
    device = {"name": props.name, "sm_count": props.multi_processor_count, "torch": torch.__version__,
              "cuda": torch.version.cuda}
    rows: list[dict[str, object]] = []

    for (b, h, s, d, causal, hkv), dtype in ((sh, dt) for sh in shapes for dt in dtypes):
        problem = Problem(Shape(b, h, s, s, d, hkv), dtype, causal)
        gqa = hkv != h
        tag = f"{problem.shape} {dtype} causal={int(causal)}"
        configs: list[tuple[str, KernelConfig]] = []
        for fam in selected:
            why_not = fam.unsupported(problem)
            if why_not or not fam.recommended_configs(problem):
                print(f"  {tag}: {fam.name} skipped: {why_not or 'no recommended config'}", file=sys.stderr)
                continue
            if not user_configs:   # what flash_attention runs for this problem (size-dependent entries included)
                configs.append((fam.name, fam.recommended_configs(problem)[0], "recommended"))
            for study, c in tuned.get((problem, fam.name), []):
                configs.append((fam.name, c, f"tuned:{study}"))
            for c in user_configs:
                try:
                    configs.append((fam.name, A.resolve_config(c, d, dtype, causal, family=fam.name, problem=problem),
                                    "--config"))
                except EvotunerError as exc:
                    print(f"  {tag}: {fam.name} skips --config {c}: {exc}", file=sys.stderr)
        q, k, v = C.make_inputs(problem.shape, dtype, device="cuda", seed=1)
        scale = 1.0 / math.sqrt(d)
        base: dict[str, float | None] = {}
        for name, backend in BASELINES.items():
            def sdpa(backend=backend):
                if backend is None:
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
            try:
                sdpa()
                base[name] = time_cuda(sdpa, warmup=args.warmup, reps=args.reps).median_us
            except RuntimeError as exc:
                base[name] = None
                print(f"  {tag}: {name} unavailable: {str(exc).splitlines()[0][:120]}", file=sys.stderr)
        timed: list[tuple[dict[str, object], Any]] = []
        for family, cfg, source in configs:
            row: dict[str, object] = {"B": b, "H": h, "HKV": hkv, "S": s, "D": d, "causal": causal, "dtype": dtype,
                                      "family": family, "source": source, "config": str(cfg), **{f"{n}_us": base[n] for n in BASELINES}}
            try:
                t0 = time.perf_counter()
                mod = A.kernel_module(cfg, problem, torch.cuda.current_device(), family=family)
                row["load_s"] = round(time.perf_counter() - t0, 3)
                chk = C.check(mod.launch, problem, seed=2, check_lse=False)
                row.update(ok=chk.ok, max_error=chk.max_error, tolerance=chk.tolerance, reason=chk.reason)
                out = torch.empty_like(q)
                t = time_cuda(lambda: mod.launch(q, k, v, out, None, scale), warmup=args.warmup, reps=args.reps)
                row.update(median_us=t.median_us, p20_us=t.p20_us, p80_us=t.p80_us,
                           tflops=problem.tflops(t.median_us))
                for n in BASELINES:
                    row[f"speedup_vs_{n}"] = (base[n] / t.median_us) if base[n] else None
            except EvotunerError as exc:
                row.update(ok=False, reason=str(exc))
            rows.append(row)
            if row.get("ok"):
                timed.append((row, lambda mod=mod, out=out: mod.launch(q, k, v, out, None, scale)))
            else:
                print(_line(row), flush=True)
        if args.rounds > 1 and base.get("sdpa_default"):
            alternate(timed, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa),
                      problem, args)
        for row, _ in timed:
            print(_line(row), flush=True)
        del q, k, v
        torch.cuda.empty_cache()

    json_path, csv_path = args.output.with_suffix(".json"), args.output.with_suffix(".csv")
    keys = sorted({k for r in rows for k in r})
    table = io.StringIO(newline="")
    w = csv.DictWriter(table, fieldnames=keys)
    w.writeheader()
    w.writerows(rows)
    try:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(json_path, json.dumps({"device": device, "rows": rows}, indent=2, default=str))
        write_text_atomic(csv_path, table.getvalue())
    except (OSError, EvotunerError) as exc:
        print(f"error: cannot write {json_path}: {exc} (the rows printed above have the figures; give another --output)",
              file=sys.stderr)
        return 1
    print(f"\n{device['name']}, torch {device['torch']}, CUDA {device['cuda']}")
    print(f"{'shape':<28}{'dtype':<6}{'c':<3}{'µs':>9}{'TFLOPS':>8}{'xdef':>7}{'xflash':>8}{'xeff':>7}  "
          f"{'ok':<4}{'family':<11}config")
    for r in rows:
        print(_line(r))
    print(f"wrote {json_path} and {csv_path}")
    return 0 if all(r.get("ok") for r in rows) else 1


def _fmt(x: object, spec: str) -> str:
    return format(x, spec) if isinstance(x, (int, float)) else "-"


def _line(r: dict[str, object]) -> str:
    heads = f"{r['H']}/{r['HKV']}" if r.get("HKV", r["H"]) != r["H"] else f"{r['H']}"
    shape = f"B={r['B']},H={heads},S={r['S']},D={r['D']}"
    return (f"{shape:<28}{r['dtype']!s:<6}{int(bool(r['causal'])):<3}{_fmt(r.get('median_us'), '9.1f')}"
            f"{_fmt(r.get('tflops'), '8.1f')}{_fmt(r.get('speedup_vs_sdpa_default'), '7.2f')}"
            f"{_fmt(r.get('speedup_vs_sdpa_flash'), '8.2f')}{_fmt(r.get('speedup_vs_sdpa_efficient'), '7.2f')}  "
            f"{'yes' if r.get('ok') else 'NO':<4}{r.get('family', '')!s:<11}{r['config']} [{r.get('source', '')}]"
            + ("" if r.get("ok") else f"  {r.get('reason')}"))


if __name__ == "__main__":
    sys.exit(main())
