// evotuner's C++ hot path, part one: the plan table and the key (fastpath.cpp includes this
// once; see the comment at its top). The types a registered plan is kept in, the flag tuples
// and their comparison (no Python code runs in it), and the key of a call computed from its
// own tensors and flags, the same function for registration and look-up.
#pragma once

#include <Python.h>

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/python_variable.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#if __has_include(<cuda.h>)
#include <cuda.h>
#define EVOTUNER_HAVE_CUDA_H 1
#endif

namespace {

// cuda.h's CUlaunchConfig, field for field (cuLaunchKernelEx, CUDA 12.0+).
struct LaunchConfig {
    unsigned grid[3];
    unsigned block[3];
    unsigned shared_bytes;
    void* stream;
    void* attrs;
    unsigned num_attrs;
};
#ifdef EVOTUNER_HAVE_CUDA_H
static_assert(sizeof(LaunchConfig) == sizeof(CUlaunchConfig), "CUlaunchConfig layout");
static_assert(offsetof(LaunchConfig, shared_bytes) == offsetof(CUlaunchConfig, sharedMemBytes), "CUlaunchConfig");
static_assert(offsetof(LaunchConfig, stream) == offsetof(CUlaunchConfig, hStream), "CUlaunchConfig layout");
static_assert(offsetof(LaunchConfig, num_attrs) == offsetof(CUlaunchConfig, numAttrs), "CUlaunchConfig layout");
#endif
using LaunchFn = int (*)(const LaunchConfig*, void*, void**, void**);

constexpr int kWrongContext = 201;  // CUDA_ERROR_INVALID_CONTEXT
constexpr int kInvalidHandle = 400; // CUDA_ERROR_INVALID_HANDLE
constexpr int kLowBit = 4;          // pointers are 16-byte aligned ...
constexpr uint64_t kPointerLimit = uint64_t{1} << 48;  // ... and below 2**48 (binder.py)
constexpr size_t kMaxPlans = 1024;
constexpr size_t kMaxFlags = 256;
constexpr size_t kMaxStreams = 64;
constexpr size_t kMaxArgBytes = 8192;
constexpr int kFlags = 6;           // causal, scale, config, layout, return_lse, family

// A strong reference (the GIL is held wherever one is made, copied or dropped).
class Ref {
  public:
    Ref() = default;
    explicit Ref(PyObject* o, bool steal = false) : o_(o) {
        if (!steal) Py_XINCREF(o_);
    }
    Ref(const Ref& r) : o_(r.o_) { Py_XINCREF(o_); }
    Ref(Ref&& r) noexcept : o_(r.o_) { r.o_ = nullptr; }
    Ref& operator=(Ref r) noexcept {
        std::swap(o_, r.o_);
        return *this;
    }
    ~Ref() { Py_XDECREF(o_); }
    PyObject* get() const { return o_; }

  private:
    PyObject* o_ = nullptr;
};

struct Field {
    uint32_t offset, width, shift;
    unsigned __int128 keep;
    uint32_t slot;                  // the pointer it holds: q, k, v, o, [lse], [workspace], [scratch]
};

// What depends only on the key (never changes once registered).
struct Plan {
    std::vector<uint8_t> args;      // the template argument bytes
    std::vector<Field> fields;      // each pointer's places (one or more: the binder's)
    size_t slots = 0;               // pointers: q, k, v, o, [lse], [workspace], [scratch]
    bool lse = false, workspace = false, scratch = false;
    unsigned geometry[7] = {};      // grid xyz, block xyz, dynamic shared bytes
    void* function = nullptr;
    LaunchFn launch = nullptr;
    std::vector<int64_t> out_shape, lse_shape;
    Ref owner, choice;              // the Python plan (kept alive: it owns the buffers) and its Choice
};

struct StreamBuffers {
    uint64_t stream, workspace, scratch;
};

struct Entry {
    std::shared_ptr<const Plan> plan;
    std::vector<StreamBuffers> streams;  // per-stream buffers (plans with a workspace or scratch)
};

using Key = std::array<int64_t, 32>;
struct KeyHash {
    size_t operator()(const Key& k) const noexcept {
        uint64_t h = 1469598103934665603ull;
        for (int64_t x : k) h = (h ^ static_cast<uint64_t>(x)) * 1099511628211ull;
        return static_cast<size_t>(h ^ (h >> 29));
    }
};

// The tables hold Python references, so they are never destroyed: C++ runs static destructors
// after the interpreter has finalized, without the GIL, and a reference dropped then aborts or
// crashes the process at exit (a dict config's copy did: SIGSEGV on the H100, tests/test_fastpath.py).
// The process is ending; the OS takes the memory back.
std::mutex g_mu;
auto& g_flags = *new std::vector<std::array<Ref, kFlags>>();   // a flag tuple's id is its index
auto& g_plans = *new std::unordered_map<Key, Entry, KeyHash>();
auto& g_order = *new std::deque<Key>();                         // registration order (the oldest goes first)
PyObject* g_config_type = nullptr;                 // evotuner.config.KernelConfig
PyObject* g_launch_failed = nullptr;               // raises the launch error (Python side)

// ---------------------------------------------------------------- flags

bool is_primitive(PyObject* o) {
    return o == Py_None || o == Py_True || o == Py_False || PyLong_CheckExact(o) || PyFloat_CheckExact(o) ||
           PyUnicode_CheckExact(o);
}

// The `items` tuple of a KernelConfig (borrowed through the instance dict), or null.
PyObject* config_items(PyObject* o) {
    if (g_config_type == nullptr || reinterpret_cast<PyObject*>(Py_TYPE(o)) != g_config_type) return nullptr;
    PyObject** dictptr = _PyObject_GetDictPtr(o);
    if (dictptr == nullptr || *dictptr == nullptr) return nullptr;
    PyObject* items = PyDict_GetItemString(*dictptr, "items");
    if (items == nullptr || !PyTuple_CheckExact(items)) return nullptr;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(items); ++i) {
        PyObject* pair = PyTuple_GET_ITEM(items, i);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2 ||
            !PyUnicode_CheckExact(PyTuple_GET_ITEM(pair, 0)) || !PyLong_CheckExact(PyTuple_GET_ITEM(pair, 1)))
            return nullptr;
    }
    return items;
}

