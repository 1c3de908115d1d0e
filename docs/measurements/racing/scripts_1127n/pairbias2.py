"""Session n: where does the paired race's 2-3% bias against the config ("own") come from?
Two equal-speed kernels (session l's rec and t11 at 1,8,1024,128 causal, ~18 µs) and a
~0.45 ms pair (8,16,2048,128 non-causal, two configs 4.5% apart), timed in several orders with
time_cuda's per-repetition recipe (L2 flush, host lead, events), 64 pairs x 6 windows each."""
import statistics, sys, tempfile
import torch
from evotuner.compiler import Builder
from evotuner.config import KernelConfig
from evotuner.problem import Problem, Shape
from evotuner.runtime.check import make_inputs
from evotuner.runtime.loader import KernelModule
from evotuner.runtime import timing as T

SHORT = Problem(Shape(1, 8, 1024, 1024, 128), "fp16", True)
LONG = Problem(Shape(8, 16, 2048, 2048, 128), "fp16", False)
REC = "BLOCK_N=128,CLUSTER=1,CONSUMER_WGS=1,CTAS_PER_SM=1,EXP_EMU=0,OVERLAP=1,PACK_GQA=0,PINGPONG=0,REG_CONS=256,REG_PROD=24,RESCALE_LOG2=0,SCHED=0,SPLITS=1,STAGES=2"
T11 = "BLOCK_N=128,CLUSTER=1,CONSUMER_WGS=1,CTAS_PER_SM=1,EXP_EMU=0,OVERLAP=1,PACK_GQA=1,PINGPONG=0,REG_CONS=256,REG_PROD=24,RESCALE_LOG2=8,SCHED=0,SPLITS=1,STAGES=3"
L1 = "BLOCK_N=128,CLUSTER=1,CONSUMER_WGS=2,CTAS_PER_SM=1,EXP_EMU=0,OVERLAP=1,PACK_GQA=0,PINGPONG=1,REG_CONS=240,REG_PROD=24,RESCALE_LOG2=8,SCHED=1,SPLITS=1,STAGES=2,TILE_OVERLAP=0"
L2 = "BLOCK_N=128,CLUSTER=1,CONSUMER_WGS=2,CTAS_PER_SM=1,EXP_EMU=0,OVERLAP=1,PACK_GQA=0,PINGPONG=1,REG_CONS=240,REG_PROD=24,RESCALE_LOG2=0,SCHED=1,SPLITS=1,STAGES=2,TILE_OVERLAP=0"
med = statistics.median

def load(b, cfg, P):
    r = b.build(KernelConfig.parse(cfg), P); assert r.ok, r.error
    return KernelModule.load(r.artifact, device=0, cache=False)

def caller(m, P):
    q, k, v = make_inputs(P.shape, "fp16", device="cuda", seed=7)
    out = torch.empty_like(q)
    return lambda: m.launch(q, k, v, out, None, P.shape.head_dim ** -0.5)

def window(a, b, order, n=64, flush=True, lead=True):
    """n repetitions of a and of b in the pattern `order` (a string of 'a'/'b' repeated), one
    synchronize; returns (med a, med b, median of adjacent-pair ratios a/b)."""
    buf = T.l2_flush_buffer(0) if flush else None
    ev = {"a": [], "b": []}
    calls = {"a": a, "b": b}
    seq = (order * (2 * n // len(order) + 1))[:2 * n]
    for f in (a, b, a, b):
        f()
    torch.cuda.synchronize()
    for c in seq:
        ev[c].append(T._timed(calls[c], buf, lead))
    torch.cuda.synchronize()
    xa = [s.elapsed_time(e) * 1000 for s, e in ev["a"]]
    xb = [s.elapsed_time(e) * 1000 for s, e in ev["b"]]
    return med(xa), med(xb), med(x / y for x, y in zip(xa, xb))

with Builder("hopper", cache_dir=tempfile.mkdtemp(), jobs=8) as b:
    mods = {"rec": (load(b, REC, SHORT), SHORT), "t11": (load(b, T11, SHORT), SHORT),
            "L1": (load(b, L1, LONG), LONG), "L2": (load(b, L2, LONG), LONG)}
calls = {n: caller(m, P) for n, (m, P) in mods.items()}
print(torch.cuda.get_device_name(), flush=True)
import random
def window_random(a, b, n=64, flush=True, lead=True, seed=0):
    """n pairs, each pair's order a coin flip."""
    rng = random.Random(seed)
    buf = T.l2_flush_buffer(0) if flush else None
    calls = {"a": a, "b": b}
    ev = {"a": [], "b": []}
    for f in (a, b, a, b):
        f()
    torch.cuda.synchronize()
    for _ in range(n):
        for c in (("a", "b") if rng.random() < 0.5 else ("b", "a")):
            ev[c].append(T._timed(calls[c], buf, lead))
    torch.cuda.synchronize()
    xa = [s.elapsed_time(e) * 1000 for s, e in ev["a"]]
    xb = [s.elapsed_time(e) * 1000 for s, e in ev["b"]]
    return med(xa), med(xb), med(x / y for x, y in zip(xa, xb))

for x, y in (("rec", "t11"),):
    for rnd in range(3):
        for a, bb in ((x, y), (y, x)):
            rs = [window(calls[a], calls[bb], order="baab") for _ in range(8)]
            print(f"{a:>3} vs {bb:<3} baab one window x8     median ratio {med(r for _, _, r in rs):.3f}  " + " ".join(f"{r:.3f}" for *_, r in rs), flush=True)
            rs = [window_random(calls[a], calls[bb], seed=i) for i in range(8)]
            print(f"{a:>3} vs {bb:<3} random order x8        median ratio {med(r for _, _, r in rs):.3f}  " + " ".join(f"{r:.3f}" for *_, r in rs), flush=True)
            rs = []
            for _ in range(8):
                t = T.time_cuda(calls[a], reps=2000, looks=(16, 32, 64), stop=lambda s, p: len(s) >= 64,
                                pair=calls[bb], pair_reps=64)
                rs.append(med(o / p for o, p in zip(t.samples_us, t.pair_samples_us)))
            print(f"{a:>3} vs {bb:<3} time_cuda paired x8    median ratio {med(rs):.3f}  " + " ".join(f"{r:.3f}" for r in rs), flush=True)
