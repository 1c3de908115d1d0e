# session s, call 3: after the cost model sums a packed batch's tiles by live warpgroups (798f226):
# the varlen search GPU tests, and guided searches of 512 and 4096 packed sequences, timed
set -u
log=$OUT/s3_tests.log
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $log
bash .device/s/gpusuite.sh $log 200 tests/gpu/test_varlen_search.py
for spec in random:512:16..2048:seed=0 random:4096:16..512:seed=0; do
  n=$(echo $spec | cut -d: -f2)
  vlog=$OUT/s3_varlen_search_$n.log
  t0=$(python3 -c 'import time; print(time.time())')
  ( cd /tmp && timeout 200 evotuner search --study vl$n --shape H=16,HKV=4,D=128 --causal --lengths $spec --trials 8 --storage sqlite:////tmp/vl$n.db ) > $vlog 2>&1; rc=$?
  echo "guided search of $n packed sequences ($spec): rc=$rc wall $(python3 -c "import time; print(round(time.time() - $t0, 1))") s" | tee -a $vlog
  grep -A1 "time split" $vlog | tee -a $log
done
