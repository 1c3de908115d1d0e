// Hopper family: split-KV (Traits::kSplits > 1). The key blocks of a tile are shared out
// among kSplits CTAs (tile_scheduler.cuh); each one's consumers write the fp32 partial
// O (normalised by its own row sums) and its LSE (log2 units) to Params::scratch; the
// last CTA of the tile to finish, told by an atomic counter per tile, combines them:
//   lse = log2(sum_s 2^lse_s),  O = sum_s 2^(lse_s - lse) O_s
// and writes O (the output's dtype, through o_ptr and its strides) and the natural-log
// LSE. It then puts the counter back to zero, so the scratch needs zeroing only once,
// when the host allocates it. SCHED 3's split tiles write the same partials (store_partial,
// partials_of) but settle them warp by warp (tail_split.cuh). Members of Consumer
// (consumer.cuh includes this file).
#pragma once

namespace hopper {

__device__ __forceinline__ int64_t round256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

// Where a tile's partials live: part s's LSE of row `row` (the tile's rows, as TileInfo counts
// them) at lse[s * stride + row], its O row at o + (s * stride + row) * D; its counter.
// Split-KV (params.h): counters [B*H*m_blocks] int32, LSE partials [B, H, S, Sq], O partials
// [B, H, S, Sq, D]. SCHED 3: counters [r, consumer warps, 2], LSE partials [r * parts, BLOCK_M],
// O partials [r * parts, BLOCK_M, D] (r split tiles), split tile `slot`'s part s in slot
// slot*parts + s (`counter`: the tile's first).
// Each region starts 256-B aligned.
struct Partials {
    int32_t* counter;
    float* lse;      // part 0, row 0 (row indices as TileInfo's: from the tile's m0 for SCHED 3)
    float* o;
    int64_t stride;  // rows from one part to the next
    __device__ __forceinline__ int64_t at(int s, int row) const { return s * stride + row; }
};

template <class T>
__device__ __forceinline__ Partials partials_of(const Params& p, const TileInfo& t) {
    auto* base = static_cast<uint8_t*>(p.scratch);
    Partials w;
    int64_t first;      // the index of part 0's row 0 in the LSE region
    int64_t counters;   // the counter region's and the LSE region's entries
    int64_t lse_rows;
    if constexpr (T::kTailSplit) {   // two counters per split tile and consumer warp (tail_split.cuh)
        const int64_t r = whole_tiles<T>(p) - p.tail_first;
        counters = r * 8 * T::kWGs;
        lse_rows = r * p.tail_parts * T::kBlockM;
        w.counter = reinterpret_cast<int32_t*>(base) + static_cast<int64_t>(t.slot) * 8 * T::kWGs;
        w.stride = T::kBlockM;
        first = static_cast<int64_t>(t.slot) * t.parts * T::kBlockM - t.m0;
    } else {
        const int64_t m_blocks = (p.seqlen_q + T::kBlockM - 1) / T::kBlockM;
        const int64_t bh = static_cast<int64_t>(t.batch) * p.heads + t.head;
        counters = static_cast<int64_t>(p.batch) * p.heads * m_blocks;
        lse_rows = static_cast<int64_t>(p.batch) * p.heads * T::kSplits * p.seqlen_q;
        w.counter = reinterpret_cast<int32_t*>(base) + bh * m_blocks + t.m0 / T::kBlockM;
        w.stride = p.seqlen_q;
        first = bh * T::kSplits * p.seqlen_q;
    }
    float* lse = reinterpret_cast<float*>(base + round256(counters * 4));
    float* o = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(lse) + round256(lse_rows * 4));
    w.lse = lse + first;
    w.o = o + first * T::kHeadDim;
    return w;
}

// This warpgroup's rows of the partial: O / l (fp32) and log2-domain LSE (-inf when the
// share saw no key of the row).
template <class T>
__device__ __forceinline__ void Consumer<T>::store_partial() {
    const Partials pw = partials_of<T>(p, t);
    const int r_lo = warp * 16 + (lane >> 2);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float lsum = l[h];
        lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
        lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
        const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
        const int row = t.m0 + g * 64 + r_lo + 8 * h;
        if (row >= t.seqlen_q) continue;
        const int64_t at = pw.at(t.split, row);
        if ((lane & 3) == 0) pw.lse[at] = lsum > 0.f ? ms[h] + __log2f(lsum) : -INFINITY;
        float* out = pw.o + at * D;
#pragma unroll
        for (int i = 0; i < T::kORegs; i += 4) {
            const int c = 8 * (i >> 2) + 2 * (lane & 3);
            if (T::kPvCols > D && c >= D) continue;   // HOPPER_PV_PADDED: D=96's zero columns
            *reinterpret_cast<float2*>(out + c) = make_float2(o[i + 2 * h] * inv, o[i + 2 * h + 1] * inv);
        }
    }
}

