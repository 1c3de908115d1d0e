"""One study run by N `evotuner search` processes, one GPU each (--gpus i), started together; the
study database analysed as scripts/bench_gpus.py does."""
import json, os, subprocess, sys, time
from pathlib import Path
sys.path.insert(0, "scripts")
import bench_gpus
n, trials, work = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
work.mkdir(parents=True, exist_ok=False)
db = work / "study.db"
env = dict(os.environ, EVOTUNER_CACHE_DIR=str(work / "cache"))
cores = os.cpu_count() or 1
procs = []
launched = time.time()
for i in range(n):
    cmd = [sys.executable, "-m", "evotuner.cli", "search", "--study", "procs", "--shape", "B=4,H=32,S=4096,D=128",
           "--dtype", "fp16", "--trials", str(trials), "--storage", f"sqlite:///{db}", "--seed", "0", "--no-transfer",
           "--causal", "--gpus", str(i), "--jobs", str(max(1, cores // n))]
    procs.append(subprocess.Popen(cmd, stdout=open(work / f"search{i}.log", "w"), stderr=subprocess.STDOUT, env=env,
                                  start_new_session=True))
rcs = [p.wait(timeout=400) for p in procs]
exited = time.time()
report = bench_gpus.analyse(db, "procs", launched, exited, trials)
report["returncodes"] = rcs
report["loop_split_s"] = [bench_gpus.time_split((work / f"search{i}.log").read_text()) for i in range(n)]
print(json.dumps(report))
