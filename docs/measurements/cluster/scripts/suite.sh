# session k (2026-11-27), one device call, nvidia-h100-x1: source .device/setup.sh && bash docs/measurements/cluster/scripts/suite.sh
# the GPU suite, part $1 (A or B)
set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
g=tests/gpu
A="$g/test_hopper_attention.py $g/test_attention.py $g/test_gqa.py $g/test_hopper_wide.py $g/test_hopper_d96_gpu.py $g/test_hopper_cluster.py"
B="$g/test_measure.py $g/test_runtime_path.py $g/test_split_kv.py $g/test_varlen.py $g/test_varlen_search.py $g/test_fastpath_gpu.py $g/test_faults.py $g/test_diagnose.py $g/test_hopper_measure.py tests/test_export.py"
files=${!1}
timeout 560 python3 -m pytest -q -rs -m gpu --durations=12 $files 2>&1 | tee $OUT/suite_$1.log | grep -vE "^\s*$" | tail -40
