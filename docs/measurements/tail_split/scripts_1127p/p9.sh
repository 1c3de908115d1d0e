# session p, call 9: the three bit-equality GPU tests after their launch block moved into
# tests/gpu/reference_check.py (launch_side_by_side).
set -o pipefail
export PYTHONUNBUFFERED=1
t0=$SECONDS
nvidia-smi --query-gpu=name --format=csv,noheader
for f in test_tail_split test_tile_overlap test_q_in_regs; do
  timeout 250 python3 -m pytest -q -rs tests/gpu/$f.py -p no:cacheprovider >> $OUT/p9_tests.log 2>&1; echo "$f rc=$? wall $((SECONDS - t0)) s"
  tail -1 $OUT/p9_tests.log
done
