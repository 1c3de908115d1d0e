# session m call 4: TILE_OVERLAP variants (1: shuffled Q address, 2: tile loop unrolled by the Q buffer)
set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$SECONDS
CO=$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -1)
echo "cuobjdump: $CO"
if [ -n "$CO" ]; then
  for c in .device/m/cubins/*.cubin; do
    $CO -sass $c > /tmp/$(basename $c).sass 2>/dev/null
    echo "$(basename $c): $(grep -c HGMMA /tmp/$(basename $c).sass) HGMMA, $(grep -c R2UR /tmp/$(basename $c).sass) R2UR, $(grep -c 'STL\|LDL' /tmp/$(basename $c).sass) local, $(grep -cE '^\s+/\*[0-9a-f]{4}\*/' /tmp/$(basename $c).sass) instrs"
  done
  tar czf $OUT/sass.tgz -C /tmp $(cd /tmp && ls *.sass)
fi
B="python3 scripts/bench_attention.py --family hopper --dtypes fp16 --rounds 5"
P=PACK_GQA=1; W=BLOCK_N=128,CONSUMER_WGS=2,REG_CONS=240
for sh in 8,32,1024,128,0,4 4,64,2048,128,0,8; do
  timeout 130 $B --config $P --config $P,TILE_OVERLAP=1 --config $P,TILE_OVERLAP=2 --config $P,$W --config $P,$W,TILE_OVERLAP=1 --config $P,$W,TILE_OVERLAP=2 \
    --shapes $sh --output $OUT/a4_${sh//,/_} 2>&1 | tail -8
done
timeout 100 $B --config SCHED=2 --config TILE_OVERLAP=1 --config TILE_OVERLAP=2 --shapes 8,16,2048,128,0 --output $OUT/a4_mha 2>&1 | tail -5
echo "total wall $((SECONDS - t0)) s"
