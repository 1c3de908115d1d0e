# session n, call 1 (nvidia-h100-x1): source .device/setup.sh && bash .device/n/b1.sh
set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$SECONDS
timeout 300 python3 -m pytest -q -rs "tests/test_export.py::test_hopper_production_extension_on_the_gpu" \
  "tests/test_export.py::test_production_extension_on_the_gpu" 2>&1 | tee $OUT/b1_ext_tests.log | tail -15
echo "ext tests wall $((SECONDS - t0)) s"
t1=$SECONDS
timeout 200 python3 .device/n/ext_split_memcheck.py /tmp/extm build 2>&1 | tail -3
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 \
  python3 .device/n/ext_split_memcheck.py /tmp/extm run 2>&1 | tee $OUT/b1_ext_memcheck.log | tail -8
echo "memcheck rc=$? wall $((SECONDS - t1)) s"
left=$((560 - (SECONDS - t0))); echo "left $left s"
if [ $left -gt 120 ]; then
  timeout $((left - 10)) python3 -m pytest -q -rs tests/gpu/test_split_kv.py 2>&1 | tee $OUT/b1_split_kv.log | tail -5
fi
