# session p, call 8: where SCHED 3's last round spends its time at 1,32/8,4096: variants of
# tail_split.cuh with the partial stores, the wait or the combine's loads left out (wrong output;
# timing only), against SCHED 3 and SCHED 2 in the same process.
set -o pipefail
export PYTHONUNBUFFERED=1
t0=$SECONDS
NV=$(command -v nvcc)
W3=BLOCK_N=80,CONSUMER_WGS=3,STAGES=2,REG_PROD=24,REG_CONS=160,OVERLAP=1,PINGPONG=1,RESCALE_LOG2=8,EXP_EMU=0,CTAS_PER_SM=1,CLUSTER=1,PACK_GQA=1,TILE_OVERLAP=0
VARS="NOCOMBINE NOWAIT NOSTORE_NOWAIT_NOCOMBINE"
for v in $VARS; do
  printf '#!/bin/sh\nexec %s %s "$@"\n' "$NV" "$(echo $v | tr '_' '\n' | sed 's/^/-DHOPPER_TS_/' | tr '\n' ' ')" > /tmp/nvcc_$v; chmod +x /tmp/nvcc_$v
done
sh=1,32,4096,128,0,8
printf "$sh $W3,SCHED=2\n$sh $W3,SCHED=3\n" > /tmp/pre.txt
echo "$sh $W3,SCHED=3" > /tmp/pre3.txt
EVOTUNER_CACHE_DIR=/tmp/c_base timeout 200 python3 .device/p/prebuild.py /tmp/pre.txt 2>&1 | tail -1 &
for v in $VARS; do EVOTUNER_NVCC=/tmp/nvcc_$v EVOTUNER_CACHE_DIR=/tmp/c_$v timeout 200 python3 .device/p/prebuild.py /tmp/pre3.txt 2>&1 | tail -1 & done
wait
B() { timeout 100 python3 scripts/bench_attention.py --family hopper --dtypes fp16 --rounds 5 "$@" --shapes $sh --output /tmp/b 2>&1 | grep -E "^B=" | sort -u | cut -c1-62 ; }
for round in 1 2; do
  echo "-- base: SCHED 2, SCHED 3"; EVOTUNER_CACHE_DIR=/tmp/c_base B --config $W3,SCHED=2 --config $W3,SCHED=3
  for v in $VARS; do echo "-- $v"; EVOTUNER_NVCC=/tmp/nvcc_$v EVOTUNER_CACHE_DIR=/tmp/c_$v B --config $W3,SCHED=3; done
done 2>&1 | tee $OUT/p8_bench.log
echo "total wall $((SECONDS - t0)) s"
