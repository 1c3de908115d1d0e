# i13 capture: real compute-sanitizer and ncu outputs for evotuner check/profile tests.
set -u
C=$OUT/cap; mkdir -p $C; D=scripts/i13_capture
T0=$(date +%s.%N)
stamp() { echo "$(date +%s.%N) $*" >> $C/timings.txt; }
stamp start
{ which compute-sanitizer ncu python3; compute-sanitizer --version; ncu --version; nvidia-smi -L; id; cat /proc/driver/nvidia/params 2>/dev/null | grep -i prof; } > $C/env.txt 2>&1
compute-sanitizer --help > $C/cs_help.txt 2>&1
ncu --help > $C/ncu_help.txt 2>&1
python3 $D/prep.py $C > $C/prep.out 2>&1; stamp prep rc=$?
FILT=""
if grep -q -- "--kernel-name " $C/cs_help.txt; then FILT="--kernel-name kns=flashcore_fwd"; elif grep -q -- "--kernel-regex" $C/cs_help.txt; then FILT="--kernel-regex kns=flashcore_fwd"; fi
echo "filter: $FILT" >> $C/env.txt
run_cs() {  # tool cfg
  local s=$(date +%s.%N)
  timeout 120 compute-sanitizer --tool $1 $FILT --log-file $C/cs_$1_$2.log --print-limit 20 --error-exitcode 9 \
      python3 $D/drive.py check $C/artifacts.json $2 > $C/cs_$1_$2.stdout 2> $C/cs_$1_$2.stderr
  local rc=$?; echo "$1 $2 rc=$rc wall=$(awk "BEGIN{print $(date +%s.%N) - $s}")" >> $C/timings.txt
}
for t in memcheck racecheck synccheck initcheck; do for c in clean_nc clean_c fault1; do run_cs $t $c & done; done
wait; stamp sanitizer_done
# without the log file: what compute-sanitizer writes to stdout itself (must never reach the protocol pipe)
timeout 60 compute-sanitizer --tool memcheck $FILT python3 $D/drive.py check $C/artifacts.json clean_nc > $C/cs_nolog.stdout 2> $C/cs_nolog.stderr; echo "nolog rc=$?" >> $C/timings.txt
M=sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_hmma.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread
SEC="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis"
run_ncu() {  # name tag extra...
  local n=$1 tag=$2; shift 2; local s=$(date +%s.%N)
  timeout 60 ncu --profile-from-start off --csv --page raw --print-units base "$@" python3 $D/drive.py ncu $C/artifacts.json $n > $C/ncu_${tag}_$n.csv 2> $C/ncu_${tag}_$n.stderr
  local rc=$?; echo "ncu $tag $n rc=$rc wall=$(awk "BEGIN{print $(date +%s.%N) - $s}")" >> $C/timings.txt; return $rc
}
for n in clean_nc sdpa; do
  run_ncu $n full $SEC --metrics $M || run_ncu $n sec $SEC
done
stamp ncu_done
# no tool on PATH / no counter permission, as an unprivileged user
cp -r $D /tmp/i13d; chmod -R a+rwx /tmp/i13d $C 2>/dev/null
timeout 30 su nobody -s /bin/bash -c "PYTHONPATH=$PYTHONPATH ncu --profile-from-start off --csv --page raw --metrics launch__registers_per_thread python3 /tmp/i13d/drive.py ncu $C/artifacts.json sdpa" > $C/ncu_noperm.stdout 2> $C/ncu_noperm.stderr; echo "noperm rc=$?" >> $C/timings.txt
stamp end
timeout 20 ncu --query-metrics > $C/ncu_query_metrics.txt 2>&1
rm -rf $C/cache
