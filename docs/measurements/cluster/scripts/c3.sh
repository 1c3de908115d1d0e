# session k (2026-11-27), one device call, nvidia-h100-x1: source .device/setup.sh && bash docs/measurements/cluster/scripts/c3.sh
set -o pipefail
export PYTHONUNBUFFERED=1
O=$OUT/c3; mkdir -p $O
bench() { timeout 150 python3 scripts/bench_attention.py --family hopper --dtypes fp16 --rounds 3 \
  --config SCHED=0,CLUSTER=1 --config SCHED=0,CLUSTER=2 --config SCHED=1,CLUSTER=2 \
  --shapes 8,16,2048,128,0 --shapes 16,16,2048,64,0 --output $O/bench_$1 2>&1 | tee $O/bench_$1.log | grep -E "^B=" | awk '{print $1,$4,$5,$6,$(NF-1)}' | sort -u; }
base64=BLOCK_N=128,CONSUMER_WGS=3,EXP_EMU=0,OVERLAP=1,PINGPONG=1,REG_CONS=160,REG_PROD=32,RESCALE_LOG2=0,STAGES=2
for c in SCHED=0,CLUSTER=1 SCHED=0,CLUSTER=2; do
  python3 docs/measurements/cluster/scripts/prof.py $base64,$c 16 16 2048 64
  timeout 100 ncu --kernel-name regex:hopper_fwd --launch-skip 1 --launch-count 1 --section SpeedOfLight \
    --metrics lts__t_bytes.sum,dram__bytes_read.sum,lts__t_sectors_srcunit_tex.sum,lts__t_requests_srcunit_tex.sum \
    python3 docs/measurements/cluster/scripts/prof.py $base64,$c 16 16 2048 64 > $O/ncu64_$c.txt 2>&1
  echo "-- D64 $c"; grep -E "lts__|dram__|Duration" $O/ncu64_$c.txt
done
echo "== current $(date +%T)"; bench cur
cp -r kernels/hopper /tmp/hopper_saved
python3 docs/measurements/cluster/scripts/p1.py && { echo "== P1 $(date +%T)"; bench p1; }
rm -rf kernels/hopper && cp -r /tmp/hopper_saved kernels/hopper
tar czf $OUT/c3.tgz -C $OUT c3 && rm -rf $O
