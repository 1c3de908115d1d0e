# session q, call 1: the GPU tests of what changed (the extension's plan, a SCHED 3 row; the served choice)
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/q1_tests.log
bash .device/q/gpusuite.sh $OUT/q1_tests.log 560 \
  tests/test_hopper_ext_tail_split.py \
  "tests/test_export.py::test_hopper_production_extension_on_the_gpu" \
  "tests/test_export.py::test_production_extension_on_the_gpu" \
  tests/gpu/test_runtime_path.py tests/gpu/test_fastpath_gpu.py tests/gpu/test_gqa.py tests/gpu/test_tail_split.py
