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
#pragma once

#include "hopper/params.h"
#include "hopper/ptx.cuh"
#include "hopper/traits.cuh"
#include "hopper/wgmma.cuh"

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

// Per-tile work: which key blocks, which of them need the mask.
struct TileInfo {
    int m0, n_blocks, n_unmasked;  // blocks n < n_unmasked need no mask
    int head, batch;
};

// Tile `tile` (0 .. num_tiles-1) -> coordinates. SCHED 0: tile = blockIdx.x of a
// (num_m, H, B) grid, head/batch from blockIdx.y/z. SCHED 1: m fastest, then head,
// then batch (consecutive tiles share K/V in L2). Causal: longest m block first.
template <class T>
__device__ __forceinline__ TileInfo tile_info(const Params& p, int tile) {
    TileInfo t;
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
        m_block = tile % num_m;
        const int bh = tile / num_m;
        t.head = bh % p.heads;
        t.batch = bh / p.heads;
    } else {
        m_block = blockIdx.x;
        t.head = blockIdx.y;
        t.batch = blockIdx.z;
    }
    if constexpr (T::kIsCausal) m_block = num_m - 1 - m_block;
    t.m0 = m_block * T::kBlockM;
    int nb = (p.seqlen_k + T::kBlockN - 1) / T::kBlockN;
    int unmasked = p.seqlen_k / T::kBlockN;  // whole blocks inside Sk
    if constexpr (T::kIsCausal) {
        const int last_row = min(t.m0 + T::kBlockM, p.seqlen_q) - 1;  // top-left: row i sees keys 0..i
        nb = min(nb, last_row / T::kBlockN + 1);
        unmasked = min(unmasked, (t.m0 + 1) / T::kBlockN);              // every key <= the tile's first row
    }
    t.n_blocks = nb;
    t.n_unmasked = unmasked;
    return t;
}

// K/V ring position: iteration `kv` (counted over all tiles of this CTA).
template <class T>
__device__ __forceinline__ int stage_of(int kv) { return kv % T::kStages; }
template <class T>
__device__ __forceinline__ uint32_t phase_of(int kv) { return (kv / T::kStages) & 1; }

template <class T>
__device__ __forceinline__ void producer(const Params& p, const Smem<T>& sm, int num_tiles) {
    prefetch_tmap(&p.tm_q);
    prefetch_tmap(&p.tm_k);
    prefetch_tmap(&p.tm_v);
    int kv = 0;
    int tile = blockIdx.x;
    for (int local = 0;; ++local) {
        // Q of the previous tile must be released by every consumer WG.
        if (local > 0) mbar_wait(sm.q_empty(), (local - 1) & 1);
        if constexpr (T::kDynamic) {
            // Publish the tile (or -1 = done) to the consumers; the q_full arrival
            // (release) orders this store before their wait (acquire).
            st_shared_u32(sm.tile_slot(), tile < num_tiles ? tile : -1);
            if (tile >= num_tiles) {
                mbar_arrive(sm.q_full());
                break;
            }
        } else {
            if (tile >= num_tiles) break;
        }
        const TileInfo t = tile_info<T>(p, tile);
        mbar_arrive_expect_tx(sm.q_full(), T::kQBytes);
        tma_load_5d(sm.q, &p.tm_q, sm.q_full(), 0, t.m0, 0, t.head, t.batch);
        const int kv_head = t.head / p.kv_group;  // GQA/MQA: the K/V head this query head reads
        // Next tile: fetched now so the atomic's latency hides behind this tile.
        const int next = T::kDynamic ? int(gridDim.x) + atomicAdd(p.tile_counter, 1) : tile + int(gridDim.x);
        for (int it = 0; it < t.n_blocks; ++it, ++kv) {
            const int n = t.n_blocks - 1 - it;
            const int s = stage_of<T>(kv);
            const uint32_t ph = phase_of<T>(kv) ^ 1;  // first round passes on a fresh barrier
            mbar_wait(sm.k_empty(s), ph);
            mbar_arrive_expect_tx(sm.k_full(s), T::kKVBytes);
            tma_load_5d(sm.k_tile(s), &p.tm_k, sm.k_full(s), 0, n * T::kBlockN, 0, kv_head, t.batch);
            mbar_wait(sm.v_empty(s), ph);
            mbar_arrive_expect_tx(sm.v_full(s), T::kKVBytes);
            tma_load_5d(sm.v_tile(s), &p.tm_v, sm.v_full(s), 0, n * T::kBlockN, 0, kv_head, t.batch);
        }
        if constexpr (!T::kPersistent) break;
        tile = next;
    }
}

