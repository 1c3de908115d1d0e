// FlashCore forward: every compile-time knob in one traits template.
//
// A config that cannot work dies here, in the compiler front end, with a
// static_assert naming the knob (the build stage records the message as the
// build error), never at launch time.
#pragma once

#include <stdint.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace flashcore {

template <typename Element> struct ElementInfo;
template <> struct ElementInfo<__half> { static constexpr int kDtype = 0; };         // FLASHCORE_DTYPE 0
template <> struct ElementInfo<__nv_bfloat16> { static constexpr int kDtype = 1; };  // FLASHCORE_DTYPE 1

template <int HEAD_DIM_, int BLOCK_M_, int BLOCK_N_, int NUM_WARPS_, int STAGES_, int MIN_BLOCKS_,
          bool IS_CAUSAL_, typename Element_, int Q_IN_REGS_ = -1>
struct Traits {
    using Element = Element_;
    static constexpr int kHeadDim = HEAD_DIM_;
    static constexpr int kBlockM = BLOCK_M_;
    static constexpr int kBlockN = BLOCK_N_;
    static constexpr int kNumWarps = NUM_WARPS_;
    static constexpr int kStages = STAGES_;
    static constexpr int kMinBlocks = MIN_BLOCKS_;
    static constexpr bool kIsCausal = IS_CAUSAL_;
    static constexpr int kDtype = ElementInfo<Element>::kDtype;

    static constexpr int kThreads = kNumWarps * 32;
    // Each warp owns kRowsPerWarp query rows, as kMTiles m16 tiles.
    static constexpr int kRowsPerWarp = kBlockM / kNumWarps;
    static constexpr int kMTiles = kRowsPerWarp / 16;
    // S = Q K^T per m16 tile: kNTilesS n8 tiles, kKStepsQK k16 steps over the head dim.
    static constexpr int kNTilesS = kBlockN / 8;
    static constexpr int kKStepsQK = kHeadDim / 16;
    // O += P V per m16 tile: kNTilesO n8 tiles over the head dim, kKStepsPV k16 steps over keys.
    static constexpr int kNTilesO = kHeadDim / 8;
    static constexpr int kKStepsPV = kBlockN / 16;
    // fp32 accumulator registers per thread (documentation; ptxas reports the truth).
    static constexpr int kAccRegs = kMTiles * (kNTilesS + kNTilesO) * 4;
    // Q's A fragments: kQRegs registers if kept for the whole kernel. Re-reading them
    // from shared memory costs one ldmatrix.x4 per m-tile and k-step per key block,
    // up to a third of the shared-memory traffic (see README); keeping them costs
    // registers. Q_IN_REGS = -1 (auto) keeps them when accumulators + Q fit in 160.
    static constexpr int kQRegs = kMTiles * kKStepsQK * 4;
    static constexpr bool kQInRegs = Q_IN_REGS_ < 0 ? (kAccRegs + kQRegs <= 160) : (Q_IN_REGS_ != 0);

    // Shared memory: one Q tile, kStages K tiles, kStages V tiles, rows of kHeadDim
    // elements, no padding (XOR swizzle instead). The output is staged through the
    // Q tile. The search space prunes with the same formula:
    //   kSmemBytes = (BLOCK_M + 2*STAGES*BLOCK_N) * HEAD_DIM * sizeof(Element)
    static constexpr int kTileQElems = kBlockM * kHeadDim;
    static constexpr int kTileKVElems = kBlockN * kHeadDim;
    static constexpr int kSmemBytes =
        (kBlockM + 2 * kStages * kBlockN) * kHeadDim * static_cast<int>(sizeof(Element));

    // 16-byte chunks (8 elements) per row, and the cp.async work per thread.
    static constexpr int kChunksPerRow = kHeadDim / 8;
    static constexpr int kChunksQ = kBlockM * kChunksPerRow;
    static constexpr int kChunksKV = kBlockN * kChunksPerRow;
    static constexpr int kLoadItersQ = (kChunksQ + kThreads - 1) / kThreads;
    static constexpr int kLoadItersKV = (kChunksKV + kThreads - 1) / kThreads;

    static_assert(sizeof(Element) == 2, "Element must be a 16-bit type (__half or __nv_bfloat16)");
    static_assert(kHeadDim == 32 || kHeadDim == 64 || kHeadDim == 96 || kHeadDim == 128 || kHeadDim == 256,
                  "HEAD_DIM must be one of 32, 64, 96, 128, 256");
    static_assert(kNumWarps >= 1 && kNumWarps <= 16, "NUM_WARPS must be in 1..16");
    static_assert(kThreads <= 1024, "THREADS = 32*NUM_WARPS must be <= 1024");
    static_assert(kBlockM % (16 * kNumWarps) == 0,
                  "BLOCK_M must be a multiple of 16*NUM_WARPS (each warp owns whole m16 tiles)");
    static_assert(kMTiles >= 1 && kMTiles <= 4, "BLOCK_M/NUM_WARPS must be 16, 32, 48 or 64 rows per warp");
    static_assert(kBlockN % 16 == 0 && kBlockN >= 16 && kBlockN <= 256,
                  "BLOCK_N must be a multiple of 16 in 16..256");
    static_assert(kStages >= 1 && kStages <= 4, "STAGES must be in 1..4 (1 = no prefetch)");
    static_assert(Q_IN_REGS_ >= -1 && Q_IN_REGS_ <= 1, "Q_IN_REGS must be -1 (auto), 0 or 1");
    static_assert(kMinBlocks >= 1 && kMinBlocks <= 32, "MIN_BLOCKS must be in 1..32");
    static_assert(kSmemBytes <= 227 * 1024,
                  "shared memory (BLOCK_M + 2*STAGES*BLOCK_N)*HEAD_DIM*2 bytes exceeds Hopper's 227 KB per block");
    static_assert(kChunksPerRow % 4 == 0, "the XOR swizzle needs HEAD_DIM to be a multiple of 32");

    // XOR swizzle of 16-byte chunks within a row: ldmatrix reads 8 rows at one
    // logical chunk and cp.async writes whole rows; both must spread over all
    // 8 16-byte bank groups. Rows of >= 128 bytes: chunk ^ (row & 7). Rows of
    // 64 or 192 bytes (D = 32, 96): two consecutive rows already sit 64 bytes
    // apart modulo 128, so chunk ^ ((row >> 1) & 3) (stays inside a 4-chunk group).
    static __device__ __forceinline__ int swizzle_key(int row) {
        if constexpr (kChunksPerRow % 8 == 0) {
            return row & 7;
        } else {
            return (row >> 1) & 3;
        }
    }
    // The swizzle only touches the chunk bits under kSwzMask, so for a lane whose rows
    // all share one key the physical chunk of logical chunk 2*ks + b is
    //   (2*ks & ~kSwzMask) + ((2*(ks % kSwzPeriod) + b) ^ key)
    // : kSwzPeriod lane registers plus a compile-time immediate per ldmatrix.
    static constexpr int kSwzMask = kChunksPerRow % 8 == 0 ? 7 : 3;
    static constexpr int kSwzPeriod = (kSwzMask + 1) / 2;
    // Element offset of (row, logical chunk) inside a [rows][kHeadDim] tile.
    static __device__ __forceinline__ int smem_offset(int row, int chunk) {
        return row * kHeadDim + ((chunk ^ swizzle_key(row)) << 3);
    }
};

}  // namespace flashcore
