# session p, call 4: SCHED=3 at the tip (uniform flag, double-buffered flag words, first chunk loaded
# beside the LSEs): GPU tests (tail split, split-KV), sanitizers, A/B bench, then a 64-trial search at
# 1,32/8,4096 with SCHED 3 in the space and the bar through the public call (bench_runtime).
set -o pipefail
export PYTHONUNBUFFERED=1
t0=$SECONDS
mkdir -p /tmp/p4
nvidia-smi --query-gpu=name --format=csv,noheader
W3=BLOCK_N=80,CONSUMER_WGS=3,STAGES=2,REG_PROD=24,REG_CONS=160,OVERLAP=1,PINGPONG=1,RESCALE_LOG2=8,EXP_EMU=0,CTAS_PER_SM=1,CLUSTER=1,PACK_GQA=1
G1=BLOCK_N=128,CONSUMER_WGS=2,STAGES=2,REG_PROD=32,REG_CONS=232,OVERLAP=1,PINGPONG=0,SCHED=2,RESCALE_LOG2=8,EXP_EMU=0,CTAS_PER_SM=1,CLUSTER=1,PACK_GQA=0,TILE_OVERLAP=1
W2=BLOCK_N=128,CONSUMER_WGS=2,STAGES=2,REG_PROD=24,REG_CONS=240,OVERLAP=1,PINGPONG=1,RESCALE_LOG2=8,EXP_EMU=0,CTAS_PER_SM=1,CLUSTER=1,PACK_GQA=1
declare -A CF
CF[1,32,4096,128,0,8]="$W3,SCHED=3,TILE_OVERLAP=0 $G1 $W3,SCHED=2,TILE_OVERLAP=0"
CF[8,32,1024,128,0,4]="$W3,SCHED=3,TILE_OVERLAP=0 $W3,SCHED=2,TILE_OVERLAP=1"
CF[4,64,2048,128,0,8]="$W3,SCHED=2,TILE_OVERLAP=0 $W2,SCHED=3,TILE_OVERLAP=0 $W2,SCHED=2,TILE_OVERLAP=0"
: > /tmp/pre.txt
for sh in "${!CF[@]}"; do for c in ${CF[$sh]}; do echo "$sh $c" >> /tmp/pre.txt; done; done
(timeout 200 python3 .device/p/prebuild.py /tmp/pre.txt 2>&1 | tail -3) &
pre=$!
timeout 120 python3 -m pytest -q -rs tests/gpu/test_tail_split.py -p no:cacheprovider > $OUT/p4_tests.log 2>&1; echo "tail tests rc=$? wall $((SECONDS - t0)) s"
tail -2 $OUT/p4_tests.log
timeout 200 python3 -m pytest -q -rs tests/gpu/test_split_kv.py -p no:cacheprovider >> $OUT/p4_tests.log 2>&1; echo "split-KV tests rc=$? wall $((SECONDS - t0)) s"
tail -2 $OUT/p4_tests.log
wait $pre
for tool in racecheck memcheck synccheck; do
  timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 python3 scripts/sanitize_paths.py --only tail \
    >> $OUT/p4_sanitize.log 2>&1; echo "== $tool rc=$? wall $((SECONDS - t0)) s" | tee -a $OUT/p4_sanitize.log
  tail -8 $OUT/p4_sanitize.log | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|WRONG|Race reported" | tail -3
done
for sh in 1,32,4096,128,0,8 8,32,1024,128,0,4 4,64,2048,128,0,8; do
  args=""; for c in ${CF[$sh]}; do args="$args --config $c"; done
  timeout 100 python3 scripts/bench_attention.py --family hopper --dtypes fp16 --rounds 5 $args --shapes $sh \
    --output /tmp/p4/p4_${sh//,/_} > /tmp/b.log 2>&1; echo "== $sh rc=$?" | tee -a $OUT/p4_bench.log
  cat /tmp/b.log >> $OUT/p4_bench.log
  grep -E "^B=" /tmp/b.log | sort -u | cut -c1-62,90-300 | sed 's/BLOCK_N=\|CONSUMER_WGS=\|STAGES=\|REG_PROD=\|REG_CONS=\|OVERLAP=\|PINGPONG=\|RESCALE_LOG2=\|EXP_EMU=\|CTAS_PER_SM=\|CLUSTER=//g'
done
echo "bench done, wall $((SECONDS - t0)) s"
if [ $((SECONDS - t0)) -lt 380 ]; then
  timeout 100 evotuner search --study g1 --shape B=1,H=32,HKV=8,S=4096,D=128 --trials 64 --storage sqlite:////tmp/p4.db > $OUT/p4_search_g1.log 2>&1
  echo "search rc=$? wall $((SECONDS - t0)) s"; grep -E "best" $OUT/p4_search_g1.log | cut -c1-250 | head -3
  EVOTUNER_TUNED=sqlite:////tmp/p4.db timeout 90 python3 scripts/bench_runtime.py --rounds 5 --shapes 1,32,4096,128,0,8 \
    --output $OUT/p4_bar > $OUT/p4_bar.log 2>&1; echo "bar rc=$? wall $((SECONDS - t0)) s"; tail -5 $OUT/p4_bar.log
  cp /tmp/p4.db $OUT/p4.db
fi
tar czf $OUT/p4_bench.tgz -C /tmp p4
echo "total wall $((SECONDS - t0)) s"
