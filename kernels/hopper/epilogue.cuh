// Hopper family: the consumer's epilogue: O / l into the warpgroup's swizzled staging
// slab, the TMA store of its panels, and the LSE. A member of Consumer (consumer.cuh
// includes this file after the class).
#pragma once


namespace hopper {

// O / l -> this WG's staging slab (swizzled like TMA's layout) -> TMA store; LSE.
template <class T>
__device__ __forceinline__ void Consumer<T>::epilogue() {
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

}  // namespace hopper
