// mini: the test-only second kernel family's own launch ABI (tests/families/mini.py
// mirrors it with ctypes). Different from FlashCore's on purpose: per-tensor row
// strides only (contiguous heads), and the softmax scale is a second kernel argument.
#pragma once

#include <stdint.h>

#include "evotuner_abi.h"

namespace mini {

struct Params {
    const void* q;        // [B, H, Sq, D], rows `q_row` elements apart, heads `q_head` apart
    const void* k;        // [B, H, Sk, D]
    const void* v;        // [B, H, Sk, D]
    void* o;              // like q
    int64_t q_row, q_head, q_batch;
    int64_t k_row, k_head, k_batch;
    int64_t v_row, v_head, v_batch;
    int64_t o_row, o_head, o_batch;
    int32_t batch, heads, seqlen_q, seqlen_k;
    int32_t tiles;        // ceil(seqlen_q / ROWS) * heads * batch
    int32_t pad_;
};

}  // namespace mini

// mini's own meta fields, after the common ones.
#define MINI_META_ROWS (EVOTUNER_META_COMMON_LEN + 0)
#define MINI_META_PERSISTENT (EVOTUNER_META_COMMON_LEN + 1)
#define MINI_META_LEN (EVOTUNER_META_COMMON_LEN + 2)
