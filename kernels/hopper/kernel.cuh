// Hopper family forward: hopper::fwd<Traits>, the algorithm.
//
// CTA = 1 producer warpgroup (warp 0, lane 0 issues every TMA load) + kWGs
// consumer warpgroups of 64 query rows each. Q is loaded once; K and V stream
// through separate kStages-deep rings (full barrier: the producer's
// arrive.expect_tx + TMA bytes; empty barrier: one arrival per consumer WG).
// S = Q K^T is an SS-wgmma (both K-major, 128B swizzle); O += P V an RS-wgmma
// with P in registers and V read MN-major (trans-b) straight from its row-major
// tile. Key blocks run from the last to the first, so the blocks that need a
// mask (causal diagonal, ragged Sk tail) come first and the rest run unmasked.
// CLUSTER=2: two CTAs of adjacent query tiles share each K/V load (traits.cuh kCluster).
//
// The roles live in their own files: smem.cuh (layout, ring), tile_scheduler.cuh,
// producer.cuh (loads), consumer.cuh (math; softmax.cuh, epilogue.cuh, split.cuh,
// tile_overlap.cuh: TILE_OVERLAP's cross-tile pipeline). This file composes
// them: hopper::fwd, the kernel body instantiate.cuh wraps.
#pragma once

#include "hopper/consumer.cuh"
#include "hopper/params.h"
#include "hopper/producer.cuh"
#include "hopper/smem.cuh"
#include "hopper/traits.cuh"

namespace hopper {

template <class T>
__device__ __forceinline__ void fwd(const Params& p, const int32_t* meta) {
    if constexpr (!T::kPersistent) {
        // Packed batches: a CTA whose tile lies past its sequence's end has nothing to do.
        if (T::kVarlen && tile_info<T>(p, blockIdx.x).empty()) return;
    }
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
    Smem<T> sm;
    sm.q = base;
    sm.k = base + T::kOffK;
    sm.v = base + T::kOffV;
    sm.o = base + T::kOffO;
    sm.bar = base + T::kOffBar;

    const int tid = threadIdx.x;
    if (tid == 0) {
        for (int b = 0; b < T::kQBufs; ++b) {
            mbar_init(sm.q_full(b), 1);
            mbar_init(sm.q_empty(b), 128 * T::kWGs);  // all consumer threads arrive
        }
        for (int s = 0; s < T::kStages; ++s) {
            mbar_init(sm.k_full(s), 1);
            mbar_init(sm.v_full(s), 1);
            mbar_init(sm.k_empty(s), T::kWGs * T::kCluster);   // CLUSTER=2: both CTAs' warpgroups
            mbar_init(sm.v_empty(s), T::kWGs * T::kCluster);
        }
        fence_mbar_init();
    }
    // Keep the meta table referenced (a never-true branch) so it stays in the cubin.
    if (p.kv_group == 0x7fffffff && meta[0] == 0) asm volatile("trap;\n");
    if constexpr (T::kClustered) {
        cluster_sync();   // the partner's barriers exist before any load or arrival reaches them
    } else {
        __syncthreads();
    }

    const int num_tiles = T::kPersistent ? hopper::num_tiles<T>(p) : 1;
    // Warp-uniform in the compiler's eyes (shfl from lane 0): descriptors land in
    // uniform registers instead of being rebuilt per thread.
    const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
    if (wg == 0) {
        setmaxnreg_dec<T::kRegProd>();
        if (tid == 0) producer<T>(p, sm, T::kPersistent ? num_tiles : int(gridDim.x));
    } else {
        setmaxnreg_inc<T::kRegCons>();
        Consumer<T> c(p, sm, wg - 1, (tid % 128) / 32, tid % 32);
        if constexpr (T::kPingpong) {
            if (c.g == T::kWGs - 1) named_arrive(1, 256);  // WG 0 issues first
        }
        if constexpr (T::kTileOverlap) {
            c.run_tiles_overlapped(num_tiles);   // tile_overlap.cuh
        } else {
            int tile = T::kPersistent ? first_tile<T>() : int(blockIdx.x);
            for (int local = 0;; ++local) {
                if constexpr (T::kDynamic) {
                    mbar_wait(sm.q_full(), local & 1);
                    tile = static_cast<int>(ld_shared_u32(sm.tile_slot()));
                    if (tile < 0) break;
                } else if constexpr (T::kPersistent) {
                    // The producer's walk: packed batches skip tiles past their sequence's end.
                    for (; tile < num_tiles; tile += tile_stride<T>()) {
                        c.t = tile_info<T>(p, tile);
                        if (!T::kVarlen || !c.t.empty()) break;
                    }
                    if (tile >= num_tiles) break;
                    mbar_wait(sm.q_full(), local & 1);
                } else {
                    mbar_wait(sm.q_full(), local & 1);
                }
                if (T::kDynamic || !T::kPersistent) c.t = tile_info<T>(p, tile);
                c.run_tile();
                if constexpr (T::kSplit) c.finish_split();   // split-KV: the tile's last share combines
                if constexpr (!T::kPersistent) break;
                if constexpr (!T::kDynamic) tile += tile_stride<T>();
            }
        }
        if constexpr (T::kPingpong) {
            if (c.g == 0) named_sync(1, 256);  // the last WG's final arrival
        }
        if constexpr (T::kPersistent) {
            if (c.warp == 0 && c.lane == 0) tma_store_wait_all();
        }
    }
    if constexpr (T::kClustered) {
        // No CTA leaves while its partner may still multicast into it or free a stage in it.
        __syncwarp();
        cluster_sync();
    }
}

}  // namespace hopper
