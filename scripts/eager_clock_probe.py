#!/usr/bin/env python3
"""Why the eager and graph figures of one big kernel differ (H100, one process): 200
back-to-back calls of ``evotuner.flash_attention`` and SDPA at 16,16,2048,64 fp16 (eager,
the SM clock and power sampled mid-run), then the same calls one at a time after an L2 flush
and a pause (a low duty cycle, like a graph replay under bench_runtime's timer).

    python3 scripts/eager_clock_probe.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

import evotuner
from evotuner.runtime.timing import l2_flush_buffer, time_eager
from evotuner.scriptargs import ArgumentParser


def _clocks() -> str:
    """The SM clock (MHz) and power draw (W), as nvidia-smi reads them now."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=10)
    return out.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    if not torch.cuda.is_available():
        print("error: eager_clock_probe needs a CUDA GPU (run it on the GPU machine)", file=sys.stderr)
        return 1
    q, k, v = (torch.randn(16, 16, 2048, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    fns = {"evotuner": lambda: evotuner.flash_attention(q, k, v),
           "sdpa": lambda: F.scaled_dot_product_attention(q, k, v)}
    flush = l2_flush_buffer()
    for fn in fns.values():
        time_eager(fn, 20)
    for rnd in range(2):
        for name, fn in fns.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(200):
                fn()
            end.record()
            time.sleep(0.06)             # the 200 calls are still running: sample the clock now
            mid = _clocks()
            torch.cuda.synchronize()
            eager = start.elapsed_time(end) * 1000 / 200
            single = []
            for _ in range(50):
                flush.zero_()
                torch.cuda.synchronize()
                time.sleep(0.002)
                single.append(time_eager(fn, 1))
            print(f"round {rnd} {name:9s} back to back {eager:7.1f} µs/call (clock MHz, power W mid-run: {mid}) | "
                  f"one at a time, L2 flushed, paused: median {statistics.median(single):7.1f} µs "
                  f"(after: {_clocks()})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
