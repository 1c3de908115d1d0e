"""Where a study's first measurement goes (issue 28): worker start, first build, first and later measure calls."""
import json, os, sys, time
T0 = time.perf_counter()
def t(): return round(time.perf_counter() - T0, 3)
from evotuner.measure.gpu import GpuMeasure
from evotuner.compiler.builder import Builder
from evotuner.problem import Problem, Shape
from evotuner.space import load_space
from evotuner.config import KernelConfig
print("imports", t(), flush=True)
m = GpuMeasure(); m.start(); print("worker spawned", t(), flush=True)
space = load_space("search_spaces/hopper.toml")
problem = Problem(Shape(4, 32, 4096, 4096, 128), "fp16", causal=True)
base = dict(BLOCK_N=80, CONSUMER_WGS=3, EXP_EMU=0, OVERLAP=1, PINGPONG=0, REG_CONS=160, REG_PROD=32,
            RESCALE_LOG2=8, SCHED=2, STAGES=2, CTAS_PER_SM=1)
configs = [KernelConfig.of(base), KernelConfig.of({**base, "STAGES": 3}), KernelConfig.of({**base, "REG_PROD": 24})]
with Builder(space.kernel, arch=space.arch, jobs=4) as b:
    futs = [b.submit(c, problem) for c in configs]
    arts = []
    for i, f in enumerate(futs):
        r = f.result(); arts.append(r.artifact); print(f"build {i} done", t(), "nvcc s", round(r.seconds, 2), flush=True)
dev = m.device(); print("worker ready (fingerprint)", t(), flush=True)
for i, a in enumerate(arts + arts[:1]):
    s = time.perf_counter()
    out = m.measure(a, problem)
    print(f"measure {i}", t(), "call s", round(time.perf_counter() - s, 3), "median", round(out.median_us, 1),
          "phases", {k: round(v, 3) for k, v in m.last_detail.get("phases", {}).items()}, flush=True)
s = time.perf_counter(); bl = m.baselines(problem); print("baselines", t(), "call s", round(time.perf_counter() - s, 2), bl, flush=True)
m.close()
