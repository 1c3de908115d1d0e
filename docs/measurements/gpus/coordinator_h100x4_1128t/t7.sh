#!/usr/bin/env bash
# session t, last call: the GPU checks of the one-transaction ask and the GPUs' shared picks, at the tip
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out"
git log -1 --oneline > "$out/t7_git.txt"; git status --short >> "$out/t7_git.txt"
echo "== two_workers (two search processes on one study, then --gpus 0,1)"
timeout 150 python3 scripts/two_workers.py --trials 12 --gpus 0,1 > "$out/t7_two_workers.log" 2>&1; echo "rc=$?"
grep -E "OK|FAIL|error" "$out/t7_two_workers.log" | tail -12
echo "== GPU tests that run searches"
bash docs/measurements/hardening_h100_1127r/gpusuite.sh "$out/t7_tests.log" 120 tests/gpu/test_varlen_search.py
echo "== bench_gpus 256 trials: one GPU, then --gpus all (a second sample of t5's code)"
timeout 200 python3 scripts/bench_gpus.py --trials 256 --causal --runs none,all --run-timeout 100 \
  --workdir /tmp/evotuner-gpus-t7 -o "$out/t7_bench_gpus.json" > "$out/t7_bench_gpus.log" 2>&1; echo "rc=$?"
grep -E "^\{" "$out/t7_bench_gpus.log" | cut -c1-1300
echo "== bench_gpus 64 trials: one GPU, then --gpus 0,1"
timeout 90 python3 scripts/bench_gpus.py --trials 64 --causal --runs none,0+1 --run-timeout 42 \
  --workdir /tmp/evotuner-gpus-two-t7 -o "$out/t7_bench_gpus_two.json" > "$out/t7_bench_gpus_two.log" 2>&1; echo "rc=$?"
grep -E "^\{" "$out/t7_bench_gpus_two.log" | cut -c1-1300
