#!/usr/bin/env python3
"""A probe (H100, one process): 200 back-to-back calls of flash_attention and SDPA at
16,16,2048,64 (eager) with the SM clock and power sampled mid-run, then the same calls one at a
time after an L2 flush and a pause. Run: python3 scripts/eager_clock_probe.py"""
# Why the eager and graph figures of one big kernel differ: is the eager-vs-graph gap at 16,16,2048,64 the GPU's clock under a continuous load? Times 200
# back-to-back calls (eager), then the same calls one at a time with an L2-sized memset and a
# pause between (low duty cycle), for evotuner and SDPA, sampling the SM clock with nvidia-smi.
import subprocess, time, statistics, torch, evotuner
import torch.nn.functional as F
q, k, v = (torch.randn(16, 16, 2048, 64, device="cuda", dtype=torch.float16) for _ in range(3))
fns = {"evotuner": lambda: evotuner.flash_attention(q, k, v), "sdpa": lambda: F.scaled_dot_product_attention(q, k, v)}
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
def clocks():
    out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=10).stdout.strip()
    return out
for name, fn in fns.items():
    for _ in range(20): fn()
    torch.cuda.synchronize()
for rnd in range(2):
    for name, fn in fns.items():
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(200): fn()
        e.record(); time.sleep(0.06); c = clocks(); torch.cuda.synchronize()
        eager = s.elapsed_time(e) * 1000 / 200
        ts = []
        for _ in range(50):
            flush.zero_(); torch.cuda.synchronize(); time.sleep(0.002)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b) * 1000)
        c2 = clocks()
        print(f"round {rnd} {name:9s} eager back-to-back {eager:7.1f} us/call (clock,power mid-run: {c}) | "
              f"one at a time, L2 flushed, paused: median {statistics.median(ts):7.1f} us (after: {c2})", flush=True)
