set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
R=BLOCK_N=128,CONSUMER_WGS=2,PINGPONG=1,REG_CONS=240,REG_PROD=24,SCHED=0,STAGES=2
A2=BLOCK_N=128,CONSUMER_WGS=1,CTAS_PER_SM=2,PINGPONG=0,REG_CONS=232,REG_PROD=24,SCHED=2,STAGES=2
A=BLOCK_N=128,CONSUMER_WGS=1,CTAS_PER_SM=2,PINGPONG=0,REG_CONS=232,REG_PROD=24,SCHED=0,STAGES=2
S1=BLOCK_N=128,CONSUMER_WGS=2,PINGPONG=1,REG_CONS=240,REG_PROD=24,SCHED=1,STAGES=2
B3=BLOCK_N=128,CONSUMER_WGS=3,PINGPONG=1,REG_CONS=160,REG_PROD=32,SCHED=2,STAGES=2
echo "== d64 non-causal mid rows $(date +%T)"
timeout 250 python3 scripts/bench_attention.py --family hopper --dtypes fp16 --rounds 3 \
  --config $R --config $A2 --config $A --config $S1 --config $B3 \
  --shapes 1,16,1024,64,0 --shapes 2,16,1024,64,0 --shapes 1,16,2048,64,0 --shapes 1,8,4096,64,0 --shapes 4,16,1024,64,0 \
  --output $OUT/nc64rows 2>&1 | tee $OUT/nc64rows.log | grep -E "rror" | head -5
M=BLOCK_N=128,CONSUMER_WGS=2,PINGPONG=1,REG_CONS=240,REG_PROD=24,SCHED=1,STAGES=2
E2=BLOCK_N=64,CONSUMER_WGS=1,CTAS_PER_SM=2,PINGPONG=0,REG_CONS=232,REG_PROD=24,SCHED=2,STAGES=2
F2=BLOCK_N=128,CONSUMER_WGS=1,PINGPONG=0,REG_CONS=256,REG_PROD=24,SCHED=2,STAGES=2
F0=BLOCK_N=128,CONSUMER_WGS=1,PINGPONG=0,REG_CONS=256,REG_PROD=24,SCHED=0,STAGES=3
MC=BLOCK_N=128,CONSUMER_WGS=2,PINGPONG=1,REG_CONS=240,REG_PROD=24,SCHED=0,STAGES=3
echo "== d128 mid rows $(date +%T)"
timeout 250 python3 scripts/bench_attention.py --family hopper --dtypes fp16 --rounds 3 \
  --config $M --config $MC --config $E2 --config $F2 --config $F0 \
  --shapes 1,16,1024,128,0 --shapes 1,16,2048,128,0 --shapes 2,16,1024,128,0 --shapes 4,16,1024,128,0 \
  --shapes 1,16,1024,128,1 --shapes 2,16,1024,128,1 --shapes 2,16,2048,128,1 \
  --output $OUT/m128rows 2>&1 | tee $OUT/m128rows.log | grep -E "rror" | head -5
