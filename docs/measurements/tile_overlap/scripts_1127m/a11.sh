# session m call 11: a 64-trial search at 8,32/4,1024,128 with TILE_OVERLAP in the space, then the bar
# through the public call with the study's best (EVOTUNER_TUNED) beside the recommended config
set -o pipefail
export PYTHONUNBUFFERED=1
D=/tmp/sm11; mkdir -p $D; t0=$SECONDS
nvidia-smi --query-gpu=name --format=csv,noheader
db=sqlite:////tmp/bars_m11.db
timeout 120 evotuner search --study g4 --shape B=8,H=32,HKV=4,S=1024,D=128 --trials 64 --storage $db > $D/search_g4.log 2>&1
echo "search rc=$? wall $((SECONDS - t0)) s"; grep -E "best|^study" $D/search_g4.log | cut -c1-200 | head -3
grep -A 14 "^ *# *BN\|BN  CW" $D/search_g4.log | head -16
timeout 150 python3 scripts/bench_runtime.py --rounds 5 --shapes 8,32,1024,128,0,4 --output $D/bar_recommended > $D/bar_recommended.log 2>&1
tail -3 $D/bar_recommended.log
EVOTUNER_TUNED=$db timeout 150 python3 scripts/bench_runtime.py --rounds 5 --shapes 8,32,1024,128,0,4 --output $D/bar_tuned > $D/bar_tuned.log 2>&1
tail -3 $D/bar_tuned.log
cp /tmp/bars_m11.db $D/
tar czf "$OUT/sm11.tgz" -C /tmp sm11
echo "total wall $((SECONDS - t0)) s"
