// Hopper family: the end of a part of a split tile (SCHED 3, the last wave split:
// tile_scheduler.cuh). Each consumer warp settles its own 16 rows, with no CTA-wide step:
//   - it counts itself in at its rows' arrival counter (one per split tile and warp);
//   - all but the last part to arrive write their fp32 partial (O / l and the log2 LSE, as
//     split-KV's shares do: split.cuh store_partial), fence, and count it stored;
//   - the last one waits until the others' partials are stored (they have arrived, so they are
//     running), then combines them with its own O, still in registers, and writes O and the LSE:
//       lse = log2(2^lse_own + sum_s 2^lse_s),  O = 2^(lse_own - lse) O_own / l + sum_s 2^(lse_s - lse) O_s
//     and puts both counters back to zero for the next launch.
// The combine reads every other part's partial at this thread's own fragment positions, so each
// thread has its rows' loads of a part in flight at once, and the last part stores no partial.
// Members of Consumer (consumer.cuh includes this file after the class).
#pragma once

namespace hopper {

__device__ __forceinline__ int ld_volatile_s32(const int32_t* ptr) {
    int v;
    asm volatile("ld.volatile.global.s32 %0, [%1];\n" : "=r"(v) : "l"(ptr) : "memory");
    return v;
}

template <class T>
__device__ __forceinline__ void Consumer<T>::tail_part_end() {
    const Partials pw = partials_of<T>(p, t);
    // Warp-uniform in the compiler's eyes (from lane 0), as kernel.cuh's warpgroup index.
    const int parts = __shfl_sync(0xffffffffu, t.parts, 0);
    const int wid = __shfl_sync(0xffffffffu, g * 4 + warp, 0);
    int32_t* arrived = pw.counter + 2 * wid;
    int32_t* stored = arrived + 1;
    int order = 0;
    if (lane == 0) order = atomicAdd(arrived, 1);
    order = __shfl_sync(0xffffffffu, order, 0);
    if (order < parts - 1) {
        store_partial();
        __threadfence();   // the partial is visible device-wide before it is counted
        __syncwarp();
        if (lane == 0) atomicAdd(stored, 1);
        return;
    }
    if (lane == 0) {
        while (ld_volatile_s32(stored) < parts - 1) __nanosleep(32);
    }
    __syncwarp();
    __threadfence();   // the others' partials (read below through L2: __ldcg)

    const int r_lo = warp * 16 + (lane >> 2);
    const int64_t bh = static_cast<int64_t>(t.batch) * p.heads + t.head;
    auto* out = static_cast<typename T::Element*>(p.o_ptr);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int row = t.m0 + g * 64 + r_lo + 8 * h;
        float lsum = l[h];
        lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
        lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
        if (row >= t.seqlen_q) continue;   // (the quad's four lanes hold the same row)
        const float own = lsum > 0.f ? ms[h] + __log2f(lsum) : -INFINITY;
        float lse_s[T::kTailParts];
        float mx = own;
#pragma unroll
        for (int s = 0; s < T::kTailParts; ++s) {
            lse_s[s] = s < parts && s != t.split ? __ldcg(pw.lse + pw.at(s, row)) : -INFINITY;
            mx = fmaxf(mx, lse_s[s]);
        }
        float sum = 0.f;
        if (mx != -INFINITY) {
            sum = own == -INFINITY ? 0.f : exp2f(own - mx);
#pragma unroll
            for (int s = 0; s < T::kTailParts; ++s) sum += lse_s[s] == -INFINITY ? 0.f : exp2f(lse_s[s] - mx);
        }
        const float lse = sum > 0.f ? mx + __log2f(sum) : -INFINITY;
        // O_own / l weighted, then each other part's (an empty one weighs 0; its partial rows
        // were written, as zeros, so they are read without a branch between the loads).
        const float w_own = sum > 0.f && own != -INFINITY ? exp2f(own - lse) / lsum : 0.f;
#pragma unroll
        for (int i = 0; i < T::kORegs; i += 4) {
            o[i + 2 * h] *= w_own;
            o[i + 2 * h + 1] *= w_own;
        }
#pragma unroll
        for (int s = 0; s < T::kTailParts; ++s) {
            if (s >= parts || s == t.split) continue;
            const float ws = sum > 0.f && lse_s[s] != -INFINITY ? exp2f(lse_s[s] - lse) : 0.f;
            const float* src = pw.o + pw.at(s, row) * D;
#pragma unroll
            for (int i = 0; i < T::kORegs; i += 4) {
                const int c = 8 * (i >> 2) + 2 * (lane & 3);
                if (T::kPvCols > D && c >= D) continue;   // HOPPER_PV_PADDED: D=96's zero columns
                const float2 x = __ldcg(reinterpret_cast<const float2*>(src + c));
                o[i + 2 * h] = fmaf(ws, x.x, o[i + 2 * h]);
                o[i + 2 * h + 1] = fmaf(ws, x.y, o[i + 2 * h + 1]);
            }
        }
        auto* dst = out + t.batch * p.o_batch_stride + t.head * p.o_head_stride + row * p.o_row_stride;
#pragma unroll
        for (int i = 0; i < T::kORegs; i += 4) {
            const int c = 8 * (i >> 2) + 2 * (lane & 3);
            if (T::kPvCols > D && c >= D) continue;
            *reinterpret_cast<uint32_t*>(dst + c) = pack2<DT>(o[i + 2 * h], o[i + 2 * h + 1]);
        }
        if (p.lse != nullptr && (lane & 3) == 0) p.lse[bh * p.seqlen_q + row] = lse * 0.69314718055994531f;
    }
    if (lane == 0) {   // every other part has counted its partial stored: nothing reads these now
        *arrived = 0;
        *stored = 0;
    }
}

}  // namespace hopper
