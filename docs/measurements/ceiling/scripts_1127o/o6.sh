# session o, call 6: the premise of last-wave splitting: three-warpgroup tiles at 1,32/8,4096 (688 packed
# tiles = 5.21 waves) against a problem of the same kind whose 660 tiles fill exactly 5 waves (1,24/6,5280).
set -o pipefail
export PYTHONUNBUFFERED=1
t0=$SECONDS
W3=BLOCK_N=80,CONSUMER_WGS=3,STAGES=2,REG_PROD=24,REG_CONS=160,OVERLAP=1,PINGPONG=1,SCHED=2,RESCALE_LOG2=8,EXP_EMU=0,CTAS_PER_SM=1,CLUSTER=1,PACK_GQA=1
G1=BLOCK_N=128,CONSUMER_WGS=2,STAGES=2,REG_PROD=32,REG_CONS=232,OVERLAP=1,PINGPONG=0,SCHED=2,RESCALE_LOG2=8,EXP_EMU=0,CTAS_PER_SM=1,CLUSTER=1,PACK_GQA=0,TILE_OVERLAP=1
: > /tmp/pre.txt
for sh in 1,32,4096,128,0,8 1,24,5280,128,0,6; do for c in $W3,TILE_OVERLAP=0 $W3,TILE_OVERLAP=1 $G1; do echo "$sh $c" >> /tmp/pre.txt; done; done
timeout 150 python3 .device/o/prebuild.py /tmp/pre.txt 2>&1 | tail -2
for sh in 1,32,4096,128,0,8 1,24,5280,128,0,6; do
  timeout 100 python3 scripts/bench_attention.py --family hopper --dtypes fp16 --rounds 5 --config $W3,TILE_OVERLAP=0 \
    --config $W3,TILE_OVERLAP=1 --config $G1 --shapes $sh > /tmp/b.log 2>&1; echo "== $sh rc=$?" | tee -a $OUT/o6_bench.log
  cat /tmp/b.log >> $OUT/o6_bench.log
  grep -E "^B=" /tmp/b.log | cut -c1-62,90-300 | sed 's/BLOCK_N=\|CONSUMER_WGS=\|STAGES=\|REG_PROD=\|REG_CONS=\|OVERLAP=\|PINGPONG=\|RESCALE_LOG2=\|EXP_EMU=\|CTAS_PER_SM=\|CLUSTER=//g' | sort -u
done
echo "total wall $((SECONDS - t0)) s"
