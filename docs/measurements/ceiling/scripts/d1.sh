set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== runtime-path + varlen GPU tests $(date +%T)"
timeout 400 python3 -m pytest -q -rs -m gpu tests/gpu/test_runtime_path.py tests/gpu/test_varlen.py 2>&1 | tee $OUT/gpu_runtime_varlen.log | tail -15
O=$OUT/ncu; mkdir -p $O
for sh in "2 16 1024 64 0 16" "1 16 1024 64 1 16" "8 32 1024 128 0 4" "1 32 4096 128 0 8" "4 16 2048 256 0 16"; do
  for who in ours sdpa; do
    tag=${who}_${sh// /_}
    python3 .device/l/prof2.py $who $sh > $O/$tag.choice 2>&1
    timeout 120 ncu --launch-skip 3 --launch-count 6 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --metrics sm__cycles_active.avg,sm__ctas_launched.sum,lts__t_bytes.sum,dram__bytes_read.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum \
      python3 .device/l/prof2.py $who $sh > $O/$tag.txt 2>&1
    echo "== $tag rc=$? $(grep CHOICE $O/$tag.choice)"
    grep -E "^  [a-zA-Z_]|Duration|Grid Size|Block Size|Registers Per|Dynamic Shared|Achieved Occupancy|Waves Per SM|Compute \(SM\) Throughput|Memory Throughput|hmma|ctas_launched|lts__t_bytes|dram__bytes" $O/$tag.txt | grep -v "==PROF==" | head -40
  done
done
tar czf $OUT/ncu.tgz -C $OUT ncu && rm -rf $O
