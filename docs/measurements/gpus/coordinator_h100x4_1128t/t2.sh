#!/usr/bin/env bash
# session t call 2 (CPU only on the GPU host): where a search's per-trial coordinator time goes on this host
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out"
lscpu | head -20 > "$out/t2_cpu.txt"; python3 -c "import numpy; numpy.show_config()" >> "$out/t2_cpu.txt" 2>&1
python3 -c "import sys, optuna, sqlalchemy, numpy; print(sys.version, optuna.__version__, sqlalchemy.__version__, numpy.__version__)" >> "$out/t2_cpu.txt"
df -h /tmp /dev/shm >> "$out/t2_cpu.txt"; mount | grep -E " /tmp | / " >> "$out/t2_cpu.txt"
python3 .device/t/synth.py search_spaces/hopper.toml /tmp/sweep_hopper.csv > "$out/t2_synth.log" 2>&1
run() {  # name dbdir extra...
  name=$1; dbdir=$2; shift 2; rm -rf "$dbdir/$name"; mkdir -p "$dbdir/$name"
  local t0=$(date +%s.%N)
  OPENBLAS_NUM_THREADS=1 EVOTUNER_CACHE_DIR="$dbdir/$name/cache" timeout 200 "$@" search --study p --shape B=4,H=32,S=4096,D=128 --causal \
    --trials 160 --storage "sqlite:///$dbdir/$name/s.db" --seed 0 --no-transfer --space hopper --replay /tmp/sweep_hopper.csv \
    > "$out/t2_$name.log" 2>&1
  local t1=$(date +%s.%N)
  python3 -c "print('$name wall', round($t1-$t0,1))" | tee -a "$out/t2_summary.txt"
  grep -A1 "time split" "$out/t2_$name.log" | tee -a "$out/t2_summary.txt"
}
run plain_tmp /tmp python3 -m evotuner.cli
run plain_shm /dev/shm python3 -m evotuner.cli
run prof_tmp /tmp python3 -m cProfile -o "$out/t2_prof_tmp.out" -m evotuner.cli
python3 - "$out/t2_prof_tmp.out" > "$out/t2_prof.txt" <<'PY'
import pstats, sys
p = pstats.Stats(sys.argv[1]); p.sort_stats('cumulative').print_stats(r'guided|study.py.*ask|_fill|_ask_one|_finish|claim|bind|coordinator|workers.py|tell|set_user_attr|_collect|judge|suggest|read_sweep|run_search', 45)
p.sort_stats('tottime').print_stats(30)
PY
head -80 "$out/t2_prof.txt"
cat "$out/t2_summary.txt"
