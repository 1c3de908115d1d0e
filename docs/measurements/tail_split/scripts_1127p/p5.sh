# session p, call 5: the production extensions after hopper_launch_row.cu.in's reorder (grid before
# the per-call memory, SCHED 3's plan and scratch): both extension GPU tests.
set -o pipefail
export PYTHONUNBUFFERED=1
t0=$SECONDS
nvidia-smi --query-gpu=name --format=csv,noheader
for t in tests/test_export.py::test_hopper_production_extension_on_the_gpu tests/test_export.py::test_production_extension_on_the_gpu; do
  timeout 280 python3 -m pytest -q -rs $t -p no:cacheprovider >> $OUT/p5_ext_tests.log 2>&1; echo "$t rc=$? wall $((SECONDS - t0)) s"
  tail -1 $OUT/p5_ext_tests.log
done
