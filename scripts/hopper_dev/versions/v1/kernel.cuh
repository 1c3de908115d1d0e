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
    uint32_t q, k, v, bar;
    __device__ __forceinline__ uint32_t q_full() const { return bar; }
    __device__ __forceinline__ uint32_t k_full(int s) const { return bar + 8 * (1 + s); }
    __device__ __forceinline__ uint32_t k_empty(int s) const { return bar + 8 * (1 + T::kStages + s); }
    __device__ __forceinline__ uint32_t v_full(int s) const { return bar + 8 * (1 + 2 * T::kStages + s); }
    __device__ __forceinline__ uint32_t v_empty(int s) const { return bar + 8 * (1 + 3 * T::kStages + s); }
    __device__ __forceinline__ uint32_t k_tile(int s) const { return k + s * T::kKVBytes; }
    __device__ __forceinline__ uint32_t v_tile(int s) const { return v + s * T::kKVBytes; }
};

// Per-tile work: which key blocks, which of them need the mask.
struct TileInfo {
    int m0, n_blocks, n_unmasked;  // blocks n < n_unmasked need no mask
};

template <class T>
__device__ __forceinline__ TileInfo tile_info(const Params& p, int m_block) {
    TileInfo t;
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

template <class T>
__device__ __forceinline__ void producer(const Params& p, const Smem<T>& sm, const TileInfo& t, int head, int batch) {
    prefetch_tmap(&p.tm_q);
    prefetch_tmap(&p.tm_k);
    prefetch_tmap(&p.tm_v);
    mbar_arrive_expect_tx(sm.q_full(), T::kQBytes);
    tma_load_5d(sm.q, &p.tm_q, sm.q_full(), 0, t.m0, 0, head, batch);
    for (int it = 0; it < t.n_blocks; ++it) {
        const int n = t.n_blocks - 1 - it;
        const int s = it % T::kStages;
        const uint32_t ph = ((it / T::kStages) & 1) ^ 1;  // first round passes on a fresh barrier
        mbar_wait(sm.k_empty(s), ph);
        mbar_arrive_expect_tx(sm.k_full(s), T::kKVBytes);
        tma_load_5d(sm.k_tile(s), &p.tm_k, sm.k_full(s), 0, n * T::kBlockN, 0, head, batch);
        mbar_wait(sm.v_empty(s), ph);
        mbar_arrive_expect_tx(sm.v_full(s), T::kKVBytes);
        tma_load_5d(sm.v_tile(s), &p.tm_v, sm.v_full(s), 0, n * T::kBlockN, 0, head, batch);
    }
}

template <class T>
struct Consumer {
    static constexpr int DT = T::kDtype;
    static constexpr int BN = T::kBlockN;
    static constexpr int D = T::kHeadDim;

    const Params& p;  // the __grid_constant__ parameter itself
    const Smem<T> sm;
    const TileInfo t;
    int g;      // consumer warpgroup 0..kWGs-1
    int warp;   // warp in the warpgroup
    int lane;
    uint32_t q_base;  // this WG's 64-row slab inside panel 0 of Q

    float o[T::kORegs];
    float m[2];     // running row max, raw score units (rows r and r+8 of this thread)
    float l[2];     // thread-partial row sums
    float ms[2];    // m * scale_log2 with -inf replaced by 0

    __device__ __forceinline__ Consumer(const Params& p_, const Smem<T>& sm_, const TileInfo& t_, int g_, int warp_,
                                        int lane_)
        : p(p_), sm(sm_), t(t_), g(g_), warp(warp_), lane(lane_) {
        q_base = sm.q + g * 64 * 128;
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
    __device__ __forceinline__ void softmax(float (&s)[T::kSRegs], int n, float (&corr)[2]) {
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
            const float ms_new = (mx[h] == -INFINITY ? 0.f : mx[h]) * p.scale_log2;
            corr[h] = m[h] == -INFINITY ? 0.f : ex2(ms[h] - ms_new);  // no row data yet: l, o are 0
            m[h] = mx[h];
            ms[h] = ms_new;
            l[h] *= corr[h];
        }
#pragma unroll
        for (int i = 0; i < T::kSRegs; ++i) {
            const int h = (i >> 1) & 1;
            s[i] = ex2(fmaf(s[i], p.scale_log2, -ms[h]));
            l[h] += s[i];
        }
    }

    __device__ __forceinline__ void rescale_o(const float (&corr)[2]) {
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
    __device__ __forceinline__ void pp_arrive(bool last) {
        if constexpr (T::kPingpong) {
            // The last WG owes WG 0 no arrival after its final issue (WG 0 got one up front).
            if (!(last && g == T::kWGs - 1)) named_arrive(1 + (g + 1) % T::kWGs, 256);
        }
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
    }

    template <bool kMasked>
    __device__ __forceinline__ void overlap_step(float (&s)[T::kSRegs], uint32_t (&pr)[T::kPRegs], float (&corr)[2],
                                                 int it) {
        const int n = t.n_blocks - 1 - it;
        const int st = it % T::kStages;
        const uint32_t ph = (it / T::kStages) & 1;
        const int sp = (it - 1) % T::kStages;
        const uint32_t php = ((it - 1) / T::kStages) & 1;
        mbar_wait(sm.k_full(st), ph);
        mbar_wait(sm.v_full(sp), php);
        pp_sync();
        issue_qk(s, st);
        issue_pv(pr, sp);
        pp_arrive(false);
        wgmma_wait<1>();
        pin(s);
        release(sm.k_empty(st));
        softmax<kMasked>(s, n, corr);
        wgmma_wait<0>();
        pin(o);
        pin(pr);
        release(sm.v_empty(sp));
        rescale_o(corr);
        to_p(s, pr);
    }

    template <bool kMasked>
    __device__ __forceinline__ void plain_step(float (&s)[T::kSRegs], uint32_t (&pr)[T::kPRegs], float (&corr)[2],
                                               int it) {
        const int n = t.n_blocks - 1 - it;
        const int st = it % T::kStages;
        const uint32_t ph = (it / T::kStages) & 1;
        mbar_wait(sm.k_full(st), ph);
        issue_qk(s, st);
        wgmma_wait<0>();
        pin(s);
        release(sm.k_empty(st));
        softmax<kMasked>(s, n, corr);
        rescale_o(corr);
        to_p(s, pr);
        mbar_wait(sm.v_full(st), ph);
        issue_pv(pr, st);
        wgmma_wait<0>();
        pin(o);
        release(sm.v_empty(st));
    }

    __device__ __forceinline__ void run() {
#pragma unroll
        for (int i = 0; i < T::kORegs; ++i) o[i] = 0.f;
        m[0] = m[1] = -INFINITY;
        l[0] = l[1] = 0.f;
        ms[0] = ms[1] = 0.f;
        if constexpr (T::kPingpong) {
            if (g == T::kWGs - 1) named_arrive(1, 256);  // WG 0 issues first
        }
        mbar_wait(sm.q_full(), 0);

        float s[T::kSRegs];
        uint32_t pr[T::kPRegs];
        float corr[2];
        const int nb = t.n_blocks;
        if constexpr (!T::kOverlap) {
            const int n_masked_iters = nb - max(t.n_unmasked, 0);
            int it = 0;
            for (; it < n_masked_iters; ++it) plain_step<true>(s, pr, corr, it);
            for (; it < nb; ++it) plain_step<false>(s, pr, corr, it);
        } else {
            // Block 0: S only.
            mbar_wait(sm.k_full(0), 0);
            pp_sync();
            issue_qk(s, 0);
            pp_arrive(false);
            wgmma_wait<0>();
            pin(s);
            release(sm.k_empty(0));
            softmax_any(s, nb - 1, corr);
            to_p(s, pr);
            // Steady state: S of block it overlaps P V of block it-1. The masked
            // blocks (the first ones, descending order) get their own loop: no
            // branch between a wgmma's issue and its wait.
            const int n_masked_iters = nb - max(t.n_unmasked, 0);
            int it = 1;
            for (; it < n_masked_iters; ++it) overlap_step<true>(s, pr, corr, it);
            for (; it < nb; ++it) overlap_step<false>(s, pr, corr, it);
            // Last P V.
            const int sl = (nb - 1) % T::kStages;
            mbar_wait(sm.v_full(sl), ((nb - 1) / T::kStages) & 1);
            pp_sync();
            issue_pv(pr, sl);
            pp_arrive(true);
            wgmma_wait<0>();
            pin(o);
            release(sm.v_empty(sl));
        }
        epilogue();
    }

    // O / l -> this WG's Q slab (swizzled like TMA's layout) -> TMA store; LSE.
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
                const int bh = blockIdx.z * p.heads + blockIdx.y;
                p.lse[static_cast<int64_t>(bh) * p.seqlen_q + row] = lse;
            }
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
                const uint32_t addr = q_base + panel * T::kBlockM * 128 + r * 128 + chunk * 16 + (c % 8) * 2;
                st_shared_u32(addr, pack2<DT>(o[i + 2 * h] * inv[h], o[i + 2 * h + 1] * inv[h]));
            }
        }
        fence_proxy_async();
        named_sync(4 + g, 128);
        if (warp == 0 && lane == 0) {
#pragma unroll
            for (int pnl = 0; pnl < T::kPanels; ++pnl) {
                tma_store_5d(&p.tm_o, q_base + pnl * T::kBlockM * 128, 0, t.m0 + g * 64, pnl, blockIdx.y,
                             blockIdx.z);
            }
            tma_store_commit();
            tma_store_wait_read();
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
    sm.bar = base + T::kOffBar;

    const int tid = threadIdx.x;
    if (tid == 0) {
        mbar_init(sm.q_full(), 1);
        for (int s = 0; s < T::kStages; ++s) {
            mbar_init(sm.k_full(s), 1);
            mbar_init(sm.v_full(s), 1);
            mbar_init(sm.k_empty(s), T::kWGs);
            mbar_init(sm.v_empty(s), T::kWGs);
        }
        fence_mbar_init();
    }
    // Keep the meta table referenced (a never-true branch) so it stays in the cubin.
    if (p.reserved == 0x7fffffff && meta[0] == 0) asm volatile("trap;\n");
    __syncthreads();

    const int m_block = T::kIsCausal ? (gridDim.x - 1 - blockIdx.x) : blockIdx.x;  // causal: longest first
    const TileInfo t = tile_info<T>(p, m_block);
    // Warp-uniform in the compiler's eyes (shfl from lane 0): descriptors land in
    // uniform registers instead of being rebuilt per thread.
    const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
    if (wg == 0) {
        setmaxnreg_dec<T::kRegProd>();
        if (tid == 0) producer<T>(p, sm, t, blockIdx.y, blockIdx.z);
    } else {
        setmaxnreg_inc<T::kRegCons>();
        Consumer<T> c(p, sm, t, wg - 1, (tid % 128) / 32, tid % 32);
        c.run();
    }
}

}  // namespace hopper
