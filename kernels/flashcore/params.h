// FlashCore forward: FlashCore's own launch ABI (kernels/flashcore/params.py mirrors
// this struct with ctypes; a CI test compiles this header on the host and compares
// every offset). The meta table's common part is every family's
// (kernels/evotuner_abi.h); FlashCore's own fields follow it.
//
// The kernel is launched as
//   grid  = (ceil(seqlen_q / BLOCK_M), heads, batch)
//   block = (THREADS, 1, 1)
//   dynamic shared memory = SMEM_BYTES
// where THREADS, SMEM_BYTES and BLOCK_M are read from the built cubin's
// `flashcore_meta` constant (see FLASHCORE_META_* below), never recomputed.
#pragma once

#include <stdint.h>

#include "evotuner_abi.h"

#define FLASHCORE_ABI_VERSION EVOTUNER_ABI_VERSION

namespace flashcore {

struct Params {
    // Q [B, H, Sq, D], K and V [B, H, Sk, D], O like Q, in any layout whose last
    // dim is contiguous (SDPA's [B,H,S,D] and FlashAttention's [B,S,H,D] alike).
    // Strides are in elements.
    const void* q;
    const void* k;
    const void* v;
    void* o;
    // Optional logsumexp output, fp32 [B, H, Sq] contiguous (natural log);
    // nullptr: not written.
    float* lse;

    int64_t q_batch_stride, q_head_stride, q_row_stride;
    int64_t k_batch_stride, k_head_stride, k_row_stride;
    int64_t v_batch_stride, v_head_stride, v_row_stride;
    int64_t o_batch_stride, o_head_stride, o_row_stride;

    int32_t batch, heads, seqlen_q, seqlen_k;

    // softmax(scale * Q K^T); scale_log2 = scale * log2(e) for exp2.
    float scale;
    float scale_log2;

    // Query heads per key/value head (GQA/MQA; 1: one K/V head per query head): query
    // head h reads K/V head h / kv_group, so K and V are [B, H / kv_group, Sk, D].
    int32_t kv_group;
};

}  // namespace flashcore

// Layout of the `extern "C" __constant__ int32_t flashcore_meta[FLASHCORE_META_LEN]`
// table every instantiation defines: the traits' derived sizes, read by the
// build stage from the cubin's ELF and by the loader through cuModuleGetGlobal.
// The common entries are evotuner_abi.h's; FlashCore's own fields follow them
// (kernels/flashcore/params.py: META_FIELDS).
#define FLASHCORE_META_ABI EVOTUNER_META_ABI
#define FLASHCORE_META_THREADS EVOTUNER_META_THREADS
#define FLASHCORE_META_SMEM_BYTES EVOTUNER_META_SMEM_BYTES
#define FLASHCORE_META_HEAD_DIM EVOTUNER_META_HEAD_DIM
#define FLASHCORE_META_IS_CAUSAL EVOTUNER_META_IS_CAUSAL
#define FLASHCORE_META_DTYPE EVOTUNER_META_DTYPE /* 0 = fp16, 1 = bf16 */
#define FLASHCORE_META_MIN_BLOCKS EVOTUNER_META_MIN_BLOCKS
#define FLASHCORE_META_BLOCK_M (EVOTUNER_META_COMMON_LEN + 0)
#define FLASHCORE_META_BLOCK_N (EVOTUNER_META_COMMON_LEN + 1)
#define FLASHCORE_META_LEN (EVOTUNER_META_COMMON_LEN + 2)
