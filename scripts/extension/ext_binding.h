// What the torch bindings of the production extension share (flashcore_ext.cpp,
// hopper_ext.cpp): input checks with messages that name the dimension, number
// formatting, the caller's stream. Torch headers only, no CUDA header.
#pragma once

#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/extension.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

namespace evotuner_ext {

// Numbers go into messages as std::to_string text, never through an ostream: on the GPU
// machine (torch 2.11+cu130, g++ 13.3) any `ostream << int64_t` compiled into an extension
// segfaults (a three-line load_inline module reproduces it), so TORCH_CHECK gets strings only.
inline std::string n(int64_t v) { return std::to_string(v); }

inline int32_t as_int32(const char* module, int64_t v, const char* what) {
    TORCH_CHECK(v >= 0 && v <= std::numeric_limits<int32_t>::max(), module, ": ", what, "=", n(v),
                " does not fit in int32");
    return static_cast<int32_t>(v);
}

// The caller's current torch stream (its cudaStream_t), through c10's device-guard interface,
// which the CUDA torch registers, so no ATen CUDA header is needed (it was a Python round trip,
// torch.cuda.current_stream(device).cuda_stream, on every call).
inline void* current_stream(int device) {
    const c10::Device cuda(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
    return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(cuda).native_handle();
}

struct Dims {
    int64_t B, H, Sq, Sk, D;
    int dtype;  // 0 fp16, 1 bf16
    int64_t Hkv;  // key/value heads: H, or a divisor of it (GQA/MQA)
};

// q, k, v: CUDA, one device, one dtype (fp16/bf16), [batch, heads, seqlen, head_dim] with
// matching batch/head_dim, k and v one seqlen and one number of heads dividing q's (GQA/MQA),
// last dim contiguous.
inline Dims check_qkv(const char* fn, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
    TORCH_CHECK(q.is_cuda() && k.is_cuda() && v.is_cuda(), fn, ": q, k and v must be CUDA tensors (got ",
                q.device().str(), ", ", k.device().str(), ", ", v.device().str(), ")");
    TORCH_CHECK(k.device() == q.device() && v.device() == q.device(), fn, ": q, k and v must be on one device");
    TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, fn,
                ": q, k, v must be [batch, heads, seqlen, head_dim] (got dims ", n(q.dim()), ", ", n(k.dim()), ", ",
                n(v.dim()), ")");
    const int dtype = q.scalar_type() == torch::kHalf ? 0 : q.scalar_type() == torch::kBFloat16 ? 1 : -1;
    TORCH_CHECK(dtype >= 0, fn, ": dtype ", c10::toString(q.scalar_type()),
                " is not supported (use float16 or bfloat16)");
    TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), fn,
                ": q, k and v must share one dtype");
    const Dims d{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), dtype, k.size(1)};
    TORCH_CHECK(k.size(0) == d.B && v.size(0) == d.B, fn, ": batch of k/v differs from q (", n(d.B), ")");
    TORCH_CHECK(v.size(1) == d.Hkv, fn, ": heads of v (", n(v.size(1)), ") differ from k's (", n(d.Hkv), ")");
    TORCH_CHECK(d.Hkv > 0 && d.H % d.Hkv == 0, fn, ": heads of k/v (", n(d.Hkv), ") do not divide q's (", n(d.H),
                "): give k and v as many heads as q or a divisor of it");
    TORCH_CHECK(v.size(2) == d.Sk, fn, ": seqlen of v (", n(v.size(2)), ") differs from k (", n(d.Sk), ")");
    TORCH_CHECK(k.size(3) == d.D && v.size(3) == d.D, fn, ": head_dim of k/v differs from q (", n(d.D), ")");
    TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, fn,
                ": the last dim of q, k, v must be contiguous (call .contiguous())");
    return d;
}

