# session q, call 8 (review): the three extension GPU tests after their probes share on_side_stream / replays_checked.
bash .device/q/gpusuite.sh $OUT/q7_ext_tests.log 400 tests/test_hopper_ext_tail_split.py \
  "tests/test_export.py::test_hopper_production_extension_on_the_gpu" "tests/test_export.py::test_production_extension_on_the_gpu"
