# session q, call 2: issue 24's dense bars at the tip, served from session n's second searches
# (docs/measurements/gqa/bars_h100_1127n/bars_n2.db.gz), three bench processes one after another.
t0=$SECONDS
gunzip -c docs/measurements/gqa/bars_h100_1127n/bars_n2.db.gz > /tmp/bars_n2.db
for i in 1 2 3; do
  left=$((560 - (SECONDS - t0)))
  [ $left -lt 60 ] && { echo "process $i: out of time"; break; }
  s0=$SECONDS
  EVOTUNER_TUNED=sqlite:////tmp/bars_n2.db timeout $((left < 190 ? left : 190)) python3 scripts/bench_runtime.py --rounds 5 \
    --shapes 1,32,4096,128,0,8 --shapes 4,64,2048,128,0,8 --shapes 2,32,8192,128,1,8 --shapes 8,32,1024,128,0,4 \
    --shapes 4,16,2048,256,0 --shapes 4,16,4096,256,1 --output $OUT/q2_bars_$i > $OUT/q2_bars_$i.log 2>&1
  echo "process $i: rc=$? wall $((SECONDS - s0)) s"; tail -8 $OUT/q2_bars_$i.log
done
echo "total wall $((SECONDS - t0)) s"
