// FlashCore forward: one instantiation per config (the evotuner build contract).
//
// The build stage writes a tiny .cu that #defines the problem's static part and
// one FLASHCORE_<NAME> per search-space parameter, then includes this file
// (include root = kernels/):
//
//   #define FLASHCORE_HEAD_DIM 64      // 32, 64, 96, 128, 256
//   #define FLASHCORE_IS_CAUSAL 0      // 0 / 1 (top-left, like SDPA's is_causal)
//   #define FLASHCORE_DTYPE 0          // 0 fp16, 1 bf16
//   #define FLASHCORE_BLOCK_M 128
//   #define FLASHCORE_BLOCK_N 64
//   #define FLASHCORE_NUM_WARPS 4
//   #define FLASHCORE_STAGES 2
//   #define FLASHCORE_MIN_BLOCKS 1
//   #include "flashcore/instantiate.cuh"
//
// It defines
//   extern "C" __global__ void FLASHCORE_KERNEL_NAME(const __grid_constant__ flashcore::Params)
//   extern "C" { __constant__ int32_t FLASHCORE_META_NAME[FLASHCORE_META_LEN]; }
// (defaults flashcore_fwd / flashcore_meta). Every FLASHCORE_* macro is #undef'd at
// the end, so one translation unit may define and include several configs, each
// with its own FLASHCORE_KERNEL_NAME and FLASHCORE_META_NAME.
//
// Optional FLASHCORE_FAULT (tests of the measure stage; 0 or undefined = none, and
// then no fault code is compiled at all):
//   1 illegal memory access   2 hang (spins forever)   3 NaN output
//   4 wrong result (x1.5)     5 meta reports 300 KiB shared memory (launch must fail)
//   6 meta reports 2048 threads (cuLaunchKernel rejects the block)
#include "flashcore/kernel.cuh"

#ifndef FLASHCORE_HEAD_DIM
#error "FLASHCORE_HEAD_DIM is not defined: #define it (32, 64, 96, 128 or 256) before including flashcore/instantiate.cuh"
#endif
#ifndef FLASHCORE_IS_CAUSAL
#error "FLASHCORE_IS_CAUSAL is not defined: #define it (0 or 1) before including flashcore/instantiate.cuh"
#endif
#ifndef FLASHCORE_DTYPE
#error "FLASHCORE_DTYPE is not defined: #define it (0 fp16, 1 bf16) before including flashcore/instantiate.cuh"
#endif
#ifndef FLASHCORE_BLOCK_M
#error "FLASHCORE_BLOCK_M is not defined: the space parameter BLOCK_M must be #defined (e.g. 128)"
#endif
#ifndef FLASHCORE_BLOCK_N
#error "FLASHCORE_BLOCK_N is not defined: the space parameter BLOCK_N must be #defined (e.g. 64)"
#endif
#ifndef FLASHCORE_NUM_WARPS
#error "FLASHCORE_NUM_WARPS is not defined: the space parameter NUM_WARPS must be #defined (e.g. 4)"
#endif
#ifndef FLASHCORE_STAGES
#error "FLASHCORE_STAGES is not defined: the space parameter STAGES must be #defined (1, 2 or 3)"
#endif
#ifndef FLASHCORE_MIN_BLOCKS
#error "FLASHCORE_MIN_BLOCKS is not defined: the space parameter MIN_BLOCKS must be #defined (e.g. 1)"
#endif
// Optional knob (a space may tune it): -1 auto, 0 Q re-read from shared memory, 1 Q in registers.
#ifndef FLASHCORE_Q_IN_REGS
#define FLASHCORE_Q_IN_REGS -1
#endif
#ifndef FLASHCORE_KERNEL_NAME
#define FLASHCORE_KERNEL_NAME flashcore_fwd
#endif
#ifndef FLASHCORE_META_NAME
#define FLASHCORE_META_NAME flashcore_meta
#endif
#ifndef FLASHCORE_FAULT
#define FLASHCORE_FAULT 0
#endif

