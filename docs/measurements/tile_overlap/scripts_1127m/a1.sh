# session m call 1: GQA query-head packing (PACK_GQA=1) and tile shapes at the non-causal GQA bar shapes
set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
B="python3 scripts/bench_attention.py --family hopper --dtypes fp16 --rounds 3"
R="--config SCHED=2 --config PACK_GQA=1 --config PACK_GQA=1,BLOCK_N=64
   --config BLOCK_N=128,CONSUMER_WGS=2,REG_CONS=240 --config PACK_GQA=1,BLOCK_N=128,CONSUMER_WGS=2,REG_CONS=240
   --config PACK_GQA=1,BLOCK_N=128,CONSUMER_WGS=2,REG_CONS=240,SCHED=1"
timeout 240 $B $R --shapes 8,32,1024,128,0,4 --output $OUT/a1_g4 2>&1 | tail -12
timeout 170 $B $R --shapes 4,64,2048,128,0,8 --output $OUT/a1_g2 2>&1 | tail -9
timeout 120 $B --config SCHED=2 --config PACK_GQA=1 --config PACK_GQA=1,BLOCK_N=128,CONSUMER_WGS=2,REG_CONS=240 \
   --shapes 1,32,4096,128,0,8 --output $OUT/a1_g1 2>&1 | tail -6
