// flashcore_ext: the production PyTorch binding of the tuned FlashCore kernels.
//
// Built by scripts/build_extension.py, never by hand. The kernels live in one
// nvcc-compiled object per row of the exported header (flashcore_config.h);
// each object exports `flashcore_ext_launch_<i>` (see launch_row.cu.in). This
// file includes no CUDA header: it is a plain C++ torch extension, so it builds
// with any torch (the CPU wheel included); the launchers link against the
// static CUDA runtime nvcc provides.
//
//   import torch, flashcore_ext
//   o = flashcore_ext.attention(q, k, v, causal, scale)   # q,k,v [B, H, S, D] fp16/bf16 CUDA
//
// The row is chosen with the header's flashcore::tuned::select(head_dim, dtype,
// causal, seqlen_k); a shape no row serves is an error naming the shape and the
// rows this build has.
#include <torch/extension.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "flashcore/params.h"
#include "flashcore_config.h"
#include "flashcore_rows.h"  // generated: kLaunchers[i] = flashcore_ext_launch_<i>

static_assert(sizeof(kLaunchers) / sizeof(kLaunchers[0]) == flashcore::tuned::kNumConfigs,
              "flashcore_ext: one launcher per header row");

namespace {

namespace tuned = flashcore::tuned;
constexpr int kErrLen = 512;

// Numbers go into messages as std::to_string text, never through an ostream: on the GPU
// machine (torch 2.11+cu130, g++ 13.3) any `ostream << int64_t` compiled into an extension
// segfaults (a three-line load_inline module reproduces it), so TORCH_CHECK gets strings only.
std::string n(int64_t v) { return std::to_string(v); }

int dtype_code(const torch::Tensor& t) {
    if (t.scalar_type() == torch::kHalf) return 0;
    if (t.scalar_type() == torch::kBFloat16) return 1;
    return -1;
}

std::string rows_text() {
    std::string s;
    for (int i = 0; i < tuned::kNumConfigs; ++i) {
        const tuned::Config& c = tuned::kConfigs[i];
        s += (i ? "; D=" : "D=") + n(c.head_dim) + (c.dtype ? " bf16" : " fp16") + (c.causal ? " causal" : "") +
             " S<=" + n(c.max_seqlen);
    }
    return s;
}

int32_t as_int32(int64_t v, const char* what) {
    TORCH_CHECK(v >= 0 && v <= std::numeric_limits<int32_t>::max(), "flashcore_ext: ", what, "=", n(v),
                " does not fit in int32");
    return static_cast<int32_t>(v);
}

// The caller's current torch stream, asked from Python so this file needs no ATen CUDA headers.
void* current_stream(int device) {
    namespace py = pybind11;
    py::object stream = py::module_::import("torch.cuda").attr("current_stream")(device);
    return reinterpret_cast<void*>(stream.attr("cuda_stream").cast<intptr_t>());
}

torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, bool causal,
                        std::optional<double> scale) {
    TORCH_CHECK(q.is_cuda() && k.is_cuda() && v.is_cuda(),
                "flashcore_ext.attention: q, k and v must be CUDA tensors (got ", q.device().str(), ", ",
                k.device().str(), ", ", v.device().str(), ")");
    TORCH_CHECK(k.device() == q.device() && v.device() == q.device(),
                "flashcore_ext.attention: q, k and v must be on one device");
    TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
                "flashcore_ext.attention: q, k, v must be [batch, heads, seqlen, head_dim] (got dims ", n(q.dim()),
                ", ", n(k.dim()), ", ", n(v.dim()), ")");
    const int dtype = dtype_code(q);
    TORCH_CHECK(dtype >= 0, "flashcore_ext.attention: dtype ", c10::toString(q.scalar_type()), " is not supported (use float16 or bfloat16)");
    TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
                "flashcore_ext.attention: q, k and v must share one dtype");
    const int64_t B = q.size(0), H = q.size(1), Sq = q.size(2), D = q.size(3), Sk = k.size(2);
    TORCH_CHECK(k.size(0) == B && v.size(0) == B, "flashcore_ext.attention: batch of k/v differs from q (", n(B), ")");
    TORCH_CHECK(k.size(1) == H && v.size(1) == H, "flashcore_ext.attention: heads of k/v differ from q (", n(H), ")");
    TORCH_CHECK(v.size(2) == Sk, "flashcore_ext.attention: seqlen of v (", n(v.size(2)), ") differs from k (", n(Sk), ")");
    TORCH_CHECK(k.size(3) == D && v.size(3) == D, "flashcore_ext.attention: head_dim of k/v differs from q (", n(D), ")");
    TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1,
                "flashcore_ext.attention: the last dim of q, k, v must be contiguous (call .contiguous())");

    const tuned::Config* row = tuned::select(static_cast<int>(D), dtype, causal, as_int32(Sk, "seqlen_k"));
    TORCH_CHECK(row != nullptr, "flashcore_ext.attention: no tuned config for head_dim=", n(D), " ",
                dtype ? "bf16" : "fp16", causal ? " causal" : " non-causal",
                "; this build serves: ", rows_text(), " (export a study for this shape and rebuild)");
    const int index = tuned::index_of(row);

    auto o = torch::empty({B, H, Sq, D}, q.options());
    if (B == 0 || H == 0 || Sq == 0) return o;
    TORCH_CHECK(Sk > 0, "flashcore_ext.attention: seqlen_k must be positive");

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
    p.batch = as_int32(B, "batch");
    p.heads = as_int32(H, "heads");
    p.seqlen_q = as_int32(Sq, "seqlen_q");
    p.seqlen_k = as_int32(Sk, "seqlen_k");
    const double s = scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(D));
    p.scale = static_cast<float>(s);
    p.scale_log2 = static_cast<float>(s * 1.4426950408889634);  // log2(e)

    const int device = q.get_device();
    char err[kErrLen] = {0};
    const int rc = kLaunchers[index](&p, current_stream(device), device, err, kErrLen);
    TORCH_CHECK(rc == 0, "flashcore_ext.attention: row ", n(index), ": ", std::string(err));
    return o;
}

