// hopper_ext: the production PyTorch binding of the tuned hopper-family kernels
// (kernels/hopper: wgmma + TMA + warp specialization, sm_90a).
//
// Built by scripts/build_extension.py --family hopper, never by hand. One
// nvcc-compiled object per row of the header's hopper section (hopper_config.h)
// exports `hopper_ext_launch_<i>` (hopper_launch_row.cu.in): it encodes the TMA
// tensor maps and launches. This file includes no CUDA header, so it builds with
// any torch (the CPU wheel included).
//
//   import torch, hopper_ext
//   o = hopper_ext.attention(q, k, v, causal, scale)   # q,k,v [B, H, S, D] fp16/bf16 CUDA, D 64, 96, 128, 192 or 256
//
// Any strides whose batch/head/row steps are multiples of 8 elements work (e.g. SDPA's
// [B,H,S,D] and a [B,S,H,D] tensor transposed to [B,H,S,D]); others get an error naming
// the stride. Sq != Sk and causal (top-left, SDPA's is_causal) are served.
#include <pybind11/stl.h>

#include <cmath>
#include <optional>
#include <string>

#include "ext_binding.h"
#include "hopper_config.h"
#include "hopper_ext_args.h"
#include "hopper_rows.h"  // generated: kLaunchers[i] = hopper_ext_launch_<i>

static_assert(sizeof(kLaunchers) / sizeof(kLaunchers[0]) == hopper::tuned::kNumConfigs,
              "hopper_ext: one launcher per header row");

namespace {

namespace tuned = hopper::tuned;
using evotuner_ext::n;
constexpr const char kModule[] = "hopper_ext";
constexpr int kErrLen = 512;

// A split-KV row's scratch (HopperExtArgs::scratch): a fresh buffer from torch's caching
// allocator on the caller's stream (the launcher clears its counters there), alive until
// attention returns (the launch is queued by then; the allocator reuses the block in stream
// order).
struct Scratch {
    torch::TensorOptions options;
    torch::Tensor buffer;
    std::string error;
};

void* allocate_scratch(void* ctx, int64_t bytes) noexcept {
    auto* s = static_cast<Scratch*>(ctx);
    try {
        s->buffer = torch::empty({bytes}, s->options);
        return s->buffer.data_ptr();
    } catch (const std::exception& e) {
        s->error = e.what();
        return nullptr;
    }
}

void strides(const torch::Tensor& t, int64_t (&out)[3]) {
    out[0] = t.stride(0), out[1] = t.stride(1), out[2] = t.stride(2);
}

torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, bool causal,
                        std::optional<double> scale) {
    const evotuner_ext::Dims d = evotuner_ext::check_qkv("hopper_ext.attention", q, k, v);
    const int index = evotuner_ext::pick_row("hopper_ext.attention", kModule, tuned::kConfigs, &tuned::select,
                                             &tuned::index_of, d, causal);

    auto o = torch::empty({d.B, d.H, d.Sq, d.D}, q.options());
    if (d.B == 0 || d.H == 0 || d.Sq == 0) return o;
    TORCH_CHECK(d.Sk > 0, "hopper_ext.attention: seqlen_k must be positive");

    HopperExtArgs a{};
    a.q = q.data_ptr();
    a.k = k.data_ptr();
    a.v = v.data_ptr();
    a.o = o.data_ptr();
    a.lse = nullptr;
    strides(q, a.q_stride);
    strides(k, a.k_stride);
    strides(v, a.v_stride);
    strides(o, a.o_stride);
    a.batch = evotuner_ext::as_int32(kModule, d.B, "batch");
    a.heads = evotuner_ext::as_int32(kModule, d.H, "heads");
    a.heads_kv = evotuner_ext::as_int32(kModule, d.Hkv, "heads of k/v");
    a.seqlen_q = evotuner_ext::as_int32(kModule, d.Sq, "seqlen_q");
    a.seqlen_k = evotuner_ext::as_int32(kModule, d.Sk, "seqlen_k");
    a.head_dim = static_cast<int32_t>(d.D);
    a.dtype = d.dtype;
    const double s = scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(d.D));
    a.scale_log2 = static_cast<float>(s * 1.4426950408889634);  // log2(e)
    // SCHED 2 hands out tiles from a counter that must be 0 at launch: a fresh zeroed int32 on
    // the caller's stream (ordered before the launch; safe with several streams in flight).
    torch::Tensor counter;
    if (tuned::kConfigs[index].sched == 2) {
        counter = torch::zeros({1}, q.options().dtype(torch::kInt32));
        a.tile_counter = counter.data_ptr<int32_t>();
    }

    Scratch scratch{q.options().dtype(torch::kUInt8), {}, {}};
    a.scratch = &allocate_scratch;
    a.scratch_ctx = &scratch;

    const int device = q.get_device();
    char err[kErrLen] = {0};
    const int rc = kLaunchers[index](&a, evotuner_ext::current_stream(device), device, err, kErrLen);
    TORCH_CHECK(rc == 0, "hopper_ext.attention: row ", n(index), ": ", std::string(err),
                scratch.error.empty() ? "" : " (", scratch.error, scratch.error.empty() ? "" : ")");
    return o;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "Hopper (wgmma/TMA) attention with the configs tuned by evotuner (arch " HOPPER_TUNED_ARCH ")";
    evotuner_ext::define_module(m, kModule, HOPPER_TUNED_ARCH, "hopper_fwd_", tuned::kConfigs, &tuned::select,
                                &tuned::index_of, &attention);
}
