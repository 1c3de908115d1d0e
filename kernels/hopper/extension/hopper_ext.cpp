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
//   hopper_ext.plan(q, k, v, causal, scale)            # how that call launches (row, grid, packed, splits, ...)
//
// The row is the header's hopper::tuned::select(head_dim, dtype, causal, seqlen_k, B*H*Sq)
// (evotuner_ext::pick_row): a decode call and a prefill of one seqlen_k take their own rows.
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

// A row's per-call memory (HopperExtArgs::scratch: SCHED 2's tile counter, split-KV's
// scratch): a fresh buffer from torch's caching allocator on the caller's stream (the launcher
// clears its counters there), alive until the launch is queued (the allocator then reuses the
// block in stream order).
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

// One call's launcher arguments: the checks, the row, the output (allocated here), the strides.
// `launches` is false for an empty problem (nothing to run).
struct Call {
    int index = -1;
    bool launches = false;
    torch::Tensor o;
    HopperExtArgs a{};
};

Call prepare(const char* fn, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, bool causal,
             std::optional<double> scale) {
    const evotuner_ext::Dims d = evotuner_ext::check_qkv(fn, q, k, v);
    Call c;
    c.index = evotuner_ext::pick_row(fn, kModule, tuned::kConfigs, &tuned::select, &tuned::index_of, d, causal);
    c.o = torch::empty({d.B, d.H, d.Sq, d.D}, q.options());
    if (d.B == 0 || d.H == 0 || d.Sq == 0) return c;
    TORCH_CHECK(d.Sk > 0, fn, ": seqlen_k must be positive");
    c.launches = true;
    HopperExtArgs& a = c.a;
    a.q = q.data_ptr();
    a.k = k.data_ptr();
    a.v = v.data_ptr();
    a.o = c.o.data_ptr();
    a.lse = nullptr;
    strides(q, a.q_stride);
    strides(k, a.k_stride);
    strides(v, a.v_stride);
    strides(c.o, a.o_stride);
    a.batch = evotuner_ext::as_int32(kModule, d.B, "batch");
    a.heads = evotuner_ext::as_int32(kModule, d.H, "heads");
    a.heads_kv = evotuner_ext::as_int32(kModule, d.Hkv, "heads of k/v");
    a.seqlen_q = evotuner_ext::as_int32(kModule, d.Sq, "seqlen_q");
    a.seqlen_k = evotuner_ext::as_int32(kModule, d.Sk, "seqlen_k");
    a.head_dim = static_cast<int32_t>(d.D);
    a.dtype = d.dtype;
    const double s = scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(d.D));
    a.scale_log2 = static_cast<float>(s * 1.4426950408889634);  // log2(e)
    return c;
}

// Hand the call to its row's launcher (which launches, or with c.a.plan describes the launch),
// with per-call memory from torch on the caller's stream; a failure is the row's error.
void run_row(const char* fn, Call& c, const torch::Tensor& q) {
    Scratch scratch{q.options().dtype(torch::kUInt8), {}, {}};
    c.a.scratch = &allocate_scratch;
    c.a.scratch_ctx = &scratch;
    const int device = q.get_device();
    char err[kErrLen] = {0};
    const int rc = kLaunchers[c.index](&c.a, evotuner_ext::current_stream(device), device, err, kErrLen);
    TORCH_CHECK(rc == 0, fn, ": row ", n(c.index), ": ", std::string(err),
                scratch.error.empty() ? "" : " (", scratch.error, scratch.error.empty() ? "" : ")");
}

torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, bool causal,
                        std::optional<double> scale) {
    Call c = prepare("hopper_ext.attention", q, k, v, causal, scale);
    if (c.launches) run_row("hopper_ext.attention", c, q);
    return c.o;
}

// How attention() would launch for these inputs, checked as it checks them; nothing queued.
pybind11::dict plan(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, bool causal,
                    std::optional<double> scale) {
    Call c = prepare("hopper_ext.plan", q, k, v, causal, scale);
    pybind11::dict out;
    out["row"] = c.index;
    out["kernel"] = "hopper_fwd_" + std::to_string(c.index);
    out["launches"] = c.launches;
    if (!c.launches) return out;
    HopperExtPlan pl{};
    c.a.plan = &pl;
    run_row("hopper_ext.plan", c, q);
    out["grid"] = pybind11::make_tuple(pl.grid[0], pl.grid[1], pl.grid[2]);
    out["block"] = pl.block;
    out["smem_bytes"] = pl.smem_bytes;
    out["sched"] = pl.sched;
    out["splits"] = pl.splits;
    out["packed"] = pl.packed != 0;
    out["heads"] = pl.heads;
    out["seqlen_q"] = pl.seqlen_q;
    out["scratch_bytes"] = pl.scratch_bytes;
    out["tail_first"] = pl.tail_first;
    out["tail_parts"] = pl.tail_parts;
    return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "Hopper (wgmma/TMA) attention with the configs tuned by evotuner (arch " HOPPER_TUNED_ARCH ")";
    evotuner_ext::define_module(m, kModule, HOPPER_TUNED_ARCH, "hopper_fwd_", tuned::kConfigs, &tuned::select,
                                &tuned::index_of, &attention);
    m.def("plan", &plan,
          "how attention(q, k, v, causal, scale) launches, checked as it checks its inputs, nothing queued: "
          "row, kernel, launches, grid, block, smem_bytes, sched, splits, packed (grouped query heads as one head "
          "per K/V head), heads and seqlen_q of the launch, scratch_bytes (its per-call memory), tail_first and tail_parts "
          "(SCHED 3's last wave split on this grid: the first tile cut, into how many parts; 1: none)",
          pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("causal") = false,
          pybind11::arg("scale") = pybind11::none());
}
