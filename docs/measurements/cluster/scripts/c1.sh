# session k (2026-11-27), one device call, nvidia-h100-x1: source .device/setup.sh && bash docs/measurements/cluster/scripts/c1.sh
# call 1: CLUSTER=2 correctness, then the pair vs unpaired vs SDPA bench, then sanitizers
set -o pipefail
export PYTHONUNBUFFERED=1
O=$OUT/c1; mkdir -p $O
t0=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
echo "== cluster tests $(date +%T)"
timeout 200 python3 -m pytest -q -rs -m gpu tests/gpu/test_hopper_cluster.py 2>&1 | tee $O/cluster_tests.log | tail -15
echo "== bench $(date +%T)"
timeout 300 python3 scripts/bench_attention.py --family hopper --dtypes fp16 --rounds 3 \
  --config SCHED=1,CLUSTER=1 --config SCHED=1,CLUSTER=2 --config SCHED=0,CLUSTER=1 --config SCHED=0,CLUSTER=2 \
  --shapes 1,32,4096,128,0,8 --shapes 4,64,2048,128,0,8 --shapes 8,32,1024,128,0,4 --shapes 8,16,2048,128,0 \
  --shapes 4,16,2048,256,0 --shapes 16,16,2048,64,0 \
  --output $O/bench_cluster 2>&1 | tee $O/bench_cluster.log | tail -45
for tool in memcheck racecheck synccheck; do
  left=$((560 - (SECONDS - t0))); [ $left -lt 20 ] && { echo "no time for $tool"; continue; }
  echo "== $tool $(date +%T) (left $left)"
  timeout $left compute-sanitizer --tool $tool --error-exitcode 9 python3 scripts/sanitize_paths.py --only cluster \
    > $O/san_$tool.log 2>&1; echo "rc=$? $(grep -c ok $O/san_$tool.log) ok"; tail -3 $O/san_$tool.log
done
tar czf $OUT/c1.tgz -C $OUT c1 && rm -rf $O
