# session q, call 6: the GPU suites not run since session p's kernel changes (SCHED 3 in the
# scheduler, the epilogue, split.cuh), each file in its own pytest process (gpusuite.sh).
bash .device/q/gpusuite.sh $OUT/q5_gpu_tests.log 570 tests/gpu/test_hopper_attention.py tests/gpu/test_attention.py \
  tests/gpu/test_varlen.py tests/gpu/test_hopper_d96_gpu.py tests/gpu/test_hopper_wide.py tests/gpu/test_hopper_cluster.py \
  tests/gpu/test_q_in_regs.py tests/gpu/test_split_kv.py
