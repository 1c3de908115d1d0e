#!/usr/bin/env bash
# The GPU verification a landing's note quotes, in one script (run on the H100 machine from the
# project root, after `source .device/setup.sh` there). Logs go to $OUT (default out/verify).
#   bash scripts/gpu_verify.sh [tests|bench|diagnose|hcheck|workers|all]...
set -uo pipefail
out=${OUT:-out/verify}; mkdir -p "$out"
db="sqlite:////tmp/evotuner-verify.db"
step() { echo "== $* ($(date +%T))"; }
for what in "${@:-all}"; do
  case $what in
    tests|all)
      step "GPU tests"
      timeout 420 python3 -m pytest -q -rs -m gpu tests 2>&1 | tee "$out/gpu_tests.log" | tail -25 ;;&
    bench|all)
      step "bench_attention (every family's recommended config vs SDPA, same run)"
      timeout 300 python3 scripts/bench_attention.py --output "$out/bench" 2>&1 | tee "$out/bench.log" | tail -40 ;;&
    diagnose|all)
      step "search + check + export --require-checked + profile"
      timeout 120 evotuner search --study v64 --shape B=16,H=16,S=2048,D=64 --trials 24 --storage "$db" 2>&1 | tail -4
      timeout 300 evotuner check --study v64 --top 3 --storage "$db" 2>&1 | tee "$out/check.log" | tail -16
      timeout 60 evotuner export --study v64 --output "$out/tuned.h" --require-checked --storage "$db" 2>&1 | tail -6
      timeout 180 evotuner profile --study v64 --top 3 --storage "$db" 2>&1 | tee "$out/profile.log" | tail -20 ;;&
    hcheck|all)
      step "compute-sanitizer on the hopper family's recommended configs (D64, D128 causal)"
      d64=BLOCK_N=128,CONSUMER_WGS=3,STAGES=2,REG_PROD=32,REG_CONS=160,OVERLAP=1,PINGPONG=1,SCHED=0,RESCALE_LOG2=8,EXP_EMU=0
      d128c=BLOCK_N=128,CONSUMER_WGS=2,STAGES=3,REG_PROD=24,REG_CONS=240,OVERLAP=1,PINGPONG=1,SCHED=0,RESCALE_LOG2=8,EXP_EMU=0
      timeout 200 evotuner check --space search_spaces/hopper.toml --config "$d64" --shape D=64 \
        --tools memcheck,racecheck,synccheck 2>&1 | tee "$out/hcheck.log" | tail -5
      timeout 200 evotuner check --space search_spaces/hopper.toml --config "$d128c" --shape D=128 --causal \
        --tools memcheck,racecheck,synccheck 2>&1 | tee -a "$out/hcheck.log" | tail -5 ;;&
    workers|all)
      step "two search processes on one study (exact budget, nothing measured twice)"
      timeout 240 python3 scripts/two_workers.py --trials 24 --gpus 0 --workdir /tmp/evotuner-two 2>&1 | tee "$out/two_workers.log" | tail -12 ;;
  esac
done
