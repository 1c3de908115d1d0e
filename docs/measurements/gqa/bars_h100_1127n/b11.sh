# session n, call 11 (after the paired-order fix) (nvidia-h100-x1): source .device/setup.sh && bash .device/n/b11.sh
# The issue-24 searches at the tip: 64 trials per bar shape, one database (each study seeded from
# those before it, as a user's would be), the spaces as shipped (PACK_GQA, TILE_OVERLAP searched).
set -o pipefail
export PYTHONUNBUFFERED=1
t0=$SECONDS
nvidia-smi --query-gpu=name --format=csv,noheader
db=sqlite:////tmp/bars_n2.db; mkdir -p /tmp/sn2
for spec in "g1 B=1,H=32,HKV=8,S=4096,D=128 -" "g2 B=4,H=64,HKV=8,S=2048,D=128 -" "g3 B=2,H=32,HKV=8,S=8192,D=128 --causal" \
            "g4 B=8,H=32,HKV=4,S=1024,D=128 -" "w1 B=4,H=16,S=2048,D=256 -" "w2 B=4,H=16,S=4096,D=256 --causal"; do
  set -- $spec; c=$3; [ "$c" = - ] && c=
  s0=$SECONDS
  timeout 110 evotuner search --study $1 --shape $2 $c --trials 64 --storage $db > /tmp/sn2/search_$1.log 2>&1; rc=$?
  echo "== $1 $2 $c: rc=$rc wall $((SECONDS - s0)) s"
  grep -E "^study|best" /tmp/sn2/search_$1.log | cut -c1-200 | head -2
done
gzip -c /tmp/bars_n2.db > $OUT/bars_n2.db.gz; tar czf $OUT/searches_n2.tgz -C /tmp sn2
EVOTUNER_TUNED=sqlite:////tmp/bars_n2.db timeout 200 python3 scripts/bench_runtime.py --rounds 5 \
    --shapes 1,32,4096,128,0,8 --shapes 4,64,2048,128,0,8 --shapes 2,32,8192,128,1,8 --shapes 8,32,1024,128,0,4 \
    --shapes 4,16,2048,256,0 --shapes 4,16,4096,256,1 --output $OUT/b11_bars > $OUT/b11_bars.log 2>&1; echo "bench rc=$?"
tail -9 $OUT/b11_bars.log
echo "total wall $((SECONDS - t0)) s"
