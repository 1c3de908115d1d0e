# session m call 7: tests/gpu/test_tile_overlap.py on the final code
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 280 python3 -m pytest -q -rs tests/gpu/test_tile_overlap.py -p no:cacheprovider 2>&1 | tail -4 | tee $OUT/a7_tests.log
