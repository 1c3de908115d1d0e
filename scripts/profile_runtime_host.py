#!/usr/bin/env python3
"""Where the host time of one ``evotuner.flash_attention`` call goes: each step of the hot
path timed on its own (``timeit``, best of 5 runs of N calls), next to the whole call and
SDPA's. A tool for working on the runtime; scripts/bench_runtime.py gives the user's figures.

    python scripts/profile_runtime_host.py --shape 1,8,512,64,0
"""

from __future__ import annotations

import sys
import timeit

import torch
import torch.nn.functional as F

import evotuner
from evotuner.runtime import attention as A
from evotuner.runtime import cuda
from evotuner.scriptargs import ArgumentParser


def main() -> int:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="1,8,512,64,0")
    ap.add_argument("--number", type=int, default=2000)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 1
    B, H, S, D, c = (int(x) for x in args.shape.split(","))
    causal = bool(c)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16) for _ in range(3))
    evotuner.flash_attention(q, k, v, causal=causal)
    key = A._plan_key(q, k, v, causal, None, None, "bhsd", False, None)
    plan = A._plans[key]
    out = torch.empty(plan.out_shape, dtype=plan.dtype, device=plan.torch_device)
    ptrs = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr())
    stream = A._current_stream(plan.device)
    if plan.workspace:
        ptrs = (*ptrs, plan.module.zeroed_workspace(stream))
    geo = plan.geometry
    import ctypes
    cgeo = tuple(ctypes.c_uint(x) for x in geo)
    launch = cuda.driver().cuLaunchKernel
    plan.config.hStream = plan.stream = stream
    side = torch.cuda.Stream()
    side_config = cuda.LaunchConfig(*geo, side.cuda_stream, None, 0)
    side_ref = ctypes.byref(side_config)
    steps = {
        "whole call": lambda: evotuner.flash_attention(q, k, v, causal=causal),
        "sdpa call": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
        "is_compiling": torch.compiler.is_compiling,
        "plan key": lambda: A._plan_key(q, k, v, causal, None, None, "bhsd", False, None),
        "plan key + get": lambda: A._plans.get(A._plan_key(q, k, v, causal, None, None, "bhsd", False, None)),
        "grad checks": lambda: torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad),
        "torch.empty out": lambda: torch.empty(plan.out_shape, dtype=plan.dtype, device=plan.torch_device),
        "q.new_empty out": lambda: q.new_empty(plan.out_shape),
        "torch.empty_like": lambda: torch.empty_like(q),
        "4 data_ptr": lambda: (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()),
        "current stream": lambda: A._current_stream(plan.device),
        "current context": cuda.current_context,
        "workspace memset": (lambda: plan.memset(ptrs[-1], 0, plan.workspace, stream)) if plan.workspace
        else (lambda: None),
        "bind_into": lambda: plan.binder.bind_into(plan.args, ptrs),
        "cuLaunchKernel": lambda: launch(plan.function, *geo, stream, plan.params, None),
        "cuLaunchKernel c_": lambda: launch(plan.function, *cgeo, stream, plan.params, None),
        "cuLaunchKernelEx": lambda: plan.launch(plan.config_ref, plan.function, plan.params, None),
        "  on a side stream": lambda: plan.launch(side_ref, plan.function, plan.params, None),
        "cuCtxGetCurrent": cuda.current_context,
        "plan.run": lambda: plan.run(q, k, v),
    }
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, shape {args.shape}, "
          f"binder {'on' if plan.binder is not None else 'OFF'}, workspace {plan.workspace}")
    for name, fn in steps.items():
        best = min(timeit.repeat(fn, number=args.number, repeat=5)) / args.number * 1e6
        torch.cuda.synchronize()
        print(f"{name:18s} {best:7.2f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
