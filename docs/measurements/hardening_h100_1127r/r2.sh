# session r, call 2: offsets a caller got wrong (past the end, backwards, before row 0, lengths
# past max_seqlen) in packed variable-length batches: the GPU test, then memcheck over every
# varlen case of sanitize_paths.py (each case also runs the four wrong-offset calls)
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/r2_tests.log
bash .device/r/gpusuite.sh $OUT/r2_tests.log 200 tests/gpu/test_varlen.py
timeout 330 compute-sanitizer --tool memcheck --error-exitcode 9 --kernel-name kns=hopper_fwd \
  python3 scripts/sanitize_paths.py --only varlen > $OUT/r2_memcheck.log 2>&1; echo "memcheck rc=$?" | tee -a $OUT/r2_memcheck.log
tail -12 $OUT/r2_memcheck.log
