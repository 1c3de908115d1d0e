"""Dev harness for the hopper family (GPU machine): unit test, correctness, timing.

  python3 scripts/hopper_dev/driver.py                 # everything: gemm test, then one subprocess per variant
  python3 scripts/hopper_dev/driver.py --variants c64 c128 --no-check
  python3 scripts/hopper_dev/driver.py --one c128      # (internal) one variant in this process, JSON lines out

Correctness: fresh random inputs per check, NaN-poisoned O and LSE, FA2's rule
(tol = 2 * max|out_lowprec - ref| + 1e-5, ref = fp32 attention on upcast inputs,
out_lowprec = the same attention computed in the inputs' dtype), also for LSE.
Timing: triton.testing.do_bench median (it clears L2 between reps), SDPA default
(cuDNN on H100) timed in the same process. Logs go to $OUT (or ./out_hopper_dev).
"""
import argparse
import ctypes
import json
import math
import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from variants import VARIANTS, DTYPES, cubin_name  # noqa: E402

BIN = HERE / "bin"
ROUNDS = int(os.environ.get("HOPPER_DEV_ROUNDS", "1"))
META_LEN = 18

CHECK_SHAPES = [  # (B, H, Sq, Sk)
    (1, 1, 1, 1), (1, 3, 17, 17), (2, 3, 97, 97), (1, 1, 128, 128), (1, 3, 513, 513), (1, 2, 2047, 2047),
    (1, 3, 97, 513), (2, 1, 513, 97), (1, 3, 1, 2047), (1, 1, 2047, 17), (3, 1, 128, 1), (1, 5, 300, 1000),
]
BSHD_SHAPES = [(2, 3, 513, 200)]
BENCH = {  # head dim -> [(B, H, S, causal)]
    64: [(16, 16, 2048, 0), (4, 16, 4096, 1), (1, 8, 512, 0)],
    128: [(8, 16, 2048, 0), (4, 32, 4096, 1), (1, 32, 8192, 0)],
}


class Lib:
    def __init__(self):
        self.lib = ctypes.CDLL(str(BIN / "libhopper_dev.so"))
        self.lib.hop_last_error.restype = ctypes.c_char_p
        self.lib.hop_load.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                      ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int32), ctypes.c_int]
        LL4 = ctypes.c_longlong * 3
        self.LL3 = LL4
        self.lib.hop_fwd.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32)] + [ctypes.c_void_p] * 4 + [
            ctypes.c_void_p] + [ctypes.c_int] * 5 + [LL4] * 4 + [ctypes.c_float, ctypes.c_void_p]
        self.lib.hop_gemm_test.argtypes = [ctypes.c_void_p, ctypes.c_int] + [ctypes.c_void_p] * 5 + [ctypes.c_int] * 3 + [
            ctypes.c_void_p]

    def err(self, rc, what):
        if rc:
            raise RuntimeError(f"{what}: rc={rc}: {self.lib.hop_last_error().decode()}")

    def load(self, path, kernel, meta_name):
        fn = ctypes.c_void_p()
        meta = (ctypes.c_int32 * META_LEN)()
        self.err(self.lib.hop_load(str(path).encode(), kernel.encode(), meta_name.encode() if meta_name else None,
                                   ctypes.byref(fn), meta, META_LEN), f"load {path}")
        return fn, meta


class Kernel:
    def __init__(self, lib, name):
        self.lib, self.name = lib, name
        self.fn, self.meta = lib.load(BIN / f"{name}.cubin", "hopper_fwd", "hopper_meta")

    def __call__(self, q, k, v, o, lse, scale):
        import torch
        B, H, Sq, D = q.shape
        Sk = k.shape[2]
        st = lambda t: self.lib.LL3(t.stride(0), t.stride(1), t.stride(2))  # noqa: E731
        for t in (q, k, v, o):
            assert t.stride(3) == 1
        self.lib.err(self.lib.lib.hop_fwd(
            self.fn, self.meta, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
            lse.data_ptr() if lse is not None else None, B, H, Sq, Sk, D, st(q), st(k), st(v), st(o), scale,
            torch.cuda.current_stream().cuda_stream), f"launch {self.name}")


