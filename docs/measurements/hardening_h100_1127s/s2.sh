# session s, call 2: after the storage change (every Optuna storage call of a search goes through
# the store's translating RDBStorage; replay build keys fitted to their column), the cost model's
# packed batches and the packed-grid check: the GPU suites of the search and varlen paths, two
# workers on one study, real searches through the store, a guided search of a 512-sequence batch
set -u
log=$OUT/s2_tests.log
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $log
bash .device/s/gpusuite.sh $log 330 tests/gpu/test_measure.py tests/gpu/test_hopper_measure.py tests/gpu/test_faults.py \
  tests/gpu/test_varlen_search.py tests/gpu/test_varlen.py
wlog=$OUT/s2_workers.log
timeout 200 python3 scripts/two_workers.py --trials 12 > $wlog 2>&1; echo "two_workers rc=$?" | tee -a $wlog
tail -3 $wlog
slog=$OUT/s2_search.log
( cd /tmp && timeout 120 evotuner search --study s2 --shape B=4,H=32,S=4096,D=128 --causal --trials 16 --storage sqlite:////tmp/s2.db ) > $slog 2>&1; echo "search rc=$?" | tee -a $slog
( cd /tmp && timeout 60 evotuner resume --study s2 --trials 20 --storage sqlite:////tmp/s2.db ) >> $slog 2>&1; echo "resume rc=$?" | tee -a $slog
( cd /tmp && timeout 60 evotuner show --study s2 --storage sqlite:////tmp/s2.db ) >> $slog 2>&1; echo "show rc=$?" | tee -a $slog
vlog=$OUT/s2_varlen_search.log
t0=$(date +%s.%N)
( cd /tmp && timeout 150 evotuner search --study vl --shape H=16,HKV=4,D=128 --causal --lengths random:512:16..2048:seed=0 --trials 8 --storage sqlite:////tmp/vl.db ) > $vlog 2>&1; rc=$?
echo "varlen search (512 sequences, guided) rc=$rc wall $(echo "$(date +%s.%N) - $t0" | bc) s" | tee -a $vlog
grep -E "time split|first measurement" $vlog | tail -2
