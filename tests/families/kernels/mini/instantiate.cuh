// mini: a tiny real attention kernel, one query row per thread, online softmax in fp32,
// fp16 only. The build stage defines MINI_HEAD_DIM, MINI_IS_CAUSAL, MINI_DTYPE and one
// MINI_<NAME> per space parameter (ROWS, UNROLL, PERSISTENT), then includes this file.
#pragma once

#include <cuda_fp16.h>

#include "mini/params.h"

#if !defined(MINI_HEAD_DIM) || !defined(MINI_IS_CAUSAL) || !defined(MINI_DTYPE)
#error "mini: MINI_HEAD_DIM, MINI_IS_CAUSAL and MINI_DTYPE must be defined"
#endif
#if !defined(MINI_ROWS) || !defined(MINI_UNROLL) || !defined(MINI_PERSISTENT)
#error "mini: the space parameters ROWS, UNROLL and PERSISTENT must be defined"
#endif
#ifndef MINI_KERNEL_NAME
#define MINI_KERNEL_NAME mini_attention
#endif
#ifndef MINI_META_NAME
#define MINI_META_NAME mini_meta
#endif

static_assert(MINI_DTYPE == EVOTUNER_DTYPE_FP16, "mini: fp16 only");
static_assert(MINI_HEAD_DIM == 32 || MINI_HEAD_DIM == 64, "mini: HEAD_DIM must be 32 or 64");
static_assert(MINI_ROWS % 32 == 0 && MINI_ROWS >= 32 && MINI_ROWS <= 256, "mini: ROWS must be 32..256, a multiple of 32");
static_assert(MINI_UNROLL >= 1 && MINI_UNROLL <= 8, "mini: UNROLL must be 1..8");
static_assert(MINI_PERSISTENT == 0 || MINI_PERSISTENT == 1, "mini: PERSISTENT must be 0 or 1");

extern "C" {
__constant__ int32_t MINI_META_NAME[MINI_META_LEN] = {
    EVOTUNER_ABI_VERSION, MINI_ROWS, 0, MINI_HEAD_DIM, MINI_IS_CAUSAL, MINI_DTYPE, 1,  // common
    MINI_ROWS, MINI_PERSISTENT,                                                        // MINI_META_ROWS, _PERSISTENT
};
}

extern "C" __global__ void __launch_bounds__(MINI_ROWS, 1)
MINI_KERNEL_NAME(const __grid_constant__ mini::Params p, const float scale) {
    constexpr int D = MINI_HEAD_DIM;
    constexpr int kUnroll = MINI_UNROLL;
    const int row_tiles = (p.seqlen_q + MINI_ROWS - 1) / MINI_ROWS;
    // PERSISTENT: a 1-D grid (a few blocks per SM) strides over every tile;
    // else one block per (row tile, head, batch).
    int tile = MINI_PERSISTENT ? blockIdx.x : blockIdx.x + row_tiles * (blockIdx.y + p.heads * blockIdx.z);
    const int step = MINI_PERSISTENT ? gridDim.x : p.tiles;
    for (; tile < p.tiles; tile += step) {
        const int t = tile % row_tiles, h = (tile / row_tiles) % p.heads, b = tile / (row_tiles * p.heads);
        const int row = t * MINI_ROWS + threadIdx.x;
        if (row >= p.seqlen_q) continue;
        const __half* q = static_cast<const __half*>(p.q) + b * p.q_batch + h * p.q_head + row * p.q_row;
        const __half* k = static_cast<const __half*>(p.k) + b * p.k_batch + h * p.k_head;
        const __half* v = static_cast<const __half*>(p.v) + b * p.v_batch + h * p.v_head;
        float qr[D], acc[D];
#pragma unroll
        for (int d = 0; d < D; ++d) { qr[d] = __half2float(q[d]) * scale; acc[d] = 0.f; }
        float m = -INFINITY, l = 0.f;
        const int keys = MINI_IS_CAUSAL ? min(p.seqlen_k, row + 1) : p.seqlen_k;
#pragma unroll kUnroll
        for (int j = 0; j < keys; ++j) {
            float s = 0.f;
#pragma unroll
            for (int d = 0; d < D; ++d) s += qr[d] * __half2float(k[j * p.k_row + d]);
            const float m2 = fmaxf(m, s), c = __expf(m - m2), e = __expf(s - m2);
            l = l * c + e;
#pragma unroll
            for (int d = 0; d < D; ++d) acc[d] = acc[d] * c + e * __half2float(v[j * p.v_row + d]);
            m = m2;
        }
        __half* o = static_cast<__half*>(p.o) + b * p.o_batch + h * p.o_head + row * p.o_row;
#pragma unroll
        for (int d = 0; d < D; ++d) o[d] = __float2half(keys > 0 ? acc[d] / l : 0.f);
    }
    if (p.seqlen_q < 0) reinterpret_cast<volatile int32_t*>(p.o)[0] = MINI_META_NAME[0];  // keep the table
}

#undef MINI_HEAD_DIM
#undef MINI_IS_CAUSAL
#undef MINI_DTYPE
#undef MINI_ROWS
#undef MINI_UNROLL
#undef MINI_PERSISTENT
#undef MINI_KERNEL_NAME
#undef MINI_META_NAME
