set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader
mkdir -p $OUT/power
nvidia-smi --query-gpu=clocks_event_reasons.active --format=csv,noheader && export REASONS=clocks_event_reasons.active || export REASONS=clocks_throttle_reasons.active
timeout 300 python3 .device/l/power.py $OUT/power 2>&1 | tee $OUT/power.log
echo "== midsize grid $(date +%T)"
timeout 250 python3 scripts/bench_attention.py --family hopper --dtypes fp16 --rounds 3 \
  --config BLOCK_N=128,CONSUMER_WGS=2,PINGPONG=0,SCHED=0,STAGES=2,REG_CONS=240,REG_PROD=24 \
  --config BLOCK_N=128,CONSUMER_WGS=2,PINGPONG=0,SCHED=0,STAGES=4,REG_CONS=240,REG_PROD=24 \
  --config BLOCK_N=128,CONSUMER_WGS=2,PINGPONG=1,SCHED=1,STAGES=4,REG_CONS=240,REG_PROD=24 \
  --config BLOCK_N=128,CONSUMER_WGS=2,PINGPONG=1,SCHED=2,STAGES=2,REG_CONS=240,REG_PROD=24 \
  --config BLOCK_N=128,CONSUMER_WGS=2,PINGPONG=1,SCHED=0,STAGES=2,REG_CONS=240,REG_PROD=24 \
  --config BLOCK_N=64,CONSUMER_WGS=2,PINGPONG=0,SCHED=0,STAGES=4,REG_CONS=240,REG_PROD=24 \
  --config BLOCK_N=128,CONSUMER_WGS=1,PINGPONG=0,SCHED=0,STAGES=2,REG_CONS=232,REG_PROD=24,CTAS_PER_SM=2 \
  --config BLOCK_N=128,CONSUMER_WGS=2,PINGPONG=0,OVERLAP=0,SCHED=0,STAGES=2,REG_CONS=240,REG_PROD=24 \
  --shapes 1,16,1024,64,1 --shapes 4,16,1024,64,1 --output $OUT/midgrid 2>&1 | tee $OUT/midgrid.log | grep -E "^B=|^shape|rror"
