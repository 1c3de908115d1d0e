// Host helpers every row launcher of the production extension shares (included by the
// generated row_<i>.cu files; scripts/build_extension.py puts this folder on the include path).
//
// Why the driver API for the meta table: `extern "C" __constant__ T x[] = {...}` gets no
// host shadow variable from nvcc (nm shows `U <meta>`), so cudaMemcpyFromSymbol cannot
// name it. As DESIGN.md's loader does, the table is read with cuModuleGetGlobal from the
// kernel's own module (cudaGetFuncBySymbol -> cuFuncGetModule); the driver entry points
// come from the runtime, so nothing links libcuda and the module imports on a machine
// without a driver.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>

namespace evotuner_ext {

// "<kernel>: <what>: <CUDA error text>" into err; returns a non-zero status.
inline int fail(char* err, int err_len, const char* kernel, const char* what, cudaError_t e) {
    std::snprintf(err, static_cast<size_t>(err_len), "%s: %s: %s", kernel, what, cudaGetErrorString(e));
    return static_cast<int>(e) != 0 ? static_cast<int>(e) : 1;
}

// A driver entry point through the runtime (CUDA 12.0 ABI of the function).
template <typename Fn>
cudaError_t driver_entry(const char* name, Fn* fn) {
    cudaDriverEntryPointQueryResult found{};
    void* p = nullptr;
    cudaError_t e = cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found);
    if (e == cudaSuccess && (found != cudaDriverEntryPointSuccess || p == nullptr)) e = cudaErrorSymbolNotFound;
    *fn = reinterpret_cast<Fn>(p);
    return e;
}

// The `len` int32 of the __constant__ table `symbol` from the module of `kernel` (the
// current device's context).
inline cudaError_t read_meta(const void* kernel, const char* symbol, int32_t* meta, size_t len) {
    using FuncGetModule = CUresult (*)(CUmodule*, CUfunction);
    using ModuleGetGlobal = CUresult (*)(CUdeviceptr*, size_t*, CUmodule, const char*);
    using MemcpyDtoH = CUresult (*)(void*, CUdeviceptr, size_t);
    FuncGetModule get_module;
    ModuleGetGlobal get_global;
    MemcpyDtoH copy;
    cudaError_t e;
    if ((e = driver_entry("cuFuncGetModule", &get_module)) != cudaSuccess) return e;
    if ((e = driver_entry("cuModuleGetGlobal", &get_global)) != cudaSuccess) return e;
    if ((e = driver_entry("cuMemcpyDtoH", &copy)) != cudaSuccess) return e;
    cudaFunction_t fn = nullptr;
    if ((e = cudaGetFuncBySymbol(&fn, kernel)) != cudaSuccess) return e;
    CUmodule module = nullptr;
    CUdeviceptr address = 0;
    size_t bytes = 0;
    if (get_module(&module, reinterpret_cast<CUfunction>(fn)) != CUDA_SUCCESS) return cudaErrorInvalidDeviceFunction;
    if (get_global(&address, &bytes, module, symbol) != CUDA_SUCCESS) return cudaErrorInvalidSymbol;
    if (bytes != sizeof(int32_t) * len) return cudaErrorInvalidValue;
    if (copy(meta, address, bytes) != CUDA_SUCCESS) return cudaErrorUnknown;
    return cudaSuccess;
}

// Switches to `device` for the scope and back to the caller's device after.
class DeviceScope {
  public:
    explicit DeviceScope(int device) {
        status_ = cudaGetDevice(&previous_);
        if (status_ == cudaSuccess && previous_ != device) {
            status_ = cudaSetDevice(device);
            switched_ = status_ == cudaSuccess;
        }
    }
    ~DeviceScope() {
        if (switched_) cudaSetDevice(previous_);
    }
    DeviceScope(const DeviceScope&) = delete;
    DeviceScope& operator=(const DeviceScope&) = delete;
    cudaError_t status() const { return status_; }

  private:
    int previous_ = -1;
    bool switched_ = false;
    cudaError_t status_ = cudaSuccess;
};

}  // namespace evotuner_ext
