# session k (2026-11-27), one device call, nvidia-h100-x1: source .device/setup.sh && bash docs/measurements/cluster/scripts/c8.sh
# Session k, after the fix (stage arrivals at CTA scope): sanitizers on the pairs, then c1's bench again
set -o pipefail
export PYTHONUNBUFFERED=1
O=$OUT/c8; mkdir -p $O
for tool in memcheck racecheck synccheck; do
  only=""; [ $tool = racecheck ] && only="--kernel-name kns=hopper_fwd"
  timeout 150 compute-sanitizer --tool $tool $only --error-exitcode 9 python3 scripts/sanitize_paths.py --only cluster \
    > $O/san_$tool.log 2>&1; echo "$tool rc=$? $(grep -c ': ok' $O/san_$tool.log) ok; $(grep -E 'SUMMARY|Internal' $O/san_$tool.log | tr '\n' ' ')"
done
timeout 300 python3 scripts/bench_attention.py --family hopper --dtypes fp16 --rounds 3 \
  --config SCHED=1,CLUSTER=1 --config SCHED=1,CLUSTER=2 --config SCHED=0,CLUSTER=1 --config SCHED=0,CLUSTER=2 \
  --shapes 1,32,4096,128,0,8 --shapes 4,64,2048,128,0,8 --shapes 8,32,1024,128,0,4 --shapes 8,16,2048,128,0 \
  --shapes 1,32,8192,128,0 --shapes 4,16,2048,256,0 --shapes 16,16,2048,64,0 \
  --output $O/bench_cluster 2>&1 | tee $O/bench_cluster.log | grep -E "^B=" | awk '{print $1,$4,$5,$6,$(NF-1)}' | sort -u
tar czf $OUT/c8.tgz -C $OUT c8 && rm -rf $O
