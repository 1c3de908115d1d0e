set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== test_hopper_attention (every entry, [d64.mid] now one warpgroup x 2 CTAs) $(date +%T)"
timeout 300 python3 -m pytest -q -rs -m gpu tests/gpu/test_hopper_attention.py tests/gpu/test_attention.py 2>&1 | tee $OUT/hopper_attention_tests.log | tail -3
echo "== sanitizers, [d64.mid] non-causal $(date +%T)"
timeout 120 evotuner check --space search_spaces/hopper.toml --shape D=64 \
  --config BLOCK_N=128,CONSUMER_WGS=1,CTAS_PER_SM=2,STAGES=2,REG_PROD=24,REG_CONS=232,PINGPONG=0,SCHED=2,OVERLAP=1,EXP_EMU=0,RESCALE_LOG2=0 \
  --tools memcheck,racecheck,synccheck 2>&1 | tee $OUT/sanitize_d64mid.log | grep -E "clean|error|config"
echo "== bench_runtime non-causal D=64 mid $(date +%T)"
timeout 150 python3 scripts/bench_runtime.py --rounds 5 --shapes 1,16,1024,64,0 --shapes 2,16,1024,64,0 --shapes 1,16,2048,64,0 --shapes 1,8,4096,64,0 \
  --output $OUT/runtime_nc64 2>&1 | tee $OUT/runtime_nc64.log | tail -7
