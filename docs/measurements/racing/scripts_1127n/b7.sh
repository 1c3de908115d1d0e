# session n, call 7 (nvidia-h100-x1): source .device/setup.sh && bash .device/n/b7.sh
# time_cuda's paired order after the coin flips: the equal-kernel ratios, then the worker's GPU tests
set -o pipefail
export PYTHONUNBUFFERED=1
t0=$SECONDS
timeout 200 python3 .device/n/pairbias3.py 2>&1 | tee $OUT/pairbias3_h100.log
timeout 350 python3 -m pytest -q -rs tests/gpu/test_measure.py tests/gpu/test_hopper_measure.py 2>&1 | tee $OUT/b7_tests.log | tail -5
echo "total wall $((SECONDS - t0)) s"
