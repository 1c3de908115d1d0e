#!/usr/bin/env python3
"""A packed variable-length batch: ``evotuner.flash_attention_varlen`` next to SDPA's fastest
path for the same sequences, in one process (issue 24's varlen bar).

    python scripts/bench_varlen.py [--batch 16] [--min 128] [--max 8192] [--heads 16] [--heads-kv 16]
                                   [--dim 128] [--causal] [--seed 0] [--rounds 5] [--config NAME=V,...]
                                   [--output bench_varlen.json]

The lengths are drawn uniformly from [--min, --max] (seeded; printed). Callees:

* **evotuner**: ``flash_attention_varlen`` on the packed [total, H, D] tensors;
* **sdpa_padded**: SDPA (its default backend choice) on the batch padded to the longest
  sequence, [B, H, Smax, D]. Causal needs no extra mask (sequences padded at their end: a
  row of a sequence only sees keys before it); non-causal passes a key-padding mask;
* **sdpa_jagged**: SDPA on jagged nested tensors (``torch.nested``, ``layout=torch.jagged``),
  when this torch takes them for these inputs (else reported with the reason).

Each is checked once against the fp32 reference of every sequence (fresh random inputs),
then timed as ``bench_runtime.py`` times: **graph** (one call captured in a CUDA graph, L2
flushed before each replay, median) and **eager** (200 back-to-back calls). Ratios: the
fastest SDPA path's time over ours, per round, then the median over rounds.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import evotuner
from evotuner.runtime import check as C
from evotuner.runtime.timing import time_eager, time_graph
from evotuner.atomicfile import write_text_atomic
from evotuner.errors import EvotunerError
from evotuner.scriptargs import ArgumentParser, output_path, positive

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_runtime import CALLS  # noqa: E402  -- the eager calls per timing, as bench_runtime's


def lengths_for(args: argparse.Namespace) -> list[int]:
    rng = random.Random(args.seed)
    return [rng.randint(args.min, args.max) for _ in range(args.batch)]


def check_packed(out: torch.Tensor, q, k, v, cu: list[int], causal: bool, scale: float, name: str) -> float:
    worst = 0.0
    for b in range(len(cu) - 1):
        rows = slice(cu[b], cu[b + 1])
        qb, kb, vb = (t[rows].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        ref, _ = C.reference(qb, kb, vb, causal, scale)
        tol = C.tolerance(C.torch_low_precision(qb, kb, vb, causal, scale), ref)
        err = float((out[rows].transpose(0, 1).unsqueeze(0).float() - ref).abs().max())
        if not (math.isfinite(err) and err <= tol):
            raise SystemExit(f"error: {name} is wrong on sequence {b}: max error {err:.3g} > tolerance {tol:.3g}")
        worst = max(worst, err)
    return worst


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=positive, default=16)
    ap.add_argument("--min", type=positive, default=128)
    ap.add_argument("--max", type=positive, default=8192)
    ap.add_argument("--heads", type=positive, default=16)
    ap.add_argument("--heads-kv", type=positive, default=None)
    ap.add_argument("--dim", type=positive, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=positive, default=5)
    ap.add_argument("--reps", type=positive, default=50, help="graph replays timed per round")
    ap.add_argument("--config", default=None, help="a hopper config for evotuner (default: recommended)")
    ap.add_argument("--output", "-o", type=output_path, default="bench_varlen.json",
                    help="the JSON report (default bench_varlen.json, here)")
    args = ap.parse_args(argv)
    if args.min > args.max:
        ap.error(f"--min {args.min} is above --max {args.max}")
    if args.heads_kv is not None and args.heads % args.heads_kv:
        ap.error(f"--heads {args.heads} must be a multiple of --heads-kv {args.heads_kv}")
    if not torch.cuda.is_available():
        print("error: bench_varlen needs a CUDA GPU (run it on the GPU machine)", file=sys.stderr)
        return 1
    H, Hkv, D = args.heads, args.heads_kv or args.heads, args.dim
    lens = lengths_for(args)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    total, smax = cu[-1], max(lens)
    print(f"lengths ({args.batch} sequences, seed {args.seed}): {lens}; total {total}, longest {smax}")
    torch.manual_seed(args.seed)
    q = torch.randn(total, H, D, device="cuda", dtype=torch.float16)
    k = torch.randn(total, Hkv, D, device="cuda", dtype=torch.float16)
    v = torch.randn(total, Hkv, D, device="cuda", dtype=torch.float16)
    cu_t = torch.tensor(cu, dtype=torch.int32, device="cuda")
    scale = 1 / math.sqrt(D)
    flops = sum(4.0 * H * n * n * D / (2 if args.causal else 1) for n in lens)

    def ours():
        return evotuner.flash_attention_varlen(q, k, v, cu_t, cu_t, smax, smax, causal=args.causal,
                                               config=args.config)

    # padded: [B, H, Smax, D]
    def pad(t: torch.Tensor) -> torch.Tensor:
        out = t.new_zeros(args.batch, smax, t.shape[1], D)
        for b, n in enumerate(lens):
            out[b, :n] = t[cu[b]:cu[b + 1]]
        return out.transpose(1, 2)

    qp, kp, vp = pad(q), pad(k), pad(v)
    mask = None
    if not args.causal:
        valid = torch.zeros(args.batch, 1, 1, smax, dtype=torch.bool, device="cuda")
        for b, n in enumerate(lens):
            valid[b, ..., :n] = True
        mask = valid
    gqa = {"enable_gqa": True} if Hkv != H else {}

    def padded():
        return F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask, is_causal=args.causal, **gqa)

    def unpad(o: torch.Tensor) -> torch.Tensor:
        o = o.transpose(1, 2)
        return torch.cat([o[b, :n] for b, n in enumerate(lens)])

    callees = {"evotuner": (ours, lambda o: o), "sdpa_padded": (padded, unpad)}
    notes: dict[str, str] = {}
    try:
        offsets = torch.tensor(cu, dtype=torch.int64, device="cuda")
        nq, nk, nv = (torch.nested.nested_tensor_from_jagged(t, offsets).transpose(1, 2) for t in (q, k, v))

        def jagged():
            return F.scaled_dot_product_attention(nq, nk, nv, is_causal=args.causal, **gqa)

        jagged()
        callees["sdpa_jagged"] = (jagged, lambda o: o.transpose(1, 2).values())
    except Exception as exc:  # noqa: BLE001 -- reported: this torch cannot run it
        notes["sdpa_jagged"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    errors = {}
    for name, (fn, back) in list(callees.items()):
        try:
            errors[name] = check_packed(back(fn()), q, k, v, cu, args.causal, scale, name)
        except SystemExit as exc:
            if name == "evotuner":
                raise
            notes[name] = str(exc)
            del callees[name]
    rounds: dict[str, dict[str, list[float]]] = {n: {"graph": [], "eager": []} for n in callees}
    for _ in range(args.rounds):
        for name, (fn, _) in callees.items():
            try:
                rounds[name]["graph"].append(time_graph(fn, args.reps))
            except Exception as exc:  # noqa: BLE001 -- a callee that cannot be captured is timed eagerly only
                notes.setdefault(name, f"graph capture: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
            rounds[name]["eager"].append(time_eager(fn, CALLS))
    report = {"lengths": lens, "heads": H, "heads_kv": Hkv, "head_dim": D, "causal": args.causal, "total": total,
              "max_error": errors, "notes": notes, "device": torch.cuda.get_device_name(), "results": {}}
    sdpa = [n for n in callees if n != "evotuner"]
    for kind in ("graph", "eager"):
        ours_t = rounds["evotuner"][kind]
        if not ours_t:
            continue
        best_sdpa = [min(rounds[n][kind][i] for n in sdpa if len(rounds[n][kind]) > i) for i in range(len(ours_t))]
        ratios = [s / o for s, o in zip(best_sdpa, ours_t)]
        report["results"][kind] = {
            "evotuner_us": statistics.median(ours_t),
            **{f"{n}_us": statistics.median(rounds[n][kind]) for n in sdpa if rounds[n][kind]},
            "ratio_vs_fastest_sdpa": statistics.median(ratios),
            "evotuner_tflops": flops / statistics.median(ours_t) / 1e6,
        }
    try:
        write_text_atomic(args.output, json.dumps(report, indent=1) + "\n")
    except (OSError, EvotunerError) as exc:
        print(json.dumps(report["results"], indent=1))
        print(f"error: cannot write {args.output}: {exc} (the results are printed above; give another --output)",
              file=sys.stderr)
        return 1
    print(json.dumps(report["results"], indent=1))
    if notes:
        print("notes:", json.dumps(notes, indent=1))
    print(f"max error vs fp32: {errors}; report {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
