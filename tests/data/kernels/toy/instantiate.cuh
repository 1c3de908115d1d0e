// A toy kernel family for the build stage's tests: it honours the FlashCore
// instantiation contract (FLASHCORE_* macros in; an `extern "C"` entry
// `flashcore_fwd(const __grid_constant__ flashcore::Params)` and the
// `flashcore_meta` table out) but its body is a few instructions, so one
// compile takes about a second instead of the real kernel's tens of seconds.
#pragma once

#include "flashcore/params.h"
#include "toy/traits.cuh"

#ifndef FLASHCORE_KERNEL_NAME
#define FLASHCORE_KERNEL_NAME flashcore_fwd
#endif
#ifndef FLASHCORE_META_NAME
#define FLASHCORE_META_NAME flashcore_meta
#endif

using ToyInst = toy::Traits<FLASHCORE_HEAD_DIM, FLASHCORE_IS_CAUSAL, FLASHCORE_DTYPE, FLASHCORE_BLOCK_M,
                            FLASHCORE_BLOCK_N, FLASHCORE_NUM_WARPS, FLASHCORE_STAGES, FLASHCORE_MIN_BLOCKS>;

extern "C" __constant__ int32_t FLASHCORE_META_NAME[FLASHCORE_META_LEN] = {
    FLASHCORE_ABI_VERSION,  // FLASHCORE_META_ABI
    ToyInst::kThreads,      // FLASHCORE_META_THREADS
    ToyInst::kSmemBytes,    // FLASHCORE_META_SMEM_BYTES
    ToyInst::kHeadDim,      // FLASHCORE_META_HEAD_DIM
    ToyInst::kIsCausal,     // FLASHCORE_META_IS_CAUSAL
    ToyInst::kDtype,        // FLASHCORE_META_DTYPE
    ToyInst::kMinBlocks,    // FLASHCORE_META_MIN_BLOCKS
    ToyInst::kBlockM,       // FLASHCORE_META_BLOCK_M
    ToyInst::kBlockN,       // FLASHCORE_META_BLOCK_N
};

// Copies one element of Q to O per thread: enough for ptxas to report
// registers, shared memory and the launch bounds, nothing more.
extern "C" __global__ void __launch_bounds__(ToyInst::kThreads, ToyInst::kMinBlocks)
FLASHCORE_KERNEL_NAME(const __grid_constant__ flashcore::Params p) {
    extern __shared__ unsigned char smem[];
    const int row = blockIdx.x * ToyInst::kBlockM + threadIdx.x % ToyInst::kBlockM;
    if (row >= p.seqlen_q) return;
    const unsigned char* q = static_cast<const unsigned char*>(p.q) + blockIdx.z * p.q_batch_stride * 2 +
                             blockIdx.y * p.q_head_stride * 2 + row * p.q_row_stride * 2;
    smem[threadIdx.x] = q[0];
    __syncthreads();
    unsigned char* o = static_cast<unsigned char*>(p.o) + blockIdx.z * p.o_batch_stride * 2 +
                       blockIdx.y * p.o_head_stride * 2 + row * p.o_row_stride * 2;
    o[0] = smem[(threadIdx.x + 1) % ToyInst::kThreads];
}
