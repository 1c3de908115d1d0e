#!/usr/bin/env bash
# The GPU verification a landing's note quotes, in one script (run on the H100 machine from the
# project root, after `source .device/setup.sh` there). Logs go to $OUT (default out/verify).
#   bash scripts/gpu_verify.sh [tests|bench|diagnose|hcheck|workers|tune|tunebench|rows|tune128|transfer|runtime|shipped|gpus|throughput|paired|kernels|midsize|decode|cluster|all]...
set -uo pipefail
steps="tests bench diagnose hcheck workers tune tunebench rows tune128 transfer runtime shipped gpus throughput paired kernels midsize decode cluster all"
usage() { echo "usage: bash scripts/gpu_verify.sh [STEP]... (default all); OUT=DIR for the logs (default out/verify); steps: ${steps// /, }"; }
for what in "$@"; do
  case " $steps " in
    *" $what "*) ;;
    *) if [ "$what" = "-h" ] || [ "$what" = "--help" ]; then usage; exit 0; fi
       echo "error: unknown step '$what' (see bash scripts/gpu_verify.sh --help; steps: ${steps// /, })" >&2; exit 2 ;;
  esac
done
out=${OUT:-out/verify}; mkdir -p "$out"
db="sqlite:////tmp/evotuner-verify.db"
# The hopper family's recommended configs (kernels/hopper/defaults.toml) and, for the rows
# benches, the big-tile D64 config with SCHED=0 (c64r) and the earlier lazy-rescale one.
hb=OVERLAP=1,EXP_EMU=0
c64=$hb,BLOCK_N=128,RESCALE_LOG2=0,CONSUMER_WGS=3,STAGES=2,REG_PROD=32,REG_CONS=160,PINGPONG=1,SCHED=2  # [d64] [d64.causal]
c64r=$hb,BLOCK_N=128,RESCALE_LOG2=8,CONSUMER_WGS=3,STAGES=2,REG_PROD=32,REG_CONS=160,PINGPONG=1,SCHED=0 # before 2026-11-24
c64dr=$hb,BLOCK_N=128,RESCALE_LOG2=8,CONSUMER_WGS=3,STAGES=2,REG_PROD=32,REG_CONS=160,PINGPONG=1,SCHED=2
h64=$hb,BLOCK_N=128,RESCALE_LOG2=0,CONSUMER_WGS=1,STAGES=2,REG_PROD=24,REG_CONS=256,PINGPONG=0,SCHED=0  # [d64.short]
m64=$hb,BLOCK_N=128,RESCALE_LOG2=0,CONSUMER_WGS=1,CTAS_PER_SM=2,STAGES=2,REG_PROD=24,REG_CONS=232,PINGPONG=0,SCHED=2  # [d64.mid], [d64.causal.mid]
n128=$hb,BLOCK_N=80,RESCALE_LOG2=8,CONSUMER_WGS=3,STAGES=2,REG_PROD=24,REG_CONS=160,PINGPONG=1,SCHED=2  # [d128]
c128pr=$hb,BLOCK_N=128,RESCALE_LOG2=8,CONSUMER_WGS=2,STAGES=2,REG_PROD=24,REG_CONS=240,PINGPONG=1,SCHED=1 # [d128.mid]
n128c=$hb,BLOCK_N=80,RESCALE_LOG2=8,CONSUMER_WGS=3,STAGES=2,REG_PROD=32,REG_CONS=160,PINGPONG=0,SCHED=2 # [d128.causal]
e128r=$hb,BLOCK_N=128,RESCALE_LOG2=8,CONSUMER_WGS=2,STAGES=3,REG_PROD=24,REG_CONS=240,PINGPONG=1,SCHED=0 # [d128.causal.mid]
step() { echo "== $* ($(date +%T))"; }
for what in "${@:-all}"; do
  case $what in
    tests|all)
      # GPU_TESTS: the files or folders to run (default: all); split them over two calls where the whole
      # suite would outrun one command's 10 minutes
      step "GPU tests ${GPU_TESTS:-tests}"
      timeout 570 python3 -m pytest -q -rs -m gpu ${GPU_TESTS:-tests} 2>&1 | tee "$out/gpu_tests.log" | tail -25 ;;&
    bench|all)
      step "bench_attention (every family's recommended config vs SDPA, same run)"
      timeout 300 python3 scripts/bench_attention.py --output "$out/bench" 2>&1 | tee "$out/bench.log" | tail -40 ;;&
    runtime|all)
      # What a user gets from evotuner.flash_attention (issue: from tuned to used): a search
      # without --space (the family flash_attention runs), a GQA search through the GPU worker,
      # the production extension built from their export, then bench_runtime (host, eager and
      # graph time next to SDPA and the extension) on the standard and GQA shapes.
      rdb="sqlite:////tmp/evotuner-runtime.db"
      step "search without --space at 16,16,2048,64, and a GQA search"
      timeout 150 evotuner search --study rt64 --shape B=16,H=16,S=2048,D=64 --trials 16 --storage "$rdb" \
          2>&1 | tee "$out/search_nospace.log" | tail -16
      timeout 150 evotuner search --study gqa128 --shape B=1,H=32,HKV=8,S=4096,D=128 --trials 16 --storage "$rdb" \
          2>&1 | tee "$out/search_gqa.log" | tail -8
      timeout 60 evotuner export --study rt64 --study gqa128 --output /tmp/rt_tuned.h --storage "$rdb" 2>&1 | tail -3
      step "production extension (hopper) from that header"
      timeout 240 python3 scripts/build_extension.py --header /tmp/rt_tuned.h --output /tmp/hopper_ext --family hopper \
          2>&1 | tail -3
      step "bench_runtime: standard shapes, then GQA shapes"
      timeout 240 python3 scripts/bench_runtime.py --rounds 3 --extension /tmp/hopper_ext --output "$out/bench_runtime" \
          2>&1 | tee "$out/bench_runtime.log"
      timeout 150 python3 scripts/bench_runtime.py --set gqa --rounds 3 --extension /tmp/hopper_ext \
          --output "$out/bench_runtime_gqa" 2>&1 | tee "$out/bench_runtime_gqa.log" ;;&
    shipped)
      # The tuned table the hopper family ships for this GPU model (kernels/hopper/tuned_*.toml):
      # a guided search per standard shape (SHIPPED_TRIALS trials, fp16 and SHIPPED_DTYPES), then
      # scripts/make_tuned_table.py over those studies; the table lands in $out.
      sdb="sqlite:////tmp/evotuner-shipped.db"
      dev=$(python3 -c "import torch; print(torch.cuda.get_device_name())")
      tag=$(python3 -c "import torch; n=torch.cuda.get_device_name().split(); print(next((w for w in n if w[:1] == 'H'), n[-1]).lower())")
      for dt in ${SHIPPED_DTYPES:-fp16}; do
        for spec in "B=16,H=16,S=2048,D=64 -" "B=1,H=8,S=512,D=64 -" "B=4,H=16,S=4096,D=64 --causal" \
                    "B=8,H=16,S=2048,D=128 -" "B=4,H=32,S=4096,D=128 --causal" "B=1,H=32,S=8192,D=128 -"; do
          set -- $spec; c=""; [ "$2" = "-" ] || c=$2
          step "shipped study $1 $dt $c"
          timeout 150 evotuner search --study "ship-$(echo "$1" | tr '=,' '-_')-$dt$c" --shape "$1" --dtype "$dt" $c --family hopper \
              --trials "${SHIPPED_TRIALS:-24}" --no-transfer --storage "$sdb" 2>&1 | grep -E "^study|^tuning" | tail -2
        done
      done
      python3 scripts/make_tuned_table.py --storage "$sdb" --family hopper --device "$dev" --output "$out/tuned_$tag.toml"
      cp /tmp/evotuner-shipped.db "$out/shipped_$tag.db" ;;
    diagnose|all)
      step "search + check + export --require-checked + profile"
      timeout 120 evotuner search --study v64 --shape B=16,H=16,S=2048,D=64 --trials 24 --storage "$db" 2>&1 | tail -4
      timeout 300 evotuner check --study v64 --top 3 --storage "$db" 2>&1 | tee "$out/check.log" | tail -16
      timeout 60 evotuner export --study v64 --output "$out/tuned.h" --require-checked --storage "$db" 2>&1 | tail -6
      timeout 180 evotuner profile --study v64 --top 3 --storage "$db" 2>&1 | tee "$out/profile.log" | tail -20 ;;&
    hcheck|all)
      # Every recommended config of kernels/hopper/defaults.toml (D64 non-causal and causal,
      # the short and mid ones, D128's big and mid entries, causal and not): at evotuner
      # check's small ragged shapes some warpgroups have no rows inside Sq (skip_tile).
      step "compute-sanitizer on the hopper family's recommended configs"
      for spec in "D=64 - $c64" "D=64 --causal $c64" "D=64 - $h64" "D=64 - $m64" "D=128 - $n128" \
                  "D=128 - $c128pr" "D=128 --causal $n128c" "D=128 --causal $e128r"; do
        set -- $spec; c=""; [ "$2" = --causal ] && c=--causal
        echo "-- $1 $c $3" >> "$out/hcheck.log"
        timeout 200 evotuner check --space search_spaces/hopper.toml --config "$3" --shape "$1" $c \
          --tools memcheck,racecheck,synccheck 2>&1 | tee -a "$out/hcheck.log" | tail -4
      done ;;&
    tune)
      # Issue 9/14: finish the hopper sweeps, load them as replayed studies (the transfer
      # sources), then a real 32-trial search of the full hopper space at every standard
      # shape and dtype, each seeded from the studies already in the database.
      step "hopper sweeps (resume)"
      timeout 240 python3 scripts/sweep.py --space search_spaces/hopper_grid.toml --budget-s 0.2 --jobs 14 \
        --stop-after-s 200 \
        --sweep B=4,H=16,S=4096,D=64:fp16:causal:tests/data/sweep_h100_hopper_d64_causal.csv \
        --sweep B=8,H=16,S=2048,D=128:bf16:tests/data/sweep_h100_hopper_d128_bf16.csv > "$out/sweep4.log" 2>&1
      grep -v '^\[' "$out/sweep4.log" | tail -12
      tar czf "$out/sweeps.tgz" tests/data/sweep_h100_hopper_*
      tdb="sqlite:///$out/tuned_h100.db"; grid=search_spaces/hopper_grid.toml
      step "replayed sweep studies (transfer sources)"
      for spec in "sweep_d64 B=16,H=16,S=2048,D=64 fp16 -" "sweep_d128 B=8,H=16,S=2048,D=128 fp16 -" \
                  "sweep_d64c B=4,H=16,S=4096,D=64 fp16 causal" "sweep_d128bf B=8,H=16,S=2048,D=128 bf16 -"; do
        set -- $spec; c=""; [ "$4" = causal ] && c=--causal; f=${1#sweep_}
        csv=tests/data/sweep_h100_hopper_${f/d64c/d64_causal}.csv; csv=${csv/d128bf/d128_bf16}
        [ -f "$csv" ] && [ "$(python3 -c "import json;print(json.load(open('$csv.json'))['complete'])")" = True ] || { echo "skip $1"; continue; }
        timeout 120 evotuner search --study "$1" --shape "$2" --dtype "$3" $c --space $grid --replay "$csv" \
          --trials 128 --no-transfer --storage "$tdb" 2>&1 | tail -1
      done
      step "seeded real searches, 32 trials each"
      t0=$SECONDS
      for dt in fp16 bf16; do for sh in 16,16,2048,64,- 8,16,2048,128,- 4,16,4096,64,causal 4,32,4096,128,causal 1,32,8192,128,- 1,8,512,64,-; do
        IFS=, read b h s d c <<< "$sh"; cf=""; [ "$c" = causal ] && cf=--causal
        [ $((SECONDS - t0)) -gt ${TUNE_BUDGET_S:-300} ] && { echo "out of time: skip $sh $dt"; continue; }
        timeout 90 evotuner search --study "t_${b}_${h}_${s}_${d}_${c}_${dt}" --shape "B=$b,H=$h,S=$s,D=$d" --dtype $dt $cf \
          --space search_spaces/hopper.toml --trials 32 --storage "$tdb" > "$out/search_${b}_${h}_${s}_${d}_${c}_${dt}.log" 2>&1
        echo "rc=$? $sh $dt: $(grep -m1 'seeded from' "$out/search_${b}_${h}_${s}_${d}_${c}_${dt}.log" | cut -c1-150)"
        grep -E '^ *[0-9]+ +[0-9]+ ' "$out/search_${b}_${h}_${s}_${d}_${c}_${dt}.log" | head -2
      done; done
      tar czf "$out/search_logs.tgz" "$out"/search_*.log && rm -f "$out"/search_*.log ;;
    tunebench)
      # Issue 9/14, second half: the bf16 searches "tune" had no time for, then every standard
      # shape's recommended and tuned configs against SDPA in one process (bench_attention
      # --tuned), the one-warpgroup "h64" config at the latency shape, and a cold 64-trial
      # hopper study (bench_tuner). Needs the database "tune" wrote at $TUNED_DB.
      tdb="sqlite:///${TUNED_DB:-out/tuned_h100.db}"
      step "seeded real searches (rest), 32 trials each"
      for sh in 4,32,4096,128,causal 1,32,8192,128,- 1,8,512,64,-; do
        IFS=, read b h s d c <<< "$sh"; cf=""; [ "$c" = causal ] && cf=--causal
        timeout 90 evotuner search --study "t_${b}_${h}_${s}_${d}_${c}_bf16" --shape "B=$b,H=$h,S=$s,D=$d" --dtype bf16 $cf \
          --space search_spaces/hopper.toml --trials 32 --storage "$tdb" > "$out/search_${b}_${h}_${s}_${d}_${c}_bf16.log" 2>&1
        echo "rc=$? $sh bf16: $(grep -m1 'seeded from' "$out/search_${b}_${h}_${s}_${d}_${c}_bf16.log" | cut -c1-150)"
      done
      step "bench_attention: recommended and tuned hopper configs vs SDPA"
      timeout 300 python3 scripts/bench_attention.py --family hopper --tuned "$tdb" --output "$out/bench_tuned" \
        2>&1 | tee "$out/bench_tuned.log" | tail -40
      timeout 60 python3 scripts/bench_attention.py --family hopper --shapes 1,8,512,64,0 \
        --config "$h64" \
        --output "$out/bench_h64" 2>&1 | tee "$out/bench_h64.log" | tail -6
      step "bench_tuner: cold and warm 64-trial hopper studies"
      timeout 280 python3 scripts/bench_tuner.py --space search_spaces/hopper.toml --trials 64 \
        --output "$out/bench_tuner_hopper.json" 2>&1 | tee "$out/bench_tuner_hopper.log" | tail -30
      cp "${TUNED_DB:-out/tuned_h100.db}" "$out/tuned_h100_after.db"
      tar czf "$out/search_logs2.tgz" "$out"/search_*.log && rm -f "$out"/search_*.log ;;
    rows)
      # Where one consumer warpgroup ("h64", defaults.toml [d64.short]) stops beating the
      # big-tile D64 configs (c64r: SCHED 0, c64dr: SCHED 2) as the query rows B*H*Sq grow:
      # all three, same run.
      step "h64 vs c64r vs c64dr by query rows (D64 non-causal)"
      timeout 240 python3 scripts/bench_attention.py --family hopper --dtypes fp16 --rounds 3 \
        --config "$c64r" --config "$c64dr" --config "$h64" --shapes 1,8,512,64,0 --shapes 1,8,1024,64,0 --shapes 1,16,1024,64,0 \
        --shapes 2,16,1024,64,0 --shapes 1,8,4096,64,0 --shapes 4,16,1024,64,0 --shapes 8,16,1024,64,0 --shapes 16,16,2048,64,0 \
        --output "$out/rows" 2>&1 | tee "$out/rows.log" | tail -24 ;;&
    tune128)
      # Issue 9: a 128-trial search (the issue's bound; TUNE_TRIALS lowers it) with the hopper
      # family's default sampler (guided) at the shapes still below 1.05x cuDNN, most important
      # first (TUNE_RUNS overrides: "B,H,S,D,causal|-,dtype ..."), each seeded from the studies
      # in the database, inside TUNE_BUDGET_S; resumable (a rerun continues the studies).
      # Studies are named ${TUNE_PREFIX:-m}_B_H_S_D_causal_dtype.
      tdb="sqlite:///${TUNED_DB:-out/tuned_h100.db}"
      step "${TUNE_TRIALS:-128}-trial searches of the whole hopper space"
      t0=$SECONDS
      for run in ${TUNE_RUNS:-8,16,2048,128,-,fp16 16,16,2048,64,-,fp16 4,16,4096,64,causal,fp16 \
                 8,16,2048,128,-,bf16 16,16,2048,64,-,bf16 4,16,4096,64,causal,bf16}; do
        IFS=, read b h s d c dt <<< "$run"; cf=""; [ "$c" = causal ] && cf=--causal
        st="${TUNE_PREFIX:-m}_${b}_${h}_${s}_${d}_${c}_${dt}"
        left=$(( ${TUNE_BUDGET_S:-420} - (SECONDS - t0) ))
        [ $left -lt 40 ] && { echo "out of time: $st stays where it is"; continue; }
        timeout $left evotuner search --study "$st" --shape "B=$b,H=$h,S=$s,D=$d" --dtype $dt $cf \
          --space search_spaces/hopper.toml --trials ${TUNE_TRIALS:-128} --storage "$tdb" > "$out/search128_$st.log" 2>&1
        echo "rc=$? $st ($((SECONDS - t0)) s): $(grep -m1 'seeded from' "$out/search128_$st.log" | cut -c1-120)"
        grep -E '^ *[0-9]+ +[0-9]+ ' "$out/search128_$st.log" | head -3
      done
      cp "${TUNED_DB:-out/tuned_h100.db}" "$out/tuned_h100.db"
      tar czf "$out/search128_logs_${TUNE_PREFIX:-m}.tgz" "$out"/search128_*.log && rm -f "$out"/search128_*.log ;;
    transfer)
      # Issue 14: real searches at shapes no study in the database has, seeded (transfer) and
      # cold (--no-transfer), each on its own copy of the 2026-11-24 database (TRANSFER_DB), then
      # bench_attention with each copy: recommended config, the study's best and SDPA in one run.
      # TRANSFER_RUNS: "B,H,S,D,causal|- ..."; TRANSFER_MODES: "seeded cold" or either.
      # TRANSFER_REPLAY: "study,B,H,S,D,causal|-,sweep ..." first adds to the database (before
      # the copies) a 64-trial default study of hopper_grid replaying
      # tests/data/sweep_h100_hopper_<sweep>.csv (what a user who tuned that shape has; no GPU needed).
      cp "${TRANSFER_DB:-docs/measurements/hopper_tuning/guided_h100_1124.db}" /tmp/transfer_src.db
      for rep in ${TRANSFER_REPLAY:-}; do
        IFS=, read st b h s d c f <<< "$rep"; cf=""; [ "$c" = causal ] && cf=--causal
        timeout 120 evotuner search --study "$st" --shape "B=$b,H=$h,S=$s,D=$d" $cf --space search_spaces/hopper_grid.toml \
          --replay "tests/data/sweep_h100_hopper_$f.csv" --trials 64 --no-transfer --storage "sqlite:////tmp/transfer_src.db" \
          > /dev/null 2>&1; echo "rc=$? replayed study $st ($f)"
      done
      runs=${TRANSFER_RUNS:-1,16,4096,128,- 2,16,8192,64,causal}; shapes=""
      for sh in $runs; do
        IFS=, read b h s d c <<< "$sh"; shapes="$shapes --shapes $b,$h,$s,$d,$([ "$c" = causal ] && echo 1 || echo 0)"; done
      for mode in ${TRANSFER_MODES:-seeded cold}; do
        cp /tmp/transfer_src.db "/tmp/transfer_$mode.db"; flag=""; [ $mode = cold ] && flag=--no-transfer
        for sh in $runs; do
          IFS=, read b h s d c <<< "$sh"; cf=""; [ "$c" = causal ] && cf=--causal
          st="x_${b}_${h}_${s}_${d}_${c}"; log="$out/transfer_${mode}_$st.log"
          step "$mode search $st"
          timeout 150 evotuner search --study "$st" --shape "B=$b,H=$h,S=$s,D=$d" $cf --space search_spaces/hopper.toml \
            --trials ${TRANSFER_TRIALS:-32} --storage "sqlite:////tmp/transfer_$mode.db" $flag > "$log" 2>&1
          echo "rc=$? $(grep -m1 'seeded from' "$log" | cut -c1-200)"
          grep -E '^ *[0-9]+ +[0-9]+ ' "$log" | head -3
        done
        timeout 200 python3 scripts/bench_attention.py --family hopper --tuned "sqlite:////tmp/transfer_$mode.db" \
          $shapes --dtypes fp16 --rounds 3 --output "$out/bench_transfer_$mode" 2>&1 | tail -12
        cp "/tmp/transfer_$mode.db" "$out/transfer_$mode.db"
      done
      tar czf "$out/transfer_logs.tgz" "$out"/transfer_*_x_*.log "$out"/bench_transfer_* && \
        rm -f "$out"/transfer_*_x_*.log "$out"/bench_transfer_* ;;
    gpus)
      # One study on one GPU, then on all of the host's GPUs, then 1 vs 2 (issues 30 and 28): cold, the user's
      # command; needs a host of several GPUs (not in `all`). GPUS_TRIALS trials (default 256) for the first pair.
      step "bench_gpus: ${GPUS_TRIALS:-256} trials on one GPU, then --gpus all"
      timeout 420 python3 scripts/bench_gpus.py --trials "${GPUS_TRIALS:-256}" --causal --runs none,all \
        --run-timeout 300 --workdir /tmp/evotuner-gpus-all -o "$out/bench_gpus_all.json" 2>&1 | tee "$out/bench_gpus_all.log" | tail -50
      step "bench_gpus: 64 trials on one GPU, then --gpus 0,1"
      timeout 170 python3 scripts/bench_gpus.py --trials 64 --causal --runs none,0+1 \
        --run-timeout 100 --workdir /tmp/evotuner-gpus-two -o "$out/bench_gpus_two.json" 2>&1 | tee "$out/bench_gpus_two.log" | tail -50 ;;
    throughput)
      # A cold 64-trial hopper study with racing (the default), then with --full-timing (issue 28): wall, time to
      # the first measurement and each one's best, from the user's command.
      for mode in racing full; do
        extra=""; [ "$mode" = full ] && extra="--full-timing"
        step "bench_gpus: a cold 64-trial study, $mode"
        timeout 200 python3 scripts/bench_gpus.py --trials 64 --causal --runs none --extra="$extra" --run-timeout 180 \
          --workdir "/tmp/evotuner-throughput-$mode" -o "$out/throughput_$mode.json" 2>&1 | tee "$out/throughput_$mode.log" | tail -25
      done ;;
    paired)
      # Paired racing (issue 28, the default of `evotuner search` since 2026-11-26): the worker's GPU tests, then on
      # one machine cold 64-trial hopper studies, paired on one GPU and (with two GPUs visible) --gpus 0,1, and with
      # --full-timing, and every study's best re-timed in one process beside SDPA (bench_attention --tuned, 9 rounds):
      # the wall times, the speed-up of two GPUs, and whether paired racing keeps the full-timing study's best.
      step "GPU tests: racing and paired racing in the real worker"
      timeout 150 python3 -m pytest -q -rs -m gpu tests/gpu/test_measure.py 2>&1 | tee "$out/paired_tests.log" | tail -3
      ngpu=$(python3 -c "import torch; print(torch.cuda.device_count())")
      runs=none; [ "$ngpu" -ge 2 ] && runs=none,0+1
      rm -rf /tmp/evotuner-paired /tmp/evotuner-full
      step "bench_gpus: cold 64-trial studies, paired racing ($runs)"
      timeout 200 python3 scripts/bench_gpus.py --trials 64 --causal --runs $runs --run-timeout 100 \
        --workdir /tmp/evotuner-paired -o "$out/paired.json" 2>&1 | tee "$out/paired.log" | grep -E "^[0-9]-|wall_s|to_first|best_us|stopped|speedup_wall|exact"
      step "bench_gpus: a cold 64-trial study, full timing"
      timeout 150 python3 scripts/bench_gpus.py --trials 64 --causal --runs none --extra=--full-timing --run-timeout 100 \
        --workdir /tmp/evotuner-full -o "$out/full.json" 2>&1 | tee "$out/full.log" | grep -E "wall_s|to_first|best_us|exact"
      step "each study's best re-timed in one process"
      tuned=$(for db in /tmp/evotuner-paired/*/study.db /tmp/evotuner-full/*/study.db; do printf -- " --tuned sqlite:///%s" "$db"; done)
      timeout 200 python3 scripts/bench_attention.py --family hopper --shapes 4,32,4096,128,1 --dtypes fp16 --rounds 9 \
        $tuned --output "$out/paired_rebest" 2>&1 | tee "$out/paired_rebest.log" | tail -8 ;;
    kernels)
      # The kernel changes of 2026-11-26 (issue 25): two CTAs per SM (CTAS_PER_SM=2) under every scheduler and the
      # split-KV combine that loads 8 splits' partials at once: their GPU tests, compute-sanitizer on each, then the
      # decode grid (the combine's cost: many splits over packed rows) and CTAS_PER_SM=2 beside the recommended
      # configs at the mid-size shapes, same run.
      step "GPU tests: two CTAs per SM, split-KV, launch description (extension rows)"
      timeout 300 python3 -m pytest -q -rs -m gpu tests/gpu/test_hopper_attention.py::test_two_ctas_per_sm \
        tests/gpu/test_split_kv.py tests/test_export.py 2>&1 | tee "$out/kernels_tests.log" | tail -8
      for tool in memcheck racecheck synccheck; do
        step "compute-sanitizer $tool: split and ctas cases"
        timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 python3 scripts/sanitize_paths.py --only split \
          2>&1 | tail -3 | tee -a "$out/kernels_sanitize.log"
        timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 python3 scripts/sanitize_paths.py --only ctas \
          2>&1 | tail -3 | tee -a "$out/kernels_sanitize.log"
      done
      step "bench_decode: the new combine (1 and 2 warpgroups, every split count)"
      timeout 240 python3 scripts/bench_decode.py --rounds 2 --sk 4096,131072 --sq 1,16 --bases 1wg-n128-s2,2wg-n128-s2 \
        --output "$out/decode_combine" 2>&1 | tee "$out/decode_combine.log" | tail -20
      step "CTAS_PER_SM=2 beside the recommended configs at mid-size shapes"
      two=OVERLAP=1,EXP_EMU=0,CONSUMER_WGS=1,REG_PROD=24,REG_CONS=232,PINGPONG=0,RESCALE_LOG2=0,CTAS_PER_SM=2
      timeout 240 python3 scripts/bench_attention.py --family hopper --dtypes fp16 --rounds 3 \
        --config "$two,BLOCK_N=64,STAGES=2,SCHED=0" --config "$two,BLOCK_N=64,STAGES=2,SCHED=2" \
        --config "$two,BLOCK_N=128,STAGES=2,SCHED=0" \
        --shapes 2,16,1024,64,0 --shapes 4,16,1024,64,1 --shapes 1,16,2048,128,0 --shapes 2,16,2048,128,1 \
        --shapes 1,8,1024,128,0 --shapes 1,16,1024,64,1 --output "$out/ctas" 2>&1 | tee "$out/ctas.log" | tail -30 ;;
    midsize)
      # Issue 25's mid-size bar: a <= 64-trial search (hopper.toml, the default sampler) at six shapes of 8k-64k query
      # rows, D 64 and 128, causal and not (MIDSIZE_RUNS "B,H,S,D,causal|- ..."), then bench_attention --tuned: each
      # study's best beside the recommended config it started from and SDPA, same run (graph-timed).
      mdb="sqlite:////tmp/evotuner-midsize.db"; shapes=""
      for sh in ${MIDSIZE_RUNS:-2,16,1024,64,- 4,16,1024,64,causal 1,16,2048,128,- 2,16,2048,128,causal \
                 1,8,1024,128,- 1,16,1024,64,causal}; do
        IFS=, read b h s d c <<< "$sh"; cf=""; [ "$c" = causal ] && cf=--causal
        shapes="$shapes --shapes $b,$h,$s,$d,$([ "$c" = causal ] && echo 1 || echo 0)"
        step "64-trial search $sh"
        timeout 110 evotuner search --study "mid_${b}_${h}_${s}_${d}_${c}" --shape "B=$b,H=$h,S=$s,D=$d" $cf \
          --trials ${MIDSIZE_TRIALS:-64} --storage "$mdb" > "$out/midsize_${b}_${h}_${s}_${d}_${c}.log" 2>&1
        echo "rc=$? $(grep -E '^(study|tuning|best)' "$out/midsize_${b}_${h}_${s}_${d}_${c}.log" | tail -2 | tr '\n' ' ' | cut -c1-220)"
      done
      step "bench_attention --tuned: recommended, the searches' best, SDPA"
      timeout 240 python3 scripts/bench_attention.py --family hopper --tuned "$mdb" $shapes --dtypes fp16 --rounds 3 \
        --output "$out/midsize_bench" 2>&1 | tee "$out/midsize_bench.log" | tail -30
      cp /tmp/evotuner-midsize.db "$out/midsize.db"
      tar czf "$out/midsize_logs.tgz" "$out"/midsize_*_*.log && rm -f "$out"/midsize_*_*.log ;;
    decode)
      # Issue 25's decoding bar: a <= 64-trial search per decode shape (DECODE_RUNS "B,H,HKV,SQ,SK ...", D=128; the
      # hopper_split space is picked for them), then bench_decode --tuned --bases none: each study's best beside the
      # recommended config and the fastest SDPA backend, same run (graph-timed).
      ddb="sqlite:////tmp/evotuner-decode.db"; t0=$SECONDS
      for sh in ${DECODE_RUNS:-1,32,32,1,4096 1,32,4,1,4096 1,32,32,1,131072 1,32,4,1,131072 16,32,32,16,4096 \
                 16,32,4,16,4096 16,32,32,1,32768 16,32,4,4,32768 1,32,4,16,131072 16,32,32,4,131072}; do
        IFS=, read b h hkv sq sk <<< "$sh"
        [ $((SECONDS - t0)) -gt ${DECODE_BUDGET_S:-420} ] && { echo "out of time: skip $sh"; continue; }
        step "64-trial search $sh"
        timeout 100 evotuner search --study "dec_${b}_${h}_${hkv}_${sq}_${sk}" \
          --shape "B=$b,H=$h,HKV=$hkv,SQ=$sq,SK=$sk,D=128" --trials ${DECODE_TRIALS:-64} --storage "$ddb" \
          > "$out/decode_$sh.log" 2>&1
        echo "rc=$? $(grep -E '^(study|tuning|best)' "$out/decode_$sh.log" | tail -2 | tr '\n' ' ' | cut -c1-220)"
      done
      step "bench_decode --tuned: the searches' best vs the recommended config and the fastest SDPA backend"
      timeout 300 python3 scripts/bench_decode.py --tuned "$ddb" --bases none --rounds 3 --sq 1,4,16 \
        --sk 4096,32768,131072 --batch 1,16 --output "$out/decode_tuned" 2>&1 | tee "$out/decode_tuned.log" | tail -40
      cp /tmp/evotuner-decode.db "$out/decode.db"
      tar czf "$out/decode_logs.tgz" "$out"/decode_*,*.log && rm -f "$out"/decode_*,*.log ;;
    cluster)
      # CTA pairs sharing K/V loads (CLUSTER=2): the GPU tests (bit-equal to CLUSTER=1 and right on
      # fresh inputs), compute-sanitizer on the pairs, then the pair against the same config unpaired
      # and SDPA at non-causal shapes (issue 24's GQA ones first), same run (CUDA-event timing of the
      # kernel module's launch, L2 flushed, 5 rounds)
      step "CLUSTER=2 GPU tests"
      timeout 570 python3 -m pytest -q -rs -m gpu tests/gpu/test_hopper_cluster.py 2>&1 | tee "$out/cluster_tests.log" | tail -8
      for tool in memcheck racecheck synccheck; do
        step "compute-sanitizer --tool $tool on the CTA pairs"
        # racecheck watches hopper_fwd alone: cuBLAS's nvjet GEMM of the fp32 reference reports a
        # shared-memory hazard of its own (320 at these shapes, 2026-11-27)
        only=""; [ $tool = racecheck ] && only="--kernel-name kns=hopper_fwd"
        timeout 300 compute-sanitizer --tool $tool $only --error-exitcode 9 python3 scripts/sanitize_paths.py --only cluster \
          > "$out/cluster_sanitize_$tool.log" 2>&1; echo "rc=$? $(grep -c ok "$out/cluster_sanitize_$tool.log") ok"
        tail -3 "$out/cluster_sanitize_$tool.log"
      done
      step "bench_attention: SCHED 0/1 with and without CLUSTER=2 (recommended tiles otherwise)"
      timeout 480 python3 scripts/bench_attention.py --family hopper --dtypes fp16 --rounds 5 \
        --config SCHED=1,CLUSTER=1 --config SCHED=1,CLUSTER=2 --config SCHED=0,CLUSTER=1 --config SCHED=0,CLUSTER=2 \
        --shapes 1,32,4096,128,0,8 --shapes 4,64,2048,128,0,8 --shapes 8,32,1024,128,0,4 --shapes 8,16,2048,128,0 \
        --shapes 1,32,8192,128,0 --shapes 4,16,2048,256,0 --shapes 16,16,2048,64,0 \
        --output "$out/bench_cluster" 2>&1 | tee "$out/bench_cluster.log" | tail -40 ;;
    workers|all)
      step "two search processes on one study (exact budget, nothing measured twice)"
      timeout 240 python3 scripts/two_workers.py --trials 24 --gpus 0 --workdir /tmp/evotuner-two 2>&1 | tee "$out/two_workers.log" | tail -12 ;;
  esac
done
