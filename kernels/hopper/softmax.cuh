// Hopper family: the consumer's online softmax: the mask, the running row max and sum,
// exp2 (or its FMA emulation), the O rescale and S -> P packing. Members of Consumer
// (consumer.cuh includes this file after the class).
#pragma once


namespace hopper {

// Mask (if kMasked), update the running max, exponentiate S in place and
// accumulate the row sums. Returns the O rescale factors through `corr`.
template <class T>
template <bool kMasked>
__device__ __forceinline__ bool Consumer<T>::softmax(float (&s)[T::kSRegs], int n, float (&corr)[2]) {
    if constexpr (kMasked) {
        const int col0 = n * BN + 2 * (lane & 3);
        const int seqlen_k = kv_len();
        const int row0 = t.m0 + g * 64 + warp * 16 + (lane >> 2);
#pragma unroll
        for (int i = 0; i < T::kSRegs; ++i) {
            const int col = col0 + 8 * (i >> 2) + (i & 1);
            const int row = row0 + 8 * ((i >> 1) & 1);
            bool masked = col >= seqlen_k;
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

template <class T>
__device__ __forceinline__ void Consumer<T>::rescale_o(const float (&corr)[2], bool update) {
    if (T::kLazyRescale && !update) return;
#pragma unroll
    for (int i = 0; i < T::kORegs; ++i) o[i] *= corr[(i >> 1) & 1];
}

template <class T>
__device__ __forceinline__ void Consumer<T>::to_p(const float (&s)[T::kSRegs], uint32_t (&pr)[T::kPRegs]) {
#pragma unroll
    for (int i = 0; i < T::kPRegs; ++i) pr[i] = pack2<DT>(s[2 * i], s[2 * i + 1]);
}

}  // namespace hopper