template <class T>
struct Consumer {
    static constexpr int DT = T::kDtype;
    static constexpr int BN = T::kBlockN;
    static constexpr int D = T::kHeadDim;

    const Params& p;  // the __grid_constant__ parameter itself
    const Smem<T> sm;
    TileInfo t;
    int g;      // consumer warpgroup 0..kWGs-1
    int warp;   // warp in the warpgroup
    int lane;
    uint32_t q_base;  // this WG's 64-row slab inside panel 0 of Q
    uint32_t o_base;  // this WG's 64-row slab inside panel 0 of the O staging tile
    int kv;           // K/V ring iteration of this tile's first block

    float o[T::kORegs];
    float m[2];     // running row max, raw score units (rows r and r+8 of this thread)
    float l[2];     // thread-partial row sums
    float ms[2];    // m * scale_log2 with -inf replaced by 0

    __device__ __forceinline__ Consumer(const Params& p_, const Smem<T>& sm_, int g_, int warp_, int lane_)
        : p(p_), sm(sm_), g(g_), warp(warp_), lane(lane_) {
        q_base = sm.q + g * 64 * 128;
        o_base = (T::kPersistent ? sm.o : sm.q) + g * 64 * 128;
        kv = 0;
    }

    __device__ __forceinline__ void issue_qk(float (&s)[T::kSRegs], int stage) {
        // Descriptors: one base each, k-step offsets added to the address field
        // (addresses stay < 256 KiB, so the 14-bit field cannot overflow).
        const uint64_t da0 = make_desc(q_base, 16, 1024);
        const uint64_t db0 = make_desc(sm.k_tile(stage), 16, 1024);
        pin(s);
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < T::kKStepsQK; ++j) {
            const uint64_t da = da0 + static_cast<uint64_t>(((j / 4) * T::kBlockM * 128 + (j % 4) * 32) >> 4);
            const uint64_t db = db0 + static_cast<uint64_t>(((j / 4) * BN * 128 + (j % 4) * 32) >> 4);
            Wgmma<BN, DT>::ss(s, da, db, j > 0 ? 1 : 0);
        }
        wgmma_commit();
        pin(s);
    }

    __device__ __forceinline__ void issue_pv(uint32_t (&pr)[T::kPRegs], int stage) {
        const uint64_t db0 = make_desc(sm.v_tile(stage), BN * 128, 1024);
        pin(o);
        pin(pr);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < T::kKStepsPV; ++kk) {
            const uint32_t a[4] = {pr[4 * kk], pr[4 * kk + 1], pr[4 * kk + 2], pr[4 * kk + 3]};
            const uint64_t db = db0 + static_cast<uint64_t>((kk * 2048) >> 4);
            Wgmma<D, DT>::rs(o, a, db, 1);
        }
        wgmma_commit();
        pin(o);
    }

    // Mask (if kMasked), update the running max, exponentiate S in place and
    // accumulate the row sums. Returns the O rescale factors through `corr`.
    template <bool kMasked>
    __device__ __forceinline__ bool softmax(float (&s)[T::kSRegs], int n, float (&corr)[2]) {
        if constexpr (kMasked) {
            const int col0 = n * BN + 2 * (lane & 3);
            const int row0 = t.m0 + g * 64 + warp * 16 + (lane >> 2);
#pragma unroll
            for (int i = 0; i < T::kSRegs; ++i) {
                const int col = col0 + 8 * (i >> 2) + (i & 1);
                const int row = row0 + 8 * ((i >> 1) & 1);
                bool masked = col >= p.seqlen_k;
                if constexpr (T::kIsCausal) masked = masked || col > row;
                if (masked) s[i] = -INFINITY;
            }
        }
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int i = 0; i < T::kSRegs; ++i) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        }
        bool update = true;
        if constexpr (T::kLazyRescale) {
            // Keep the stale max (P <= 2^kRescaleLog2) unless some row of this warp
            // grew by more than that or had no finite score yet: then O, l and the
            // max are left alone and the O rescale is skipped (warp-uniform).
            bool grow = false;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                grow |= m[h] == -INFINITY ? mx[h] != -INFINITY
                                          : mx[h] * p.scale_log2 - ms[h] > float(T::kRescaleLog2);
            }
            update = __any_sync(0xffffffffu, grow);
        }
        if (update) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float ms_new = (mx[h] == -INFINITY ? 0.f : mx[h]) * p.scale_log2;
                corr[h] = m[h] == -INFINITY ? 0.f : ex2(ms[h] - ms_new);  // no row data yet: l, o are 0
                m[h] = mx[h];
                ms[h] = ms_new;
                l[h] *= corr[h];
            }
        } else {
            corr[0] = corr[1] = 1.f;
        }
