#!/usr/bin/env python3
"""What the GPU worker's correctness check costs per trial, piece by piece (issue 28: the
per-trial time a measurement spends outside its timing).

    python scripts/check_cost.py [--shape B=4,H=32,S=4096,D=128] [--dtype fp16] [--causal] [--rounds 5]

Times, with CUDA synchronized around each piece (median of ``--rounds``, ms): fresh inputs
(``make_inputs``), the kernel's call (SDPA stands in for it), the fp32 reference, the
low-precision bound of the output, the LSE bound, the comparison, and the whole
``check.check``; then the same ``check.check`` at the ragged shape the worker checks second.
Needs a GPU.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F

from evotuner.measure.worker_tools import ragged_problem
from evotuner.problem import Problem, Shape
from evotuner.runtime import check as C
from evotuner.scriptargs import ArgumentParser


def _ms(fn: Callable[[], Any], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="B=4,H=32,S=4096,D=128")
    ap.add_argument("--dtype", default="fp16", choices=("fp16", "bf16"))
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: check_cost needs a CUDA GPU", file=sys.stderr)
        return 1
    problem = Problem(Shape.parse(args.shape), dtype=args.dtype, causal=args.causal)
    shape, causal = problem.shape, problem.causal
    scale = 1.0 / math.sqrt(shape.head_dim)

    def run(q, k, v, o, lse, s):
        o.copy_(F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=s,
                                               enable_gqa=k.shape[1] != q.shape[1]))
        if lse is not None:
            lse.zero_()

    q, k, v = C.make_inputs(shape, problem.dtype, device="cuda", seed=0)
    ref, _ = C.reference(q, k, v, causal, scale)
    pieces = {
        "make_inputs": lambda: C.make_inputs(shape, problem.dtype, device="cuda", seed=1),
        "kernel (SDPA)": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
        "reference fp32": lambda: C.reference(q, k, v, causal, scale),
        "low-precision bound": lambda: C.torch_low_precision(q, k, v, causal, scale),
        "lse bound": lambda: C.lse_low_precision(q, k, causal, scale),
        "compare": lambda: C.compare(ref.half(), ref, 1.0),
        "check.check (study shape)": lambda: C.check(run, problem, seed=2, check_lse=True),
        "check.check (ragged)": lambda: C.check(run, ragged_problem(problem), seed=3, check_lse=True),
    }
    _ms(pieces["check.check (study shape)"], 1)          # warm-up: cuBLAS and SDPA plans
    report = {name: round(_ms(fn, args.rounds), 2) for name, fn in pieces.items()}
    for name, ms in report.items():
        print(f"{name:28s} {ms:8.2f} ms")
    print(json.dumps({"problem": str(problem), "ms": report}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