def reference(q, k, v, causal, scale):
    """(fp32 out, fp32 lse, low-precision out, low-precision lse) per FA2's rule."""
    import torch
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    qf, kf, vf = (t.reshape(B * H, t.shape[2], D) for t in (q, k, v))
    mask = (torch.arange(Sk, device=q.device)[None, :] > torch.arange(Sq, device=q.device)[:, None]) if causal else None
    outs, lses, outs_lp, lses_lp = [], [], [], []
    step = max(1, (1 << 28) // max(Sq * Sk * 4, 1))
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for s in range(0, B * H, step):
            e = min(B * H, s + step)
            sc = torch.matmul(qf[s:e].float(), kf[s:e].float().transpose(1, 2)) * scale
            sl = torch.matmul(qf[s:e], kf[s:e].transpose(1, 2)) * scale  # input dtype
            if mask is not None:
                sc.masked_fill_(mask, float("-inf"))
                sl.masked_fill_(mask, float("-inf"))
            lses.append(torch.logsumexp(sc, -1))
            outs.append(torch.matmul(torch.softmax(sc, -1), vf[s:e].float()))
            lses_lp.append(torch.logsumexp(sl.float(), -1))
            outs_lp.append(torch.matmul(torch.softmax(sl, -1).to(q.dtype), vf[s:e]))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    cat = lambda xs, *shape: torch.cat(xs).reshape(*shape)  # noqa: E731
    return (cat(outs, B, H, Sq, D), cat(lses, B, H, Sq), cat(outs_lp, B, H, Sq, D), cat(lses_lp, B, H, Sq))


def check(kern, B, H, Sq, Sk, D, dtype, causal, layout="bhsd", seed=0):
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = torch.float16 if dtype == 0 else torch.bfloat16

    def mk(S):
        if layout == "bshd":
            return torch.randn(B, S, H, D, device="cuda", dtype=dt, generator=g).transpose(1, 2)
        return torch.randn(B, H, S, D, device="cuda", dtype=dt, generator=g)

    q, k, v = mk(Sq), mk(Sk), mk(Sk)
    o = (torch.empty(B, Sq, H, D, device="cuda", dtype=dt).transpose(1, 2) if layout == "bshd"
         else torch.empty(B, H, Sq, D, device="cuda", dtype=dt)).fill_(float("nan"))
    lse = torch.full((B, H, Sq), float("nan"), device="cuda", dtype=torch.float32)
    scale = 1.0 / math.sqrt(D)
    kern(q, k, v, o, lse, scale)
    torch.cuda.synchronize()
    ref, ref_lse, lp, lp_lse = reference(q, k, v, causal, scale)
    tol = 2 * float((lp.float() - ref).abs().max()) + 1e-5
    ltol = 2 * float((lp_lse - ref_lse).abs().max()) + 1e-5
    of = o.float()
    res = dict(shape=[B, H, Sq, Sk], layout=layout, tol=tol, lse_tol=ltol)
    if not bool(torch.isfinite(of).all()) or not bool(torch.isfinite(lse).all()):
        res.update(ok=False, err=float("inf"), lse_err=float("inf"),
                   why=f"{int((~torch.isfinite(of)).sum())} non-finite O, {int((~torch.isfinite(lse)).sum())} non-finite LSE")
        return res
    err = float((of - ref).abs().max())
    lerr = float((lse - ref_lse).abs().max())
    res.update(ok=err <= tol and lerr <= ltol, err=err, lse_err=lerr)
    return res


def bench_ms(fn):
    import triton
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def time_problem(kern, B, H, S, D, dtype, causal):
    import torch
    import torch.nn.functional as F
    dt = torch.float16 if dtype == 0 else torch.bfloat16
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=dt) for _ in range(3))
    o = torch.empty_like(q)
    lse = torch.empty(B, H, S, device="cuda", dtype=torch.float32)
    scale = 1.0 / math.sqrt(D)
    flops = 4.0 * B * H * S * S * D / (2 if causal else 1)
    res = {}
    kern(q, k, v, o, lse, scale)
    torch.cuda.synchronize()
    # ROUNDS alternations of (ours, SDPA), each a do_bench median; report the medians.
    ours, theirs = [], []
    for _ in range(ROUNDS):
        ours.append(bench_ms(lambda: kern(q, k, v, o, lse, scale)))
        theirs.append(bench_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal), scale=scale)))
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    ms, ms_s = med(ours), med(theirs)
    res["ms"] = ms
    res["tflops"] = flops / ms * 1e-9
    res["ms_all"], res["sdpa_ms_all"] = ours, theirs
    res["sdpa_ms"] = ms_s
    res["sdpa_tflops"] = flops / ms_s * 1e-9
    res["ratio"] = ms_s / res["ms"]
    return res


