set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== bench_runtime causal few rows (new defaults) $(date +%T)"
timeout 240 python3 scripts/bench_runtime.py --rounds 5 \
  --shapes 1,4,1024,64,1 --shapes 1,8,1024,64,1 --shapes 1,16,1024,64,1 --shapes 1,8,2048,64,1 \
  --shapes 2,16,1024,64,1 --shapes 1,16,2048,64,1 --shapes 1,4,2048,128,1 --shapes 1,8,1024,128,1 \
  --output $OUT/runtime_causal_rows 2>&1 | tee $OUT/runtime_causal_rows.log | tail -14
echo "== split-KV GPU tests $(date +%T)"
timeout 200 python3 -m pytest -q -rs -m gpu tests/gpu/test_split_kv.py 2>&1 | tee $OUT/split_tests.log | tail -4
echo "== sanitizers on the new entries $(date +%T)"
for spec in "D=64 BLOCK_N=128,CONSUMER_WGS=1,CTAS_PER_SM=2,STAGES=2,REG_PROD=24,REG_CONS=232,PINGPONG=0,SCHED=2,OVERLAP=1,EXP_EMU=0,RESCALE_LOG2=0" \
            "D=128 BLOCK_N=128,CONSUMER_WGS=1,STAGES=2,REG_PROD=24,REG_CONS=256,PINGPONG=0,SCHED=0,OVERLAP=1,EXP_EMU=0,RESCALE_LOG2=0"; do
  set -- $spec
  echo "-- $1 causal $2" | tee -a $OUT/sanitize.log
  timeout 150 evotuner check --space search_spaces/hopper.toml --config "$2" --shape "$1" --causal \
    --tools memcheck,racecheck,synccheck 2>&1 | tee -a $OUT/sanitize.log | tail -5
done
