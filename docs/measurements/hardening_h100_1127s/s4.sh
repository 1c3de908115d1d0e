# session s, call 4: after the review (scriptargs.work_folder in bench_gpus/two_workers,
# numbers.parse_whole): those scripts for real, and the user's figures at a GQA bar shape and a
# packed batch (graph and eager against SDPA in the same process; kernels unchanged this session)
set -u
log=$OUT/s4.log
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $log
run() { echo "== $*" >> $log; timeout 200 "$@" >> $log 2>&1; rc=$?; echo "rc=$rc" >> $log; echo "$1 $2: rc=$rc"; }
run python3 scripts/two_workers.py --trials 6
run python3 scripts/bench_gpus.py --trials 4 --shape B=1,H=8,S=512,D=64 --runs none --output $OUT/bg.json
run python3 scripts/bench_runtime.py --rounds 3 --shapes 1,32,4096,128,0,8 --shapes 8,32,1024,128,0,4 --output $OUT/br
run python3 scripts/bench_varlen.py --causal --rounds 3 --output $OUT/bv.json
grep -E "OK:|exact|x SDPA|graph|eager|max err|ratio" $log | tail -20
