# session o, call 3: the export query-rows change through both production extensions, then the
# GPU suites of the runtime path, hopper attention, GQA (after Q_IN_REGS touched the consumer).
set -o pipefail
export PYTHONUNBUFFERED=1
t0=$SECONDS
bash .device/o/gpusuite.sh $OUT/o3_gpu_tests.log 560 \
  "tests/test_export.py::test_hopper_production_extension_on_the_gpu" \
  "tests/test_export.py::test_production_extension_on_the_gpu" \
  tests/gpu/test_runtime_path.py tests/gpu/test_fastpath_gpu.py tests/gpu/test_hopper_attention.py \
  tests/gpu/test_gqa.py tests/gpu/test_attention.py
echo "total wall $((SECONDS - t0)) s"
