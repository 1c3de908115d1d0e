# session k (2026-11-27), one device call, nvidia-h100-x1: source .device/setup.sh && bash docs/measurements/gqa/bars_h100_1127k/run.sh
# Session k: session i's issue-24 searches again (64 trials each, one database, each seeded from the
# studies before it: the user's command), for the seeded proposal cost on the GPU machine (one BLAS
# thread, the posterior-sd pruning), then the served bars if time is left.
set -o pipefail
export PYTHONUNBUFFERED=1
D=/tmp/sk; mkdir -p $D; t0=$SECONDS
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -c "import torch, evotuner.cli, evotuner.measure.worker, evotuner.runtime.check" 2>/dev/null
db=sqlite:////tmp/bars.db
for spec in "g1 B=1,H=32,HKV=8,S=4096,D=128 -" "g2 B=4,H=64,HKV=8,S=2048,D=128 -" "g3 B=2,H=32,HKV=8,S=8192,D=128 --causal" \
            "g4 B=8,H=32,HKV=4,S=1024,D=128 -" "w1 B=4,H=16,S=2048,D=256 -" "w2 B=4,H=16,S=4096,D=256 --causal"; do
  set -- $spec; c=$3; [ "$c" = - ] && c=
  s0=$SECONDS
  timeout 100 evotuner search --study $1 --shape $2 $c --trials 64 --storage $db > $D/search_$1.log 2>&1; rc=$?
  echo "== $1 $2 $c: rc=$rc wall $((SECONDS - s0)) s"
  grep -E "seeded from|time split|^study" $D/search_$1.log | cut -c1-230 | head -3
done
left=$((570 - (SECONDS - t0))); echo "left $left s"
if [ $left -gt 150 ]; then
  EVOTUNER_TUNED=$db timeout $((left - 20)) python3 scripts/bench_runtime.py --rounds 5 --shapes 1,32,4096,128,0,8 --shapes 4,64,2048,128,0,8 \
    --shapes 2,32,8192,128,1,8 --shapes 8,32,1024,128,0,4 --shapes 4,16,2048,256,0 --shapes 4,16,4096,256,1 \
    --output $D/bars_h100 > $D/bars.log 2>&1; echo "bench rc=$?"; tail -14 $D/bars.log
fi
cp /tmp/bars.db $D/ 2>/dev/null
tar czf "$OUT/sk.tgz" -C /tmp sk
