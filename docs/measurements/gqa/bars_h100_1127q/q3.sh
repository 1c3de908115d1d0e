# session q, call 3: issue 24's dense bars at the tip, served from session n's second searches
# (docs/measurements/gqa/bars_h100_1127n/bars_n2.db.gz), ten more bench processes one after another.
t0=$SECONDS
gunzip -c docs/measurements/gqa/bars_h100_1127n/bars_n2.db.gz > /tmp/bars_n2.db
for i in 4 5 6 7 8 9 10 11 12 13; do
  left=$((560 - (SECONDS - t0)))
  [ $left -lt 50 ] && { echo "process $i: out of time"; break; }
  s0=$SECONDS
  EVOTUNER_TUNED=sqlite:////tmp/bars_n2.db timeout $((left < 190 ? left : 190)) python3 scripts/bench_runtime.py --rounds 5 \
    --shapes 1,32,4096,128,0,8 --shapes 4,64,2048,128,0,8 --shapes 2,32,8192,128,1,8 --shapes 8,32,1024,128,0,4 \
    --shapes 4,16,2048,256,0 --shapes 4,16,4096,256,1 --output /tmp/q3_bars_$i > /tmp/q3_bars_$i.log 2>&1
  echo "process $i: rc=$? wall $((SECONDS - s0)) s"; tail -7 /tmp/q3_bars_$i.log | head -6
done
echo "total wall $((SECONDS - t0)) s"
tar czf $OUT/q3_logs.tgz -C /tmp $(cd /tmp && ls q3_bars_*)