#pragma unroll
        for (int i = 0; i < T::kSRegs; ++i) {
            const int h = (i >> 1) & 1;
            const float x = fmaf(s[i], p.scale_log2, -ms[h]);
            if constexpr (T::kExpEmu > 0) {
                s[i] = (i % T::kExpEmu == T::kExpEmu - 1) ? ex2_poly(x) : ex2(x);
            } else {
                s[i] = ex2(x);
            }
            l[h] += s[i];
        }
        return update;
    }

    __device__ __forceinline__ void rescale_o(const float (&corr)[2], bool update) {
        if (T::kLazyRescale && !update) return;
#pragma unroll
        for (int i = 0; i < T::kORegs; ++i) o[i] *= corr[(i >> 1) & 1];
    }

    __device__ __forceinline__ void to_p(const float (&s)[T::kSRegs], uint32_t (&pr)[T::kPRegs]) {
#pragma unroll
        for (int i = 0; i < T::kPRegs; ++i) pr[i] = pack2<DT>(s[2 * i], s[2 * i + 1]);
    }

    __device__ __forceinline__ void pp_sync() {
        if constexpr (T::kPingpong) named_sync(1 + g, 256);
    }
    // Every issue region ends with an arrival for the next WG; WG 0 got one up
    // front from the last WG and absorbs the last WG's final one at exit.
    __device__ __forceinline__ void pp_arrive() {
        if constexpr (T::kPingpong) named_arrive(1 + (g + 1) % T::kWGs, 256);
    }

    __device__ __forceinline__ void release(uint32_t bar) {
        if (warp == 0 && lane == 0) mbar_arrive(bar);
    }

    __device__ __forceinline__ void softmax_any(float (&s)[T::kSRegs], int n, float (&corr)[2]) {
        if (n >= t.n_unmasked) {
            softmax<true>(s, n, corr);
        } else {
            softmax<false>(s, n, corr);
        }
    }  // (first block only: O is still 0, no rescale needed)

    template <bool kMasked>
    __device__ __forceinline__ void overlap_step(float (&s)[T::kSRegs], uint32_t (&pr)[T::kPRegs], float (&corr)[2],
                                                 int it) {
        const int n = t.n_blocks - 1 - it;
        const int st = stage_of<T>(kv + it);
        const uint32_t ph = phase_of<T>(kv + it);
        const int sp = stage_of<T>(kv + it - 1);
        const uint32_t php = phase_of<T>(kv + it - 1);
        mbar_wait(sm.k_full(st), ph);
        mbar_wait(sm.v_full(sp), php);
        pp_sync();
        issue_qk(s, st);
        issue_pv(pr, sp);
        pp_arrive();
        wgmma_wait<1>();
        pin(s);
        release(sm.k_empty(st));
        const bool upd = softmax<kMasked>(s, n, corr);
        wgmma_wait<0>();
        pin(o);
        pin(pr);
        release(sm.v_empty(sp));
        rescale_o(corr, upd);
        to_p(s, pr);
    }

    template <bool kMasked>
    __device__ __forceinline__ void plain_step(float (&s)[T::kSRegs], uint32_t (&pr)[T::kPRegs], float (&corr)[2],
                                               int it) {
        const int n = t.n_blocks - 1 - it;
        const int st = stage_of<T>(kv + it);
        const uint32_t ph = phase_of<T>(kv + it);
        mbar_wait(sm.k_full(st), ph);
        issue_qk(s, st);
        wgmma_wait<0>();
        pin(s);
        release(sm.k_empty(st));
        const bool upd = softmax<kMasked>(s, n, corr);
        rescale_o(corr, upd);
        to_p(s, pr);
        mbar_wait(sm.v_full(st), ph);
        issue_pv(pr, st);
        wgmma_wait<0>();
        pin(o);
        release(sm.v_empty(st));
    }

    // Keep this warpgroup's side of iteration `it`'s handshakes without computing it:
    // its ping-pong turn (passed on at once) and its K/V releases, each after that load
    // landed (so an arrival never counts toward an older phase of the stage).
    __device__ __forceinline__ void pass_block(int it) {
        if constexpr (T::kOverlap) {
            pp_sync();
            pp_arrive();
        }
        const int st = stage_of<T>(kv + it);
        const uint32_t ph = phase_of<T>(kv + it);
        mbar_wait(sm.k_full(st), ph);
        release(sm.k_empty(st));
        mbar_wait(sm.v_full(st), ph);
        release(sm.v_empty(st));
    }

    // A warpgroup whose 64 rows all lie past Sq (the ragged last m block: S=2048 at
    // BLOCK_M=192, the longest causal tile at S=4096) computes nothing. It keeps only
    // its side of every handshake, in the same order as run_tile: every block passed
    // (pass_block), the ping-pong turn of run_tile's last P V (nb+1 turns in all, like
    // run_tile's overlap path) and its Q release. The other warpgroups get the tensor cores:
    // +1-2% at 16,16,2048,64 and +1-3% at 4,16,4096,64 causal (dev run 8, same run,
    // c64r / c64dr against the code without it); memcheck/racecheck/synccheck clean.
    __device__ __forceinline__ void skip_tile() {
        const int nb = t.n_blocks;
        for (int it = 0; it < nb; ++it) pass_block(it);
        if constexpr (T::kOverlap) {
            pp_sync();
            pp_arrive();
        }
        mbar_arrive(sm.q_empty());  // every consumer thread, as in run_tile
        kv += nb;
    }

    // Causal: the tile's key blocks reach its last row, this warpgroup's last row sees
    // fewer. Blocks run from the last down, so the ones no row of this warpgroup sees
    // are the first `causal_skip()` iterations: with 64-row warpgroups and BLOCK_N=128
    // the first warpgroup of a 192-row tile skips one block, the second one every other tile.
    __device__ __forceinline__ int causal_skip() const {
        if constexpr (T::kIsCausal) {
            const int last_row = min(t.m0 + g * 64 + 63, p.seqlen_q - 1);
            const int mine = min((p.seqlen_k + BN - 1) / BN, last_row / BN + 1);
            return t.n_blocks - mine;   // >= 0, < n_blocks (every row sees key 0)
        } else {
            return 0;
        }
    }

    // One tile: t and kv set by the caller, who has waited for q_full.
    __device__ __forceinline__ void run_tile() {
        if (t.m0 + g * 64 >= p.seqlen_q) {
            skip_tile();
            return;
        }
#pragma unroll
        for (int i = 0; i < T::kORegs; ++i) o[i] = 0.f;
        m[0] = m[1] = -INFINITY;
        l[0] = l[1] = 0.f;
        ms[0] = ms[1] = 0.f;

        float s[T::kSRegs];
        uint32_t pr[T::kPRegs];
        float corr[2];
        const int nb = t.n_blocks;
        const int n_masked_iters = nb - max(t.n_unmasked, 0);
        const int first = causal_skip();   // iterations before it: masked for every row here
        for (int it = 0; it < first; ++it) pass_block(it);
        if constexpr (!T::kOverlap) {
            int it = first;
            for (; it < n_masked_iters; ++it) plain_step<true>(s, pr, corr, it);
            for (; it < nb; ++it) plain_step<false>(s, pr, corr, it);
            mbar_arrive(sm.q_empty());  // every consumer thread: its reads of Q and the tile slot precede it
        } else {
            // First block: S only.
            mbar_wait(sm.k_full(stage_of<T>(kv + first)), phase_of<T>(kv + first));
            pp_sync();
            issue_qk(s, stage_of<T>(kv + first));
            pp_arrive();
            wgmma_wait<0>();
            pin(s);
            release(sm.k_empty(stage_of<T>(kv + first)));
            softmax_any(s, nb - 1 - first, corr);
            to_p(s, pr);
            // Steady state: S of block it overlaps P V of block it-1. The masked
            // blocks (the first ones, descending order) get their own loop: no
            // branch between a wgmma's issue and its wait.
            int it = first + 1;
            for (; it < n_masked_iters; ++it) overlap_step<true>(s, pr, corr, it);
            for (; it < nb; ++it) overlap_step<false>(s, pr, corr, it);
            // Every Q K^T of this tile has retired: the producer may load the next Q.
            mbar_arrive(sm.q_empty());  // every consumer thread: its reads of Q and the tile slot precede it
            // Last P V.
            const int sl = stage_of<T>(kv + nb - 1);
            mbar_wait(sm.v_full(sl), phase_of<T>(kv + nb - 1));
            pp_sync();
            issue_pv(pr, sl);
            pp_arrive();
            wgmma_wait<0>();
            pin(o);
            release(sm.v_empty(sl));
        }
        kv += nb;
        epilogue();
    }

    // O / l -> this WG's staging slab (swizzled like TMA's layout) -> TMA store; LSE.
    __device__ __forceinline__ void epilogue() {
        float inv[2];
        const int r_lo = warp * 16 + (lane >> 2);  // row inside the WG's 64-row slab
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float lsum = l[h];
            lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
            lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
            inv[h] = lsum > 0.f ? 1.f / lsum : 0.f;
            const int row = t.m0 + g * 64 + r_lo + 8 * h;
            if (p.lse != nullptr && (lane & 3) == 0 && row < p.seqlen_q) {
                const float lse = lsum > 0.f ? (ms[h] + __log2f(lsum)) * 0.69314718055994531f : -INFINITY;
                const int bh = t.batch * p.heads + t.head;
                p.lse[static_cast<int64_t>(bh) * p.seqlen_q + row] = lse;
            }
        }
        if constexpr (T::kPersistent) {
            // The previous tile's store must have finished reading the staging slab.
            if (warp == 0 && lane == 0) tma_store_wait_read();
            named_sync(4 + g, 128);
        }
        // Register i: row r_lo + 8*((i>>1)&1), column 8*(i>>2) + 2*(lane&3) + (i&1).
