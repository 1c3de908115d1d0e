# session k (2026-11-27), one device call, nvidia-h100-x1: source .device/setup.sh && bash docs/measurements/cluster/scripts/c9.sh
# Session k: after the fix, FlashAttention-3's D=128 pair tile (BLOCK_N=176, two consumer warpgroups, SCHED 0) and
# two more tiles, each with and without pairs, at issue 24's non-causal D=128 shapes
set -o pipefail
export PYTHONUNBUFFERED=1
O=$OUT/c9; mkdir -p $O
w2=CONSUMER_WGS=2,REG_PROD=24,REG_CONS=240,STAGES=2
timeout 500 python3 scripts/bench_attention.py --family hopper --dtypes fp16 --rounds 3 \
  --config BLOCK_N=176,$w2,SCHED=0,CLUSTER=1 --config BLOCK_N=176,$w2,SCHED=0,CLUSTER=2 \
  --config BLOCK_N=128,$w2,SCHED=1,CLUSTER=1 --config BLOCK_N=128,$w2,SCHED=1,CLUSTER=2 \
  --config BLOCK_N=80,CONSUMER_WGS=3,REG_PROD=24,REG_CONS=160,STAGES=3,SCHED=1,CLUSTER=1 \
  --config BLOCK_N=80,CONSUMER_WGS=3,REG_PROD=24,REG_CONS=160,STAGES=3,SCHED=1,CLUSTER=2 \
  --shapes 1,32,4096,128,0,8 --shapes 4,64,2048,128,0,8 --shapes 8,32,1024,128,0,4 --shapes 8,16,2048,128,0 \
  --shapes 1,32,8192,128,0 --output $O/bench_fa3tile 2>&1 | tee $O/bench_fa3tile.log | grep -E "^B=" | awk '{print $1,$4,$5,$6,$(NF-1)}' | sort -u
tar czf $OUT/c9.tgz -C $OUT c9 && rm -rf $O
