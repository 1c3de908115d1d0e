# session p, call 6: the SCHED=3 GPU test again after SCHED 3 left the searched space (the test
# builds it by its config; its space assertion dropped), and the tail group once more.
set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 -m pytest -q -rs tests/gpu/test_tail_split.py -p no:cacheprovider > $OUT/p6_tests.log 2>&1; echo "tail tests rc=$?"; tail -2 $OUT/p6_tests.log
timeout 120 python3 scripts/sanitize_paths.py --only tail > $OUT/p6_paths.log 2>&1; echo "sanitize_paths (no tool) rc=$?"; cat $OUT/p6_paths.log | cut -c1-150
