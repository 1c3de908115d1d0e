# session k (2026-11-27), one device call, nvidia-h100-x1: source .device/setup.sh && bash docs/measurements/runtime/gpu_tests_1127k.sh
# Session k, final: the GPU tests of the paths changed this session (partial configs over the problem's
# recommended config; CTA pairs' CTA-scope arrivals; the export probe's message)
set -o pipefail
export PYTHONUNBUFFERED=1
g=tests/gpu
timeout 560 python3 -m pytest -q -rs -m gpu --durations=8 $g/test_runtime_path.py $g/test_fastpath_gpu.py \
  "$g/test_attention.py::test_custom_scale_partial_config_and_strided_views" $g/test_split_kv.py $g/test_varlen.py \
  $g/test_hopper_cluster.py 2>&1 | tee $OUT/final_tests.log | grep -vE "^\s*$" | tail -25
