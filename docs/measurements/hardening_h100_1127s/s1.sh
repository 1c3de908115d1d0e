# session s, call 1: the GPU paths this session's changes touch
#  - the export walk's header reader (both production extensions build from an exported header
#    and read it with header.read_header), the runtime path serving a header (use_tuned)
#  - params.h (a comment: every hopper cubin rebuilds) -> the tail split and runtime path tests
#  - the layout: a real search's hint lines at 80 columns with a long --storage path
#  - the scripts whose refusals changed and run on a GPU: bench_gpus.py, sweep.py --sweep
set -u
log=$OUT/s1_tests.log
nvidia-smi --query-gpu=name,power.limit,driver_version --format=csv,noheader | tee $log
bash .device/s/gpusuite.sh $log 330 \
  tests/test_export.py::test_hopper_production_extension_on_the_gpu \
  tests/test_export.py::test_production_extension_on_the_gpu \
  tests/test_hopper_ext_tail_split.py \
  tests/gpu/test_runtime_path.py \
  tests/gpu/test_tail_split.py \
  tests/gpu/test_fastpath_gpu.py
slog=$OUT/s1_search.log
db=/tmp/a_rather_long_folder_name_for_the_study_database/of_this_session/studies.db
mkdir -p $(dirname $db)
( export COLUMNS=80; cd /tmp && timeout 150 evotuner search --study s1 --shape B=2,H=16,S=1024,D=128 --trials 8 --storage sqlite:///$db ) > $slog 2>&1; echo "search rc=$?" | tee -a $slog
( export COLUMNS=80; timeout 60 evotuner export --study s1 --storage sqlite:///$db --output /tmp/s1.h ) >> $slog 2>&1; echo "export rc=$?" | tee -a $slog
echo "// mine" > /tmp/mine.cpp; echo "int main() {}" >> /tmp/mine.cpp
( timeout 60 evotuner export --study s1 --storage sqlite:///$db --output /tmp/mine.cpp ) >> $slog 2>&1; echo "export onto mine.cpp rc=$? (1 meant)"| tee -a $slog; cat /tmp/mine.cpp >> $slog
python3 - >> $slog 2>&1 <<'PY'
import torch, evotuner
evotuner.use_tuned("/tmp/s1.h")
q, k, v = (torch.randn(2, 16, 1024, 128, device="cuda", dtype=torch.float16) for _ in range(3))
o, choice = evotuner.flash_attention(q, k, v, return_choice=True)
ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
print("served from the header:", choice, "max err", (o.float() - ref).abs().max().item())
PY
echo "use_tuned(header) rc=$?" | tee -a $slog
awk 'length > 80' $slog | head -5 > $OUT/s1_long_lines.txt
plog=$OUT/s1_scripts.log
run() { echo "== $*" >> $plog; timeout 150 "$@" >> $plog 2>&1; rc=$?; echo "rc=$rc" >> $plog; echo "$1 $2: rc=$rc"; }
run python3 scripts/sweep.py --shape B=1,H=2,S=256,D=32 --space tests/data/loop_tiny.toml --output /tmp/sw.csv --limit 3
run python3 scripts/sweep.py --sweep "B=1,H=2,S=128,D=64:fp16:nofolder/x.csv"
run python3 scripts/bench_gpus.py --trials 4 --shape B=1,H=8,S=512,D=64 --runs none --workdir /tmp/bg --output $OUT/bg.json
run python3 scripts/bench_gpus.py --trials 4 --shape B=1,H=8,S=512,D=64 --runs none --workdir /tmp/bg --output $OUT/bg2.json
tail -3 $log
