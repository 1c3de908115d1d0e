# session n, call 3 (nvidia-h100-x1): source .device/setup.sh && bash .device/n/b3.sh
# The issue-24 bars through the public call at the tip: served from call 2's searches (EVOTUNER_TUNED),
# D=96 with the recommended configs, then the varlen bar (16 causal sequences, 128..8192).
set -o pipefail
export PYTHONUNBUFFERED=1
t0=$SECONDS
nvidia-smi --query-gpu=name --format=csv,noheader
EVOTUNER_TUNED=sqlite:///$PWD/.device/n/bars_n.db timeout 330 python3 scripts/bench_runtime.py --rounds 5 \
    --shapes 1,32,4096,128,0,8 --shapes 4,64,2048,128,0,8 --shapes 2,32,8192,128,1,8 --shapes 8,32,1024,128,0,4 \
    --shapes 4,16,2048,256,0 --shapes 4,16,4096,256,1 --shapes 8,16,2048,96,0 --shapes 4,32,4096,96,1 \
    --output $OUT/b3_bars > $OUT/b3_bars.log 2>&1; echo "bench rc=$? wall $((SECONDS - t0)) s"; tail -12 $OUT/b3_bars.log
left=$((560 - (SECONDS - t0))); echo "left $left s"
timeout $((left - 10)) python3 scripts/bench_varlen.py --causal --rounds 3 --output $OUT/b3_varlen.json > $OUT/b3_varlen.log 2>&1
echo "varlen rc=$?"; tail -8 $OUT/b3_varlen.log
echo "total wall $((SECONDS - t0)) s"