def emit(d):
    print("JSON " + json.dumps(d), flush=True)


def run_one(variant, do_check, do_time, dtypes):
    import torch
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    lib = Lib()
    v = VARIANTS[variant]
    D = v["D"]
    for dtype in dtypes:
        for causal in (0, 1):
            name = cubin_name(variant, dtype, causal)
            try:
                kern = Kernel(lib, name)
            except Exception as e:  # noqa: BLE001
                emit(dict(kind="load", name=name, ok=False, why=str(e)))
                continue
            if do_check:
                worst = None
                for (B, H, Sq, Sk) in CHECK_SHAPES:
                    r = check(kern, B, H, Sq, Sk, D, dtype, causal, seed=hash((B, H, Sq, Sk)) & 0xffff)
                    r.update(kind="check", name=name)
                    emit(r)
                for (B, H, Sq, Sk) in BSHD_SHAPES:
                    r = check(kern, B, H, Sq, Sk, D, dtype, causal, layout="bshd", seed=7)
                    r.update(kind="check", name=name)
                    emit(r)
            if do_time:
                for (B, H, S, c) in BENCH[D]:
                    if c != causal:
                        continue
                    r = time_problem(kern, B, H, S, D, dtype, causal)
                    r.update(kind="time", name=name, variant=variant, dtype=DTYPES[dtype], shape=[B, H, S, D],
                             causal=causal)
                    emit(r)


