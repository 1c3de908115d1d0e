# session p, call 11 (after the review's mends): split-KV and tail-split GPU tests, the fast-path
# and runtime-path GPU tests (the binder's fields now name their pointer), then SCHED 3 against
# SCHED 2 on the same tiles through the public call (bench_runtime, graph and eager x SDPA).
set -o pipefail
export PYTHONUNBUFFERED=1
t0=$SECONDS
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python3 -m pytest -q -rs tests/gpu/test_split_kv.py tests/gpu/test_tail_split.py tests/gpu/test_fastpath_gpu.py \
  tests/gpu/test_runtime_path.py -p no:cacheprovider > $OUT/p11_tests.log 2>&1
echo "tests rc=$? wall $((SECONDS - t0)) s"; tail -3 $OUT/p11_tests.log
for s in 3 2; do
  timeout 90 evotuner search --study w3s$s --shape B=1,H=32,HKV=8,S=4096,D=128 --trials 1 --space .device/p/w3_sched$s.toml \
    --storage sqlite:////tmp/w3s$s.db > $OUT/p11_search_s$s.log 2>&1; echo "search SCHED $s rc=$? wall $((SECONDS - t0)) s"
  grep -E "best" $OUT/p11_search_s$s.log | head -1 | cut -c1-160
  EVOTUNER_TUNED=sqlite:////tmp/w3s$s.db timeout 120 python3 scripts/bench_runtime.py --rounds 5 --shapes 1,32,4096,128,0,8 \
    --output $OUT/p11_bar_s$s > $OUT/p11_bar_s$s.log 2>&1; echo "bar SCHED $s rc=$? wall $((SECONDS - t0)) s"; tail -4 $OUT/p11_bar_s$s.log
done
echo "total wall $((SECONDS - t0)) s"
