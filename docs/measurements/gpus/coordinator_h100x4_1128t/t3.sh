#!/usr/bin/env bash
# session t call 3: where the real 1-GPU search's coordinator time goes (cProfile of the main thread, per-thread CPU)
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out"
d=/tmp/t3; rm -rf $d; mkdir -p $d
OPENBLAS_NUM_THREADS=1 EVOTUNER_CACHE_DIR=$d/cache timeout 300 python3 -m cProfile -o "$out/t3_prof.out" -m evotuner.cli search \
  --study g --shape B=4,H=32,S=4096,D=128 --causal --trials 128 --storage sqlite:///$d/s.db --seed 0 --no-transfer > "$out/t3_search.log" 2>&1 &
pid=$!
sleep 0.5
python3 .device/t/threads.py $pid > "$out/t3_threads.log" 2>&1 &
wait $pid; echo "search rc=$?"
sleep 2
grep -A2 "time split" "$out/t3_search.log"
python3 - "$out/t3_prof.out" > "$out/t3_prof.txt" <<'PY'
import pstats, sys
p = pstats.Stats(sys.argv[1]); p.sort_stats('cumulative').print_stats(r'guided|study.py.*ask|_fill|_ask_one|_finish|claim|bind|tell|set_user_attr|_collect|judge|suggest|run_search|_set_trial_param|execute|commit|_pick|_predict|_posterior|_observations|submit', 60)
p.sort_stats('tottime').print_stats(40)
PY
head -150 "$out/t3_prof.txt" | cut -c1-160
tail -40 "$out/t3_threads.log"
