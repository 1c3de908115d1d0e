# session p, call 7: SCHED=3 with the warp-level end of a part (tail_split.cuh: no CTA-wide flag; the
# last part combines the others' partials into its registers): GPU tests, sanitizers, A/B bench.
set -o pipefail
export PYTHONUNBUFFERED=1
t0=$SECONDS
nvidia-smi --query-gpu=name --format=csv,noheader
W3=BLOCK_N=80,CONSUMER_WGS=3,STAGES=2,REG_PROD=24,REG_CONS=160,OVERLAP=1,PINGPONG=1,RESCALE_LOG2=8,EXP_EMU=0,CTAS_PER_SM=1,CLUSTER=1,PACK_GQA=1
G1=BLOCK_N=128,CONSUMER_WGS=2,STAGES=2,REG_PROD=32,REG_CONS=232,OVERLAP=1,PINGPONG=0,SCHED=2,RESCALE_LOG2=8,EXP_EMU=0,CTAS_PER_SM=1,CLUSTER=1,PACK_GQA=0,TILE_OVERLAP=1
declare -A CF
CF[1,32,4096,128,0,8]="$W3,SCHED=3,TILE_OVERLAP=0 $G1 $W3,SCHED=2,TILE_OVERLAP=0"
CF[8,32,1024,128,0,4]="$W3,SCHED=3,TILE_OVERLAP=0 $W3,SCHED=2,TILE_OVERLAP=1"
CF[1,24,5280,128,0,6]="$W3,SCHED=3,TILE_OVERLAP=0 $W3,SCHED=2,TILE_OVERLAP=0"
: > /tmp/pre.txt
for sh in "${!CF[@]}"; do for c in ${CF[$sh]}; do echo "$sh $c" >> /tmp/pre.txt; done; done
(timeout 200 python3 .device/p/prebuild.py /tmp/pre.txt 2>&1 | tail -3) &
pre=$!
timeout 120 python3 -m pytest -q -rs tests/gpu/test_tail_split.py -p no:cacheprovider > $OUT/p7_tests.log 2>&1; echo "tail tests rc=$? wall $((SECONDS - t0)) s"
tail -3 $OUT/p7_tests.log | cut -c1-400
wait $pre
for sh in 1,32,4096,128,0,8 8,32,1024,128,0,4 1,24,5280,128,0,6; do
  args=""; for c in ${CF[$sh]}; do args="$args --config $c"; done
  timeout 100 python3 scripts/bench_attention.py --family hopper --dtypes fp16 --rounds 5 $args --shapes $sh \
    --output /tmp/p7_${sh//,/_} > /tmp/b.log 2>&1; echo "== $sh rc=$?" | tee -a $OUT/p7_bench.log
  cat /tmp/b.log >> $OUT/p7_bench.log
  grep -E "^B=" /tmp/b.log | sort -u | cut -c1-62,90-300 | sed 's/BLOCK_N=\|CONSUMER_WGS=\|STAGES=\|REG_PROD=\|REG_CONS=\|OVERLAP=\|PINGPONG=\|RESCALE_LOG2=\|EXP_EMU=\|CTAS_PER_SM=\|CLUSTER=//g'
done
for tool in racecheck memcheck synccheck; do
  timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 python3 scripts/sanitize_paths.py --only tail \
    >> $OUT/p7_sanitize.log 2>&1; echo "== $tool rc=$? wall $((SECONDS - t0)) s" | tee -a $OUT/p7_sanitize.log
  tail -8 $OUT/p7_sanitize.log | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|WRONG|Race reported" | tail -3
done
timeout 150 python3 -m pytest -q -rs tests/gpu/test_split_kv.py -p no:cacheprovider >> $OUT/p7_tests.log 2>&1; echo "split-KV tests rc=$? wall $((SECONDS - t0)) s"
tail -1 $OUT/p7_tests.log
echo "total wall $((SECONDS - t0)) s"
