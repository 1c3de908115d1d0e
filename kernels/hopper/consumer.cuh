// Hopper family: a consumer warpgroup (the mainloop's math). S = Q K^T by SS-wgmma (RS with
// Q_IN_REGS: Q's fragments read once per tile, load_q), the online softmax (softmax.cuh),
// O += P V by RS-wgmma with P in registers, the overlap and ping-pong schedules, causal block
// passing; the epilogue stores O and the LSE (epilogue.cuh).
#pragma once

#include "hopper/params.h"
#include "hopper/ptx.cuh"
#include "hopper/smem.cuh"
#include "hopper/tile_scheduler.cuh"
#include "hopper/traits.cuh"
#include "hopper/wgmma.cuh"

namespace hopper {

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
    uint32_t q_base;  // this WG's 64-row slab inside panel 0 of Q (TILE_OVERLAP: the current tile's buffer)
    uint32_t o_base;  // this WG's 64-row slab inside panel 0 of the O staging tile
    int kv;           // K/V ring iteration of this tile's first block

    float o[T::kORegs];
    uint32_t qr[T::kQRegs];   // Q_IN_REGS: this warpgroup's Q as wgmma A fragments (load_q)
    float m[2];     // running row max, raw score units (rows r and r+8 of this thread)
    float l[2];     // thread-partial row sums
    float ms[2];    // m * scale_log2 with -inf replaced by 0

    __device__ __forceinline__ Consumer(const Params& p_, const Smem<T>& sm_, int g_, int warp_, int lane_)
        : p(p_), sm(sm_), g(g_), warp(warp_), lane(lane_) {
        q_base = sm.q + g * 64 * 128;
        o_base = (T::kPersistent ? sm.o : sm.q) + g * 64 * 128;
        kv = 0;
    }

    // Q_IN_REGS: this warpgroup's 64 rows of Q (the tile at q_base, landed) into qr, the A
    // fragments of S = Q K^T's k16 steps. ldmatrix.x4 per step: lane l gives row 16*warp + l%16,
    // 16-byte chunk 2*(step%4) + l/16 of panel step/4, stored at chunk ^ (row%8) (128B swizzle;
    // the slab starts 1024-B aligned); matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15) come back as
    // a0..a3 in wgmma's A order. D=96: panel 1's zero-filled columns are never read.
    __device__ __forceinline__ void load_q() {
        if constexpr (T::kQInRegs) {
            const int r = warp * 16 + (lane & 15);
#pragma unroll
            for (int j = 0; j < T::kKStepsQK; ++j) {
                const int chunk = 2 * (j % 4) + (lane >> 4);
                uint32_t f[4];
                ldmatrix_x4(q_base + (j / 4) * T::kBlockM * 128 + r * 128 + ((chunk ^ (r & 7)) << 4), f);
#pragma unroll
                for (int i = 0; i < 4; ++i) qr[4 * j + i] = f[i];
            }
        }
    }

    __device__ __forceinline__ void issue_qk(float (&s)[T::kSRegs], int stage) {
        // Descriptors: one base each, k-step offsets added to the address field
        // (addresses stay < 256 KiB, so the 14-bit field cannot overflow). D=96: six k-steps,
        // the last two in panel 1's first 32 columns (its zero-filled 32 are never read).
        const uint64_t da0 = make_desc(q_base, 16, 1024);
        const uint64_t db0 = make_desc(sm.k_tile(stage), 16, 1024);
        pin(s);
        wgmma_fence();
#pragma unroll
        for (int j = 0; j < T::kKStepsQK; ++j) {
            const uint64_t db = db0 + static_cast<uint64_t>(((j / 4) * BN * 128 + (j % 4) * 32) >> 4);
            if constexpr (T::kQInRegs) {
                const uint32_t a[4] = {qr[4 * j], qr[4 * j + 1], qr[4 * j + 2], qr[4 * j + 3]};
                Wgmma<BN, DT>::rsk(s, a, db, j > 0 ? 1 : 0);
            } else {
                const uint64_t da = da0 + static_cast<uint64_t>(((j / 4) * T::kBlockM * 128 + (j % 4) * 32) >> 4);
                Wgmma<BN, DT>::ss(s, da, db, j > 0 ? 1 : 0);
            }
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
            Wgmma<T::kPvCols, DT>::rs(o, a, db, 1);   // N = D (96: 1.5 of V's 64-column panels)
        }
        wgmma_commit();
        pin(o);
    }

    // Mask (if kMasked), update the running max, exponentiate S in place and
    // accumulate the row sums. Returns the O rescale factors through `corr` (softmax.cuh).
    template <bool kMasked>
    __device__ __forceinline__ bool softmax(float (&s)[T::kSRegs], int n, float (&corr)[2]);
    __device__ __forceinline__ void rescale_o(const float (&corr)[2], bool update);
    __device__ __forceinline__ void to_p(const float (&s)[T::kSRegs], uint32_t (&pr)[T::kPRegs]);


