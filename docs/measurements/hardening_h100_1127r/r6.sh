# session r, call 6 (after the review moved the scripts' argparse types into evotuner.scriptargs): the scripts the walk's fixes touched, run for real on the GPU (small cases):
# each must finish with rc 0 and write its files; sweep.py must refuse to overwrite a sweep of
# another problem (rc 2), and resume its own
log=$OUT/r6_scripts.log
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $log
run() { echo "== $*" >> $log; timeout 170 "$@" >> $log 2>&1; rc=$?; echo "rc=$rc" >> $log; echo "$1 $2: rc=$rc"; }
run python3 scripts/bench_attention.py --family hopper --dtypes fp16 --rounds 1 --shapes 1,8,512,64,0 --output $OUT/ba
run python3 scripts/bench_runtime.py --rounds 1 --shapes 1,8,1024,64,0,2 --output $OUT/br
run python3 scripts/bench_varlen.py --batch 4 --min 64 --max 512 --rounds 1 --output $OUT/bv.json
mkdir -p $OUT/bd; run python3 scripts/bench_decode.py --sq 1 --sk 4096 --batch 1 --groups 8 --rounds 1 --bases none --output $OUT/bd
run python3 scripts/sweep.py --shape B=1,H=2,S=256,D=32 --space tests/data/loop_tiny.toml --output /tmp/sw.csv --limit 3
run python3 scripts/sweep.py --shape B=1,H=2,S=256,D=32 --space tests/data/loop_tiny.toml --output /tmp/sw.csv --limit 4
run python3 scripts/sweep.py --shape B=1,H=2,S=512,D=32 --space tests/data/loop_tiny.toml --output /tmp/sw.csv --limit 3
wc -l /tmp/sw.csv >> $log
run python3 scripts/kernel_smoke.py --out /tmp/ks --match "D64 fp16 BLOCK_M=128,BLOCK_N=64,MIN_BLOCKS=1,NUM_WARPS=4,STAGES=2" --rounds 1 --no-faults
run python3 scripts/two_workers.py --trials 4
tail -3 $log