template <class T>
__device__ __forceinline__ void Consumer<T>::finish_split() {
    constexpr int kConsumers = 128 * T::kWGs;
    constexpr int kBarrier = 8;   // ids 1..3: ping-pong, 4..6: epilogue slabs
    const int ctid = g * 128 + warp * 32 + lane;
    const Partials pw = partials_of<T>(p, t);
    const int64_t bh = static_cast<int64_t>(t.batch) * p.heads + t.head;
    __threadfence();   // this thread's partial is visible device-wide before the count
    named_sync(kBarrier, kConsumers);
    if (ctid == 0) {
        const int done = atomicAdd(pw.counter, 1);
        st_shared_u32(sm.tile_slot(), done == T::kSplits - 1 ? 1u : 0u);
    }
    named_sync(kBarrier, kConsumers);
    if (ld_shared_u32(sm.tile_slot()) == 0) return;
    __threadfence();   // the other shares' partials (read below through L2: __ldcg)

    constexpr int kCols = D / 32;    // columns per lane: 4 (D=128), 3 (D=96) or 2 (D=64)
    // Lane l holds the LSE partials of splits l, l + 32, ...; the O partials are loaded
    // kChunk splits at a time, every load of a chunk in flight before the first is used (the
    // combine is a chain of L2 round trips otherwise: one per split and row).
    constexpr int kPerLane = (T::kSplits + 31) / 32;
    constexpr int kChunk = T::kSplits < 8 ? T::kSplits : 8;
    const int lane_col = lane * kCols;
    const int row_end = min(t.m0 + T::kBlockM, t.seqlen_q);
    const int64_t split_stride = pw.stride * D;   // O partial of split s + 1
    auto* out = static_cast<typename T::Element*>(p.o_ptr);
    for (int row = t.m0 + ctid / 32; row < row_end; row += kConsumers / 32) {
        const float* lse_row = pw.lse + row;   // split s at + s*Sq
        float v[kPerLane];
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < kPerLane; ++j) {
            const int s = 32 * j + lane;
            v[j] = s < T::kSplits ? __ldcg(lse_row + s * pw.stride) : -INFINITY;
            mx = fmaxf(mx, v[j]);
        }
#pragma unroll
        for (int d = 16; d > 0; d >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, d));
        float sum = 0.f;
        if (mx != -INFINITY) {
#pragma unroll
            for (int j = 0; j < kPerLane; ++j) sum += v[j] == -INFINITY ? 0.f : exp2f(v[j] - mx);
        }
#pragma unroll
        for (int d = 16; d > 0; d >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, d);
        const float lse = sum > 0.f ? mx + __log2f(sum) : -INFINITY;
        float w[kPerLane];   // each split's weight 2^(lse_s - lse); 0 for an empty share
#pragma unroll
        for (int j = 0; j < kPerLane; ++j) w[j] = sum > 0.f && v[j] != -INFINITY ? exp2f(v[j] - lse) : 0.f;
        float acc[kCols];
#pragma unroll
        for (int j = 0; j < kCols; ++j) acc[j] = 0.f;
        const float* src = pw.o + static_cast<int64_t>(row) * D + lane_col;
#pragma unroll
        for (int s0 = 0; s0 < T::kSplits; s0 += kChunk) {
            float x[kChunk][kCols];
#pragma unroll
            for (int u = 0; u < kChunk; ++u) {
                if (s0 + u >= T::kSplits) break;
                const float* at = src + (s0 + u) * split_stride;
                if constexpr (kCols == 4) {
                    const float4 q = __ldcg(reinterpret_cast<const float4*>(at));
                    x[u][0] = q.x; x[u][1] = q.y; x[u][2] = q.z; x[u][3] = q.w;
                } else if constexpr (kCols == 2) {
                    const float2 q = __ldcg(reinterpret_cast<const float2*>(at));
                    x[u][0] = q.x; x[u][1] = q.y;
                } else {   // D=96: 3 columns per lane, 4-byte aligned only
#pragma unroll
                    for (int j = 0; j < kCols; ++j) x[u][j] = __ldcg(at + j);
                }
            }
#pragma unroll
            for (int u = 0; u < kChunk; ++u) {
                const int s = s0 + u;
                if (s >= T::kSplits) break;
                const float ws = __shfl_sync(0xffffffffu, w[s / 32], s % 32);
                // an empty share's partial is never read into the sum (it may hold anything)
#pragma unroll
                for (int j = 0; j < kCols; ++j) acc[j] = ws != 0.f ? fmaf(ws, x[u][j], acc[j]) : acc[j];
            }
        }
        auto* dst = out + t.batch * p.o_batch_stride + t.head * p.o_head_stride + row * p.o_row_stride + lane_col;
        if constexpr (kCols % 2 != 0) {   // D=96: 3 columns per lane, 2-byte aligned: one store each
            auto* d16 = reinterpret_cast<uint16_t*>(dst);
#pragma unroll
            for (int j = 0; j < kCols; ++j) d16[j] = static_cast<uint16_t>(pack2<DT>(acc[j], 0.f) & 0xffffu);
        } else {
            uint32_t packed[kCols / 2];
#pragma unroll
            for (int j = 0; j < kCols / 2; ++j) packed[j] = pack2<DT>(acc[2 * j], acc[2 * j + 1]);
            if constexpr (kCols == 4) {
                *reinterpret_cast<uint2*>(dst) = make_uint2(packed[0], packed[1]);
            } else {
#pragma unroll
                for (int j = 0; j < kCols / 2; ++j) reinterpret_cast<uint32_t*>(dst)[j] = packed[j];
            }
        }
        if (p.lse != nullptr && lane == 0) p.lse[bh * p.seqlen_q + row] = lse * 0.69314718055994531f;
    }
    if (ctid == 0) *pw.counter = 0;   // as the host left it, for the next launch
}

}  // namespace hopper
