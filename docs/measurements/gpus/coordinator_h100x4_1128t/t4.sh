#!/usr/bin/env bash
# session t: one study on 1 GPU then --gpus all, after a change; $1 = tag
set -u
tag=${1:-t4}
out=${OUT:-/tmp/out}; mkdir -p "$out"
git log -1 --oneline > "$out/${tag}_git.txt"; git status --short >> "$out/${tag}_git.txt"
timeout 560 python3 scripts/bench_gpus.py --trials 256 --causal --runs none,all --run-timeout 270 \
  --workdir /tmp/evotuner-gpus-$tag -o "$out/${tag}_bench_gpus.json" > "$out/${tag}_bench_gpus.log" 2>&1
echo "rc=$?" | tee -a "$out/${tag}_bench_gpus.log"
grep -E "^\{" "$out/${tag}_bench_gpus.log" | cut -c1-1500
for d in /tmp/evotuner-gpus-$tag/*/; do n=$(basename "$d"); cp "$d"/study.db "$out/${tag}_$n.db" 2>/dev/null; cp "$d"/search.log "$out/${tag}_$n.search.log" 2>/dev/null; done
