# session o, call 4: the rest of the GPU suites at the tip.
set -o pipefail
export PYTHONUNBUFFERED=1
t0=$SECONDS
bash .device/o/gpusuite.sh $OUT/o4_gpu_tests.log 560 \
  tests/gpu/test_split_kv.py tests/gpu/test_varlen.py tests/gpu/test_tile_overlap.py tests/gpu/test_hopper_d96_gpu.py \
  tests/gpu/test_hopper_wide.py tests/gpu/test_measure.py tests/gpu/test_hopper_measure.py tests/gpu/test_varlen_search.py \
  tests/gpu/test_hopper_cluster.py tests/gpu/test_diagnose.py tests/gpu/test_faults.py
echo "total wall $((SECONDS - t0)) s"
