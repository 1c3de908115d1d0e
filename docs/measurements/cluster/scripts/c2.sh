# session k (2026-11-27), one device call, nvidia-h100-x1: source .device/setup.sh && bash docs/measurements/cluster/scripts/c2.sh
set -o pipefail
export PYTHONUNBUFFERED=1
O=$OUT/c2; mkdir -p $O
base=BLOCK_N=80,CONSUMER_WGS=3,EXP_EMU=0,OVERLAP=1,PINGPONG=1,REG_CONS=160,REG_PROD=24,RESCALE_LOG2=8,STAGES=2
which ncu || ls /usr/local/cuda/bin | grep -i ncu
for c in SCHED=0,CLUSTER=1 SCHED=0,CLUSTER=2 SCHED=1,CLUSTER=1 SCHED=1,CLUSTER=2; do
  echo "== ncu $c $(date +%T)"
  python3 docs/measurements/cluster/scripts/prof.py $base,$c   # build outside ncu
  timeout 150 ncu --kernel-name regex:hopper_fwd --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis \
    --metrics sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_active.min,sm__ctas_launched.sum,sm__ctas_launched.max,sm__ctas_launched.min,smsp__pcsamp_warps_issue_stalled_barrier,smsp__pcsamp_warps_issue_stalled_long_scoreboard,lts__t_bytes.sum,dram__bytes_read.sum \
    python3 docs/measurements/cluster/scripts/prof.py $base,$c > $O/ncu_${c//[=,]/_}.txt 2>&1; echo rc=$?
  grep -E "Duration|sm__cycles_active|sm__ctas_launched|Cluster|Achieved Occupancy|Waves|Registers|Shared Memory Config|lts__t_bytes|dram__bytes|Stall|Throughput" $O/ncu_${c//[=,]/_}.txt | head -40
done
echo "== bench stages $(date +%T)"
timeout 200 python3 scripts/bench_attention.py --family hopper --dtypes fp16 --rounds 3 \
  --config SCHED=0,CLUSTER=1 --config SCHED=0,CLUSTER=2 --config SCHED=0,CLUSTER=2,STAGES=3 --config SCHED=0,CLUSTER=2,BLOCK_N=128,CONSUMER_WGS=2,REG_CONS=240 --config SCHED=0,CLUSTER=1,BLOCK_N=128,CONSUMER_WGS=2,REG_CONS=240 \
  --shapes 8,16,2048,128,0 --output $O/bench_stages 2>&1 | tee $O/bench_stages.log | grep -E "^B=|^shape"
tar czf $OUT/c2.tgz -C $OUT c2 && rm -rf $O
