"""Sustained speed, SM clock and board power of ours vs SDPA, each run back to back for SECS s
while nvidia-smi samples every 50 ms; then cuBLAS GEMM 8192^3 and HBM read/copy bandwidth.
python3 power.py OUTDIR"""
import os, statistics, subprocess, sys, time
import torch
import torch.nn.functional as F
import evotuner

out = sys.argv[1]
SECS = 4.0
SHAPES = [(1, 32, 4096, 128, 0, 8), (4, 16, 2048, 256, 0, 16), (8, 32, 1024, 128, 0, 4), (4, 32, 4096, 128, 1, 32)]


def sustained(name, fn, flops):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    log = f"{out}/smi_" + "".join(c if c.isalnum() else "_" for c in name) + ".csv"
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu," + os.environ.get("REASONS", "clocks_event_reasons.active"),
                            "--format=csv,noheader,nounits", "-lms", "50"], stdout=open(log, "w"), start_new_session=True)
    time.sleep(0.3)
    n, t0 = 0, time.perf_counter()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    while time.perf_counter() - t0 < SECS:
        for _ in range(20):
            fn()
        n += 20
        torch.cuda.synchronize()
    e.record(); torch.cuda.synchronize()
    us = s.elapsed_time(e) * 1e3 / n
    smi.terminate(); smi.wait(timeout=10)
    rows = [r.split(",") for r in open(log).read().strip().splitlines()[4:-2]]
    if not rows or len(rows[0]) < 4:
        print(name, "no nvidia-smi samples:", open(log).read()[:300]); return (us, 0.0, 0.0)
    clk = statistics.median(float(r[0]) for r in rows)
    pw = statistics.median(float(r[1]) for r in rows)
    reasons = sorted({r[3].strip() for r in rows})
    tf = flops / us / 1e6 if flops else 0
    print(f"{name:34s} {us:9.1f} us  {tf:6.1f} TF  sm_clk {clk:6.0f} MHz  power {pw:6.1f} W  reasons {reasons}", flush=True)
    return us, clk, pw


for B, H, S, D, C, HKV in SHAPES:
    q = torch.randn(B, H, S, D, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(B, HKV, S, D, device="cuda", dtype=torch.float16) for _ in range(2))
    flops = 4 * B * H * S * S * D / (2 if C else 1)
    tag = f"{B},{H}/{HKV},{S},{D},{'causal' if C else 'full'}"
    for rnd in range(2):
        a = sustained(f"ours {tag} r{rnd}", lambda: evotuner.flash_attention(q, k, v, causal=bool(C)), flops)
        b = sustained(f"sdpa {tag} r{rnd}", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(C), enable_gqa=HKV != H), flops)
        print(f"  ratio sdpa/ours {b[0]/a[0]:.3f}  clock ours/sdpa {a[1]/b[1]:.3f}", flush=True)
    del q, k, v

a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
bm = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
sustained("cublas gemm 8192^3", lambda: a @ bm, 2 * 8192 ** 3)
del a, bm
x = torch.empty(2 * 1024 ** 3, device="cuda", dtype=torch.float16).normal_()   # 4 GiB
y = torch.empty_like(x)
us, _, _ = sustained("hbm read (sum of 4 GiB)", lambda: x.sum(), 0)
print(f"  read  {x.numel() * 2 / us / 1e6:.3f} TB/s")
us, _, _ = sustained("hbm copy (4 GiB -> 4 GiB)", lambda: y.copy_(x), 0)
print(f"  copy  {2 * x.numel() * 2 / us / 1e6:.3f} TB/s (read + write)")
