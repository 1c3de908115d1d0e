// Hopper family: the CTA's shared-memory carve-up (Q, the K and V rings, the O staging
// tile, the mbarriers) and the K/V ring position of an iteration.
#pragma once

#include "hopper/traits.cuh"

namespace hopper {

template <class T>
struct Smem {
    static constexpr int kQ = 2 * T::kQBufs;   // Q barriers before the K/V rings'
    uint32_t q, k, v, o, bar;
    // Q buffer b (0 .. kQBufs-1; TILE_OVERLAP: tile j of the CTA in buffer j % 2)
    __device__ __forceinline__ uint32_t q_tile(int b = 0) const { return q + b * T::kQBytes; }
    __device__ __forceinline__ uint32_t q_full(int b = 0) const { return bar + 16 * b; }
    __device__ __forceinline__ uint32_t q_empty(int b = 0) const { return bar + 16 * b + 8; }
    __device__ __forceinline__ uint32_t k_full(int s) const { return bar + 8 * (kQ + s); }
    __device__ __forceinline__ uint32_t k_empty(int s) const { return bar + 8 * (kQ + T::kStages + s); }
    __device__ __forceinline__ uint32_t v_full(int s) const { return bar + 8 * (kQ + 2 * T::kStages + s); }
    __device__ __forceinline__ uint32_t v_empty(int s) const { return bar + 8 * (kQ + 3 * T::kStages + s); }
    // SCHED 2, 3: the tile of Q buffer b (split-KV, SCHED 0: slot 0 holds the combine flag)
    __device__ __forceinline__ uint32_t tile_slot(int b = 0) const { return bar + 8 * T::kNumBars + 4 * b; }
    __device__ __forceinline__ uint32_t k_tile(int s) const { return k + s * T::kKVBytes; }
    __device__ __forceinline__ uint32_t v_tile(int s) const { return v + s * T::kKVBytes; }
};

// K/V ring position: iteration `kv` (counted over all tiles of this CTA).
template <class T>
__device__ __forceinline__ int stage_of(int kv) { return kv % T::kStages; }
template <class T>
__device__ __forceinline__ uint32_t phase_of(int kv) { return (kv / T::kStages) & 1; }

}  // namespace hopper
