// Hopper family forward: one instantiation per config (the evotuner build contract).
//
// The build stage writes a tiny .cu (include root = kernels/):
//
//   #define HOPPER_HEAD_DIM 128      // 64, 96, 128, 192, 256 (96: tiles padded to 128 columns)
//   #define HOPPER_IS_CAUSAL 0       // 0 / 1 (top-left, SDPA's is_causal)
//   #define HOPPER_DTYPE 0           // 0 fp16, 1 bf16
//   #define HOPPER_BLOCK_N 128       // 16..256 step 16
//   #define HOPPER_CONSUMER_WGS 2    // 1..3; BLOCK_M = 64*CONSUMER_WGS
//   #define HOPPER_STAGES 2          // K/V ring depth, 1..8
//   #define HOPPER_REG_PROD 24       // setmaxnreg of the producer WG
//   #define HOPPER_REG_CONS 240      // setmaxnreg of each consumer WG
//   #define HOPPER_OVERLAP 1         // S(n+1) = QK^T issued before softmax(n) retires PV(n)
//   #define HOPPER_PINGPONG 1        // consumer WGs take turns issuing their GEMMs
//   #define HOPPER_SCHED 0           // 0 one CTA per tile, 1 persistent static, 2 persistent dynamic (grid = min(#SMs, tiles)),
//                                    // 3 dynamic with the last wave split (non-causal dense)
//   #define HOPPER_RESCALE_LOG2 0    // optional (default 0 = eager O rescale); 8 = lazy rescale
//   #define HOPPER_EXP_EMU 0         // optional (default 0); k >= 2: 1 exp2 in k by FMA polynomial
//   #define HOPPER_VARLEN 0          // optional (default 0); 1: packed variable-length batches (a problem property)
//   #define HOPPER_SPLITS 1          // optional (default 1); k > 1: split-KV over k CTAs per tile (needs SCHED 0)
//   #define HOPPER_PACK_GQA 0        // optional (default 0); 1: the host packs a K/V head's query heads into one
//   #define HOPPER_CTAS_PER_SM 1     // optional (default 1); 2: two CTAs per SM (__launch_bounds__ min blocks)
//   #define HOPPER_CLUSTER 1         // optional (default 1); 2: CTA pairs along M share K/V loads (__cluster_dims__)
//   #define HOPPER_TILE_OVERLAP 0    // optional (default 0); 1: the next tile's first QK^T under this one's epilogue
//   #define HOPPER_Q_IN_REGS 0       // optional (default 0); 1: S = Q K^T with Q in registers (RS-wgmma)
//   #include "hopper/instantiate.cuh"
//
// Optional: HOPPER_BLOCK_M (if given it must equal 64*CONSUMER_WGS), HOPPER_PV_PADDED (dev
// switch, default 0: 1 makes D=96's PV wgmma N=128 over the zero-padded V columns),
// HOPPER_KERNEL_NAME (default hopper_fwd), HOPPER_META_NAME (default hopper_meta).
// Every HOPPER_* macro is #undef'd at the end (one TU may hold several configs).
#include "hopper/kernel.cuh"

