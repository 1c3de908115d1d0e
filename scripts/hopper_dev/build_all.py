"""Build every variant x dtype x causal cubin (+ the stage-0 unit test and the
launcher) into scripts/hopper_dev/bin/, and write bin/manifest.json with the
ptxas figures (registers, spills, stack, smem, C751x serialization notes).

Run from the repository root: python3 scripts/hopper_dev/build_all.py [-j 2] [variant ...]
"""
import argparse
import concurrent.futures as cf
import json
import pathlib
import re
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
from variants import VARIANTS, cubin_name  # noqa: E402

BIN = HERE / "bin"
GEN = HERE / "gen"
FLAGS = ["-cubin", "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-std=c++17", "-Xptxas", "-v", "-I",
         str(ROOT / "kernels")]


def build_one(variant: str, dtype: int, causal: int) -> dict:
    v = VARIANTS[variant]
    name = cubin_name(variant, dtype, causal)
    src = GEN / f"{name}.cu"
    src.write_text(
        f"#define HOPPER_HEAD_DIM {v['D']}\n#define HOPPER_IS_CAUSAL {causal}\n#define HOPPER_DTYPE {dtype}\n"
        f"#define HOPPER_BLOCK_N {v['BN']}\n#define HOPPER_CONSUMER_WGS {v['WGS']}\n#define HOPPER_STAGES {v['ST']}\n"
        f"#define HOPPER_REG_PROD {v['RP']}\n#define HOPPER_REG_CONS {v['RC']}\n#define HOPPER_OVERLAP {v['OV']}\n"
        f"#define HOPPER_PINGPONG {v['PP']}\n#define HOPPER_SCHED {v.get('SC', 0)}\n#define HOPPER_RESCALE_LOG2 {v.get('RS', 0)}\n#define HOPPER_EXP_EMU {v.get('EE', 0)}\n#include \"hopper/instantiate.cuh\"\n")
    t0 = time.time()
    r = subprocess.run(["nvcc", *FLAGS, "-o", str(BIN / f"{name}.cubin"), str(src)], capture_output=True, text=True,
                       timeout=300)
    rep = r.stdout + r.stderr
    info = dict(name=name, variant=variant, dtype=dtype, causal=causal, ok=r.returncode == 0,
                build_s=round(time.time() - t0, 2))
    if r.returncode:
        info["error"] = rep[-2000:]
        return info
    m = re.search(r"Used (\d+) registers", rep)
    info["regs"] = int(m.group(1)) if m else None
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", rep)
    info["stack"], info["spill_st"], info["spill_ld"] = (int(x) for x in m.groups()) if m else (None,) * 3
    info["c751x"] = sorted(set(re.findall(r"\(C751\d\)", rep)))
    return info


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-j", type=int, default=2)
    ap.add_argument("variants", nargs="*")
    a = ap.parse_args()
    BIN.mkdir(exist_ok=True)
    GEN.mkdir(exist_ok=True)
    names = a.variants or list(VARIANTS)
    jobs = [(vn, dt, c) for vn in names for dt in (0, 1) for c in (0, 1)]
    extra = [
        ["nvcc", "-O2", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-I", str(ROOT / "kernels"), "-o",
         str(BIN / "libhopper_dev.so"), str(HERE / "launcher.cu"), "-ldl"],
        ["nvcc", *FLAGS, "-o", str(BIN / "gemm_test.cubin"), str(HERE / "gemm_test.cu")],
    ]
    for cmd in extra:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if r.returncode:
            sys.exit(r.stdout + r.stderr)
    man_path = BIN / "manifest.json"
    manifest = json.loads(man_path.read_text()) if man_path.exists() else {}
    with cf.ThreadPoolExecutor(a.j) as ex:
        for info in ex.map(lambda j: build_one(*j), jobs):
            manifest[info["name"]] = info
            print(f"{info['name']:22s} ok={info['ok']} regs={info.get('regs')} stack={info.get('stack')} "
                  f"spill={info.get('spill_st')} {' '.join(info.get('c751x', []))} {info['build_s']}s", flush=True)
            if not info["ok"]:
                print(info["error"])
    man_path.write_text(json.dumps(manifest, indent=1))


if __name__ == "__main__":
    main()
