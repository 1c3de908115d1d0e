"""Print the check/timing tables of a driver results.json: python3 table.py runs/runN_results.json"""
import json
import sys

rs = json.load(open(sys.argv[1]))
by = {}
for r in rs:
    if r["kind"] == "gemm":
        print(f"gemm {r['name']:22s} S rel err {r['s_rel_err']:.2e}  O rel err {r['o_rel_err']:.2e}  {'OK' if r['ok'] else 'FAIL'}")
    if r["kind"] in ("check", "load"):
        by.setdefault(r["name"], []).append(r)
for name, xs in by.items():
    bad = [x for x in xs if not x.get("ok")]
    worst = max((x.get("err", 0) / max(x.get("tol", 1), 1e-9) for x in xs), default=0)
    lw = max((x.get("lse_err", 0) / max(x.get("lse_tol", 1), 1e-9) for x in xs), default=0)
    print(f"check {name:18s} {len(xs) - len(bad)}/{len(xs)} ok, worst err/tol O {worst:.2f} LSE {lw:.2f}")
print(f"{'variant':8s} {'dtype':5s} {'shape':22s} {'TF':>7s} {'sdpaTF':>7s} {'ratio':>6s}")
for r in rs:
    if r["kind"] == "time":
        B, H, S, D = r["shape"]
        print(f"{r['variant']:8s} {r['dtype']:5s} {f'{B},{H},{S},{D}' + (' c' if r['causal'] else ''):22s} "
              f"{r['tflops']:7.1f} {r['sdpa_tflops']:7.1f} {r['ratio']:6.3f}")