#if FLASHCORE_DTYPE == 0
#define FLASHCORE_ELEMENT_ __half
#elif FLASHCORE_DTYPE == 1
#define FLASHCORE_ELEMENT_ __nv_bfloat16
#else
#error "FLASHCORE_DTYPE must be 0 (fp16) or 1 (bf16)"
#endif
#if FLASHCORE_IS_CAUSAL != 0 && FLASHCORE_IS_CAUSAL != 1
#error "FLASHCORE_IS_CAUSAL must be 0 or 1"
#endif
#if FLASHCORE_FAULT < 0 || FLASHCORE_FAULT > 6
#error "FLASHCORE_FAULT must be 0..6"
#endif

#define FLASHCORE_CAT2_(a, b) a##b
#define FLASHCORE_CAT_(a, b) FLASHCORE_CAT2_(a, b)
#define FLASHCORE_TRAITS_ FLASHCORE_CAT_(FLASHCORE_KERNEL_NAME, _traits)

using FLASHCORE_TRAITS_ =
    flashcore::Traits<FLASHCORE_HEAD_DIM, FLASHCORE_BLOCK_M, FLASHCORE_BLOCK_N, FLASHCORE_NUM_WARPS, FLASHCORE_STAGES,
                      FLASHCORE_MIN_BLOCKS, FLASHCORE_IS_CAUSAL != 0, FLASHCORE_ELEMENT_, FLASHCORE_Q_IN_REGS>;

// The braces matter: `extern "C" __constant__ T x[] = {...}` (no braces) is only a
// declaration on the host side of `nvcc -c` (host + device, as the torch extension is
// built), so the host stub's reference stayed undefined (`nm`: U flashcore_meta_<i>).
// Inside a linkage block it is a definition on both sides; the cubin still holds the
// plain symbol flashcore_meta (readelf -sW).
extern "C" {
__constant__ int32_t FLASHCORE_META_NAME[FLASHCORE_META_LEN] = {
    FLASHCORE_ABI_VERSION,                                                 // FLASHCORE_META_ABI
    FLASHCORE_FAULT == 6 ? 2048 : FLASHCORE_TRAITS_::kThreads,             // FLASHCORE_META_THREADS
    FLASHCORE_FAULT == 5 ? 300 * 1024 : FLASHCORE_TRAITS_::kSmemBytes,     // FLASHCORE_META_SMEM_BYTES
    FLASHCORE_TRAITS_::kHeadDim,                                           // FLASHCORE_META_HEAD_DIM
    FLASHCORE_TRAITS_::kIsCausal ? 1 : 0,                                  // FLASHCORE_META_IS_CAUSAL
    FLASHCORE_TRAITS_::kDtype,                                             // FLASHCORE_META_DTYPE
    FLASHCORE_TRAITS_::kMinBlocks,                                         // FLASHCORE_META_MIN_BLOCKS
    FLASHCORE_TRAITS_::kBlockM,                                            // FLASHCORE_META_BLOCK_M
    FLASHCORE_TRAITS_::kBlockN,                                            // FLASHCORE_META_BLOCK_N
};
static_assert(FLASHCORE_META_LEN == 9 && FLASHCORE_META_BLOCK_M == 7, "flashcore_meta: update the table above");
}

extern "C" __global__ void __launch_bounds__(FLASHCORE_TRAITS_::kThreads, FLASHCORE_TRAITS_::kMinBlocks)
    FLASHCORE_KERNEL_NAME(const __grid_constant__ flashcore::Params params) {
    flashcore::fwd<FLASHCORE_TRAITS_, FLASHCORE_FAULT>(params, FLASHCORE_META_NAME);
}

#undef FLASHCORE_TRAITS_
#undef FLASHCORE_CAT_
#undef FLASHCORE_CAT2_
#undef FLASHCORE_ELEMENT_
#undef FLASHCORE_HEAD_DIM
#undef FLASHCORE_IS_CAUSAL
#undef FLASHCORE_DTYPE
#undef FLASHCORE_BLOCK_M
#undef FLASHCORE_BLOCK_N
#undef FLASHCORE_NUM_WARPS
#undef FLASHCORE_STAGES
#undef FLASHCORE_MIN_BLOCKS
#undef FLASHCORE_Q_IN_REGS
#undef FLASHCORE_KERNEL_NAME
#undef FLASHCORE_META_NAME
#undef FLASHCORE_FAULT
#undef FLASHCORE_RESCALE_LOG2
