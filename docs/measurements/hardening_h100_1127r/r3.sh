# session r, call 3 (two GPUs): the runtime-path test that needs two GPUs
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/r3_tests.log
bash .device/r/gpusuite.sh $OUT/r3_tests.log 300 tests/gpu/test_runtime_path.py
