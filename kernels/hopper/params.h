// Hopper family forward: the launch ABI (host and device share this header).
//
// Launch:
//   grid  = SCHED 0: (ceil(seqlen_q / BLOCK_M), heads, batch)        BLOCK_M = 64 * CONSUMER_WGS
//           SCHED 1, 2, 3: (min(#SMs * CTAS_PER_SM, ceil(seqlen_q / BLOCK_M) * heads * batch), 1, 1)
//           (persistent; 2, 3 = dynamic: need Params::tile_counter zero at launch; the kernel
//           leaves it zero, so a buffer zeroed once serves every later launch on its stream;
//           3 also Params::scratch, tail_first and tail_parts)
//           CLUSTER = 2 (SCHED 0, 1): x counts pairs of query blocks, times 2: SCHED 0
//           2*ceil(m_blocks / 2); SCHED 1 2*min(#SMs / 2, ceil(m_blocks / 2) * heads * batch)
//   block = (THREADS, 1, 1)                                 THREADS = 128 * (CONSUMER_WGS + 1)
//   dynamic shared memory = SMEM_BYTES                      (raise CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
// with THREADS, SMEM_BYTES, BLOCK_M, BLOCK_N read from the cubin's `hopper_meta`
// table (HOPPER_META_* below), never recomputed by the host.
//
// The kernel takes `const __grid_constant__ hopper::Params` (TMA reads the maps
// from the parameter space, so they must not be copied to local memory).
//
// Tensor maps (cuTensorMapEncodeTiled, one per tensor), for X in {Q, K, V, O},
// X a [B, H, S, D] view with element strides (sb, sh, ss, 1):
//   dtype   CU_TENSOR_MAP_DATA_TYPE_FLOAT16 (6) or _BFLOAT16 (9), rank 5
//   dims    {64, S, D/64, H, B}                      (S = seqlen_q for Q/O, seqlen_k for K/V)
//           D=96: {96, S, 1, H, B}, every box one 64-column panel (the kernel issues one TMA
//           per panel at x = 64*panel; columns 96..127 load as zeros, stores clip them)
//   strides {ss*2, 128, sh*2, sb*2} bytes            (each % 16 == 0 and < 2^40; base 16-B aligned)
//   box     Q {64, BLOCK_M, D/64, 1, 1}   K, V {64, BLOCK_N, D/64, 1, 1}   O {64, 64, 1, 1, 1}
//           (CLUSTER = 2: K, V {64, BLOCK_N, 1, 1, 1}, one panel per multicast load)
//   element strides {1,1,1,1,1}, INTERLEAVE_NONE, SWIZZLE_128B, L2_PROMOTION_L2_256B,
//   OOB_FILL_NONE (rows past S load as zeros; stores past S are clipped).
#pragma once

#include <stdint.h>
#include <cuda.h>  // CUtensorMap (alignas(128), 128 bytes); no driver call is made from device code

#define HOPPER_ABI_VERSION 7

