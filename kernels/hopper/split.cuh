// Hopper family: split-KV (Traits::kSplits > 1). The key blocks of a tile are shared out
// among kSplits CTAs (tile_scheduler.cuh); each one's consumers write the fp32 partial
// O (normalised by its own row sums) and its LSE (log2 units) to Params::scratch; the
// last CTA of the tile to finish, told by an atomic counter per tile, combines them:
//   lse = log2(sum_s 2^lse_s),  O = sum_s 2^(lse_s - lse) O_s
// and writes O (the output's dtype, through o_ptr and its strides) and the natural-log
// LSE. It then puts the counter back to zero, so the scratch needs zeroing only once,
// when the host allocates it. Members of Consumer (consumer.cuh includes this file).
#pragma once

namespace hopper {

// Scratch layout (params.h): counters [B*H*m_blocks] int32, LSE partials [B, H, S, Sq],
// O partials [B, H, S, Sq, D]; each region starts 256-B aligned.
struct SplitScratch {
    int32_t* counters;
    float* lse;
    float* o;
};

__device__ __forceinline__ int64_t round256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

template <class T>
__device__ __forceinline__ SplitScratch split_scratch(const Params& p) {
    const int64_t m_blocks = (p.seqlen_q + T::kBlockM - 1) / T::kBlockM;
    const int64_t bh = static_cast<int64_t>(p.batch) * p.heads;
    auto* base = static_cast<uint8_t*>(p.scratch);
    SplitScratch s;
    s.counters = reinterpret_cast<int32_t*>(base);
    base += round256(bh * m_blocks * 4);
    s.lse = reinterpret_cast<float*>(base);
    base += round256(bh * T::kSplits * p.seqlen_q * 4);
    s.o = reinterpret_cast<float*>(base);
    return s;
}

// This warpgroup's rows of the partial: O / l (fp32) and log2-domain LSE (-inf when the
// share saw no key of the row).
template <class T>
__device__ __forceinline__ void Consumer<T>::store_partial() {
    const SplitScratch sc = split_scratch<T>(p);
    const int r_lo = warp * 16 + (lane >> 2);
    const int64_t part = (static_cast<int64_t>(t.batch) * p.heads + t.head) * T::kSplits + t.split;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float lsum = l[h];
        lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
        lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
        const float inv = lsum > 0.f ? 1.f / lsum : 0.f;
        const int row = t.m0 + g * 64 + r_lo + 8 * h;
        if (row >= t.seqlen_q) continue;
        const int64_t at = part * p.seqlen_q + row;
        if ((lane & 3) == 0) sc.lse[at] = lsum > 0.f ? ms[h] + __log2f(lsum) : -INFINITY;
        float* out = sc.o + at * D;
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
    const SplitScratch sc = split_scratch<T>(p);
    const int m_blocks = (p.seqlen_q + T::kBlockM - 1) / T::kBlockM;
    const int64_t bh = static_cast<int64_t>(t.batch) * p.heads + t.head;
    int32_t* counter = sc.counters + bh * m_blocks + t.m0 / T::kBlockM;
    __threadfence();   // this thread's partial is visible device-wide before the count
    named_sync(kBarrier, kConsumers);
    if (ctid == 0) {
        const int done = atomicAdd(counter, 1);
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
    const int64_t split_stride = static_cast<int64_t>(p.seqlen_q) * D;   // O partial of split s + 1
    auto* out = static_cast<typename T::Element*>(p.o_ptr);
    for (int row = t.m0 + ctid / 32; row < row_end; row += kConsumers / 32) {
        const float* lse_row = sc.lse + bh * T::kSplits * p.seqlen_q + row;   // split s at + s*Sq
        float v[kPerLane];
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < kPerLane; ++j) {
            const int s = 32 * j + lane;
            v[j] = s < T::kSplits ? __ldcg(lse_row + static_cast<int64_t>(s) * p.seqlen_q) : -INFINITY;
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
        const float* src = sc.o + (bh * T::kSplits * p.seqlen_q + row) * D + lane_col;
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
    if (ctid == 0) *counter = 0;   // as the host left it, for the next launch
}

}  // namespace hopper
