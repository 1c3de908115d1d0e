# session k (2026-11-27), one device call, nvidia-h100-x1: source .device/setup.sh && bash docs/measurements/cluster/scripts/c6.sh
set -o pipefail
export PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -rs -m gpu tests/test_export.py 2>&1 | tee $OUT/export.log | tail -4
echo "== racecheck on hopper_fwd alone (CTA pairs)"
timeout 200 compute-sanitizer --tool racecheck --kernel-name kns=hopper_fwd --error-exitcode 9 python3 scripts/sanitize_paths.py --only cluster \
  > $OUT/race_cluster.log 2>&1; echo "rc=$? $(grep -c ': ok' $OUT/race_cluster.log) ok"; tail -3 $OUT/race_cluster.log
