"""Paired timing under CPU contention (as during a search: nvcc on every core). Host cost per
launch of each module, then paired ratios with and without 16 busy processes."""
import os, subprocess, statistics, sys, time, tempfile
import torch
from evotuner.compiler import Builder
from evotuner.config import KernelConfig
from evotuner.problem import Problem, Shape
from evotuner.runtime.check import make_inputs
from evotuner.runtime.loader import KernelModule
from evotuner.runtime.timing import time_cuda

P = Problem(Shape(1, 8, 1024, 1024, 128), "fp16", True)
CF = {
 "rec": "BLOCK_N=128,CLUSTER=1,CONSUMER_WGS=1,CTAS_PER_SM=1,EXP_EMU=0,OVERLAP=1,PACK_GQA=0,PINGPONG=0,REG_CONS=256,REG_PROD=24,RESCALE_LOG2=0,SCHED=0,SPLITS=1,STAGES=2",
 "t11": "BLOCK_N=128,CLUSTER=1,CONSUMER_WGS=1,CTAS_PER_SM=1,EXP_EMU=0,OVERLAP=1,PACK_GQA=1,PINGPONG=0,REG_CONS=256,REG_PROD=24,RESCALE_LOG2=8,SCHED=0,SPLITS=1,STAGES=3",
 "t25": "BLOCK_N=176,CLUSTER=1,CONSUMER_WGS=2,CTAS_PER_SM=1,EXP_EMU=0,OVERLAP=1,PACK_GQA=0,PINGPONG=1,REG_CONS=232,REG_PROD=24,RESCALE_LOG2=0,SCHED=0,SPLITS=1,STAGES=2",
}
mods = {}
with Builder("hopper", cache_dir=tempfile.mkdtemp(), jobs=4) as b:
    for n, c in CF.items():
        r = b.build(KernelConfig.parse(c), P); assert r.ok, r.error
        mods[n] = KernelModule.load(r.artifact, device=0, cache=False)
q, k, v = make_inputs(P.shape, "fp16", device="cuda", seed=7)
def call(m):
    out = torch.empty_like(q)
    return lambda: m.launch(q, k, v, out, None, 1 / 128 ** 0.5)
calls = {n: call(m) for n, m in mods.items()}
med = statistics.median
def host_us(f, n=300):
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): f()
    dt = (time.perf_counter() - t) / n * 1e6; torch.cuda.synchronize(); return dt
def run(tag):
    print(f"-- {tag}: host µs/launch " + "  ".join(f"{n} {host_us(f):.1f}" for n, f in calls.items()), flush=True)
    alone = {n: time_cuda(f, reps=300).median_us for n, f in calls.items()}
    print("   alone " + "  ".join(f"{n} {u:.2f}" for n, u in alone.items()), flush=True)
    for a, b in (("t25", "t11"), ("t25", "rec"), ("rec", "t11"), ("t11", "rec")):
        rs = []
        for _ in range(4):
            t = time_cuda(calls[a], reps=2000, looks=(16, 32, 64), stop=lambda s, p: len(s) >= 64, pair=calls[b], pair_reps=64)
            rs.append((med(t.samples_us), med(t.pair_samples_us), med(sorted(x / y for x, y in zip(t.samples_us, t.pair_samples_us))),
                       max(t.pair_samples_us), max(t.samples_us)))
        print(f"   {a} vs {b}: " + " | ".join(f"own {o:.1f} pair {p:.1f} ratio {r:.3f} maxp {mp:.0f} maxo {mo:.0f}" for o, p, r, mp, mo in rs)
              + f"   (alone ratio {alone[a] / alone[b]:.3f})", flush=True)
run("quiet")
busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 16)]
try:
    time.sleep(1)
    run(f"{len(busy)} busy processes")
finally:
    for p in busy: p.kill()
