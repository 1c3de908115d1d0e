# session p, call 2: where SCHED=3 costs at whole waves (1,24/6,5280: nothing split), the racecheck
# report's instructions, and the SASS of SCHED 2 against 3.
set -o pipefail
export PYTHONUNBUFFERED=1
t0=$SECONDS
mkdir -p /tmp/p2 $OUT/sass
NV=$(command -v nvcc)
W3=BLOCK_N=80,CONSUMER_WGS=3,STAGES=2,REG_PROD=24,REG_CONS=160,OVERLAP=1,PINGPONG=1,RESCALE_LOG2=8,EXP_EMU=0,CTAS_PER_SM=1,CLUSTER=1,PACK_GQA=1,TILE_OVERLAP=0
for v in NOFIN NOFIN_NOEPI; do
  printf '#!/bin/sh\nexec %s %s "$@"\n' "$NV" "$(echo -DHOPPER_TS_$v | sed 's/_NOEPI/ -DHOPPER_TS_NOEPI/')" > /tmp/nvcc_$v; chmod +x /tmp/nvcc_$v
done
for sh in 1,24,5280,128,0,6 1,32,4096,128,0,8; do echo "$sh $W3,SCHED=2"; echo "$sh $W3,SCHED=3"; done > /tmp/pre.txt
for sh in 1,24,5280,128,0,6 1,32,4096,128,0,8; do echo "$sh $W3,SCHED=3"; done > /tmp/pre3.txt
EVOTUNER_CACHE_DIR=/tmp/c_base timeout 200 python3 .device/p/prebuild.py /tmp/pre.txt 2>&1 | tail -2 &
for v in NOFIN NOFIN_NOEPI; do
  EVOTUNER_NVCC=/tmp/nvcc_$v EVOTUNER_CACHE_DIR=/tmp/c_$v timeout 200 python3 .device/p/prebuild.py /tmp/pre3.txt 2>&1 | tail -2 &
done
wait
echo "built, wall $((SECONDS - t0)) s"
for d in /tmp/c_base/builds/*/*; do
  s=$(grep -o "HOPPER_SCHED [0-9]" $d/gen.cu | tail -1 | cut -c14); m=$(grep -c "HOPPER_KV_GROUP\|HOPPER_BLOCK_N 80" $d/gen.cu)
  cuobjdump -sass $d/kernel.cubin > $OUT/sass/s${s}_$(basename $d | cut -c1-8).sass 2>/dev/null
done
ls -la $OUT/sass
for f in $OUT/sass/*.sass; do echo "== $f $(grep -cE '^\s+/\*[0-9a-f]{4}\*/' $f) instructions"; done
f3=$(ls $OUT/sass/s3_*.sass | head -1)
echo "== around the racecheck report (0xada0 write, 0xae90 read) in $f3"
grep -nE '/\*(ad[4-9a-f]0|ae[0-9a-f]0|af[0-4]0)\*/' $f3 | head -60
for sh in 1,24,5280,128,0,6 1,32,4096,128,0,8; do
  for order in "$W3,SCHED=2 $W3,SCHED=3" "$W3,SCHED=3 $W3,SCHED=2"; do
    args=""; for c in $order; do args="$args --config $c"; done
    EVOTUNER_CACHE_DIR=/tmp/c_base timeout 100 python3 scripts/bench_attention.py --family hopper --dtypes fp16 --rounds 5 $args --shapes $sh \
      --output /tmp/p2/b_${sh//,/_} 2>&1 | grep -E "^B=" | cut -c1-62,90-300 | sort -u | sed 's/BLOCK_N=.*SCHED=/SCHED=/'
  done
  for v in NOFIN NOFIN_NOEPI; do
    echo "-- $v"
    EVOTUNER_NVCC=/tmp/nvcc_$v EVOTUNER_CACHE_DIR=/tmp/c_$v timeout 100 python3 scripts/bench_attention.py --family hopper --dtypes fp16 --rounds 5 --config $W3,SCHED=3 --shapes $sh \
      --output /tmp/p2/b_$v 2>&1 | grep -E "^B=" | cut -c1-62,90-300 | sort -u | sed 's/BLOCK_N=.*SCHED=/SCHED=/'
  done
  [ $((SECONDS - t0)) -gt 480 ] && break
done
cd $OUT && tar czf sass.tgz sass && rm -rf sass
echo "total wall $((SECONDS - t0)) s"
