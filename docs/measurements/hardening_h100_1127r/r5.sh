# session r, call 5: kernel_smoke.py (its --out, GPU check and atomic writes changed) on one config
log=$OUT/r5_smoke.log
timeout 300 python3 scripts/kernel_smoke.py --out $OUT/ks --match "D64 fp16 BLOCK_M=128,BLOCK_N=64,MIN_BLOCKS=1,NUM_WARPS=4,STAGES=2" --rounds 1 --no-faults > $log 2>&1
echo "rc=$?" | tee -a $log; tail -6 $log; ls $OUT/ks
