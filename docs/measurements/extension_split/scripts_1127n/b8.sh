# session n, call 8 (nvidia-h100-x1): source .device/setup.sh && bash .device/n/b8.sh
# hopper_ext's current stream through c10 instead of a Python round trip: host µs per call of the
# old and the new binding (same header, alternating processes), then the extension GPU tests.
set -o pipefail
export PYTHONUNBUFFERED=1
t0=$SECONDS
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p /tmp/oldbx && cp scripts/build_extension.py /tmp/oldbx/ && cp -r scripts/extension /tmp/oldbx/ \
  && cp .device/n/old_ext_binding.h /tmp/oldbx/extension/ext_binding.h
timeout 200 python3 .device/n/ext_host.py /tmp/extn build scripts/build_extension.py 2>&1 | tail -1
timeout 200 python3 .device/n/ext_host.py /tmp/exto build /tmp/oldbx/build_extension.py 2>&1 | tail -1
echo "built at $((SECONDS - t0)) s"
for i in 1 2 3; do
  timeout 60 python3 .device/n/ext_host.py /tmp/exto old 2>&1 | tail -1
  timeout 60 python3 .device/n/ext_host.py /tmp/extn new 2>&1 | tail -1
done | tee $OUT/b8_ext_host.log
timeout 300 python3 -m pytest -q -rs "tests/test_export.py::test_hopper_production_extension_on_the_gpu" \
  "tests/test_export.py::test_production_extension_on_the_gpu" 2>&1 | tee $OUT/b8_ext_tests.log | tail -4
echo "total wall $((SECONDS - t0)) s"
