# session m call 12: the GPU suites that share the split epilogue and the Q barriers: packed batches,
# split-KV, CTA pairs, D=192/256
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$SECONDS
for f in tests/gpu/test_varlen.py tests/gpu/test_split_kv.py tests/gpu/test_hopper_cluster.py tests/gpu/test_hopper_wide.py; do
  left=$((540 - (SECONDS - t0))); [ $left -lt 30 ] && { echo "no time left for $f"; continue; }
  timeout $left python3 -m pytest -q -rs $f -p no:cacheprovider 2>&1 | tail -3 | sed "s|^|$f: |" | tee -a $OUT/a12_tests.log
done
echo "total wall $((SECONDS - t0)) s"
