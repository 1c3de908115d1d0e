# session m call 6: TILE_OVERLAP GPU test on the final code; compute-sanitizer on the packed
# recommended configs (dense, past the split space) and on TILE_OVERLAP=1
set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$SECONDS
timeout 240 python3 -m pytest -q -rs tests/gpu/test_tile_overlap.py -p no:cacheprovider 2>&1 | tail -4 | tee $OUT/a6_tests.log
echo "tests wall $((SECONDS - t0)) s"
TO=STAGES=2,REG_PROD=24,OVERLAP=1,RESCALE_LOG2=8,EXP_EMU=0,TILE_OVERLAP=1
CASES="--case 2,16,4,700,333,128,0,- --case 2,24,4,900,257,64,0,- --case 1,8,2,1100,300,96,0,-
  --case 2,16,4,700,333,128,0,BLOCK_N=80,CONSUMER_WGS=3,REG_CONS=160,PINGPONG=1,SCHED=2,PACK_GQA=1,$TO
  --case 2,5,5,1000,97,64,0,BLOCK_N=128,CONSUMER_WGS=1,REG_CONS=256,PINGPONG=0,SCHED=1,$TO"
python3 scripts/sanitize_paths.py $CASES 2>&1 | tail -6
for tool in memcheck racecheck synccheck; do
  timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 python3 scripts/sanitize_paths.py $CASES > $OUT/a6_$tool.log 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/a6_$tool.log | tail -1)"
done
echo "total wall $((SECONDS - t0)) s"
