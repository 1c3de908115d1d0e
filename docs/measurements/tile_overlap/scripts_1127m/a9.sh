# session m call 9: the production extension packs grouped query heads (a PACK_GQA=1 row), on the GPU
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$SECONDS
timeout 560 python3 -m pytest -q -rs "tests/test_export.py::test_hopper_production_extension_on_the_gpu" \
  "tests/test_export.py::test_production_extension_on_the_gpu" -p no:cacheprovider 2>&1 | tail -15 | tee $OUT/a9_tests.log
echo "wall $((SECONDS - t0)) s"
