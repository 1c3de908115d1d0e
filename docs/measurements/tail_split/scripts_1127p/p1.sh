# session p, call 1: SCHED=3 (the last wave split): GPU test, split-KV regression, sanitizers, A/B bench.
set -o pipefail
export PYTHONUNBUFFERED=1
t0=$SECONDS
mkdir -p /tmp/p1
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader
W3=BLOCK_N=80,CONSUMER_WGS=3,STAGES=2,REG_PROD=24,REG_CONS=160,OVERLAP=1,PINGPONG=1,RESCALE_LOG2=8,EXP_EMU=0,CTAS_PER_SM=1,CLUSTER=1,PACK_GQA=1
W2=BLOCK_N=128,CONSUMER_WGS=2,STAGES=2,REG_PROD=24,REG_CONS=240,OVERLAP=1,PINGPONG=1,RESCALE_LOG2=8,EXP_EMU=0,CTAS_PER_SM=1,CLUSTER=1,PACK_GQA=1
G1=BLOCK_N=128,CONSUMER_WGS=2,STAGES=2,REG_PROD=32,REG_CONS=232,OVERLAP=1,PINGPONG=0,SCHED=2,RESCALE_LOG2=8,EXP_EMU=0,CTAS_PER_SM=1,CLUSTER=1,PACK_GQA=0,TILE_OVERLAP=1
declare -A CF
CF[1,32,4096,128,0,8]="$W3,SCHED=2,TILE_OVERLAP=0 $W3,SCHED=3,TILE_OVERLAP=0 $G1"
CF[8,32,1024,128,0,4]="$W3,SCHED=2,TILE_OVERLAP=1 $W3,SCHED=2,TILE_OVERLAP=0 $W3,SCHED=3,TILE_OVERLAP=0"
CF[1,24,5280,128,0,6]="$W3,SCHED=2,TILE_OVERLAP=0 $W3,SCHED=3,TILE_OVERLAP=0"
CF[4,64,2048,128,0,8]="$W3,SCHED=2,TILE_OVERLAP=0 $W2,SCHED=2,TILE_OVERLAP=0 $W2,SCHED=3,TILE_OVERLAP=0"
: > /tmp/pre.txt
for sh in "${!CF[@]}"; do for c in ${CF[$sh]}; do echo "$sh $c" >> /tmp/pre.txt; done; done
(timeout 250 python3 .device/p/prebuild.py /tmp/pre.txt 2>&1 | tail -5) &
pre=$!
timeout 240 python3 -m pytest -q -rs tests/gpu/test_tail_split.py -p no:cacheprovider > $OUT/p1_tests.log 2>&1; echo "tail tests rc=$? wall $((SECONDS - t0)) s"
tail -15 $OUT/p1_tests.log
wait $pre
for sh in 1,32,4096,128,0,8 8,32,1024,128,0,4 1,24,5280,128,0,6 4,64,2048,128,0,8; do
  args=""; for c in ${CF[$sh]}; do args="$args --config $c"; done
  [ $((SECONDS - t0)) -gt 330 ] && { echo "out of time before $sh"; break; }
  timeout 100 python3 scripts/bench_attention.py --family hopper --dtypes fp16 --rounds 5 $args --shapes $sh \
    --output /tmp/p1/p1_${sh//,/_} > /tmp/b.log 2>&1; echo "== $sh rc=$?" | tee -a $OUT/p1_bench.log
  cat /tmp/b.log >> $OUT/p1_bench.log
  grep -E "^B=" /tmp/b.log | cut -c1-62,90-300 | sed 's/BLOCK_N=\|CONSUMER_WGS=\|STAGES=\|REG_PROD=\|REG_CONS=\|OVERLAP=\|PINGPONG=\|RESCALE_LOG2=\|EXP_EMU=\|CTAS_PER_SM=\|CLUSTER=//g'
done
for tool in memcheck racecheck synccheck; do
  [ $((SECONDS - t0)) -gt 470 ] && { echo "out of time before $tool"; break; }
  timeout 110 compute-sanitizer --tool $tool --error-exitcode 9 python3 scripts/sanitize_paths.py --only tail \
    >> $OUT/p1_sanitize.log 2>&1; echo "== $tool rc=$? wall $((SECONDS - t0)) s" | tee -a $OUT/p1_sanitize.log
  tail -6 $OUT/p1_sanitize.log | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|WRONG|ok$" | tail -3
done
tar czf $OUT/p1_bench.tgz -C /tmp p1
echo "total wall $((SECONDS - t0)) s"