def run_gemm():
    import torch
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    lib = Lib()
    tests = [("gemm_n128_d64_f16", 128, 64, 0), ("gemm_n128_d128_f16", 128, 128, 0),
             ("gemm_n128_d128_bf16", 128, 128, 1), ("gemm_n64_d128_f16", 64, 128, 0),
             ("gemm_n176_d128_bf16", 176, 128, 1), ("gemm_n256_d64_f16", 256, 64, 0)]
    for kname, N, D, dtype in tests:
        dt = torch.float16 if dtype == 0 else torch.bfloat16
        a = torch.randn(64, D, device="cuda", dtype=dt)
        b = torch.randn(N, D, device="cuda", dtype=dt)
        v = torch.randn(N, D, device="cuda", dtype=dt)
        s = torch.full((64, N), float("nan"), device="cuda")
        o = torch.full((64, D), float("nan"), device="cuda")
        fn, _ = lib.load(BIN / "gemm_test.cubin", kname, None)
        smem = 1024 + (64 + 2 * N) * D * 2 + 64
        lib.err(lib.lib.hop_gemm_test(fn, dtype, a.data_ptr(), b.data_ptr(), v.data_ptr(), s.data_ptr(), o.data_ptr(),
                                      N, D, smem, torch.cuda.current_stream().cuda_stream), kname)
        torch.cuda.synchronize()
        s_ref = a.double() @ b.double().T
        o_ref = s.to(dt).double() @ v.double()
        es = float((s.double() - s_ref).abs().max() / s_ref.abs().max())
        eo = float((o.double() - o_ref).abs().max() / o_ref.abs().max())
        emit(dict(kind="gemm", name=kname, s_rel_err=es, o_rel_err=eo, ok=es < 1e-3 and eo < 1e-2))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--one")
    ap.add_argument("--small", action="store_true", help="with --one: only small ragged shapes (for compute-sanitizer)")
    ap.add_argument("--gemm", action="store_true")
    ap.add_argument("--variants", nargs="*")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--no-time", action="store_true")
    ap.add_argument("--dtypes", default="0,1")
    ap.add_argument("--timeout", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=1, help="alternations of (ours, SDPA) per timed shape")
    a = ap.parse_args()
    dtypes = [int(x) for x in a.dtypes.split(",")]
    os.environ["HOPPER_DEV_ROUNDS"] = str(a.rounds)
    if a.gemm:
        return run_gemm()
    if a.one:
        if a.small:
            global CHECK_SHAPES, BSHD_SHAPES
            CHECK_SHAPES = [(1, 3, 17, 17), (2, 1, 97, 200), (1, 1, 130, 67)]
            BSHD_SHAPES = []
        return run_one(a.one, not a.no_check, not a.no_time, dtypes)
    out = pathlib.Path(os.environ.get("OUT", "out_hopper_dev"))
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "driver_log.txt", "w")
    results = []

    def sub(args, timeout):
        t0 = time.time()
        try:
            p = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, timeout=timeout)
            text, rc = p.stdout + p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            text = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            text += "\nTIMEOUT"
            rc = "timeout"
        log.write(f"=== {args} rc={rc} {time.time() - t0:.1f}s\n{text}\n")
        log.flush()
        for line in text.splitlines():
            if line.startswith("JSON "):
                results.append(json.loads(line[5:]))
        if rc != 0:
            print(f"!! {args}: rc={rc}: {text.strip().splitlines()[-1] if text.strip() else ''}", flush=True)

    sub(["--gemm"], 60)
    flags = (["--no-check"] if a.no_check else []) + (["--no-time"] if a.no_time else []) + ["--dtypes", a.dtypes]
    for vn in (a.variants or list(VARIANTS)):
        sub(["--one", vn, *flags], a.timeout)
    (out / "results.json").write_text(json.dumps(results, indent=0))
    # Summary tables.
    for r in results:
        if r["kind"] == "gemm":
            print(f"gemm {r['name']:22s} S rel err {r['s_rel_err']:.2e}  O rel err {r['o_rel_err']:.2e}  "
                  f"{'OK' if r['ok'] else 'FAIL'}")
    by = {}
    for r in results:
        if r["kind"] in ("check", "load"):
            by.setdefault(r["name"], []).append(r)
    for name, rs in by.items():
        bad = [r for r in rs if not r.get("ok")]
        worst = max((r.get("err", 0) / max(r.get("tol", 1), 1e-9) for r in rs), default=0)
        print(f"check {name:18s} {len(rs) - len(bad)}/{len(rs)} ok, worst err/tol {worst:.2f}"
              + (f"  FAIL e.g. {bad[0].get('shape')} {bad[0].get('layout', '')} err {bad[0].get('err')} "
                 f"tol {bad[0].get('tol')} lse {bad[0].get('lse_err')}/{bad[0].get('lse_tol')} "
                 f"{bad[0].get('why', '')}" if bad else ""))
    print(f"{'variant':8s} {'dtype':5s} {'shape':22s} {'TF':>7s} {'sdpaTF':>7s} {'ratio':>6s}")
    for r in results:
        if r["kind"] == "time":
            B, H, S, D = r["shape"]
            print(f"{r['variant']:8s} {r['dtype']:5s} {f'{B},{H},{S},{D}' + (' c' if r['causal'] else ''):22s} "
                  f"{r['tflops']:7.1f} {r['sdpa_tflops']:7.1f} {r['ratio']:6.3f}")
    best = {}
    for r in results:
        if r["kind"] == "time":
            key = (r["dtype"], tuple(r["shape"]), r["causal"])
            if key not in best or r["ratio"] > best[key]["ratio"]:
                best[key] = r
    print("best per shape:")
    for key in sorted(best):
        r = best[key]
        B, H, S, D = r["shape"]
        print(f"  {r['dtype']:5s} {f'{B},{H},{S},{D}' + (' c' if r['causal'] else ''):22s} {r['variant']:8s} "
              f"{r['tflops']:7.1f} TF  sdpa {r['sdpa_tflops']:7.1f}  ratio {r['ratio']:.3f}")


if __name__ == "__main__":
    main()