int select_row(int head_dim, const std::string& dtype, bool causal, int64_t seqlen) {
    TORCH_CHECK(dtype == "fp16" || dtype == "bf16", "flashcore_ext.select: dtype must be 'fp16' or 'bf16'");
    return tuned::index_of(tuned::select(head_dim, dtype == "bf16" ? 1 : 0, causal, as_int32(seqlen, "seqlen")));
}

pybind11::list configs() {
    pybind11::list out;
    for (int i = 0; i < tuned::kNumConfigs; ++i) {
        const tuned::Config& c = tuned::kConfigs[i];
        pybind11::dict d;
        d["head_dim"] = c.head_dim;
        d["dtype"] = c.dtype ? "bf16" : "fp16";
        d["causal"] = c.causal;
        d["max_seqlen"] = c.max_seqlen;
        d["kernel"] = "flashcore_fwd_" + std::to_string(i);
        out.append(d);
    }
    return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "FlashCore attention with the configs tuned by evotuner (arch " FLASHCORE_TUNED_ARCH ")";
    m.def("attention", &attention, "o = softmax(scale * q k^T [causal mask]) v; q, k, v [B, H, S, D] CUDA fp16/bf16",
          pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("causal") = false,
          pybind11::arg("scale") = pybind11::none());
    m.def("select", &select_row, "index of the header row serving (head_dim, dtype, causal, seqlen_k), -1 for none",
          pybind11::arg("head_dim"), pybind11::arg("dtype"), pybind11::arg("causal"), pybind11::arg("seqlen"));
    m.def("configs", &configs, "the header's rows: head_dim, dtype, causal, max_seqlen, kernel name");
    m.attr("arch") = FLASHCORE_TUNED_ARCH;
}
