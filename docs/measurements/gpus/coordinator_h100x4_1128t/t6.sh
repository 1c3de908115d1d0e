#!/usr/bin/env bash
# session t: the same study run by 4 search processes, one GPU each (vs --gpus all's threads)
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out"
timeout 450 python3 .device/t/procs.py 4 256 /tmp/t6procs > "$out/t6_procs.json" 2> "$out/t6_procs.err"
echo "rc=$?"; cat "$out/t6_procs.json" | cut -c1-2500; tail -5 "$out/t6_procs.err"
cp /tmp/t6procs/search*.log "$out/" 2>/dev/null; cp /tmp/t6procs/study.db "$out/t6_procs.db"
