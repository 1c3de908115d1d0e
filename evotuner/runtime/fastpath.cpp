// evotuner's C++ hot path for evotuner.flash_attention (see evotuner/runtime/fastpath.py);
// the plan table and the key are in fastpath_table.h, this file binds, launches and registers.
//
// Python resolves a call exactly as before (validate, choose, build, load, derive the plan
// and its ArgBinder) and then registers the plan here, under a key this file computes from
// the call's own tensors and flags; the same function computes the key of every later call,
// so registration and look-up cannot drift. A hit allocates the output (and LSE), writes the
// pointers into a per-call copy of the argument bytes (the family's workspace, a tile counter,
// is this stream's buffer, zeroed once: the kernel leaves it as it found it) and launches with
// cuLaunchKernelEx on torch's current stream of the tensors' device, all
// without Python code. Anything unusual (a tensor subclass, an unknown key or stream, grad,
// odd pointers, a flag of a type whose equality could run Python code, another current
// context) returns None and Python takes its own path, unchanged.
//
// No CUDA header and no CUDA library: the driver's entry point (cuLaunchKernelEx) is an
// address Python passes with each plan (from the libcuda it already
// loaded), CUlaunchConfig is mirrored below (checked against cuda.h where the compiler sees
// one), and torch's current stream comes from the device-generic c10 guard interface (in
// libc10), so the module builds against any torch, the CPU wheel included.
//
// Threads: every entry point runs with the GIL held; the tables are guarded by one mutex that
// is never held while Python code can run (the flag comparisons below only compare str, int,
// float, tuples and dicts of those, which run no Python code), nor during allocation or launch.

#include "fastpath_table.h"   // the plan table and the key (types, flags, tensor keys)

#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace {

// ---------------------------------------------------------------- binding

void bind_into(uint8_t* buf, const std::vector<Field>& fields, const uint64_t* ptrs) {
    for (const Field& f : fields) {
        const unsigned __int128 value = f.keep | (static_cast<unsigned __int128>(ptrs[f.slot] >> kLowBit) << f.shift);
        const uint64_t lo = static_cast<uint64_t>(value), hi = static_cast<uint64_t>(value >> 64);
        std::memcpy(buf + f.offset, &lo, 8);  // little-endian, as the device reads it
        if (f.width == 16) std::memcpy(buf + f.offset + 8, &hi, 8);
    }
}

uint64_t current_stream(const c10::Device& device) {
    if (device.type() != c10::DeviceType::CUDA) return 0;
    const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    return reinterpret_cast<uint64_t>(impl->getStream(device).native_handle());
}

// A call's q, k, v (args[0..2]) into t, when they are plain tensors and its flags (args[3..8])
// are of the kinds the table compares without Python code; false: the Python path's call.
bool call_tensors(PyObject* const* args, at::Tensor* t) {
    if (!plain_tensor(args[0]) || !plain_tensor(args[1]) || !plain_tensor(args[2]) || !flags_ok(args + 3))
        return false;
    for (int i = 0; i < 3; ++i) t[i] = THPVariable_Unpack(args[i]);
    return true;
}

PyObject* wrap(at::Tensor t) { return THPVariable_Wrap(std::move(t)); }

// ---------------------------------------------------------------- run

