// Dev launcher for the hopper family (host code only; built into libhopper_dev.so).
// Loads cubins through the driver API (libcuda.so.1 via dlopen: this build
// machine has no libcuda), reads `hopper_meta`, encodes the tensor maps with
// cuTensorMapEncodeTiled exactly as kernels/hopper/README.md specifies, and
// launches on the caller's stream in the caller's current context (torch's).
//
// Build: nvcc -O2 -std=c++17 -shared -Xcompiler -fPIC -I kernels -o scripts/hopper_dev/bin/libhopper_dev.so
//        scripts/hopper_dev/launcher.cu -ldl
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <cuda.h>

#include "hopper/extension/launch_rules.h"
#include "hopper/params.h"

#define STR_(x) #x
#define XSTR(x) STR_(x)

namespace {

char g_err[1024];

struct Api {
    decltype(&::cuGetErrorString) GetErrorString;
    decltype(&::cuCtxGetCurrent) CtxGetCurrent;
    decltype(&::cuModuleLoad) ModuleLoad;
    decltype(&::cuModuleGetFunction) ModuleGetFunction;
    decltype(&::cuModuleGetGlobal) ModuleGetGlobal;
    decltype(&::cuMemcpyDtoH) MemcpyDtoH;
    decltype(&::cuFuncSetAttribute) FuncSetAttribute;
    decltype(&::cuLaunchKernel) LaunchKernel;
    decltype(&::cuTensorMapEncodeTiled) TensorMapEncodeTiled;
    decltype(&::cuFuncGetAttribute) FuncGetAttribute;
    decltype(&::cuCtxGetDevice) CtxGetDevice;
    decltype(&::cuDeviceGetAttribute) DeviceGetAttribute;
    decltype(&::cuMemAlloc) MemAlloc;
    decltype(&::cuMemsetD32Async) MemsetD32Async;
} api;
CUdeviceptr g_counter = 0;  // SCHED 2 tile counter (one per process; the dev harness uses one device)
int g_num_sms = 0;
bool g_ready = false;

int fail(const char* what, CUresult r) {
    const char* s = nullptr;
    if (api.GetErrorString) api.GetErrorString(r, &s);
    snprintf(g_err, sizeof g_err, "%s: CUDA error %d (%s)", what, static_cast<int>(r), s ? s : "?");
    return static_cast<int>(r) ? static_cast<int>(r) : -1;
}
int fail_msg(const char* msg) {
    snprintf(g_err, sizeof g_err, "%s", msg);
    return -1;
}

template <class F>
bool sym(void* h, F& f, const char* name) {
    f = reinterpret_cast<F>(dlsym(h, name));
    if (!f) snprintf(g_err, sizeof g_err, "libcuda.so.1 has no %s", name);
    return f != nullptr;
}

int init() {
    if (g_ready) return 0;
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) return fail_msg("dlopen(libcuda.so.1) failed");
    bool ok = sym(h, api.GetErrorString, XSTR(cuGetErrorString)) && sym(h, api.CtxGetCurrent, XSTR(cuCtxGetCurrent)) &&
              sym(h, api.ModuleLoad, XSTR(cuModuleLoad)) && sym(h, api.ModuleGetFunction, XSTR(cuModuleGetFunction)) &&
              sym(h, api.ModuleGetGlobal, XSTR(cuModuleGetGlobal)) && sym(h, api.MemcpyDtoH, XSTR(cuMemcpyDtoH)) &&
              sym(h, api.FuncSetAttribute, XSTR(cuFuncSetAttribute)) && sym(h, api.LaunchKernel, XSTR(cuLaunchKernel)) &&
              sym(h, api.TensorMapEncodeTiled, XSTR(cuTensorMapEncodeTiled)) &&
              sym(h, api.FuncGetAttribute, XSTR(cuFuncGetAttribute)) && sym(h, api.CtxGetDevice, XSTR(cuCtxGetDevice)) &&
              sym(h, api.DeviceGetAttribute, XSTR(cuDeviceGetAttribute)) && sym(h, api.MemAlloc, XSTR(cuMemAlloc)) &&
              sym(h, api.MemsetD32Async, XSTR(cuMemsetD32Async));
    if (!ok) return -1;
    g_ready = true;
    return 0;
}

