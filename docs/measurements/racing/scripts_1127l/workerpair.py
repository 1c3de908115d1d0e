"""Reproduce the paired race inside the worker: measure t25 raced against incumbent_us with
the paired incumbent #11 (and others), as the search's loop sends it. 1,8,1024,128 causal."""
import dataclasses, json, sys, tempfile
import torch
from evotuner.compiler import Builder
from evotuner.config import KernelConfig
from evotuner.measure.protocol import artifact_wire, measure_request
from evotuner.measure.racing import DEFAULT_RULE, PAIRED_MARGIN, Race
from evotuner.measure.worker import Worker
from evotuner.problem import Problem, Shape

P = Problem(Shape(1, 8, 1024, 1024, 128), "fp16", True)
CF = {
 "rec": "BLOCK_N=128,CLUSTER=1,CONSUMER_WGS=1,CTAS_PER_SM=1,EXP_EMU=0,OVERLAP=1,PACK_GQA=0,PINGPONG=0,REG_CONS=256,REG_PROD=24,RESCALE_LOG2=0,SCHED=0,SPLITS=1,STAGES=2",
 "t11": "BLOCK_N=128,CLUSTER=1,CONSUMER_WGS=1,CTAS_PER_SM=1,EXP_EMU=0,OVERLAP=1,PACK_GQA=1,PINGPONG=0,REG_CONS=256,REG_PROD=32,RESCALE_LOG2=8,SCHED=0,SPLITS=1,STAGES=3",
 "t2": "BLOCK_N=176,CLUSTER=1,CONSUMER_WGS=1,CTAS_PER_SM=1,EXP_EMU=0,OVERLAP=1,PACK_GQA=1,PINGPONG=0,REG_CONS=256,REG_PROD=24,RESCALE_LOG2=8,SCHED=0,SPLITS=1,STAGES=2",
 "t25": "BLOCK_N=176,CLUSTER=1,CONSUMER_WGS=2,CTAS_PER_SM=1,EXP_EMU=0,OVERLAP=1,PACK_GQA=0,PINGPONG=1,REG_CONS=232,REG_PROD=24,RESCALE_LOG2=0,SCHED=0,SPLITS=1,STAGES=2",
}
arts = {}
with Builder("hopper", cache_dir=tempfile.mkdtemp(), jobs=4) as b:
    for n, c in CF.items():
        r = b.build(KernelConfig.parse(c), P)
        assert r.ok, r.error
        arts[n] = r.artifact
rule = dataclasses.replace(DEFAULT_RULE, paired_margin=PAIRED_MARGIN)
w = Worker()
def measure(name, inc_us, pair_name=None, pair_us=None, seed=0):
    a = arts[name]
    race = Race(inc_us, rule, artifact_wire(arts[pair_name]), pair_us) if pair_name else Race(inc_us, DEFAULT_RULE)
    req = measure_request(str(a.cubin), a.entry, dict(a.meta), P.as_dict(), seed, 0.5, key=a.key, sha256=a.sha256,
                          family=a.family, race=race.to_wire())
    rep = w.handle(req)
    d = rep.to_wire()
    if not d.get("ok"):
        print(name, "FAILED", d); return
    m = d["value"]["measurement"]; det = d["value"]["detail"].get("paired")
    keep = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in m.items() if k in ("median_us", "p20_us", "p80_us", "repetitions", "stopped_early", "pair_ratio", "pairs")}
    print(f"{name:4s} vs inc {inc_us:5.2f} pair {pair_name}: {keep} paired={json.dumps(det)[:300]}", flush=True)
for n in CF:
    measure(n, 1000.0)                      # effectively unraced: own figures
for seed in range(3):
    measure("t25", 16.99, "t11", 17.2, seed)
    measure("t25", 16.99, "t2", 16.99, seed)
    measure("t2", 17.78, "rec", 17.78, seed)
    measure("rec", 16.99, "t25", 22.0, seed)