// run(q, k, v, causal, scale, config, layout, return_lse, family, return_choice): what
// flash_attention returns, or None for the Python path.
PyObject* run(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "run: expected 10 arguments");
        return nullptr;
    }
    at::Tensor t[3];
    if (!call_tensors(args, t)) Py_RETURN_NONE;
    if (c10::GradMode::is_enabled() && (t[0].requires_grad() || t[1].requires_grad() || t[2].requires_grad()))
        Py_RETURN_NONE;  // Python raises forward_only_error()
    int want_choice = args[9] == Py_True ? 1 : args[9] == Py_False ? 0 : PyObject_IsTrue(args[9]);
    if (want_choice < 0) return nullptr;
    try {
        const c10::Device device = t[0].device();
        const uint64_t stream = current_stream(device);
        std::shared_ptr<const Plan> plan;
        uint64_t ws = 0, scratch = 0;
        {
            std::lock_guard<std::mutex> lock(g_mu);
            const int id = find_flags(args + 3);
            if (id == -2) return nullptr;
            if (id < 0) Py_RETURN_NONE;
            auto it = g_plans.find(tensor_key(t, id));
            if (it == g_plans.end()) Py_RETURN_NONE;
            plan = it->second.plan;
            if (plan->workspace || plan->scratch) {
                bool found = false;
                for (const StreamBuffers& s : it->second.streams)
                    if (s.stream == stream) ws = s.workspace, scratch = s.scratch, found = true;
                if (!found) Py_RETURN_NONE;  // Python makes this stream's buffers first
            }
        }
        uint64_t ptrs[7];
        size_t n = 0;
        for (const at::Tensor& x : t) ptrs[n++] = reinterpret_cast<uint64_t>(x.const_data_ptr());
        at::TensorOptions options = at::TensorOptions().dtype(t[0].scalar_type()).device(device);
        at::Tensor out = at::empty(plan->out_shape, options);
        ptrs[n++] = reinterpret_cast<uint64_t>(out.mutable_data_ptr());
        at::Tensor lse;
        if (plan->lse) {
            lse = at::empty(plan->lse_shape, options.dtype(at::kFloat));
            ptrs[n++] = reinterpret_cast<uint64_t>(lse.mutable_data_ptr());
        }
        if (plan->workspace) ptrs[n++] = ws;
        if (plan->scratch) ptrs[n++] = scratch;
        for (size_t i = 0; i < n; ++i)
            if (ptrs[i] == 0 || (ptrs[i] & 15) || ptrs[i] >= kPointerLimit) Py_RETURN_NONE;
        if (n != plan->slots) Py_RETURN_NONE;
        alignas(64) uint8_t buf[kMaxArgBytes];
        std::memcpy(buf, plan->args.data(), plan->args.size());
        bind_into(buf, plan->fields, ptrs);
        void* stream_handle = reinterpret_cast<void*>(stream);
        LaunchConfig config{{plan->geometry[0], plan->geometry[1], plan->geometry[2]},
                            {plan->geometry[3], plan->geometry[4], plan->geometry[5]},
                            plan->geometry[6], stream_handle, nullptr, 0};
        void* params[1] = {buf};
        const int code = plan->launch(&config, plan->function, params, nullptr);
        if (code == kWrongContext || code == kInvalidHandle) Py_RETURN_NONE;  // nothing ran
        if (code) {
            PyObject* r = PyObject_CallFunction(g_launch_failed, "iO", code, plan->owner.get());
            Py_XDECREF(r);
            if (r != nullptr) PyErr_SetString(PyExc_RuntimeError, "launch failed");
            return nullptr;
        }
        PyObject* o = wrap(std::move(out));
        if (o == nullptr) return nullptr;
        if (!plan->lse && !want_choice) return o;
        PyObject* l = nullptr;
        if (plan->lse && (l = wrap(std::move(lse))) == nullptr) {
            Py_DECREF(o);
            return nullptr;
        }
        PyObject* c = plan->choice.get();
        if (l != nullptr && want_choice) return Py_BuildValue("(NNO)", o, l, c);
        return l != nullptr ? Py_BuildValue("(NN)", o, l) : Py_BuildValue("(NO)", o, c);
    } catch (const std::exception&) {
        // allocation or a device query failed: Python's path raises torch's own error
        if (PyErr_Occurred()) return nullptr;
        Py_RETURN_NONE;
    }
}

// ---------------------------------------------------------------- registration

bool read_u64(PyObject* o, uint64_t* v) {
    *v = PyLong_AsUnsignedLongLong(o);
    return !PyErr_Occurred();
}

bool read_shape(PyObject* o, std::vector<int64_t>* shape) {
    PyObject* seq = PySequence_Fast(o, "shape: expected a sequence");
    if (seq == nullptr) return false;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
        shape->push_back(PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i)));
        if (PyErr_Occurred()) {
            Py_DECREF(seq);
            return false;
        }
    }
    Py_DECREF(seq);
    return true;
}