#ifndef HOPPER_HEAD_DIM
#error "HOPPER_HEAD_DIM is not defined: #define it (64, 96, 128, 192 or 256) before including hopper/instantiate.cuh"
#endif
#ifndef HOPPER_IS_CAUSAL
#error "HOPPER_IS_CAUSAL is not defined: #define it (0 or 1)"
#endif
#ifndef HOPPER_DTYPE
#error "HOPPER_DTYPE is not defined: #define it (0 fp16, 1 bf16)"
#endif
#ifndef HOPPER_BLOCK_N
#error "HOPPER_BLOCK_N is not defined: the space parameter BLOCK_N must be #defined (e.g. 128)"
#endif
#ifndef HOPPER_CONSUMER_WGS
#error "HOPPER_CONSUMER_WGS is not defined: the space parameter CONSUMER_WGS must be #defined (1, 2 or 3)"
#endif
#ifndef HOPPER_STAGES
#error "HOPPER_STAGES is not defined: the space parameter STAGES must be #defined (e.g. 2)"
#endif
#ifndef HOPPER_REG_PROD
#error "HOPPER_REG_PROD is not defined: the space parameter REG_PROD must be #defined (e.g. 24)"
#endif
#ifndef HOPPER_REG_CONS
#error "HOPPER_REG_CONS is not defined: the space parameter REG_CONS must be #defined (e.g. 240)"
#endif
#ifndef HOPPER_OVERLAP
#error "HOPPER_OVERLAP is not defined: the space parameter OVERLAP must be #defined (0 or 1)"
#endif
#ifndef HOPPER_PINGPONG
#error "HOPPER_PINGPONG is not defined: the space parameter PINGPONG must be #defined (0 or 1)"
#endif
#ifndef HOPPER_SCHED
#error "HOPPER_SCHED is not defined: the space parameter SCHED must be #defined (0, 1, 2 or 3)"
#endif
#if defined(HOPPER_BLOCK_M) && HOPPER_BLOCK_M != 64 * HOPPER_CONSUMER_WGS
#error "HOPPER_BLOCK_M must equal 64*HOPPER_CONSUMER_WGS (each consumer warpgroup owns 64 query rows)"
#endif
#ifndef HOPPER_RESCALE_LOG2
#define HOPPER_RESCALE_LOG2 0
#endif
#ifndef HOPPER_EXP_EMU
#define HOPPER_EXP_EMU 0
#endif
#ifndef HOPPER_SPLITS
#define HOPPER_SPLITS 1
#endif
#ifndef HOPPER_PACK_GQA
#define HOPPER_PACK_GQA 0
#endif
#ifndef HOPPER_CTAS_PER_SM
#define HOPPER_CTAS_PER_SM 1
#endif
#ifndef HOPPER_CLUSTER
#define HOPPER_CLUSTER 1
#endif
#ifndef HOPPER_TILE_OVERLAP
#define HOPPER_TILE_OVERLAP 0
#endif
#ifndef HOPPER_Q_IN_REGS
#define HOPPER_Q_IN_REGS 0
#endif
#if HOPPER_CLUSTER != 1 && HOPPER_CLUSTER != 2
#error "HOPPER_CLUSTER must be 1 (off) or 2 (CTA pairs sharing K/V loads)"
#endif
#ifndef HOPPER_KERNEL_NAME
#define HOPPER_KERNEL_NAME hopper_fwd
#endif
#ifndef HOPPER_META_NAME
#define HOPPER_META_NAME hopper_meta
#endif

#if HOPPER_DTYPE == 0
#define HOPPER_ELEMENT_ __half
#elif HOPPER_DTYPE == 1
#define HOPPER_ELEMENT_ __nv_bfloat16
#else
#error "HOPPER_DTYPE must be 0 (fp16) or 1 (bf16)"
#endif
#if HOPPER_IS_CAUSAL != 0 && HOPPER_IS_CAUSAL != 1
#error "HOPPER_IS_CAUSAL must be 0 or 1"
#endif
#ifndef HOPPER_VARLEN
#define HOPPER_VARLEN 0
#endif
#if HOPPER_VARLEN != 0 && HOPPER_VARLEN != 1
#error "HOPPER_VARLEN must be 0 or 1"
#endif

#define HOPPER_CAT2_(a, b) a##b
#define HOPPER_CAT_(a, b) HOPPER_CAT2_(a, b)
#define HOPPER_TRAITS_ HOPPER_CAT_(HOPPER_KERNEL_NAME, _traits)

using HOPPER_TRAITS_ = hopper::Traits<HOPPER_HEAD_DIM, HOPPER_BLOCK_N, HOPPER_STAGES, HOPPER_CONSUMER_WGS,
                                      HOPPER_REG_PROD, HOPPER_REG_CONS, HOPPER_OVERLAP, HOPPER_PINGPONG,
                                      HOPPER_SCHED, HOPPER_IS_CAUSAL != 0, HOPPER_ELEMENT_, HOPPER_RESCALE_LOG2,
                                      HOPPER_EXP_EMU, HOPPER_VARLEN != 0, HOPPER_SPLITS,
                                      HOPPER_PACK_GQA, HOPPER_CTAS_PER_SM, HOPPER_CLUSTER,
                                      HOPPER_TILE_OVERLAP, HOPPER_Q_IN_REGS>;