// Whether flag `i` is of a type this table serves: immutable values whose equality runs no
// Python code. Anything else (a causal flag that is not a bool, a Mapping that is not a dict
// of plain values, a subclass) takes the Python path.
bool flag_ok(int i, PyObject* o) {
    switch (i) {
        case 0:
        case 4: return o == Py_True || o == Py_False;
        case 1: return o == Py_None || PyFloat_CheckExact(o) || PyLong_CheckExact(o);
        case 2: {
            if (o == Py_None || PyUnicode_CheckExact(o)) return true;
            if (config_items(o) != nullptr) return true;
            if (!PyDict_CheckExact(o)) return false;
            PyObject *key, *value;
            Py_ssize_t pos = 0;
            while (PyDict_Next(o, &pos, &key, &value))
                if (!PyUnicode_CheckExact(key) || !is_primitive(value)) return false;
            return true;
        }
        case 3: return PyUnicode_CheckExact(o);
        case 5: return o == Py_None || PyUnicode_CheckExact(o);
    }
    return false;
}

// Python's equality of two accepted flag values, identity first (as a tuple compares its
// items); a type mismatch counts as different (at worst a second entry for one plan). -1: error.
int same(PyObject* a, PyObject* b) {
    if (a == b) return 1;
    if (Py_TYPE(a) != Py_TYPE(b)) return 0;
    if (PyFloat_CheckExact(a)) return PyFloat_AS_DOUBLE(a) == PyFloat_AS_DOUBLE(b);
    if (PyDict_CheckExact(a) || PyLong_CheckExact(a) || PyUnicode_CheckExact(a))
        return PyObject_RichCompareBool(a, b, Py_EQ);
    PyObject *ia = config_items(a), *ib = config_items(b);
    if (ia != nullptr && ib != nullptr) return PyObject_RichCompareBool(ia, ib, Py_EQ);
    return 0;
}

// The id of the flag tuple (caller holds g_mu); -1 when unknown, -2 on an error.
int find_flags(PyObject* const* f) {
    for (size_t id = 0; id < g_flags.size(); ++id) {
        bool all = true;
        for (int i = 0; i < kFlags && all; ++i) {
            const int r = same(f[i], g_flags[id][i].get());
            if (r < 0) return -2;
            all = r == 1;
        }
        if (all) return static_cast<int>(id);
    }
    return -1;
}

bool flags_ok(PyObject* const* f) {
    for (int i = 0; i < kFlags; ++i)
        if (!flag_ok(i, f[i])) return false;
    return true;
}

// ---------------------------------------------------------------- the key

bool plain_tensor(PyObject* o) {
    if (!THPVariable_CheckExact(o)) return false;
    const at::Tensor& t = THPVariable_Unpack(o);
    if (!t.defined() || t.layout() != c10::kStrided || t.dim() != 4 || t.is_neg() || t.is_conj() || !t.has_storage())
        return false;
    const auto type = t.device().type();
    return type == c10::DeviceType::CUDA || type == c10::DeviceType::CPU;  // CPU: the tests' plans only
}

// q, k, v's shapes, strides, dtypes and devices, then the flag id (what _plan_key holds).
Key tensor_key(const at::Tensor* t, int flag_id) {
    Key key{};
    size_t n = 0;
    for (int i = 0; i < 3; ++i) {
        for (int d = 0; d < 4; ++d) key[n++] = t[i].sizes()[d];
        for (int d = 0; d < 4; ++d) key[n++] = t[i].strides()[d];
        key[n++] = static_cast<int64_t>(t[i].scalar_type());
        key[n++] = (static_cast<int64_t>(t[i].device().type()) << 16) | (t[i].device().index() & 0xffff);
    }
    key[n++] = flag_id;
    key[n++] = 0x65766f;  // the key's format
    return key;
}

}  // namespace
