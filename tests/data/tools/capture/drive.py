"""i13 capture driver: run one cubin at small ragged shapes (as `evotuner check` will), or
profile one call (flashcore / sdpa) between cudaProfilerStart/Stop (as `evotuner profile` will)."""
import json, math, sys, time
import torch
from evotuner.compiler.result import Artifact
from evotuner.problem import Problem, Shape

mode, arts_path, name = sys.argv[1], sys.argv[2], sys.argv[3]
a = json.loads(open(arts_path).read())[name] if name != "sdpa" else None
if mode == "check":
    from evotuner.runtime.check import check
    from evotuner.runtime.loader import KernelModule
    art = Artifact(cubin=a["cubin"], key=a["key"], sha256="", meta=a["meta"], entry=a["entry"])
    mod = KernelModule.load(art, device=0, cache=False)
    bm, bn = a["meta"].get("block_m", 128), a["meta"].get("block_n", 64)
    causal = bool(a["problem"]["causal"])
    shapes = [(1, 2, 97, 203), (2, 1, 203, 97), (1, 1, bm + 1, 2 * bn + 3), (1, 2, 2 * bm - 3, bn - 5)]
    for i, (B, H, sq, sk) in enumerate(shapes):
        p = Problem(Shape(B, H, sq, sk, 64), "fp16", causal)
        t = time.perf_counter()
        r = check(mod.launch, p, seed=i)
        print(f"shape {p.shape}: ok={r.ok} err={r.max_error} tol={r.tolerance} {r.reason or ''} {time.perf_counter()-t:.2f}s", file=sys.stderr, flush=True)
    torch.cuda.synchronize()
else:
    from evotuner.runtime.check import make_inputs
    p = Problem(Shape(16, 16, 2048, 2048, 64), "fp16", False)
    q, k, v = make_inputs(p.shape, "fp16", device="cuda:0", seed=0)
    if name == "sdpa":
        f = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=False)
    else:
        from evotuner.runtime.loader import KernelModule
        art = Artifact(cubin=a["cubin"], key=a["key"], sha256="", meta=a["meta"], entry=a["entry"])
        mod = KernelModule.load(art, device=0, cache=False)
        o = torch.empty_like(q)
        f = lambda: mod.launch(q, k, v, o, None, 1.0 / math.sqrt(64))
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    f()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print("profiled one call", file=sys.stderr)
