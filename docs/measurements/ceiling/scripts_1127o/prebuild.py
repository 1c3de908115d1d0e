"""Build every (shape, --config) of this call's benches at once (nvcc in parallel; the disk
cache then serves bench_attention's one-at-a-time loads). Args: lines 'B,H,S,D,C,HKV CONFIG'."""
import sys, time
from evotuner.problem import Problem, Shape
from evotuner.runtime import attention as A
from evotuner.runtime.choice import resolve_config
t0 = time.time()
b = A._get_builder("hopper")
futs = []
for line in open(sys.argv[1]):
    if not line.strip():
        continue
    sh, cfg = line.split()
    B, H, S, D, C, HKV = map(int, sh.split(","))
    p = Problem(Shape(B, H, S, S, D, HKV), "fp16", bool(C))
    futs.append((line.strip(), b.submit(resolve_config(cfg, D, "fp16", bool(C), family="hopper", problem=p), p)))
for what, f in futs:
    r = f.result()
    if not r.ok:
        print("BUILD FAIL", what, (r.error or "")[-300:])
print(f"prebuilt {len(futs)} in {time.time() - t0:.0f} s")
