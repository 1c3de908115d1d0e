# session q, call 4: compute-sanitizer memcheck on the production extension's SCHED 3 row
# (tests/test_hopper_ext_tail_split.py's build and probe, run under the tool).
set -o pipefail
python3 - <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "tests")
from test_hopper_ext_tail_split import CASES, _PROBE, _build_extension_module, _header
out = Path("/tmp/q4"); out.mkdir(exist_ok=True)
built = _build_extension_module().build(_header(out), out / "ext", family="hopper")
(out / "probe.py").write_text(_PROBE.replace("CASES", repr(CASES)))
print("built", built.module)
PY
for tool in memcheck synccheck racecheck; do
  s0=$SECONDS
  timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 --kernel-name kns=hopper_fwd \
    python3 /tmp/q4/probe.py /tmp/q4/ext > $OUT/q4_$tool.log 2>&1
  echo "$tool: rc=$? wall $((SECONDS - s0)) s"; tail -4 $OUT/q4_$tool.log
done
bash .device/q/gpusuite.sh $OUT/q4_tests.log 260 tests/test_hopper_ext_tail_split.py "tests/test_export.py::test_hopper_production_extension_on_the_gpu" \
  "tests/test_export.py::test_production_extension_on_the_gpu"
