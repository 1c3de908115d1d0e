"""The hopper cost model's time per config on a packed causal batch of N sequences (CPU; session s):
`python docs/measurements/hardening_h100_1127s/cost_probe.py N` prints seconds for the first 20
configs of the hopper space and the process's peak memory. Before e2844e4, 2048 sequences took
1.46 s (73 ms a config); after it, 0.1 s; once a tile's clocks were summed by live warpgroups,
0.05 s, and 65535 sequences 0.34 s (the first config walks the batch; then about 1 ms a
config), on the 2-core CI box."""
import random
import resource
import sys
import time

from evotuner.kernels.hopper import cost
from evotuner.problem import Problem
from evotuner.space import load_space

n = int(sys.argv[1])
rnd = random.Random(0)
problem = Problem.packed([rnd.randint(128, 8192) for _ in range(n)], heads=32, head_dim=128, heads_kv=8, causal=True)
configs = []
for config in load_space(family="hopper").configs():
    configs.append(config.as_dict())
    if len(configs) >= 20:
        break
start = time.time()
for config in configs:
    cost.estimate_us(config, problem)
print(f"{n} sequences: {time.time() - start:.2f} s for {len(configs)} configs; "
      f"peak memory {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MB")
