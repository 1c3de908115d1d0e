# session m call 5: GPU tests of the packing defaults and TILE_OVERLAP, then the issue-24 bars through the public call
set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$SECONDS
timeout 330 python3 -m pytest -q -rs tests/gpu/test_tile_overlap.py tests/gpu/test_gqa.py tests/gpu/test_hopper_d96_gpu.py -p no:cacheprovider 2>&1 | tail -8 | tee $OUT/a5_tests.log
echo "tests wall $((SECONDS - t0)) s"
left=$((560 - (SECONDS - t0)))
timeout $left python3 scripts/bench_runtime.py --rounds 5 --shapes 1,32,4096,128,0,8 --shapes 4,64,2048,128,0,8 \
    --shapes 2,32,8192,128,1,8 --shapes 8,32,1024,128,0,4 --shapes 4,16,2048,256,0 --shapes 4,16,4096,256,1 \
    --output $OUT/a5_bars > $OUT/a5_bars.log 2>&1; echo "bench rc=$?"; tail -12 $OUT/a5_bars.log
echo "total wall $((SECONDS - t0)) s"
