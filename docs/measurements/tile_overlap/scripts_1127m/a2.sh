# session m call 2: TILE_OVERLAP correctness (GPU test) and A/B timing at the GQA bar shapes
set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$SECONDS
timeout 280 python3 -m pytest -q -x -rs tests/gpu/test_tile_overlap.py -p no:cacheprovider 2>&1 | tail -15 | tee $OUT/a2_tests.log
echo "tests wall $((SECONDS - t0)) s"
B="python3 scripts/bench_attention.py --family hopper --dtypes fp16 --rounds 3"
P=PACK_GQA=1; W=BLOCK_N=128,CONSUMER_WGS=2,REG_CONS=240; N=BLOCK_N=80,CONSUMER_WGS=3,REG_CONS=160,SCHED=2
for sh in 8,32,1024,128,0,4 4,64,2048,128,0,8; do
  timeout 150 $B --config $P --config $P,TILE_OVERLAP=1 --config $P,$W --config $P,$W,TILE_OVERLAP=1 --config TILE_OVERLAP=1 \
    --shapes $sh --output $OUT/a2_$sh 2>&1 | tail -7
done
timeout 120 $B --config $P --config $P,TILE_OVERLAP=1 --config $P,$N --config $P,$N,TILE_OVERLAP=1 \
    --shapes 1,32,4096,128,0,8 --output $OUT/a2_g1 2>&1 | tail -6
timeout 100 $B --config SCHED=2 --config TILE_OVERLAP=1 --shapes 8,16,2048,128,0 --shapes 16,16,2048,64,0 --output $OUT/a2_mha 2>&1 | tail -6
echo "total wall $((SECONDS - t0)) s"
