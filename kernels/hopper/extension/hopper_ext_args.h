// What hopper_ext.cpp (the torch binding, no CUDA headers) hands a hopper row launcher
// (hopper_launch_row.cu.in). Plain C++: both sides include it.
#pragma once

#include <cstdint>

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
    int32_t* tile_counter;        // SCHED 2 rows: a device int32 that is 0 at launch, zeroed on the launch stream
    // Split-KV rows (SPLITS > 1): the launcher asks for `bytes` of device memory, allocated in
    // the launch stream's order and kept alive by the binding until the launch is queued (the
    // launcher clears the counters in it on that stream); nullptr when that failed (the binding
    // holds why).
    void* (*scratch)(void* ctx, int64_t bytes);
    void* scratch_ctx;
};