// The binder's fields ((offset, width, shift, keep_lo, keep_hi, slot) each) into *out, each
// checked to fit `arg_bytes` argument bytes, to hold a pointer's 44 significant bits and to
// name one of `slots` pointers, every pointer with a field; false with a Python error set
// (`what` names the caller) otherwise.
bool read_fields(PyObject* fields, size_t arg_bytes, size_t slots, const char* what, std::vector<Field>* out) {
    PyObject* seq = PySequence_Fast(fields, "fields: expected a sequence");
    if (seq == nullptr) return false;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
        unsigned offset, width, shift, slot;
        unsigned long long lo, hi;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "IIIKKI", &offset, &width, &shift, &lo, &hi,
                              &slot)) {
            Py_DECREF(seq);
            return false;
        }
        if ((width != 8 && width != 16) || shift + 44 > width * 8 || offset + width > arg_bytes) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "%s: a field does not fit the argument bytes", what);
            return false;
        }
        if (slot >= slots) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "%s: a field names pointer %u of %zu", what, slot, slots);
            return false;
        }
        out->push_back({offset, width, shift, (static_cast<unsigned __int128>(hi) << 64) | lo, slot});
    }
    Py_DECREF(seq);
    for (size_t k = 0; k < slots; ++k) {
        bool held = false;
        for (const Field& f : *out) held = held || f.slot == k;
        if (!held) {
            PyErr_Format(PyExc_ValueError, "%s: pointer %zu has no field", what, k);
            return false;
        }
    }
    return true;
}

// Plan from the spec tuple fastpath.py builds (plan_spec()).
std::shared_ptr<Plan> read_plan(PyObject* spec) {
    PyObject *args, *fields, *geometry, *out_shape, *lse_shape, *owner, *choice;
    unsigned long long function, launch;
    int lse, workspace, scratch;
    if (!PyArg_ParseTuple(spec, "SOpppOKKOOOO", &args, &fields, &lse, &workspace, &scratch, &geometry, &function,
                          &launch, &out_shape, &lse_shape, &owner, &choice))
        return nullptr;
    auto plan = std::make_shared<Plan>();
    const char* bytes = PyBytes_AS_STRING(args);
    plan->args.assign(bytes, bytes + PyBytes_GET_SIZE(args));
    plan->lse = lse, plan->workspace = workspace, plan->scratch = scratch;
    plan->function = reinterpret_cast<void*>(function);
    plan->launch = reinterpret_cast<LaunchFn>(launch);
    plan->owner = Ref(owner), plan->choice = Ref(choice);
    if (!PyArg_ParseTuple(geometry, "IIIIIII", &plan->geometry[0], &plan->geometry[1], &plan->geometry[2],
                          &plan->geometry[3], &plan->geometry[4], &plan->geometry[5], &plan->geometry[6]))
        return nullptr;
    if (!read_shape(out_shape, &plan->out_shape)) return nullptr;
    if (plan->lse && !read_shape(lse_shape, &plan->lse_shape)) return nullptr;
    plan->slots = 4 + plan->lse + plan->workspace + plan->scratch;
    if (!read_fields(fields, plan->args.size(), plan->slots, "register", &plan->fields)) return nullptr;
    if (plan->args.size() > kMaxArgBytes || plan->launch == nullptr) {
        PyErr_SetString(PyExc_ValueError, "register: the plan's fields do not fit its argument bytes");
        return nullptr;
    }
    return plan;
}

void add_stream(Entry& entry, const StreamBuffers& buffers) {
    const Plan& plan = *entry.plan;
    if (!plan.workspace && !plan.scratch) return;
    for (StreamBuffers& s : entry.streams)
        if (s.stream == buffers.stream) {
            s = buffers;
            return;
        }
    const bool usable = (!plan.workspace || buffers.workspace) && (!plan.scratch || buffers.scratch);
    if (usable && entry.streams.size() < kMaxStreams) entry.streams.push_back(buffers);
}

