#!/usr/bin/env bash
# session t call 1: baseline of one study on 1 GPU then --gpus all (issue 30's bar), code at the session's start
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi -L | tee "$out/t1_gpus.txt"; nproc | tee -a "$out/t1_gpus.txt"; lscpu | grep -i "model name" | tee -a "$out/t1_gpus.txt"
git log -1 --oneline | tee -a "$out/t1_gpus.txt"
timeout 560 python3 scripts/bench_gpus.py --trials 256 --causal --runs none,all --run-timeout 270 \
  --workdir /tmp/evotuner-gpus-all -o "$out/t1_bench_gpus.json" > "$out/t1_bench_gpus.log" 2>&1
echo "rc=$?" | tee -a "$out/t1_bench_gpus.log"
tail -60 "$out/t1_bench_gpus.log"
for d in /tmp/evotuner-gpus-all/*/; do n=$(basename "$d"); cp "$d"/study.db "$out/t1_$n.db" 2>/dev/null; cp "$d"/*.log "$out/" 2>/dev/null; done
ls -la "$out" /tmp/evotuner-gpus-all/*/
