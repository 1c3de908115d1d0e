#!/usr/bin/env bash
# A/B a change of one file of kernels/hopper/ (KERNEL_FILE, default kernel.cuh; the kernel is
# split by role: producer.cuh, consumer.cuh, softmax.cuh, epilogue.cuh, tile_scheduler.cuh,
# smem.cuh) on the GPU machine: scripts/bench_attention.py
# alternately with the working tree's kernel ("new") and a saved copy ("old"), REPS times
# each (new, old, new, old, ...), every bench its own process with SDPA timed beside it, so
# each ratio is a same-run ratio; the kernel file is restored on exit.
#   bash scripts/hopper_dev/ab_kernel.sh OLD_KERNEL_CUH OUTDIR REPS [bench_attention args...]
# e.g. git show HEAD~1:kernels/hopper/softmax.cuh > scripts/hopper_dev/kernel_old.cuh, then on
# the device: KERNEL_FILE=kernels/hopper/softmax.cuh \
#   bash scripts/hopper_dev/ab_kernel.sh scripts/hopper_dev/kernel_old.cuh $OUT/ab 2 \
#   --family hopper --rounds 3 --shapes 4,16,4096,64,1
set -euo pipefail
old=$1; out=$2; reps=$3; shift 3
kernel=${KERNEL_FILE:-kernels/hopper/kernel.cuh}
saved=$(mktemp); cp "$kernel" "$saved"
trap 'cp "$saved" "$kernel"; rm -f "$saved"' EXIT
mkdir -p "$out"
for ((r = 0; r < reps; r++)); do
  for which in new old; do
    if [ "$which" = old ]; then cp "$old" "$kernel"; else cp "$saved" "$kernel"; fi
    timeout 300 python3 scripts/bench_attention.py "$@" --output "$out/${which}_$r" > "$out/${which}_$r.log" 2>&1 \
      || echo "bench $which $r: exit $?"
    echo "== $which $r"; grep -E "^B=" "$out/${which}_$r.log" | awk '{print $1, $2, $3, $4, $5, $6}' | sort -u
  done
done