// Braces: a definition on both the host and device side (see flashcore/instantiate.cuh).
extern "C" {
__constant__ int32_t HOPPER_META_NAME[HOPPER_META_LEN] = {
    HOPPER_ABI_VERSION,             // HOPPER_META_ABI
    HOPPER_TRAITS_::kThreads,       // HOPPER_META_THREADS
    HOPPER_TRAITS_::kSmemBytes,     // HOPPER_META_SMEM_BYTES
    HOPPER_TRAITS_::kBlockM,        // HOPPER_META_BLOCK_M
    HOPPER_TRAITS_::kBlockN,        // HOPPER_META_BLOCK_N
    HOPPER_TRAITS_::kHeadDim,       // HOPPER_META_HEAD_DIM
    HOPPER_TRAITS_::kIsCausal ? 1 : 0,
    HOPPER_TRAITS_::kDtype,         // HOPPER_META_DTYPE
    HOPPER_TRAITS_::kStages,        // HOPPER_META_STAGES
    HOPPER_TRAITS_::kWGs,           // HOPPER_META_CONSUMER_WGS
    HOPPER_TRAITS_::kRegProd,       // HOPPER_META_REG_PROD
    HOPPER_TRAITS_::kRegCons,       // HOPPER_META_REG_CONS
    HOPPER_TRAITS_::kOverlap ? 1 : 0,
    HOPPER_TRAITS_::kPingpong ? 1 : 0,
    64,                             // HOPPER_META_O_BOX_ROWS
    HOPPER_TRAITS_::kSched,         // HOPPER_META_SCHED
    HOPPER_TRAITS_::kRescaleLog2,   // HOPPER_META_RESCALE_LOG2
    HOPPER_TRAITS_::kExpEmu,        // HOPPER_META_EXP_EMU
    HOPPER_TRAITS_::kVarlen,        // HOPPER_META_VARLEN
    HOPPER_TRAITS_::kSplits,        // HOPPER_META_SPLITS
    HOPPER_TRAITS_::kPackGqa,       // HOPPER_META_PACK_GQA
    HOPPER_TRAITS_::kCtasPerSm,     // HOPPER_META_CTAS_PER_SM
    HOPPER_TRAITS_::kCluster,       // HOPPER_META_CLUSTER
};
}

// CLUSTER=2: the cluster shape is the kernel's own (a plain launch of a grid whose x is a
// multiple of it forms the pairs), so every launcher stays cuLaunchKernel / <<<>>>.
#if HOPPER_CLUSTER > 1
#define HOPPER_CLUSTER_DIMS_ __cluster_dims__(HOPPER_CLUSTER, 1, 1)
#else
#define HOPPER_CLUSTER_DIMS_
#endif
extern "C" __global__ void HOPPER_CLUSTER_DIMS_ __launch_bounds__(HOPPER_TRAITS_::kThreads, HOPPER_TRAITS_::kCtasPerSm)
    HOPPER_KERNEL_NAME(const __grid_constant__ hopper::Params params) {
    hopper::fwd<HOPPER_TRAITS_>(params, HOPPER_META_NAME);
}

#undef HOPPER_TRAITS_
#undef HOPPER_CAT_
#undef HOPPER_CAT2_
#undef HOPPER_ELEMENT_
#undef HOPPER_HEAD_DIM
#undef HOPPER_IS_CAUSAL
#undef HOPPER_DTYPE
#undef HOPPER_BLOCK_M
#undef HOPPER_BLOCK_N
#undef HOPPER_CONSUMER_WGS
#undef HOPPER_STAGES
#undef HOPPER_REG_PROD
#undef HOPPER_REG_CONS
#undef HOPPER_OVERLAP
#undef HOPPER_PINGPONG
#undef HOPPER_SCHED
#undef HOPPER_RESCALE_LOG2
#undef HOPPER_EXP_EMU
#undef HOPPER_VARLEN
#undef HOPPER_SPLITS
#undef HOPPER_PACK_GQA
#undef HOPPER_CTAS_PER_SM
#undef HOPPER_CLUSTER
#undef HOPPER_TILE_OVERLAP
#undef HOPPER_Q_IN_REGS
#undef HOPPER_CLUSTER_DIMS_
#undef HOPPER_PV_PADDED
#undef HOPPER_KERNEL_NAME
#undef HOPPER_META_NAME
