# session q, call 7: the rest of the GPU suites (measurement, varlen search, diagnostics, faults).
bash .device/q/gpusuite.sh $OUT/q6_gpu_tests.log 570 tests/gpu/test_measure.py tests/gpu/test_hopper_measure.py \
  tests/gpu/test_varlen_search.py tests/gpu/test_diagnose.py tests/gpu/test_faults.py tests/gpu/test_tile_overlap.py tests/gpu/test_split_kv.py