// register(q, k, v, causal, scale, config, layout, return_lse, family, spec, stream, workspace, scratch):
// True when the plan (and this stream's buffers) is served from now on, False when the call
// is of a kind the table does not serve or the table is full.
PyObject* register_plan(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError, "register: expected 13 arguments");
        return nullptr;
    }
    at::Tensor t[3];
    if (!call_tensors(args, t)) Py_RETURN_FALSE;
    StreamBuffers buffers{};
    if (!read_u64(args[10], &buffers.stream) || !read_u64(args[11], &buffers.workspace) ||
        !read_u64(args[12], &buffers.scratch))
        return nullptr;
    {   // known already: only this stream's buffers may be new
        std::lock_guard<std::mutex> lock(g_mu);
        const int id = find_flags(args + 3);
        if (id == -2) return nullptr;
        auto it = id >= 0 ? g_plans.find(tensor_key(t, id)) : g_plans.end();
        if (it != g_plans.end()) {
            add_stream(it->second, buffers);
            Py_RETURN_TRUE;
        }
    }
    std::shared_ptr<Plan> fresh = read_plan(args[9]);  // outside the lock: parsing may run Python code
    if (!fresh) return nullptr;
    std::array<Ref, kFlags> flags;
    for (int i = 0; i < kFlags; ++i)  // a dict is kept as a copy: the caller may change theirs
        flags[i] = PyDict_CheckExact(args[3 + i]) ? Ref(PyDict_Copy(args[3 + i]), true) : Ref(args[3 + i]);
    if (flags[2].get() == nullptr) return nullptr;
    std::vector<Ref> dropped;  // released after the lock: freeing a plan may run Python code
    {
        std::lock_guard<std::mutex> lock(g_mu);
        int id = find_flags(args + 3);  // again: another thread may have registered meanwhile
        if (id == -2) return nullptr;
        if (id < 0) {
            if (g_flags.size() >= kMaxFlags) Py_RETURN_FALSE;
            g_flags.push_back(std::move(flags));
            id = static_cast<int>(g_flags.size()) - 1;
        }
        const Key key = tensor_key(t, id);
        auto it = g_plans.find(key);
        if (it == g_plans.end()) {
            while (g_plans.size() >= kMaxPlans && !g_order.empty()) {
                auto old = g_plans.find(g_order.front());
                if (old != g_plans.end()) {
                    dropped.push_back(old->second.plan->owner);
                    dropped.push_back(old->second.plan->choice);
                    g_plans.erase(old);
                }
                g_order.pop_front();
            }
            it = g_plans.emplace(key, Entry{fresh, {}}).first;
            g_order.push_back(key);
        }
        add_stream(it->second, buffers);
    }
    Py_RETURN_TRUE;
}

PyObject* clear(PyObject*, PyObject*) {
    std::vector<std::array<Ref, kFlags>> flags;
    std::unordered_map<Key, Entry, KeyHash> plans;
    {
        std::lock_guard<std::mutex> lock(g_mu);
        flags.swap(g_flags);
        plans.swap(g_plans);
        g_order.clear();
    }
    Py_RETURN_NONE;  // the references go here, outside the lock
}

PyObject* counts(PyObject*, PyObject*) {
    std::lock_guard<std::mutex> lock(g_mu);
    size_t streams = 0;
    for (const auto& kv : g_plans) streams += kv.second.streams.size();
    return Py_BuildValue("(nnn)", static_cast<Py_ssize_t>(g_flags.size()), static_cast<Py_ssize_t>(g_plans.size()),
                         static_cast<Py_ssize_t>(streams));
}

// configure(KernelConfig, launch_failed): the config type and the launch-error callback.
PyObject* configure(PyObject*, PyObject* args) {
    PyObject *type, *failed;
    if (!PyArg_ParseTuple(args, "OO", &type, &failed)) return nullptr;
    Py_XSETREF(g_config_type, Py_NewRef(type));
    Py_XSETREF(g_launch_failed, Py_NewRef(failed));
    Py_RETURN_NONE;
}

