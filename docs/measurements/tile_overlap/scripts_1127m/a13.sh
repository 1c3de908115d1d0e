# session m call 13: tests/gpu/test_tile_overlap.py after the review's refactor of the TILE_OVERLAP path
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -q -rs tests/gpu/test_tile_overlap.py -p no:cacheprovider 2>&1 | tail -3 | tee $OUT/a13_tests.log
