#!/bin/bash
# compute-sanitizer (memcheck, racecheck, synccheck) on small ragged shapes for the given variants.
# Usage (GPU machine, repo root): bash scripts/hopper_dev/sanitize.sh c64pr c128pr
out=${OUT:-out_hopper_dev}; mkdir -p $out
for v in "$@"; do
  for tool in memcheck racecheck synccheck; do
    timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 python3 scripts/hopper_dev/driver.py --one $v --small --no-time --dtypes 0 \
      > $out/san_${v}_$tool.log 2>&1
    rc=$?
    echo "sanitize $v $tool rc=$rc $(grep -c '"ok": true' $out/san_${v}_$tool.log) checks ok, $(grep -o 'ERROR SUMMARY: [0-9]* error' $out/san_${v}_$tool.log | tail -1)"
  done
done