    // This tile's sequence as the masked blocks and the epilogue need it: the problem's
    // lengths (constant bank) when dense; packed batches re-read their offsets there
    // (L1 hits) so no register holds them through the mainloop.
    __device__ __forceinline__ int kv_len() const {
        if constexpr (!T::kVarlen) return p.seqlen_k;
        return ld_global_nc_s32(p.cu_seqlens_k + t.batch + 1) - ld_global_nc_s32(p.cu_seqlens_k + t.batch);
    }
    __device__ __forceinline__ int q_first_row() const {
        if constexpr (!T::kVarlen) return 0;
        return ld_global_nc_s32(p.cu_seqlens_q + t.batch);
    }
    __device__ __forceinline__ int q_len(int first_row) const {
        if constexpr (!T::kVarlen) return p.seqlen_q;
        return ld_global_nc_s32(p.cu_seqlens_q + t.batch + 1) - first_row;
    }

    __device__ __forceinline__ void pp_sync() {
        if constexpr (T::kPingpong) named_sync(1 + g, 256);
    }
    // Every issue region ends with an arrival for the next WG; WG 0 got one up
    // front from the last WG and absorbs the last WG's final one at exit.
    __device__ __forceinline__ void pp_arrive() {
        if constexpr (T::kPingpong) named_arrive(1 + (g + 1) % T::kWGs, 256);
    }

    // Free a K/V stage: one arrival per warpgroup; CLUSTER=2 in both CTAs' barrier (the
    // stage is refilled by a load multicast to both).
    __device__ __forceinline__ void release(uint32_t bar) {
        if (warp == 0 && lane == 0) {
            if constexpr (T::kClustered) {
#pragma unroll
                for (int r = 0; r < T::kCluster; ++r) mbar_arrive_cluster(mapa_shared(bar, static_cast<uint32_t>(r)));
            } else {
                mbar_arrive(bar);
            }
        }
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
        const int n = t.n_top - 1 - it;
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
        const int n = t.n_top - 1 - it;
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
        pass_loads(it);
    }
    // Iteration `it`'s K and V released, each after its load landed.
    __device__ __forceinline__ void pass_loads(int it) {
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
    // (A split-KV share may lie wholly past this warpgroup's last row: all skipped.)
    __device__ __forceinline__ int causal_skip() const {
        if constexpr (T::kIsCausal) {
            const int last_row = min(t.m0 + g * 64 + 63, t.seqlen_q - 1);
            const int mine = min((t.seqlen_k + BN - 1) / BN, last_row / BN + 1);
            if constexpr (!T::kSplit) return t.n_blocks - mine;   // >= 0, < n_blocks (every row sees key 0)
            return min(t.n_blocks, max(0, t.n_top - mine));
        } else {
            return 0;
        }
    }

    // One tile: t and kv set by the caller, who has waited for q_full.
    __device__ __forceinline__ void run_tile() {
        if (t.m0 + g * 64 >= t.seqlen_q) {
            skip_tile();
            return;
        }
#pragma unroll
        for (int i = 0; i < T::kORegs; ++i) o[i] = 0.f;
        m[0] = m[1] = -INFINITY;
        l[0] = l[1] = 0.f;
        ms[0] = ms[1] = 0.f;
        if (T::kVarlen && t.n_blocks == 0) {   // a packed sequence with no keys: O = 0, LSE = -inf
            skip_tile();
            epilogue();
            return;
        }
        if constexpr (T::kSplit || T::kTailSplit) {
            // A share with no block this warpgroup sees: an empty partial (LSE -inf).
            if (t.n_blocks == 0 || causal_skip() >= t.n_blocks) {
                skip_tile();
                epilogue();
                return;
            }
        }

        float s[T::kSRegs];
        uint32_t pr[T::kPRegs];
        float corr[2];
        load_q();
        const int nb = t.n_blocks;
        // Iterations on blocks n >= n_unmasked (the first ones: blocks run downwards).
        const int n_masked_iters = T::kSplit || T::kTailSplit
                                       ? min(nb, max(0, t.n_top - max(t.n_unmasked, t.n_top - nb)))
                                       : nb - max(t.n_unmasked, 0);
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
            softmax_any(s, t.n_top - 1 - first, corr);
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

    // TILE_OVERLAP=1: every tile of this persistent CTA, the next tile's first Q K^T issued
    // once this tile's O is staged and computed under its store (tile_overlap.cuh).
    __device__ __forceinline__ void run_tiles_overlapped(int num_tiles);
    __device__ __forceinline__ int fetch_tile(int local, int num_tiles) const;

    // O / l -> this WG's staging slab -> TMA store; LSE (epilogue.cuh). Split-KV: the fp32
    // partial O and LSE to the scratch (split.cuh); SCHED 3's split tiles: tail_part_end.
    __device__ __forceinline__ void epilogue();
    __device__ __forceinline__ void epilogue_stage();
    __device__ __forceinline__ void epilogue_commit();
    __device__ __forceinline__ void store_partial();
    // Split-KV, after run_tile by every consumer thread of the CTA: count this CTA's share
    // done; the tile's last one combines the partials into O and the LSE (split.cuh).
    __device__ __forceinline__ void finish_split();
    // SCHED 3, a part of a split tile: this warp's rows' partial, or (the last part to arrive)
    // the combine of every part into O and the LSE (tail_split.cuh).
    __device__ __forceinline__ void tail_part_end();
};

}  // namespace hopper

#include "hopper/softmax.cuh"
#include "hopper/epilogue.cuh"
#include "hopper/split.cuh"
#include "hopper/tail_split.cuh"
#include "hopper/tile_overlap.cuh"