// key(q, k, v, causal, scale, config, layout, return_lse, family): the look-up key as a tuple
// (the flag id last but one), or None where run() would not look (for the tests).
PyObject* key(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "key: expected 9 arguments");
        return nullptr;
    }
    at::Tensor t[3];
    if (!call_tensors(args, t)) Py_RETURN_NONE;
    int id;
    {
        std::lock_guard<std::mutex> lock(g_mu);
        id = find_flags(args + 3);
    }
    if (id == -2) return nullptr;
    const Key k = tensor_key(t, id);
    PyObject* out = PyTuple_New(static_cast<Py_ssize_t>(k.size()));
    if (out == nullptr) return nullptr;
    for (size_t i = 0; i < k.size(); ++i) PyTuple_SET_ITEM(out, static_cast<Py_ssize_t>(i), PyLong_FromLongLong(k[i]));
    return out;
}

// bind(template, fields, pointers) -> bytes: the binder's rule, for the tests (one pointer per slot).
PyObject* bind(PyObject*, PyObject* args) {
    PyObject *tmpl, *fields, *pointers;
    if (!PyArg_ParseTuple(args, "SOO", &tmpl, &fields, &pointers)) return nullptr;
    std::vector<uint64_t> ptrs;
    PyObject* seq = PySequence_Fast(pointers, "pointers: expected a sequence");
    if (seq == nullptr) return nullptr;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
        ptrs.push_back(PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(seq, i)));
        if (PyErr_Occurred()) {
            Py_DECREF(seq);
            return nullptr;
        }
    }
    Py_DECREF(seq);
    std::vector<Field> parsed;   // every field names one of the pointers, each pointer has one
    if (!read_fields(fields, static_cast<size_t>(PyBytes_GET_SIZE(tmpl)), ptrs.size(), "bind", &parsed))
        return nullptr;
    std::vector<uint8_t> buf(PyBytes_AS_STRING(tmpl), PyBytes_AS_STRING(tmpl) + PyBytes_GET_SIZE(tmpl));
    bind_into(buf.data(), parsed, ptrs.data());
    return PyBytes_FromStringAndSize(reinterpret_cast<const char*>(buf.data()), static_cast<Py_ssize_t>(buf.size()));
}

// stream(device_index) -> int: torch's current stream of that CUDA device, as run() sees it.
PyObject* stream(PyObject*, PyObject* arg) {
    const long index = PyLong_AsLong(arg);
    if (PyErr_Occurred()) return nullptr;
    try {
        return PyLong_FromUnsignedLongLong(
            current_stream(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index))));
    } catch (const std::exception& e) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
        return nullptr;
    }
}

PyMethodDef kMethods[] = {
    {"run", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(run)), METH_FASTCALL,
     "run(q, k, v, causal, scale, config, layout, return_lse, family, return_choice): the result or None"},
    {"register", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(register_plan)), METH_FASTCALL,
     "register(q, k, v, causal, scale, config, layout, return_lse, family, spec, stream, workspace, scratch)"},
    {"key", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(key)), METH_FASTCALL,
     "key(q, k, v, causal, scale, config, layout, return_lse, family): the look-up key or None"},
    {"bind", bind, METH_VARARGS, "bind(template, fields, pointers) -> bytes"},
    {"clear", clear, METH_NOARGS, "forget every plan and flag tuple"},
    {"counts", counts, METH_NOARGS, "(flag tuples, plans, stream buffers) held"},
    {"configure", configure, METH_VARARGS, "configure(KernelConfig, launch_failed)"},
    {"stream", stream, METH_O, "stream(device) -> torch's current stream handle"},
    {nullptr, nullptr, 0, nullptr}};

#define EVOTUNER_STR2(x) #x
#define EVOTUNER_STR(x) EVOTUNER_STR2(x)

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, EVOTUNER_STR(TORCH_EXTENSION_NAME),
                       "evotuner's C++ hot path (evotuner/runtime/fastpath.py)", -1, kMethods};

}  // namespace

#define EVOTUNER_INIT2(name) PyInit_##name
#define EVOTUNER_INIT(name) EVOTUNER_INIT2(name)

PyMODINIT_FUNC EVOTUNER_INIT(TORCH_EXTENSION_NAME)(void) {
    PyObject* m = PyModule_Create(&kModule);
    if (m == nullptr) return nullptr;
    if (PyModule_AddStringConstant(m, "BUILD_KEY", EVOTUNER_STR(EVOTUNER_BUILD_KEY)) < 0) {
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}
