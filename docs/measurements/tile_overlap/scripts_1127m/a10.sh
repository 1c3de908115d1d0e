# session m call 10: TILE_OVERLAP with the next tile's Q waited for after the last P V (not before it)
set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$SECONDS
B="python3 scripts/bench_attention.py --family hopper --dtypes fp16 --rounds 5"
P=PACK_GQA=1; W=BLOCK_N=128,CONSUMER_WGS=2,REG_CONS=240
for sh in 8,32,1024,128,0,4 4,64,2048,128,0,8; do
  timeout 100 $B --config $P --config $P,TILE_OVERLAP=1 --config $P,$W --config $P,$W,TILE_OVERLAP=1 \
    --shapes $sh --output $OUT/a10_${sh//,/_} 2>&1 | tail -6
done
timeout 80 $B --config SCHED=2 --config TILE_OVERLAP=1 --shapes 8,16,2048,128,0 --output $OUT/a10_mha 2>&1 | tail -4
echo "bench wall $((SECONDS - t0)) s"
timeout 200 python3 -m pytest -q -rs tests/gpu/test_tile_overlap.py -p no:cacheprovider 2>&1 | tail -3 | tee $OUT/a10_tests.log
echo "total wall $((SECONDS - t0)) s"
