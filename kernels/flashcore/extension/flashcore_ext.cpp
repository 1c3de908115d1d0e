// flashcore_ext: the production PyTorch binding of the tuned FlashCore kernels.
//
// Built by scripts/build_extension.py, never by hand. The kernels live in one
// nvcc-compiled object per row of the exported header (flashcore_config.h);
// each object exports `flashcore_ext_launch_<i>` (see flashcore_launch_row.cu.in). This
// file includes no CUDA header: it is a plain C++ torch extension, so it builds
// with any torch (the CPU wheel included); the launchers link against the
// static CUDA runtime nvcc provides.
//
//   import torch, flashcore_ext
//   o = flashcore_ext.attention(q, k, v, causal, scale)   # q,k,v [B, H, S, D] fp16/bf16 CUDA
//
// The row is chosen with the header's flashcore::tuned::select(head_dim, dtype,
// causal, seqlen_k, B*H*Sq) (evotuner_ext::pick_row); a shape no row serves is an
// error naming the shape and the rows this build has.
#include <pybind11/stl.h>

#include <cmath>
#include <optional>
#include <string>

#include "ext_binding.h"
#include "flashcore/params.h"
#include "flashcore_config.h"
#include "flashcore_rows.h"  // generated: kLaunchers[i] = flashcore_ext_launch_<i>

static_assert(sizeof(kLaunchers) / sizeof(kLaunchers[0]) == flashcore::tuned::kNumConfigs,
              "flashcore_ext: one launcher per header row");

namespace {

namespace tuned = flashcore::tuned;
using evotuner_ext::n;
constexpr const char kModule[] = "flashcore_ext";
constexpr int kErrLen = 512;

torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, bool causal,
                        std::optional<double> scale) {
    const evotuner_ext::Dims d = evotuner_ext::check_qkv("flashcore_ext.attention", q, k, v);
    const int index = evotuner_ext::pick_row("flashcore_ext.attention", kModule, tuned::kConfigs, &tuned::select,
                                             &tuned::index_of, d, causal);

    auto o = torch::empty({d.B, d.H, d.Sq, d.D}, q.options());
    if (d.B == 0 || d.H == 0 || d.Sq == 0) return o;
    TORCH_CHECK(d.Sk > 0, "flashcore_ext.attention: seqlen_k must be positive");

    flashcore::Params p{};
    p.q = q.data_ptr();
    p.k = k.data_ptr();
    p.v = v.data_ptr();
    p.o = o.data_ptr();
    p.lse = nullptr;
    p.q_batch_stride = q.stride(0), p.q_head_stride = q.stride(1), p.q_row_stride = q.stride(2);
    p.k_batch_stride = k.stride(0), p.k_head_stride = k.stride(1), p.k_row_stride = k.stride(2);
    p.v_batch_stride = v.stride(0), p.v_head_stride = v.stride(1), p.v_row_stride = v.stride(2);
    p.o_batch_stride = o.stride(0), p.o_head_stride = o.stride(1), p.o_row_stride = o.stride(2);
    p.batch = evotuner_ext::as_int32(kModule, d.B, "batch");
    p.heads = evotuner_ext::as_int32(kModule, d.H, "heads");
    p.seqlen_q = evotuner_ext::as_int32(kModule, d.Sq, "seqlen_q");
    p.seqlen_k = evotuner_ext::as_int32(kModule, d.Sk, "seqlen_k");
    const double s = scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(d.D));
    p.scale = static_cast<float>(s);
    p.scale_log2 = static_cast<float>(s * 1.4426950408889634);  // log2(e)
    p.kv_group = static_cast<int32_t>(d.H / d.Hkv);               // GQA/MQA: query heads per K/V head

    const int device = q.get_device();
    char err[kErrLen] = {0};
    const int rc = kLaunchers[index](&p, evotuner_ext::current_stream(device), device, err, kErrLen);
    TORCH_CHECK(rc == 0, "flashcore_ext.attention: row ", n(index), ": ", std::string(err));
    return o;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "FlashCore attention with the configs tuned by evotuner (arch " FLASHCORE_TUNED_ARCH ")";
    evotuner_ext::define_module(m, kModule, FLASHCORE_TUNED_ARCH, "flashcore_fwd_", tuned::kConfigs, &tuned::select,
                                &tuned::index_of, &attention);
}
