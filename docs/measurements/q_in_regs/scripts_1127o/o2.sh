# session o, call 2: Q_IN_REGS again: the GPU test (varlen case's config fixed), compute-sanitizer
# on the Q-in-registers cases of scripts/sanitize_paths.py, and a second A/B process.
set -o pipefail
export PYTHONUNBUFFERED=1
t0=$SECONDS
mkdir -p /tmp/o2
timeout 200 python3 -m pytest -q -rs tests/gpu/test_q_in_regs.py -p no:cacheprovider > $OUT/o2_tests.log 2>&1; echo "tests rc=$? wall $((SECONDS - t0)) s"
tail -2 $OUT/o2_tests.log
for tool in memcheck racecheck synccheck; do
  timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 python3 scripts/sanitize_paths.py --only qregs \
    >> $OUT/o2_sanitize.log 2>&1; echo "== $tool rc=$? wall $((SECONDS - t0)) s" | tee -a $OUT/o2_sanitize.log
  tail -3 $OUT/o2_sanitize.log | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|WRONG" 
done
W2=BLOCK_N=128,CONSUMER_WGS=2,STAGES=2,REG_PROD=24,REG_CONS=240,OVERLAP=1,PINGPONG=1,RESCALE_LOG2=8,EXP_EMU=0,CTAS_PER_SM=1,CLUSTER=1
G1=BLOCK_N=128,CONSUMER_WGS=2,STAGES=2,REG_PROD=32,REG_CONS=232,OVERLAP=1,PINGPONG=0,SCHED=2,RESCALE_LOG2=8,EXP_EMU=0,CTAS_PER_SM=1,CLUSTER=1,PACK_GQA=0,TILE_OVERLAP=1
W3C=BLOCK_N=80,CONSUMER_WGS=3,STAGES=2,REG_PROD=32,REG_CONS=160,OVERLAP=1,PINGPONG=0,SCHED=2,RESCALE_LOG2=8,EXP_EMU=0,CTAS_PER_SM=1,CLUSTER=1,PACK_GQA=0,TILE_OVERLAP=0
declare -A CF
CF[1,32,4096,128,0,8]="$G1 $G1,Q_IN_REGS=1 $W2,SCHED=1,PACK_GQA=1,TILE_OVERLAP=1 $W2,SCHED=1,PACK_GQA=1,TILE_OVERLAP=1,Q_IN_REGS=1"
CF[2,32,8192,128,1,8]="$W3C $W2,SCHED=1 $W2,SCHED=1,Q_IN_REGS=1"
CF[4,64,2048,128,0,8]="$W2,SCHED=2,PACK_GQA=1,TILE_OVERLAP=1 $W2,SCHED=2,PACK_GQA=1,TILE_OVERLAP=1,Q_IN_REGS=1"
: > /tmp/pre.txt
for sh in "${!CF[@]}"; do for c in ${CF[$sh]}; do echo "$sh $c" >> /tmp/pre.txt; done; done
timeout 200 python3 .device/o/prebuild.py /tmp/pre.txt 2>&1 | tail -3
for sh in 1,32,4096,128,0,8 2,32,8192,128,1,8 4,64,2048,128,0,8; do
  args=""; for c in ${CF[$sh]}; do args="$args --config $c"; done
  [ $((SECONDS - t0)) -gt 520 ] && { echo "out of time before $sh"; break; }
  timeout 120 python3 scripts/bench_attention.py --family hopper --dtypes fp16 --rounds 5 $args --shapes $sh \
    --output /tmp/o2/o2_${sh//,/_} > /tmp/b.log 2>&1; echo "== $sh rc=$?" | tee -a $OUT/o2_bench.log
  cat /tmp/b.log >> $OUT/o2_bench.log
  grep -E "^B=" /tmp/b.log | cut -c1-62,90-300 | sed 's/BLOCK_N=\|CONSUMER_WGS=\|STAGES=\|REG_PROD=\|REG_CONS=\|OVERLAP=\|PINGPONG=\|RESCALE_LOG2=\|EXP_EMU=\|CTAS_PER_SM=\|CLUSTER=//g' | sort -u
done
tar czf $OUT/o2_bench.tgz -C /tmp o2
echo "total wall $((SECONDS - t0)) s"
