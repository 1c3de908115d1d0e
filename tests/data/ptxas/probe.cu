// ptxas probe for the gate tests: NT threads, __launch_bounds__(NT, MINB).
// -DNT=1024 -DMINB=2 caps it at 32 registers, so its 64-float accumulator spills.
#include <stdint.h>
#ifndef MINB
#define MINB 1
#endif
#ifndef NT
#define NT 128
#endif
extern "C" __constant__ int32_t flashcore_meta[9] = {1,NT,0,0,0,0,0,0,MINB};
extern "C" __global__ void __launch_bounds__(NT, MINB) flashcore_fwd(float* out, const float* in, int n) {
    __shared__ float tile[NT];
    float acc[64];
    #pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = in[threadIdx.x * 64 + i];
    for (int j = 0; j < n; ++j) {
        #pragma unroll
        for (int i = 0; i < 64; ++i) acc[i] = acc[i] * acc[(i + 7) & 63] + in[j * 64 + i];
    }
    tile[threadIdx.x] = acc[0];
    __syncthreads();
    float s = 0.f;
    #pragma unroll
    for (int i = 0; i < 64; ++i) s += acc[i] * tile[(threadIdx.x + i) % NT];
    out[threadIdx.x] = s;
}
