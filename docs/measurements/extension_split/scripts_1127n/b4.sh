# session n, call 4 (nvidia-h100-x1): source .device/setup.sh && bash .device/n/b4.sh
# The extension's split row after its counters moved to a cudaMemsetAsync in the launcher:
# build, memcheck, time decode shapes through hopper_ext beside SDPA, then the extension GPU test.
set -o pipefail
export PYTHONUNBUFFERED=1
t0=$SECONDS
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 .device/n/ext_split_memcheck.py /tmp/extm build 2>&1 | tail -2
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 \
  python3 .device/n/ext_split_memcheck.py /tmp/extm run 2>&1 | tee $OUT/b4_ext_memcheck.log | tail -4
echo "memcheck rc=$? at $((SECONDS - t0)) s"
timeout 150 python3 scripts/bench_extension.py --module /tmp/extm/ext --dtypes bf16 --rounds 3 \
  --shapes 1,32,8192,128,0,8,1 --shapes 16,32,8192,128,0,8,1 --shapes 16,32,4096,128,0,8,4 \
  --shapes 4,32,8192,128,0,8,16 --shapes 8,8,6000,128,0,8,1 --output $OUT/b4_bench_ext 2>&1 | tee $OUT/b4_bench_ext.log
echo "bench rc=$? at $((SECONDS - t0)) s"
timeout 240 python3 -m pytest -q -rs "tests/test_export.py::test_hopper_production_extension_on_the_gpu" 2>&1 \
  | tee $OUT/b4_ext_test.log | tail -4
echo "total wall $((SECONDS - t0)) s"