// X viewed as [B, H, S, D], element strides (sb, sh, ss, 1), a box of rows x panels: refused
// and encoded by the runtime's rules (kernels/hopper/launch.py, rendered as hopper/extension/launch_rules.h).
int encode(CUtensorMap* map, int dtype, const void* base, long long S, int D, long long H, long long B, long long sb,
           long long sh, long long ss, int box_rows, int box_panels) {
    const int64_t fault = hopper_tma_fault(static_cast<int64_t>(reinterpret_cast<uintptr_t>(base)), B, H, D, sb, sh, ss, 1);
    if (fault != 0) {
        snprintf(g_err, sizeof g_err, "TMA refuses the view: %s (strides batch %lld, head %lld, row %lld elements)",
                 kHopperTmaFaultSubjects[fault], sb, sh, ss);
        return -1;
    }
    const HopperTmaView t = hopper_tma_view(B, H, S, D, sb, sh, ss, box_rows, box_panels);
    cuuint64_t dims[kHopperTmaRank], strides[kHopperTmaRank - 1];
    cuuint32_t box[kHopperTmaRank], estr[kHopperTmaRank];
    for (int i = 0; i < kHopperTmaRank; ++i) {
        dims[i] = static_cast<cuuint64_t>(t.dims[i]);
        box[i] = static_cast<cuuint32_t>(t.box[i]);
        estr[i] = static_cast<cuuint32_t>(t.element_strides[i]);
        if (i < kHopperTmaRank - 1) strides[i] = static_cast<cuuint64_t>(t.byte_strides[i]);
    }
    CUresult r = api.TensorMapEncodeTiled(map, dtype == 0 ? HOPPER_TMA_FP16 : HOPPER_TMA_BF16, kHopperTmaRank,
                                          const_cast<void*>(base), dims, strides, box, estr, HOPPER_TMA_INTERLEAVE,
                                          HOPPER_TMA_SWIZZLE, HOPPER_TMA_L2_PROMOTION, HOPPER_TMA_FLOAT_OOB_FILL);
    if (r != CUDA_SUCCESS) return fail("cuTensorMapEncodeTiled", r);
    return 0;
}

}  // namespace

