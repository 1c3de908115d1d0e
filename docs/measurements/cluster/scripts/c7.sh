# session k (2026-11-27), one device call, nvidia-h100-x1: source .device/setup.sh && bash docs/measurements/cluster/scripts/c7.sh
# Session k: is the cluster-scope release of the stage arrivals the pairs' cost? SASS, then A/B (P2 = CUTLASS's
# CTA-scope arrive), then the pair tests on P2
# Needs the tree before the fix (git checkout 7a13ca5): p2.py applies the fix. The cubins cl1, cl2, cl2p2
# (D=128 BLOCK_N=80 SCHED 0, CLUSTER 1, 2, and 2 with p2.py) were built here with evotuner's Builder
# and copied into .device/.
set -o pipefail
export PYTHONUNBUFFERED=1
O=$OUT/c7; mkdir -p $O
for c in cl1 cl2 cl2p2; do cuobjdump -sass .device/$c.cubin > $O/$c.sass; echo "$c: $(grep -cE 'MEMBAR' $O/$c.sass) MEMBAR; $(grep -oE '(MEMBAR|FENCE|CCTL|ERRBAR|SYNCS)[A-Z0-9._]*' $O/$c.sass | sort | uniq -c | tr '\n' ' ')"; done
bench() { timeout 150 python3 scripts/bench_attention.py --family hopper --dtypes fp16 --rounds 3 \
  --config SCHED=0,CLUSTER=1 --config SCHED=0,CLUSTER=2 --config SCHED=1,CLUSTER=2 \
  --shapes 8,16,2048,128,0 --shapes 16,16,2048,64,0 --shapes 1,32,4096,128,0,8 --output $O/bench_$1 2>&1 | tee $O/bench_$1.log | grep -E "^B=" | awk '{print $1,$4,$5,$6,$(NF-1)}' | sort -u; }
echo "== current $(date +%T)"; bench cur
cp kernels/hopper/ptx.cuh /tmp/ptx_saved
python3 docs/measurements/cluster/scripts/p2.py && { echo "== P2 $(date +%T)"; bench p2;
  timeout 200 python3 -m pytest -q -rs -m gpu tests/gpu/test_hopper_cluster.py 2>&1 | tee $O/p2_tests.log | tail -3; }
cp /tmp/ptx_saved kernels/hopper/ptx.cuh
tar czf $OUT/c7.tgz -C $OUT c7 && rm -rf $O
