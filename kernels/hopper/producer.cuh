// Hopper family: the producer warpgroup (the mainloop's loads). Lane 0 of warp 0 issues
// every TMA load: Q once per tile (TILE_OVERLAP: into two buffers in turn, so tile j+1's Q
// loads while tile j runs), then K and V blocks into their rings, last block first;
// under GQA a query head reads K/V head h / kv_group. CLUSTER=2: half of each K/V block,
// multicast to the pair (load_kv).
#pragma once

#include "hopper/params.h"
#include "hopper/ptx.cuh"
#include "hopper/smem.cuh"
#include "hopper/tile_scheduler.cuh"

namespace hopper {

// SCHED 2: the tile after this CTA's current one, from the counter. Every tile index below
// num_tiles is held by exactly one CTA (blockIdx.x, or gridDim.x + a value fetched here), and
// each held tile, worked or skipped, fetches exactly once, so a launch makes num_tiles fetches
// with values 0 .. num_tiles-1. The one that gets the last value puts the counter back to zero
// for the next launch on the stream, so the runtime zeroes it once, not before every launch.
__device__ __forceinline__ int next_dynamic_tile(int* counter, int num_tiles) {
    const int fetched = atomicAdd(counter, 1);
    if (fetched == num_tiles - 1) atomicExch(counter, 0);
    return int(gridDim.x) + fetched;
}

// One tile of `rows` rows at (row, head, batch) into `dst`. D a multiple of 64: one TMA of
// the {64, rows, D/64} box. D=96 (kNarrow): the map's inner extent is D itself, so each
// 64-column panel is a TMA of its own at x = 64*panel; the second one's columns 96..127 lie
// past the extent and land as zeros (the tx count is the full box either way: kQBytes /
// kKVBytes hold the padded width).
template <class T, int kRows>
__device__ __forceinline__ void load_tile(uint32_t dst, const CUtensorMap* map, uint32_t bar, int row, int head,
                                          int batch) {
    if constexpr (T::kNarrow) {
#pragma unroll
        for (int pnl = 0; pnl < T::kPanels; ++pnl)
            tma_load_5d(dst + pnl * kRows * 128, map, bar, 64 * pnl, row, 0, head, batch);
    } else {
        tma_load_5d(dst, map, bar, 0, row, 0, head, batch);
    }
}

// One K or V block of BLOCK_N rows into ring slot `dst`. CLUSTER=2: this CTA loads its
// panels (p % 2 == rank) into the same slot of both CTAs, completing on both CTAs' barrier
// at `bar`'s offset; the partner loads the others (each full barrier expects the whole tile).
template <class T>
__device__ __forceinline__ void load_kv(uint32_t dst, const CUtensorMap* map, uint32_t bar, int row, int head,
                                        int batch) {
    if constexpr (T::kClustered) {
        const int rank = static_cast<int>(cluster_ctarank());
#pragma unroll
        for (int pnl = 0; pnl < T::kPanels; ++pnl) {
            if (pnl % T::kCluster == rank)
                tma_load_5d_multicast(dst + pnl * T::kBlockN * 128, map, bar, 0, row, pnl, head, batch,
                                      static_cast<uint16_t>((1u << T::kCluster) - 1));
        }
    } else {
        load_tile<T, T::kBlockN>(dst, map, bar, row, head, batch);
    }
}

template <class T>
__device__ __forceinline__ void producer(const Params& p, const Smem<T>& sm, int num_tiles) {
    prefetch_tmap(&p.tm_q);
    prefetch_tmap(&p.tm_k);
    prefetch_tmap(&p.tm_v);
    int kv = 0;
    int tile = T::kPersistent ? first_tile<T>() : int(blockIdx.x);
    for (int local = 0;; ++local) {
        // Q buffer b's previous tile (local - kQBufs) must be released by every consumer WG.
        const int b = local % T::kQBufs;
        if (local >= T::kQBufs) mbar_wait(sm.q_empty(b), ((local - T::kQBufs) / T::kQBufs) & 1);
        TileInfo t;
        if constexpr (T::kPersistent && T::kVarlen) {
            // Packed batches: tiles past their sequence's end are skipped here and by
            // the consumers alike (static: the same walk; dynamic: never published).
            for (; tile < num_tiles; tile = T::kDynamic ? next_dynamic_tile(p.tile_counter, num_tiles)
                                                        : tile + tile_stride<T>()) {
                t = tile_info<T>(p, tile);
                if (!t.empty()) break;
            }
        }
        if constexpr (T::kDynamic) {
            // Publish the tile (or -1 = done) to the consumers; the q_full arrival
            // (release) orders this store before their wait (acquire).
            st_shared_u32(sm.tile_slot(b), tile < num_tiles ? tile : -1);
            if (tile >= num_tiles) {
                mbar_arrive(sm.q_full(b));
                break;
            }
        } else {
            if (tile >= num_tiles) break;
        }
        // Dense builds (and SCHED 0, whose empty tile's CTA returned at its start): the tile's
        // work once it is known to be one, which keeps a 24-register producer from spilling.
        if constexpr (!(T::kPersistent && T::kVarlen)) t = tile_info<T>(p, tile);
        if (T::kClustered && t.empty()) {
            mbar_arrive(sm.q_full(b));   // an odd last query block's partner: no rows to load
        } else {
            mbar_arrive_expect_tx(sm.q_full(b), T::kQBytes);
            load_tile<T, T::kBlockM>(sm.q_tile(b), &p.tm_q, sm.q_full(b), t.q_row + t.m0, t.head, t.tb);
        }
        const int kv_head = t.head / p.kv_group;  // GQA/MQA: the K/V head this query head reads
        // Next tile: fetched now so the atomic's latency hides behind this tile.
        const int next = T::kDynamic ? next_dynamic_tile(p.tile_counter, num_tiles) : tile + tile_stride<T>();
        for (int it = 0; it < t.n_blocks; ++it, ++kv) {
            const int n = t.n_top - 1 - it;
            const int s = stage_of<T>(kv);
            const uint32_t ph = phase_of<T>(kv) ^ 1;  // first round passes on a fresh barrier
            mbar_wait(sm.k_empty(s), ph);
            mbar_arrive_expect_tx(sm.k_full(s), T::kKVBytes);
            load_kv<T>(sm.k_tile(s), &p.tm_k, sm.k_full(s), t.k_row + n * T::kBlockN, kv_head, t.tb);
            mbar_wait(sm.v_empty(s), ph);
            mbar_arrive_expect_tx(sm.v_full(s), T::kKVBytes);
            load_kv<T>(sm.v_tile(s), &p.tm_v, sm.v_full(s), t.k_row + n * T::kBlockN, kv_head, t.tb);
        }
        if constexpr (!T::kPersistent) break;
        tile = next;
    }
}

}  // namespace hopper
