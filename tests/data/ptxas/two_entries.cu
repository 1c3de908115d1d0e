// Two entries and a non-inlined device function: the parser must pick flashcore_fwd's block.
#include <stdint.h>
extern "C" __constant__ int32_t flashcore_meta[9] = {1,128,0,0,0,0,0,0,1};
extern "C" __global__ void __launch_bounds__(128, 1) flashcore_fwd(float* out, const float* in, int n) {
    __shared__ float tile[256];
    extern __shared__ float dyn[];
    float acc[48];
    #pragma unroll
    for (int i = 0; i < 48; ++i) acc[i] = in[threadIdx.x * 48 + i];
    for (int j = 0; j < n; ++j) {
        #pragma unroll
        for (int i = 0; i < 48; ++i) acc[i] = acc[i] * acc[(i + j) % 48 == 0 ? 0 : i] + in[j * 48 + i];
    }
    tile[threadIdx.x] = acc[0]; dyn[threadIdx.x] = acc[1];
    __syncthreads();
    float s = 0.f;
    #pragma unroll
    for (int i = 0; i < 48; ++i) s += acc[i];
    out[threadIdx.x] = s + tile[(threadIdx.x + 1) % 128] + dyn[threadIdx.x];
}
__device__ __noinline__ float helper(float x, int n) { float a[8]; for (int i = 0; i < 8; ++i) a[i] = x * i; return a[n & 7]; }
extern "C" __global__ void other_kernel(float* out, int n) { out[threadIdx.x] = helper(1.f, n); }
