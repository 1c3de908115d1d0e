# session r, call 1: the GPU tests of what changed (runtime input checks, use_tuned, header reading
# for the production extensions, nvcc discovery and the builder), then a real 8-trial search + show + export
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/r1_tests.log
bash .device/r/gpusuite.sh $OUT/r1_tests.log 470 \
  tests/gpu/test_runtime_path.py tests/gpu/test_fastpath_gpu.py tests/gpu/test_varlen.py \
  "tests/test_export.py::test_hopper_production_extension_on_the_gpu" \
  "tests/test_export.py::test_production_extension_on_the_gpu" \
  tests/test_hopper_ext_tail_split.py tests/gpu/test_measure.py tests/gpu/test_hopper_measure.py tests/gpu/test_gqa.py
{ cd /tmp && rm -f r1.db
  timeout 90 evotuner search --study r1 --shape B=2,H=16,S=1024,D=128 --trials 8 --storage sqlite:///r1.db; echo "search rc=$?"
  timeout 30 evotuner show --study r1 --storage sqlite:///r1.db; echo "show rc=$?"
  timeout 30 evotuner export --study r1 --output /tmp/r1.h --storage sqlite:///r1.db; echo "export rc=$?"
} > $OUT/r1_search.log 2>&1
tail -5 $OUT/r1_search.log
