# gpusuite.sh LOG BUDGET_S TEST...: each test file (or node id) in its own pytest process with a
# timeout, appended to LOG; one summary line per file; stops starting new ones past BUDGET_S.
log=$1; budget=$2; shift 2
t0=$SECONDS
for t in "$@"; do
  left=$((budget - (SECONDS - t0)))
  [ $left -lt 40 ] && { echo "SKIPPED (out of time): $t" | tee -a $log; continue; }
  echo "== $t $(date +%T)" >> $log
  timeout $left python3 -m pytest -q -rs -p no:cacheprovider "$t" >> $log 2>&1; rc=$?
  echo "$t: rc=$rc $(tail -1 $log)"
done
