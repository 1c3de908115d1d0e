#!/bin/bash
# Build one config: build.sh NAME "D=128 CAUSAL=0 DTYPE=0 BN=128 WGS=2 ST=2 RP=24 RC=240 OV=1 PP=1"
# -> scripts/hopper_dev/bin/NAME.cubin and NAME.ptxas (ptxas -v report). Run from the repo root.
set -e
name=$1; shift
eval "$1"
mkdir -p scripts/hopper_dev/bin scripts/hopper_dev/gen
src=scripts/hopper_dev/gen/$name.cu
cat > $src <<EOC
#define HOPPER_HEAD_DIM $D
#define HOPPER_IS_CAUSAL $CAUSAL
#define HOPPER_DTYPE $DTYPE
#define HOPPER_BLOCK_N $BN
#define HOPPER_CONSUMER_WGS $WGS
#define HOPPER_STAGES $ST
#define HOPPER_REG_PROD $RP
#define HOPPER_REG_CONS $RC
#define HOPPER_OVERLAP $OV
#define HOPPER_PINGPONG $PP
#define HOPPER_SCHED ${SC:-0}
#define HOPPER_RESCALE_LOG2 ${RS:-0}
#include "hopper/instantiate.cuh"
EOC
nvcc -cubin -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -Xptxas -v -I kernels $EXTRA \
  -o scripts/hopper_dev/bin/$name.cubin $src > scripts/hopper_dev/bin/$name.ptxas 2>&1 || { cat scripts/hopper_dev/bin/$name.ptxas; exit 1; }
echo "$name: $(grep -o 'C75[0-9]*' scripts/hopper_dev/bin/$name.ptxas | sort -u | tr '\n' ' ')$(grep -o '[0-9]* bytes stack frame, [0-9]* bytes spill stores' scripts/hopper_dev/bin/$name.ptxas)"
