# session n, call 12 (after the review's per-call memory change): source .device/setup.sh && bash .device/n/b12.sh
set -o pipefail
export PYTHONUNBUFFERED=1
t0=$SECONDS
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 python3 -m pytest -q -rs --basetemp=/tmp/pt "tests/test_export.py::test_hopper_production_extension_on_the_gpu" 2>&1 \
  | tee $OUT/b12_ext_test.log | tail -4
echo "test wall $((SECONDS - t0)) s"
m=$(dirname $(ls /tmp/pt/*/ext/hopper_ext*.so | head -1))
timeout 120 python3 scripts/bench_extension.py --module $m --rounds 3 --dtypes fp16,bf16 \
  --shapes 1,16,4096,64,1 --shapes 16,32,8192,128,0,8,1 --output $OUT/b12_bench_ext 2>&1 | tee $OUT/b12_bench_ext.log
echo "total wall $((SECONDS - t0)) s"
