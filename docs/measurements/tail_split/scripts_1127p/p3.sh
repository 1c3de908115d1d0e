# session p, call 3: SCHED=3's cost at whole waves, variants of finish_split (uniform flag, compact combine).
set -o pipefail
export PYTHONUNBUFFERED=1
t0=$SECONDS
NV=$(command -v nvcc)
W3=BLOCK_N=80,CONSUMER_WGS=3,STAGES=2,REG_PROD=24,REG_CONS=160,OVERLAP=1,PINGPONG=1,RESCALE_LOG2=8,EXP_EMU=0,CTAS_PER_SM=1,CLUSTER=1,PACK_GQA=1,TILE_OVERLAP=0
VARS="NOUNI COMPACT NOFIN_NOEPI"
for v in $VARS; do
  printf '#!/bin/sh\nexec %s %s "$@"\n' "$NV" "$(echo -DHOPPER_TS_$v | sed 's/_NOEPI/ -DHOPPER_TS_NOEPI/')" > /tmp/nvcc_$v; chmod +x /tmp/nvcc_$v
done
for sh in 1,24,5280,128,0,6 1,32,4096,128,0,8; do echo "$sh $W3,SCHED=2"; echo "$sh $W3,SCHED=3"; done > /tmp/pre.txt
for sh in 1,24,5280,128,0,6 1,32,4096,128,0,8; do echo "$sh $W3,SCHED=3"; done > /tmp/pre3.txt
EVOTUNER_CACHE_DIR=/tmp/c_base timeout 200 python3 .device/p/prebuild.py /tmp/pre.txt 2>&1 | tail -1 &
for v in $VARS; do
  EVOTUNER_NVCC=/tmp/nvcc_$v EVOTUNER_CACHE_DIR=/tmp/c_$v timeout 200 python3 .device/p/prebuild.py /tmp/pre3.txt 2>&1 | tail -1 &
done
wait
for d in /tmp/c_base/builds/*/* /tmp/c_NOUNI/builds/*/*; do
  echo "$d $(stat -c %s $d/kernel.cubin) B, WARPSYNC $(cuobjdump -sass $d/kernel.cubin | grep -c WARPSYNC), instrs $(cuobjdump -sass $d/kernel.cubin | grep -cE '^\s+/\*[0-9a-f]{4}\*/')"
done
B() { timeout 100 python3 scripts/bench_attention.py --family hopper --dtypes fp16 --rounds 5 "$@" --output /tmp/b 2>&1 | grep -E "^B=" | cut -c1-62,90-300 | sort -u | sed 's/BLOCK_N=.*SCHED=/SCHED=/'; }
for sh in 1,24,5280,128,0,6 1,32,4096,128,0,8; do
  EVOTUNER_CACHE_DIR=/tmp/c_base B --config $W3,SCHED=2 --config $W3,SCHED=3 --shapes $sh
  for v in $VARS; do echo "-- $v"; EVOTUNER_NVCC=/tmp/nvcc_$v EVOTUNER_CACHE_DIR=/tmp/c_$v B --config $W3,SCHED=3 --shapes $sh; done
  echo "-- reversed"; EVOTUNER_CACHE_DIR=/tmp/c_base B --config $W3,SCHED=3 --config $W3,SCHED=2 --shapes $sh
done
echo "total wall $((SECONDS - t0)) s"