#pragma unroll
        for (int i = 0; i < T::kORegs; i += 4) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = r_lo + 8 * h;
                const int c = 8 * (i >> 2) + 2 * (lane & 3);
                const int panel = c / 64;
                const int chunk = ((c % 64) / 8) ^ (r & 7);
                const uint32_t addr = o_base + panel * T::kBlockM * 128 + r * 128 + chunk * 16 + (c % 8) * 2;
                st_shared_u32(addr, pack2<DT>(o[i + 2 * h] * inv[h], o[i + 2 * h + 1] * inv[h]));
            }
        }
        fence_proxy_async();
        named_sync(4 + g, 128);
        if (warp == 0 && lane == 0) {
#pragma unroll
            for (int pnl = 0; pnl < T::kPanels; ++pnl) {
                tma_store_5d(&p.tm_o, o_base + pnl * T::kBlockM * 128, 0, t.m0 + g * 64, pnl, t.head, t.batch);
            }
            tma_store_commit();
            // Non-persistent: the CTA exits next, so the smem must be read now.
            if constexpr (!T::kPersistent) tma_store_wait_read();
        }
    }
};

template <class T>
__device__ __forceinline__ void fwd(const Params& p, const int32_t* meta) {
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
        mbar_init(sm.q_full(), 1);
        mbar_init(sm.q_empty(), 128 * T::kWGs);  // all consumer threads arrive
        for (int s = 0; s < T::kStages; ++s) {
            mbar_init(sm.k_full(s), 1);
            mbar_init(sm.v_full(s), 1);
            mbar_init(sm.k_empty(s), T::kWGs);
            mbar_init(sm.v_empty(s), T::kWGs);
        }
        fence_mbar_init();
    }
    // Keep the meta table referenced (a never-true branch) so it stays in the cubin.
    if (p.kv_group == 0x7fffffff && meta[0] == 0) asm volatile("trap;\n");
    __syncthreads();

    const int num_tiles =
        T::kPersistent ? ((p.seqlen_q + T::kBlockM - 1) / T::kBlockM) * p.heads * p.batch : 1;
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
        int tile = blockIdx.x;
        for (int local = 0;; ++local) {
            if constexpr (T::kDynamic) {
                mbar_wait(sm.q_full(), local & 1);
                tile = static_cast<int>(ld_shared_u32(sm.tile_slot()));
                if (tile < 0) break;
            } else {
                if (T::kPersistent && tile >= num_tiles) break;
                mbar_wait(sm.q_full(), local & 1);
            }
            c.t = tile_info<T>(p, tile);
            c.run_tile();
            if constexpr (!T::kPersistent) break;
            if constexpr (!T::kDynamic) tile += gridDim.x;
        }
        if constexpr (T::kPingpong) {
            if (c.g == 0) named_sync(1, 256);  // the last WG's final arrival
        }
        if constexpr (T::kPersistent) {
            if (c.warp == 0 && c.lane == 0) tma_store_wait_all();
        }
    }
}

}  // namespace hopper
