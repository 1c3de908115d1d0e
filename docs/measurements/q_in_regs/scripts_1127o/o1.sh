# session o, call 1: Q_IN_REGS (S = Q K^T with Q in registers): right and bit-equal (GPU test),
# then A/B against Q from shared memory at the issue-24 D=128 shapes and D=64/96 (bench_attention, same process).
set -o pipefail
export PYTHONUNBUFFERED=1
t0=$SECONDS
mkdir -p /tmp/o1
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader
W2=BLOCK_N=128,CONSUMER_WGS=2,STAGES=2,REG_PROD=24,REG_CONS=240,OVERLAP=1,PINGPONG=1,RESCALE_LOG2=8,EXP_EMU=0,CTAS_PER_SM=1,CLUSTER=1
G1=BLOCK_N=128,CONSUMER_WGS=2,STAGES=2,REG_PROD=32,REG_CONS=232,OVERLAP=1,PINGPONG=0,SCHED=2,RESCALE_LOG2=8,EXP_EMU=0,CTAS_PER_SM=1,CLUSTER=1,PACK_GQA=0,TILE_OVERLAP=1
W3=BLOCK_N=80,CONSUMER_WGS=3,STAGES=2,REG_PROD=24,REG_CONS=160,OVERLAP=1,PINGPONG=1,SCHED=2,RESCALE_LOG2=8,EXP_EMU=0,CTAS_PER_SM=1,CLUSTER=1
declare -A CF
CF[1,32,4096,128,0,8]="$G1 $G1,Q_IN_REGS=1 $W2,SCHED=1,PACK_GQA=1,TILE_OVERLAP=1 $W2,SCHED=1,PACK_GQA=1,TILE_OVERLAP=1,Q_IN_REGS=1"
CF[4,64,2048,128,0,8]="$W3,PACK_GQA=1,TILE_OVERLAP=0 $W2,SCHED=2,PACK_GQA=1,TILE_OVERLAP=1 $W2,SCHED=2,PACK_GQA=1,TILE_OVERLAP=1,Q_IN_REGS=1"
CF[8,32,1024,128,0,4]="$W3,PACK_GQA=1,TILE_OVERLAP=1 $W2,SCHED=2,PACK_GQA=1,TILE_OVERLAP=1 $W2,SCHED=2,PACK_GQA=1,TILE_OVERLAP=1,Q_IN_REGS=1"
CF[2,32,8192,128,1,8]="$W3,PINGPONG=0,REG_PROD=32,PACK_GQA=0,TILE_OVERLAP=0 $W2,SCHED=1 $W2,SCHED=1,Q_IN_REGS=1"
CF[8,16,2048,128,0,16]="$W2,SCHED=2,TILE_OVERLAP=1 $W2,SCHED=2,TILE_OVERLAP=1,Q_IN_REGS=1"
CF[16,16,2048,64,0,16]="$W2,SCHED=2,TILE_OVERLAP=1 $W2,SCHED=2,TILE_OVERLAP=1,Q_IN_REGS=1"
CF[8,16,2048,96,0,16]="$W2,SCHED=2,TILE_OVERLAP=1 $W2,SCHED=2,TILE_OVERLAP=1,Q_IN_REGS=1"
: > /tmp/pre.txt
for sh in "${!CF[@]}"; do for c in ${CF[$sh]}; do echo "$sh $c" >> /tmp/pre.txt; done; done
(timeout 250 python3 .device/o/prebuild.py /tmp/pre.txt 2>&1 | tail -5) &
pre=$!
timeout 330 python3 -m pytest -q -rs tests/gpu/test_q_in_regs.py -p no:cacheprovider > $OUT/o1_tests.log 2>&1; echo "tests rc=$? wall $((SECONDS - t0)) s"
tail -4 $OUT/o1_tests.log
wait $pre
for sh in 1,32,4096,128,0,8 4,64,2048,128,0,8 8,32,1024,128,0,4 2,32,8192,128,1,8 8,16,2048,128,0,16 16,16,2048,64,0,16 8,16,2048,96,0,16; do
  args=""; for c in ${CF[$sh]}; do args="$args --config $c"; done
  [ $((SECONDS - t0)) -gt 540 ] && { echo "out of time before $sh"; break; }
  timeout 120 python3 scripts/bench_attention.py --family hopper --dtypes fp16 --rounds 5 $args --shapes $sh \
    --output /tmp/o1/o1_${sh//,/_} > /tmp/b.log 2>&1; echo "== $sh rc=$?" | tee -a $OUT/o1_bench.log
  cat /tmp/b.log >> $OUT/o1_bench.log
  grep -E "^B=" /tmp/b.log | cut -c1-62,90-300 | sed 's/BLOCK_N=\|CONSUMER_WGS=\|STAGES=\|REG_PROD=\|REG_CONS=\|OVERLAP=\|PINGPONG=\|RESCALE_LOG2=\|EXP_EMU=\|CTAS_PER_SM=\|CLUSTER=//g'
done
tar czf $OUT/o1_bench.tgz -C /tmp o1
echo "total wall $((SECONDS - t0)) s"
