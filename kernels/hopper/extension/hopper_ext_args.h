// What hopper_ext.cpp (the torch binding, no CUDA headers) hands a hopper row launcher
// (hopper_launch_row.cu.in). Plain C++: both sides include it.
#pragma once

#include <cstdint>

// How a call launches (HopperExtArgs::plan): filled instead of launching.
struct HopperExtPlan {
    int32_t grid[3];
    int32_t block;
    int32_t smem_bytes;
    int32_t sched;
    int32_t splits;
    int32_t packed;            // 1: grouped query heads packed, one K/V head's as one head
    int32_t heads;             // the launch's heads and query rows per head (packed: K/V heads, group*Sq)
    int32_t seqlen_q;
    int64_t scratch_bytes;     // per-call memory the launch takes (split-KV scratch, SCHED 2/3 counter, SCHED 3 scratch; 0: none)
    int32_t tail_first;        // SCHED 3's plan on this grid (launch_rules.h hopper_tail_plan): the first split tile
    int32_t tail_parts;        // and the parts each tile from there is cut in (1: nothing split; always 1 below SCHED 3)
};

struct HopperExtArgs {
    const void* q;
    const void* k;
    const void* v;
    void* o;
    float* lse;                   // nullptr, or fp32 [batch, heads, seqlen_q] contiguous (natural log)
    int64_t q_stride[3];          // element strides of the [batch, heads, seqlen, head_dim] views: batch, head, row
    int64_t k_stride[3];
    int64_t v_stride[3];
    int64_t o_stride[3];
    int32_t batch, heads, seqlen_q, seqlen_k, head_dim;
    int32_t heads_kv;             // heads of k and v: heads, or a divisor of it (GQA/MQA)
    int32_t dtype;                // 0 fp16, 1 bf16
    float scale_log2;             // softmax scale * log2(e)
    // Per-call device memory for SCHED 2's tile counter, split-KV's and SCHED 3's scratch: the launcher asks
    // for `bytes`, allocated in the launch stream's order and kept alive by the binding until the
    // launch is queued, and clears the counters in it on that stream; nullptr when the allocation
    // failed (the binding holds why).
    void* (*scratch)(void* ctx, int64_t bytes);
    void* scratch_ctx;
    // Non-null: check the call and describe its launch here, queueing nothing (no scratch taken).
    HopperExtPlan* plan;
};
