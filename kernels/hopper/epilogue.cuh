// Hopper family: the consumer's epilogue: the LSE and O / l into the warpgroup's swizzled
// staging slab (epilogue_stage), then the TMA store of its panels (epilogue_commit;
// TILE_OVERLAP issues the next tile's first Q K^T between the two). A member of Consumer (consumer.cuh
// includes this file after the class).
#pragma once


namespace hopper {

// O / l -> this WG's staging slab (swizzled like TMA's layout) -> TMA store; LSE.
template <class T>
__device__ __forceinline__ void Consumer<T>::epilogue() {
    if constexpr (T::kSplit) {   // a share's partial; finish_split writes O
        store_partial();
        return;
    }
    if constexpr (T::kTailSplit) {   // SCHED 3: a part of a split tile of the last wave
        if (__shfl_sync(0xffffffffu, t.parts, 0) > 1) {
            tail_part_end();
            return;
        }
    }
    epilogue_stage();
    epilogue_commit();
}

// The LSE, and O / l in 16 bit into this WG's staging slab (O's registers are free after it).
template <class T>
__device__ __forceinline__ void Consumer<T>::epilogue_stage() {
    float inv[2];
    const int q_row = q_first_row();      // the sequence's first row in the maps (packed; else 0)
    const int seqlen_q = q_len(q_row);
    const int r_lo = warp * 16 + (lane >> 2);  // row inside the WG's 64-row slab
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float lsum = l[h];
        lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
        lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
        inv[h] = lsum > 0.f ? 1.f / lsum : 0.f;
        const int row = t.m0 + g * 64 + r_lo + 8 * h;
        // (packed: rows outside the packed Q too, should the offsets overrun it)
        if (p.lse != nullptr && (lane & 3) == 0 && row < seqlen_q &&
            (!T::kVarlen || (q_row + row >= 0 && q_row + row < p.total_q))) {
            const float lse = lsum > 0.f ? (ms[h] + __log2f(lsum)) * 0.69314718055994531f : -INFINITY;
            const int64_t at = T::kVarlen
                                   ? static_cast<int64_t>(t.head) * p.total_q + q_row + row  // [H, total_q]
                                   : static_cast<int64_t>(t.batch * p.heads + t.head) * p.seqlen_q + row;
            p.lse[at] = lse;
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
}

// The staging slab (epilogue_stage) -> O: a TMA store of its panels (packed batches whose
// sequence ends inside the slab: a direct copy of its rows).
template <class T>
__device__ __forceinline__ void Consumer<T>::epilogue_commit() {
    const int q_row = q_first_row();
    const int seqlen_q = q_len(q_row);
    fence_proxy_async();
    named_sync(4 + g, 128);
    const int slab = t.m0 + g * 64;  // this WG's first row in its sequence
    if (T::kVarlen && slab + 64 > seqlen_q) {
        // Packed batch, the sequence ends inside this slab: a TMA store would write the
        // next sequence's rows. Every thread copies 16-byte chunks of the rows inside it.
        constexpr int kChunks = 64 * 8 * T::kPanels;
        auto* out = static_cast<uint16_t*>(p.o_ptr);
#pragma unroll 1
        for (int i = warp * 32 + lane; i < kChunks; i += 128) {   // (not unrolled: 160-register consumers)
            const int r = i / (8 * T::kPanels);
            const int pnl = (i / 8) % T::kPanels;
            const int ch = i % 8;
            const int grow = q_row + slab + r;   // offsets that overrun the packed O write nothing
            if (slab + r >= seqlen_q || grow < 0 || grow >= p.total_q) continue;
            if (T::kNarrow && pnl * 64 + ch * 8 >= D) continue;   // D=96: the padding columns
            const uint4 v = ld_shared_v4(o_base + pnl * T::kBlockM * 128 + r * 128 + ((ch ^ (r & 7)) * 16));
            const int64_t at = static_cast<int64_t>(grow) * p.o_row_stride +
                               static_cast<int64_t>(t.head) * p.o_head_stride + pnl * 64 + ch * 8;
            *reinterpret_cast<uint4*>(out + at) = v;
        }
        return;
    }
    if (warp == 0 && lane == 0) {
#pragma unroll
        for (int pnl = 0; pnl < T::kPanels; ++pnl) {
            // D=96: the map's inner extent is 96, the panel at x = 64 is clipped to 32 columns
            tma_store_5d(&p.tm_o, o_base + pnl * T::kBlockM * 128, T::kNarrow ? 64 * pnl : 0, q_row + slab,
                         T::kNarrow ? 0 : pnl, t.head, T::kVarlen ? 0 : t.batch);
        }
        tma_store_commit();
        // Non-persistent: the CTA exits next, so the smem must be read now.
        if constexpr (!T::kPersistent) tma_store_wait_read();
    }
}

}  // namespace hopper
