set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
R=BLOCK_N=128,CONSUMER_WGS=3,PINGPONG=1,REG_CONS=160,REG_PROD=32,SCHED=2,STAGES=2
A=BLOCK_N=128,CONSUMER_WGS=1,CTAS_PER_SM=2,PINGPONG=0,REG_CONS=232,REG_PROD=24,SCHED=0,STAGES=2
A2=BLOCK_N=128,CONSUMER_WGS=1,CTAS_PER_SM=2,PINGPONG=0,REG_CONS=232,REG_PROD=24,SCHED=2,STAGES=2
B=BLOCK_N=128,CONSUMER_WGS=2,PINGPONG=1,REG_CONS=240,REG_PROD=24,SCHED=0,STAGES=2
C=BLOCK_N=128,CONSUMER_WGS=2,PINGPONG=1,REG_CONS=240,REG_PROD=24,SCHED=2,STAGES=2
D=BLOCK_N=128,CONSUMER_WGS=3,PINGPONG=1,REG_CONS=160,REG_PROD=32,SCHED=1,STAGES=2
echo "== d64 causal few rows $(date +%T)"
timeout 330 python3 scripts/bench_attention.py --family hopper --dtypes fp16,bf16 --rounds 3 \
  --config $R --config $A --config $A2 --config $B --config $C --config $D \
  --shapes 1,4,1024,64,1 --shapes 1,8,1024,64,1 --shapes 1,16,1024,64,1 --shapes 1,8,2048,64,1 \
  --shapes 2,16,1024,64,1 --shapes 1,16,2048,64,1 --shapes 4,16,1024,64,1 --shapes 1,16,4096,64,1 --shapes 8,16,1024,64,1 \
  --output $OUT/c64rows 2>&1 | tee $OUT/c64rows.log | grep -E "^shape" -A200 | grep -E "^B=|rror" | awk '{print $1,$2,$4,$7,$NF}'
M=BLOCK_N=128,CONSUMER_WGS=2,STAGES=3,REG_PROD=24,REG_CONS=240,PINGPONG=1,SCHED=0
E=BLOCK_N=64,CONSUMER_WGS=1,CTAS_PER_SM=2,PINGPONG=0,REG_CONS=232,REG_PROD=24,SCHED=0,STAGES=2
F=BLOCK_N=128,CONSUMER_WGS=1,PINGPONG=0,REG_CONS=256,REG_PROD=24,SCHED=0,STAGES=2
echo "== d128 causal few rows $(date +%T)"
timeout 200 python3 scripts/bench_attention.py --family hopper --dtypes fp16 --rounds 3 \
  --config $M --config $E --config $F \
  --shapes 1,4,2048,128,1 --shapes 1,8,1024,128,1 --shapes 1,16,1024,128,1 --shapes 2,16,1024,128,1 \
  --output $OUT/c128rows 2>&1 | tee $OUT/c128rows.log | grep -E "^shape" -A200 | grep -E "^B=|rror" | awk '{print $1,$2,$4,$7,$NF}'