// "D=64 fp16 B*H*Sq<=131072 S<=2048; D=128 bf16 causal ..." of a header section's kConfigs
// (B*H*Sq<=2^b: the row's query-rows bucket b).
template <class Config, size_t N>
std::string rows_text(const Config (&configs)[N]) {
    std::string s;
    for (size_t i = 0; i < N; ++i) {
        const Config& c = configs[i];
        s += (i ? "; D=" : "D=") + n(c.head_dim) + (c.dtype ? " bf16" : " fp16") + (c.causal ? " causal" : "") +
             " B*H*Sq<=" + n(int64_t(1) << c.query_rows_bucket) + " S<=" + n(c.max_seqlen);
    }
    return s;
}

// The header rows as Python dicts (the bindings' configs()).
template <class Config, size_t N>
pybind11::list configs_list(const Config (&configs)[N], const std::string& kernel_prefix) {
    pybind11::list out;
    for (size_t i = 0; i < N; ++i) {
        const Config& c = configs[i];
        pybind11::dict d;
        d["head_dim"] = c.head_dim;
        d["dtype"] = c.dtype ? "bf16" : "fp16";
        d["causal"] = c.causal;
        d["query_rows_bucket"] = c.query_rows_bucket;
        d["max_seqlen"] = c.max_seqlen;
        d["kernel"] = kernel_prefix + std::to_string(i);
        out.append(d);
    }
    return out;
}

// A header section's select(head_dim, dtype, causal, seqlen_k, query_rows = B*H*Sq).
template <class Config>
using Select = const Config* (*)(int, int, bool, int, int64_t);

// The row of a header section serving the call (its query rows B*H*Sq and seqlen_k: the
// header's select()), or an error naming the shape and the rows.
template <class Config, size_t N>
int pick_row(const char* fn, const char* module, const Config (&configs)[N], Select<Config> select,
             int (*index_of)(const Config*), const Dims& d, bool causal) {
    const Config* row = select(static_cast<int>(d.D), d.dtype, causal, as_int32(module, d.Sk, "seqlen_k"),
                               d.B * d.H * d.Sq);
    TORCH_CHECK(row != nullptr, fn, ": no tuned config for head_dim=", n(d.D), " ", d.dtype ? "bf16" : "fp16",
                causal ? " causal" : " non-causal", "; this build serves: ", rows_text(configs),
                " (export a study for this shape and rebuild)");
    return index_of(row);
}

using Attention = torch::Tensor (*)(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&, bool,
                                    std::optional<double>);

// attention(), select(), configs() and arch of a binding over one header section.
template <class Config, size_t N>
void define_module(pybind11::module_& m, const char* module, const char* arch, const char* kernel_prefix,
                   const Config (&configs)[N], Select<Config> select, int (*index_of)(const Config*),
                   Attention attention) {
    m.def("attention", attention, "o = softmax(scale * q k^T [causal mask]) v; q, k, v [B, H, S, D] CUDA fp16/bf16",
          pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("causal") = false,
          pybind11::arg("scale") = pybind11::none());
    const std::string name = module;
    m.def(
        "select",
        [name, select, index_of](int head_dim, const std::string& dtype, bool causal, int64_t seqlen,
                                 int64_t query_rows) {
            TORCH_CHECK(dtype == "fp16" || dtype == "bf16", name, ".select: dtype must be 'fp16' or 'bf16'");
            TORCH_CHECK(query_rows >= 0, name, ".select: query_rows=", n(query_rows), " is negative (give B*H*Sq)");
            return index_of(select(head_dim, dtype == "bf16" ? 1 : 0, causal, as_int32(name.c_str(), seqlen, "seqlen"),
                                   query_rows));
        },
        "index of the header row serving (head_dim, dtype, causal, seqlen_k, query_rows = B*H*Sq), -1 for none",
        pybind11::arg("head_dim"), pybind11::arg("dtype"), pybind11::arg("causal"), pybind11::arg("seqlen"),
        pybind11::arg("query_rows"));
    const std::string prefix = kernel_prefix;
    m.def("configs", [&configs, prefix] { return configs_list(configs, prefix); },
          "the header's rows: head_dim, dtype, causal, query_rows_bucket, max_seqlen, kernel name");
    m.attr("arch") = arch;
}

}  // namespace evotuner_ext
