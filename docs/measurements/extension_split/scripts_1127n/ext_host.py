"""Session n: host µs per hopper_ext.attention call (1000 back-to-back calls, no synchronize,
tiny kernels so the host bounds the rate), for the build in argv[1]; argv[2] labels it.
`build` mode: python3 ext_host.py OUT build BUILD_EXTENSION_PY (builds test_export's header)."""
import importlib.util, statistics, sys, time
from pathlib import Path
out = Path(sys.argv[1])
if sys.argv[2] == "build":
    sys.path.insert(0, "tests")
    import test_export as te
    spec = importlib.util.spec_from_file_location("build_extension", sys.argv[3])
    bx = importlib.util.module_from_spec(spec); sys.modules[spec.name] = bx; spec.loader.exec_module(bx)
    out.mkdir(parents=True, exist_ok=True)
    te.export_header(te.hopper_studies(pack=True, split=True), te.HOPPER_SPLIT_STUDIES, out / "tuned.h")
    print("built", bx.build(out / "tuned.h", out / "ext", family="hopper").module)
    sys.exit(0)
import torch
sys.path.insert(0, str(out / "ext")); import hopper_ext as f
cases = {"D64 fp16 1,1,128 (row 0)": ((1, 1, 128, 64), (1, 1, 128, 64), torch.float16),
         "D128 bf16 GQA 1,8/2,128 (row 3)": ((1, 8, 128, 128), (1, 2, 128, 128), torch.bfloat16),
         "D128 bf16 split decode 1,8/2,1x2100 (row 4)": ((1, 8, 1, 128), (1, 2, 2100, 128), torch.bfloat16)}
s = torch.cuda.current_stream(0)
t = time.perf_counter()
for _ in range(10000):
    s = torch.cuda.current_stream(0).cuda_stream
py_us = (time.perf_counter() - t) / 10000 * 1e6
res = {}
for name, (qs, ks, dt) in cases.items():
    q = torch.randn(*qs, device="cuda", dtype=dt); k = torch.randn(*ks, device="cuda", dtype=dt); v = torch.randn_like(k)
    for _ in range(50):
        f.attention(q, k, v, False, None)
    rounds = []
    for _ in range(5):
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(1000):
            f.attention(q, k, v, False, None)
        rounds.append((time.perf_counter() - t) / 1000 * 1e6)
        torch.cuda.synchronize()
    res[name] = statistics.median(rounds)
print(f"{sys.argv[2]:4s} " + "  ".join(f"{n}: {u:.2f} µs" for n, u in res.items())
      + f"  | torch.cuda.current_stream(0).cuda_stream from Python: {py_us:.2f} µs")