extern "C" {

const char* hop_last_error() { return g_err; }

// Load a cubin; returns the function and (if meta_name != NULL) HOPPER_META_LEN ints of meta.
int hop_load(const char* path, const char* kernel, const char* meta_name, void** fn_out, int32_t* meta, int meta_len) {
    if (int e = init()) return e;
    CUcontext ctx = nullptr;
    api.CtxGetCurrent(&ctx);
    if (!ctx) return fail_msg("no current CUDA context (initialize torch.cuda first)");
    CUmodule mod;
    CUresult r = api.ModuleLoad(&mod, path);
    if (r != CUDA_SUCCESS) return fail("cuModuleLoad", r);
    CUfunction fn;
    r = api.ModuleGetFunction(&fn, mod, kernel);
    if (r != CUDA_SUCCESS) return fail("cuModuleGetFunction", r);
    if (meta_name && meta) {
        CUdeviceptr dp;
        size_t bytes;
        r = api.ModuleGetGlobal(&dp, &bytes, mod, meta_name);
        if (r != CUDA_SUCCESS) return fail("cuModuleGetGlobal(meta)", r);
        if (bytes < static_cast<size_t>(meta_len) * 4) return fail_msg("meta table too short");
        r = api.MemcpyDtoH(meta, dp, meta_len * 4);
        if (r != CUDA_SUCCESS) return fail("cuMemcpyDtoH(meta)", r);
    }
    *fn_out = fn;
    return 0;
}

int hop_func_attr(void* fn, int attr, int* out) {
    CUresult r = api.FuncGetAttribute(out, static_cast<CUfunction_attribute>(attr), static_cast<CUfunction>(fn));
    return r == CUDA_SUCCESS ? 0 : fail("cuFuncGetAttribute", r);
}

// Attention forward. Strides in elements, each tensor viewed as [B, H, S, D].
int hop_fwd(void* fn, const int32_t* meta, const void* q, const void* k, const void* v, void* o, float* lse, int B,
            int H, int Sq, int Sk, int D, const long long* q_str, const long long* k_str, const long long* v_str,
            const long long* o_str, float scale, void* stream) {
    if (meta[HOPPER_META_ABI] != HOPPER_ABI_VERSION) return fail_msg("hopper_meta ABI mismatch");
    if (meta[HOPPER_META_HEAD_DIM] != D) return fail_msg("head_dim differs from the kernel's HEAD_DIM");
    const int dtype = meta[HOPPER_META_DTYPE];
    hopper::Params p;
    memset(&p, 0, sizeof p);
    const void* views[4] = {q, k, v, o};
    const long long* strides[4] = {q_str, k_str, v_str, o_str};
    CUtensorMap* maps[4] = {&p.tm_q, &p.tm_k, &p.tm_v, &p.tm_o};
    for (int m = 0; m < 4; ++m) {
        const HopperMapBox b = hopper_map_box(m, meta[HOPPER_META_BLOCK_M], meta[HOPPER_META_BLOCK_N],
                                              meta[HOPPER_META_O_BOX_ROWS], D, meta[HOPPER_META_CLUSTER]);
        const long long S = (m == kHopperMapK || m == kHopperMapV) ? Sk : Sq;
        if (int e = encode(maps[m], dtype, views[m], S, D, H, B, strides[m][0], strides[m][1], strides[m][2],
                           static_cast<int>(b.rows), static_cast<int>(b.panels)))
            return e;
    }
    p.lse = lse;
    p.batch = B;
    p.heads = H;
    p.seqlen_q = Sq;
    p.seqlen_k = Sk;
    p.kv_group = 1;  // the dev harness runs multi-head attention only
    p.scale_log2 = scale * 1.4426950408889634f;
    const int smem = meta[HOPPER_META_SMEM_BYTES];
    CUresult r = api.FuncSetAttribute(static_cast<CUfunction>(fn), CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem);
    if (r != CUDA_SUCCESS) return fail("cuFuncSetAttribute(max dynamic smem)", r);
    void* args[] = {&p};
    if (meta[HOPPER_META_SCHED] == 2) {  // dynamic: the tile counter must be 0 at launch
        if (!g_counter && (r = api.MemAlloc(&g_counter, 4)) != CUDA_SUCCESS) return fail("cuMemAlloc(counter)", r);
        if ((r = api.MemsetD32Async(g_counter, 0, 1, static_cast<CUstream>(stream))) != CUDA_SUCCESS)
            return fail("cuMemsetD32Async(counter)", r);
        p.tile_counter = reinterpret_cast<int32_t*>(g_counter);
    }
    if (meta[HOPPER_META_SCHED] >= 1 && !g_num_sms) {  // persistent: one CTA per SM at most
        CUdevice dev;
        if ((r = api.CtxGetDevice(&dev)) != CUDA_SUCCESS) return fail("cuCtxGetDevice", r);
        if ((r = api.DeviceGetAttribute(&g_num_sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)) != CUDA_SUCCESS)
            return fail("cuDeviceGetAttribute", r);
    }
    const HopperLaunchGrid g = hopper_launch_grid(meta[HOPPER_META_SCHED], Sq, meta[HOPPER_META_BLOCK_M],
                                                  meta[HOPPER_META_SPLITS], H, B, g_num_sms,
                                                  meta[HOPPER_META_CTAS_PER_SM], meta[HOPPER_META_CLUSTER]);
    const unsigned gx = static_cast<unsigned>(g.x), gy = static_cast<unsigned>(g.y), gz = static_cast<unsigned>(g.z);
    r = api.LaunchKernel(static_cast<CUfunction>(fn), gx, gy, gz, meta[HOPPER_META_THREADS], 1, 1, smem,
                         static_cast<CUstream>(stream), args, nullptr);
    if (r != CUDA_SUCCESS) return fail("cuLaunchKernel", r);
    return 0;
}

// Stage-0 unit test (scripts/hopper_dev/gemm_test.cu): A [64, D], B [N, D], V [N, D] contiguous.
struct alignas(128) GemmParams {
    CUtensorMap a, b, v;
    float* s_out;
    float* o_out;
};
int hop_gemm_test(void* fn, int dtype, const void* a, const void* b, const void* v, float* s_out, float* o_out, int N,
                  int D, int smem, void* stream) {
    if (int e = init()) return e;
    GemmParams p;
    memset(&p, 0, sizeof p);
    int e;
    if ((e = encode(&p.a, dtype, a, 64, D, 1, 1, 64LL * D, 64LL * D, D, 64, D / 64))) return e;
    if ((e = encode(&p.b, dtype, b, N, D, 1, 1, 1LL * N * D, 1LL * N * D, D, N, D / 64))) return e;
    if ((e = encode(&p.v, dtype, v, N, D, 1, 1, 1LL * N * D, 1LL * N * D, D, N, D / 64))) return e;
    p.s_out = s_out;
    p.o_out = o_out;
    CUresult r = api.FuncSetAttribute(static_cast<CUfunction>(fn), CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem);
    if (r != CUDA_SUCCESS) return fail("cuFuncSetAttribute", r);
    void* args[] = {&p};
    r = api.LaunchKernel(static_cast<CUfunction>(fn), 1, 1, 1, 128, 1, 1, smem, static_cast<CUstream>(stream), args,
                         nullptr);
    if (r != CUDA_SUCCESS) return fail("cuLaunchKernel(gemm_test)", r);
    return 0;
}

}  // extern "C"
