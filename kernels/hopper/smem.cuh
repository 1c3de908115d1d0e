// Hopper family: the CTA's shared-memory carve-up (Q, the K and V rings, the O staging
// tile, the mbarriers) and the K/V ring position of an iteration.
#pragma once

#include "hopper/traits.cuh"

namespace hopper {

template <class T>
struct Smem {
    uint32_t q, k, v, o, bar;
    __device__ __forceinline__ uint32_t q_full() const { return bar; }
    __device__ __forceinline__ uint32_t q_empty() const { return bar + 8; }
    __device__ __forceinline__ uint32_t k_full(int s) const { return bar + 8 * (2 + s); }
    __device__ __forceinline__ uint32_t k_empty(int s) const { return bar + 8 * (2 + T::kStages + s); }
    __device__ __forceinline__ uint32_t v_full(int s) const { return bar + 8 * (2 + 2 * T::kStages + s); }
    __device__ __forceinline__ uint32_t v_empty(int s) const { return bar + 8 * (2 + 3 * T::kStages + s); }
    __device__ __forceinline__ uint32_t tile_slot() const { return bar + 8 * T::kNumBars; }  // SCHED 2
    __device__ __forceinline__ uint32_t k_tile(int s) const { return k + s * T::kKVBytes; }
    __device__ __forceinline__ uint32_t v_tile(int s) const { return v + s * T::kKVBytes; }
};

// K/V ring position: iteration `kv` (counted over all tiles of this CTA).
template <class T>
__device__ __forceinline__ int stage_of(int kv) { return kv % T::kStages; }
template <class T>
__device__ __forceinline__ uint32_t phase_of(int kv) { return (kv / T::kStages) & 1; }

}  // namespace hopper
