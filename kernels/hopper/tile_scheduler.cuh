// Hopper family: the tile scheduler. Tile index -> (query block, head, batch) and the key
// blocks it needs, for SCHED 0 (one CTA per tile), 1 (persistent, static), 2 (persistent,
// tiles handed out by an atomic counter) and 3 (2, with the last wave's tiles in parts).
#pragma once

#include <type_traits>

#include "hopper/params.h"
#include "hopper/ptx.cuh"
#include "hopper/traits.cuh"

namespace hopper {

// Per-tile work: which key blocks, which of them need the mask, and where its sequence
// lies (packed variable-length batches: its own lengths and first rows; dense: the
// problem's lengths, rows from 0 and the map's batch coordinate).
struct TileInfo {
    // Key blocks n_top-1 down to n_top-n_blocks, in that order (n_blocks iterations; a
    // split-KV CTA takes its share of the tile's blocks, else n_top == n_blocks).
    int m0, n_blocks, n_top, n_unmasked;  // blocks n < n_unmasked need no mask
    int split;                            // split-KV: this CTA's share (0 .. parts-1), else 0
    int parts;                            // shares of the tile's key blocks (1: a whole tile)
    int slot;                             // SCHED 3: the split tile's number among the tail's
    int head, batch;
    int seqlen_q, seqlen_k;        // this tile's sequence
    int q_row, k_row, tb;          // its first Q/O and K/V row in the maps, the maps' batch coordinate
    __device__ __forceinline__ bool empty() const { return m0 >= seqlen_q; }
};

// The persistent schedulers' tiles: one per (query block, head, batch), or with clusters one
// per (cluster's run of kCluster query blocks, head, batch), which every CTA of the cluster
// works on in lockstep (its own query block of the run).
template <class T>
__device__ __forceinline__ int whole_tiles(const Params& p) {
    const int num_m = (p.seqlen_q + T::kBlockM - 1) / T::kBlockM;
    return ((num_m + T::kCluster - 1) / T::kCluster) * p.heads * p.batch;
}

// SCHED 3, the last wave split (Stream-K style, at tile granularity). `tiles` whole tiles on
// a grid of G CTAs leave a last round of r = tiles mod G tiles while G - r CTAs idle; each of
// those r tiles (the last r in hand-out order, from Params::tail_first) is cut into
// Params::tail_parts parts of its key blocks instead, r * parts <= G of them, so the last round
// takes about 1/parts of a tile. The host plans it (launch.py tail_plan: at least two key blocks
// a part, at most kTailParts parts, a last round at least half full splits nothing), so the
// producer's 24 registers hold no plan: its numbers are read from the parameter bank.
//
// What the persistent schedulers hand out: whole tiles, and with SCHED 3 the split tail's parts.
template <class T>
__device__ __forceinline__ int num_tiles(const Params& p) {
    if constexpr (T::kTailSplit) return p.tail_first + (whole_tiles<T>(p) - p.tail_first) * p.tail_parts;
    return whole_tiles<T>(p);
}
// A persistent CTA's first tile and the stride of its static walk (a cluster's CTAs share both).
template <class T>
__device__ __forceinline__ int first_tile() { return int(blockIdx.x) / T::kCluster; }
template <class T>
__device__ __forceinline__ int tile_stride() { return int(gridDim.x) / T::kCluster; }

// Tile `tile` (0 .. num_tiles-1) -> coordinates. SCHED 0: tile = blockIdx.x of a
// (num_m, H, B) grid (CLUSTER=2: num_m rounded up to even), head/batch from blockIdx.y/z.
// SCHED 1: m fastest, then head, then batch (consecutive tiles share K/V in L2). Causal:
// longest m block first.
template <class T>
__device__ __forceinline__ TileInfo tile_info(const Params& p, int tile) {
    TileInfo t;
    t.split = T::kSplit ? int(blockIdx.x) % T::kSplits : 0;
    t.parts = T::kSplits;
    t.slot = 0;
    if constexpr (T::kTailSplit) {   // unit `tile` -> its tile, and its part of a split one
        if (tile >= p.tail_first) {
            const int v = tile - p.tail_first;
            t.slot = v / p.tail_parts;
            t.split = v - t.slot * p.tail_parts;
            t.parts = p.tail_parts;
            tile = p.tail_first + t.slot;
        }
    }
    const int num_m = (p.seqlen_q + T::kBlockM - 1) / T::kBlockM;
    int m_block;
    if constexpr (T::kPersistent && T::kIsCausal) {
        // Causal persistent: heads in L2 sections of `sec` (K+V of a section
        // <= ~24 MiB); inside a section, longest m blocks of all its heads first
        // (static striding by gridDim then hands out work longest-first).
        const int hb = p.heads * p.batch;
        const long long kv_bytes = static_cast<long long>(p.seqlen_k) * T::kHeadDim * 4;
        const int sec = static_cast<int>(max(1ll, min(static_cast<long long>(hb), (24ll << 20) / kv_bytes)));
        const int s_idx = tile / (sec * num_m);
        const int r = tile - s_idx * sec * num_m;
        const int hs = min(sec, hb - s_idx * sec);  // heads in this (maybe last, short) section
        m_block = r / hs;                           // reversed below: longest first
        const int bh = s_idx * sec + r % hs;
        t.head = bh % p.heads;
        t.batch = bh / p.heads;
    } else if constexpr (T::kPersistent) {
        // CLUSTER=2: tile = a pair of query blocks; this CTA takes the one of its rank.
        const int units = (num_m + T::kCluster - 1) / T::kCluster;
        m_block = T::kClustered ? T::kCluster * (tile % units) + int(cluster_ctarank()) : tile % num_m;
        const int bh = tile / units;
        t.head = bh % p.heads;
        t.batch = bh / p.heads;
    } else {
        // split-KV: grid x = m blocks * kSplits, the splits of one m block adjacent
        m_block = T::kSplit ? int(blockIdx.x) / T::kSplits : int(blockIdx.x);
        t.head = blockIdx.y;
        t.batch = blockIdx.z;
    }
    t.seqlen_q = p.seqlen_q;
    t.seqlen_k = p.seqlen_k;
    t.q_row = t.k_row = 0;
    t.tb = t.batch;
    int seq_m = num_m;
    if constexpr (T::kVarlen) {  // packed: this sequence's rows; the grid spans the longest
        t.q_row = p.cu_seqlens_q[t.batch];
        t.seqlen_q = p.cu_seqlens_q[t.batch + 1] - t.q_row;
        t.k_row = p.cu_seqlens_k[t.batch];
        t.seqlen_k = p.cu_seqlens_k[t.batch + 1] - t.k_row;
        t.tb = 0;
        seq_m = (t.seqlen_q + T::kBlockM - 1) / T::kBlockM;
    }
    // Causal: longest m block first (of this sequence; blocks past its end stay empty).
    if constexpr (T::kIsCausal) m_block = m_block < seq_m ? seq_m - 1 - m_block : m_block;
    t.m0 = m_block * T::kBlockM;
    int nb = (t.seqlen_k + T::kBlockN - 1) / T::kBlockN;
    int unmasked = t.seqlen_k / T::kBlockN;  // whole blocks inside Sk
    if constexpr (T::kIsCausal) {
        const int last_row = min(t.m0 + T::kBlockM, t.seqlen_q) - 1;  // top-left: row i sees keys 0..i
        nb = min(nb, last_row / T::kBlockN + 1);
        unmasked = min(unmasked, (t.m0 + 1) / T::kBlockN);              // every key <= the tile's first row
    }
    t.n_unmasked = unmasked;
    if constexpr (T::kSplit || T::kTailSplit) {
        // Split s takes blocks [s*nb/S, (s+1)*nb/S): shares differ by at most one block,
        // and a split past the tile's blocks gets none (it still reports an empty partial).
        // (SCHED 3: S = t.parts, 1 for a whole tile: all its blocks.)
        // (SCHED 3: 32-bit, parts <= kTailParts; the producer's 24 registers hold no 64-bit division.)
        using Wide = typename std::conditional<T::kTailSplit, int, long long>::type;
        const int lo = static_cast<int>(static_cast<Wide>(t.split) * nb / t.parts);
        const int hi = static_cast<int>(static_cast<Wide>(t.split + 1) * nb / t.parts);
        t.n_top = hi;
        t.n_blocks = hi - lo;
    } else {
        t.n_top = nb;
        t.n_blocks = nb;
    }
    return t;
}

}  // namespace hopper