namespace hopper {

struct alignas(128) Params {
    CUtensorMap tm_q;  // box rows BLOCK_M
    CUtensorMap tm_k;  // box rows BLOCK_N
    CUtensorMap tm_v;  // box rows BLOCK_N
    CUtensorMap tm_o;  // box rows 64, one 64-column panel
    // Optional logsumexp output, fp32 [B, H, Sq] contiguous, natural log; nullptr: not written.
    // Q and O are [B, H, Sq, D]; K and V [B, H / kv_group, Sk, D].
    float* lse;
    int32_t batch, heads, seqlen_q, seqlen_k;
    // softmax(scale * Q K^T): scale_log2 = scale * log2(e).
    float scale_log2;
    // Query heads per key/value head (GQA/MQA; 1: one K/V head per query head). Query
    // head h reads K/V head h / kv_group; tm_k and tm_v have heads / kv_group heads.
    int32_t kv_group;
    // SCHED 2 and 3 only: a device int32 that is 0 at launch; the kernel counts handed-out tiles
    // in it and its last fetch puts it back to 0 (the host zeroes it once per stream).
    int32_t* tile_counter;
    // Packed variable-length batches (kernels built with HOPPER_VARLEN=1 only; ignored else). Sequence b's query rows are
    // cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1 of the packed Q/O, its keys cu_seqlens_k[b] ..
    // of K/V; the maps then have B = 1 and S = the packed rows; batch, seqlen_q and seqlen_k
    // are the number of sequences and the longest query / key lengths (the grid's extent).
    // Tiles past a sequence's end do nothing. The rows of O's last 64-row slab of a
    // sequence are stored through o_ptr (strides in elements), clipped at its end; the
    // LSE is then [heads, total_q].
    const int32_t* cu_seqlens_q;
    const int32_t* cu_seqlens_k;
    void* o_ptr;
    int64_t o_row_stride, o_head_stride;
    int32_t total_q;
    // Split-KV (SPLITS > 1, SCHED 0): grid x = ceil(seqlen_q / BLOCK_M) * SPLITS. `scratch`
    // is device memory the host zeroed once when it allocated it (the kernel leaves its
    // counters at zero again): int32 counters [B*H*m_blocks] (padded to 256 B), fp32 LSE
    // partials [B, H, SPLITS, Sq] (padded to 256 B), fp32 O partials [B, H, SPLITS, Sq, D].
    // The combining CTA writes O through o_ptr with element strides o_batch_stride,
    // o_head_stride, o_row_stride (the dense [B, H, Sq, D] view), and the LSE.
    //
    // SCHED 3 (the last wave split, tile_scheduler.cuh): the host's plan (launch.py
    // tail_plan): tiles tail_first .. tiles-1 (r of them) are cut into tail_parts parts each
    // (tail_parts 1: none is). `scratch` then holds int32 counters [r, BLOCK_M / 16 warps, 2]
    // (padded to 256 B), fp32 LSE partials [r * tail_parts, BLOCK_M] (padded to 256 B) and fp32 O
    // partials [r * tail_parts, BLOCK_M, D] (launch.py tail_scratch bounds them for any grid), the
    // counters zeroed once by the host (the kernel leaves them zero); each split tile's last part
    // writes its O through o_ptr and the o_*_stride (whole tiles use tm_o; tail_split.cuh).
    void* scratch;
    int64_t o_batch_stride;
    int32_t tail_first, tail_parts;
};

static_assert(sizeof(CUtensorMap) == 128, "CUtensorMap must be 128 bytes");
static_assert(alignof(Params) == 128, "Params must be 128-byte aligned (CUtensorMap members)");

}  // namespace hopper

// `extern "C" __constant__ int32_t hopper_meta[HOPPER_META_LEN]` in every cubin:
#define HOPPER_META_ABI 0
#define HOPPER_META_THREADS 1
#define HOPPER_META_SMEM_BYTES 2
#define HOPPER_META_BLOCK_M 3
#define HOPPER_META_BLOCK_N 4
#define HOPPER_META_HEAD_DIM 5
#define HOPPER_META_IS_CAUSAL 6
#define HOPPER_META_DTYPE 7 /* 0 = fp16, 1 = bf16 */
#define HOPPER_META_STAGES 8
#define HOPPER_META_CONSUMER_WGS 9
#define HOPPER_META_REG_PROD 10
#define HOPPER_META_REG_CONS 11
#define HOPPER_META_OVERLAP 12
#define HOPPER_META_PINGPONG 13
#define HOPPER_META_O_BOX_ROWS 14 /* rows of the O map's box (64) */
#define HOPPER_META_SCHED 15 /* 0: grid (ceil(Sq/BLOCK_M), H, B); 1-3: grid (min(#SMs x CTAS_PER_SM, tiles), 1, 1); 2, 3: zeroed tile_counter; 3: tail scratch */
#define HOPPER_META_RESCALE_LOG2 16
#define HOPPER_META_EXP_EMU 17
#define HOPPER_META_VARLEN 18 /* 1: packed variable-length batches (Params::cu_seqlens_q/k) */
#define HOPPER_META_SPLITS 19 /* 1: off; k > 1: split-KV, grid x = m blocks * k, Params::scratch */
#define HOPPER_META_PACK_GQA 20 /* 1: the host may launch a K/V head's G query heads as one head of G*Sq rows */
#define HOPPER_META_CTAS_PER_SM 21 /* __launch_bounds__ min blocks; persistent grids take min(#SMs x this, tiles) */
#define HOPPER_META_CLUSTER 22 /* CTAs per cluster along M (2: K/V multicast; grid x a multiple of it) */
#define HOPPER_META_LEN 23
