// Stage-0 unit test of the pieces the attention kernel is built from, with the
// same tensor-map encoding, descriptors and fragment mapping:
//   S = A B^T     SS-wgmma m64nNk16, A [64, D] and B [N, D] K-major, 128B swizzle
//   O = P V       RS-wgmma, P = fp16/bf16(S) from the S fragments, V [N, D] MN-major (trans-b)
// One warpgroup; thread 0 issues the TMA loads. Writes S and O (fp32, row-major).
#include "hopper/ptx.cuh"
#include "hopper/wgmma.cuh"
#include <cuda.h>

namespace {
struct alignas(128) GemmParams {
    CUtensorMap a, b, v;
    float* s_out;
    float* o_out;
};

template <int N, int D, int DT>
__device__ void gemm_test(const GemmParams& p) {
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    const uint32_t base = (hopper::smem_u32(smem_raw) + 1023u) & ~1023u;
    const uint32_t sa = base, sb = sa + 64 * D * 2, sv = sb + N * D * 2, bar = sv + N * D * 2;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    if (tid == 0) {
        hopper::mbar_init(bar, 1);
        hopper::fence_mbar_init();
    }
    __syncthreads();
    if (tid == 0) {
        hopper::mbar_arrive_expect_tx(bar, (64 + 2 * N) * D * 2);
        hopper::tma_load_5d(sa, &p.a, bar, 0, 0, 0, 0, 0);
        hopper::tma_load_5d(sb, &p.b, bar, 0, 0, 0, 0, 0);
        hopper::tma_load_5d(sv, &p.v, bar, 0, 0, 0, 0, 0);
    }
    hopper::mbar_wait(bar, 0);
    float s[N / 2];
    float o[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
    hopper::pin(s);
    hopper::wgmma_fence();
#pragma unroll
    for (int j = 0; j < D / 16; ++j) {
        const uint64_t da = hopper::make_desc(sa + (j / 4) * 64 * 128 + (j % 4) * 32, 16, 1024);
        const uint64_t db = hopper::make_desc(sb + (j / 4) * N * 128 + (j % 4) * 32, 16, 1024);
        hopper::Wgmma<N, DT>::ss(s, da, db, j > 0);
    }
    hopper::wgmma_commit();
    hopper::wgmma_wait<0>();
    hopper::pin(s);
    uint32_t pr[N / 4];
#pragma unroll
    for (int i = 0; i < N / 4; ++i) pr[i] = hopper::pack2<DT>(s[2 * i], s[2 * i + 1]);
    hopper::pin(o);
    hopper::pin(pr);
    hopper::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < N / 16; ++kk) {
        const uint32_t a[4] = {pr[4 * kk], pr[4 * kk + 1], pr[4 * kk + 2], pr[4 * kk + 3]};
        hopper::Wgmma<D, DT>::rs(o, a, hopper::make_desc(sv + kk * 2048, N * 128, 1024), 1);
    }
    hopper::wgmma_commit();
    hopper::wgmma_wait<0>();
    hopper::pin(o);
    const int r0 = warp * 16 + lane / 4;
#pragma unroll
    for (int i = 0; i < N / 2; ++i)
        p.s_out[(r0 + 8 * ((i >> 1) & 1)) * N + 8 * (i >> 2) + 2 * (lane & 3) + (i & 1)] = s[i];
#pragma unroll
    for (int i = 0; i < D / 2; ++i)
        p.o_out[(r0 + 8 * ((i >> 1) & 1)) * D + 8 * (i >> 2) + 2 * (lane & 3) + (i & 1)] = o[i];
}
}  // namespace

#define GT(N, D, DT, name) \
    extern "C" __global__ void __launch_bounds__(128, 1) name(const __grid_constant__ GemmParams p) { gemm_test<N, D, DT>(p); }
GT(128, 64, 0, gemm_n128_d64_f16)
GT(128, 128, 0, gemm_n128_d128_f16)
GT(128, 128, 1, gemm_n128_d128_bf16)
GT(64, 128, 0, gemm_n64_d128_f16)
GT(176, 128, 1, gemm_n176_d128_bf16)
GT(256, 64, 0, gemm_n256_d64_f16)
