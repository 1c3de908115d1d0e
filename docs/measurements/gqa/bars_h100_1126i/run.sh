# session i, call 6 (nvidia-h100-x1): issue 24's speed bars re-measured with 9 rounds (3 rounds gave per-round SDPA
# spreads of up to 20%): a 64-trial search per shape (the user's command, default space and sampler), then
# flash_attention served from the studies (EVOTUNER_TUNED) next to SDPA (enable_gqa), graph and eager, one process.
set -o pipefail
D=/tmp/s6; mkdir -p $D
python3 -c "import torch, evotuner.cli, evotuner.measure.worker, evotuner.runtime.check" 2>/dev/null
db=sqlite:////tmp/bars.db
for spec in "g1 B=1,H=32,HKV=8,S=4096,D=128 -" "g2 B=4,H=64,HKV=8,S=2048,D=128 -" "g3 B=2,H=32,HKV=8,S=8192,D=128 --causal" \
            "g4 B=8,H=32,HKV=4,S=1024,D=128 -" "w1 B=4,H=16,S=2048,D=256 -" "w2 B=4,H=16,S=4096,D=256 --causal"; do
  set -- $spec; c=$3; [ "$c" = - ] && c=
  echo "== search $1 $2 $c $(date +%T)"
  timeout 90 evotuner search --study $1 --shape $2 $c --trials 64 --storage $db > $D/search_$1.log 2>&1; echo rc=$?
  grep -E "^study|time split" $D/search_$1.log | head -2; sed -n '/^best/,/^ *[0-9]/p' $D/search_$1.log | tail -1
done
echo "== bench_runtime, served from the studies, 9 rounds $(date +%T)"
EVOTUNER_TUNED=$db timeout 240 python3 scripts/bench_runtime.py --rounds 9 --shapes 1,32,4096,128,0,8 --shapes 4,64,2048,128,0,8 \
  --shapes 2,32,8192,128,1,8 --shapes 8,32,1024,128,0,4 --shapes 4,16,2048,256,0 --shapes 4,16,4096,256,1 \
  --output $D/bars_h100 > $D/bars.log 2>&1; echo rc=$?
tail -30 $D/bars.log
cp /tmp/bars.db $D/ 2>/dev/null
tar czf "$OUT/s6.tgz" -C /tmp s6
echo "== done $(date +%T)"
