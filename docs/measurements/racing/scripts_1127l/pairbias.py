"""Does timing two kernels alternately (the paired race) bias either? 1,8,1024,128 causal fp16."""
import statistics, sys
import torch
from evotuner.config import KernelConfig
from evotuner.problem import Problem, Shape
from evotuner.runtime.attention import kernel_module
from evotuner.runtime.check import make_inputs
from evotuner.runtime.timing import time_cuda

B, H, S, D, C = (int(x) for x in (sys.argv[1:6] if len(sys.argv) > 5 else (1, 8, 1024, 128, 1)))
P = Problem(Shape(B, H, S, S, D), "fp16", bool(C))
CF = {
 "rec": "BLOCK_N=128,CLUSTER=1,CONSUMER_WGS=1,CTAS_PER_SM=1,EXP_EMU=0,OVERLAP=1,PACK_GQA=0,PINGPONG=0,REG_CONS=256,REG_PROD=24,RESCALE_LOG2=0,SCHED=0,SPLITS=1,STAGES=2",
 "t2": "BLOCK_N=176,CLUSTER=1,CONSUMER_WGS=1,CTAS_PER_SM=1,EXP_EMU=0,OVERLAP=1,PACK_GQA=1,PINGPONG=0,REG_CONS=256,REG_PROD=24,RESCALE_LOG2=8,SCHED=0,SPLITS=1,STAGES=2",
 "t25": "BLOCK_N=176,CLUSTER=1,CONSUMER_WGS=2,CTAS_PER_SM=1,EXP_EMU=0,OVERLAP=1,PACK_GQA=0,PINGPONG=1,REG_CONS=232,REG_PROD=24,RESCALE_LOG2=0,SCHED=0,SPLITS=1,STAGES=2",
 "t46": "BLOCK_N=80,CLUSTER=1,CONSUMER_WGS=1,CTAS_PER_SM=1,EXP_EMU=0,OVERLAP=1,PACK_GQA=1,PINGPONG=0,REG_CONS=256,REG_PROD=32,RESCALE_LOG2=0,SCHED=0,SPLITS=1,STAGES=2",
}
dev = torch.cuda.current_device()
mods = {n: kernel_module(KernelConfig.parse(c) if hasattr(KernelConfig, "parse") else KernelConfig.of(dict(kv.split("=") for kv in c.split(","))), P, dev, family="hopper") for n, c in CF.items()}
q, k, v = make_inputs(P.shape, "fp16", device="cuda", seed=7)
scale = 1.0 / D ** 0.5
def call(m):
    out = torch.empty_like(q)
    return lambda: m.launch(q, k, v, out, None, scale)
med = statistics.median
for rnd in range(2):
    alone = {n: time_cuda(call(m), reps=300).median_us for n, m in mods.items()}
    print(f"round {rnd} alone: " + "  ".join(f"{n} {u:.2f}" for n, u in alone.items()), flush=True)
    for a, b in (("t25", "t2"), ("t2", "t25"), ("t46", "t2"), ("rec", "t2"), ("t2", "rec"), ("t25", "rec"), ("rec", "t25")):
        t = time_cuda(call(mods[a]), reps=2000, looks=(16, 32, 64), stop=lambda s, p: len(s) >= 64,
                      pair=call(mods[b]), pair_reps=64)
        own, th = t.samples_us, t.pair_samples_us
        r = sorted(x / y for x, y in zip(own, th))
        print(f"  {a:4s} paired with {b:4s}: own {med(own):6.2f} (alone {alone[a]:6.2f})  pair {med(th):6.2f} (alone {alone[b]:6.2f})"
              f"  ratio med {med(r):.3f} p10 {r[len(r)//10]:.3f} p90 {r[9*len(r)//10]:.3f}  alone ratio {alone[a]/alone[b]:.3f}"
              f"  own first8 {[round(x,1) for x in own[:8]]} pair first8 {[round(x,1) for x in th[:8]]}", flush=True)
