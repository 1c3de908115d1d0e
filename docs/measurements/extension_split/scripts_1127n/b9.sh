# session n, call 9 (nvidia-h100-x1): source .device/setup.sh && bash .device/n/b9.sh
# b8's host timing again, each process pinned to one core (taskset -c 5), 8 alternations
set -o pipefail
export PYTHONUNBUFFERED=1
t0=$SECONDS
mkdir -p /tmp/oldbx && cp scripts/build_extension.py /tmp/oldbx/ && cp -r scripts/extension /tmp/oldbx/ \
  && cp .device/n/old_ext_binding.h /tmp/oldbx/extension/ext_binding.h
[ -f /tmp/extn/ext/hopper_ext.so ] || timeout 200 python3 .device/n/ext_host.py /tmp/extn build scripts/build_extension.py 2>&1 | tail -1
[ -f /tmp/exto/ext/hopper_ext.so ] || timeout 200 python3 .device/n/ext_host.py /tmp/exto build /tmp/oldbx/build_extension.py 2>&1 | tail -1
echo "built at $((SECONDS - t0)) s"
for i in 1 2 3 4 5 6 7 8; do
  timeout 60 taskset -c 5 python3 .device/n/ext_host.py /tmp/exto old 2>&1 | tail -1
  timeout 60 taskset -c 5 python3 .device/n/ext_host.py /tmp/extn new 2>&1 | tail -1
done | tee $OUT/b9_ext_host.log
echo "total wall $((SECONDS - t0)) s"
