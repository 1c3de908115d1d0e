// Toy traits: the same parameters as FlashCore's, checked with static_asserts
// whose messages the build tests look for in BuildResult.error.
#pragma once

#include <stdint.h>

#if !defined(FLASHCORE_HEAD_DIM) || !defined(FLASHCORE_IS_CAUSAL) || !defined(FLASHCORE_DTYPE)
#error "toy: FLASHCORE_HEAD_DIM, FLASHCORE_IS_CAUSAL and FLASHCORE_DTYPE must be defined"
#endif
#if !defined(FLASHCORE_BLOCK_M) || !defined(FLASHCORE_BLOCK_N) || !defined(FLASHCORE_NUM_WARPS) || \
    !defined(FLASHCORE_STAGES) || !defined(FLASHCORE_MIN_BLOCKS)
#error "toy: FLASHCORE_BLOCK_M, _BLOCK_N, _NUM_WARPS, _STAGES and _MIN_BLOCKS must be defined"
#endif

namespace toy {

template <int HeadDim, int IsCausal, int Dtype, int BlockM, int BlockN, int NumWarps, int Stages, int MinBlocks>
struct Traits {
    static_assert(HeadDim == 32 || HeadDim == 64 || HeadDim == 96 || HeadDim == 128 || HeadDim == 256,
                  "toy: HEAD_DIM must be one of 32, 64, 96, 128, 256");
    static_assert(Dtype == 0 || Dtype == 1, "toy: DTYPE must be 0 (fp16) or 1 (bf16)");
    static_assert(BlockM % 16 == 0 && BlockM > 0, "toy: BLOCK_M must be a positive multiple of 16");
    static_assert(BlockN % 16 == 0 && BlockN > 0, "toy: BLOCK_N must be a positive multiple of 16");
    static_assert(NumWarps >= 1 && NumWarps <= 16, "toy: NUM_WARPS must be in 1..16");
    static_assert(Stages >= 1, "toy: STAGES must be at least 1");
    static_assert(MinBlocks >= 1, "toy: MIN_BLOCKS must be at least 1");

    static constexpr int kHeadDim = HeadDim;
    static constexpr int kIsCausal = IsCausal;
    static constexpr int kDtype = Dtype;
    static constexpr int kBlockM = BlockM;
    static constexpr int kBlockN = BlockN;
    static constexpr int kMinBlocks = MinBlocks;
    static constexpr int kThreads = NumWarps * 32;
    // Q tile once, K and V tiles per stage, 2-byte elements (FlashCore's layout).
    static constexpr int kSmemBytes = (BlockM + 2 * Stages * BlockN) * HeadDim * 2;
};

}  // namespace toy
