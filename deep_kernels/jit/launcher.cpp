// The hot path of a kernel call, in native code: encode TMA descriptors and launch on a stream, in one call.
//
// Python does the validation and picks the kernel; this extension does the two driver calls that
// cost microseconds through cuda-python. encode() turns a launch's parameters into bytes once (the
// tensor-map encodings are the costly part) and launch_encoded() launches from them; prepare() makes of
// them a launch fixed but for its stream, whose launch(stream) is the whole per-call cost, for callers
// that cache launches per set of addresses. The driver is opened with dlopen, so the extension builds
// and imports on a machine without a GPU. Built on first use by deep_kernels/jit/launcher.py.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <cuda.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace {

struct Driver {
    decltype(&::cuLaunchKernelEx) launch_kernel_ex = nullptr;
    decltype(&::cuTensorMapEncodeTiled) tensor_map_encode_tiled = nullptr;
    decltype(&::cuGetErrorName) get_error_name = nullptr;
    decltype(&::cuCtxSetCurrent) ctx_set_current = nullptr;
    decltype(&::cuCtxGetCurrent) ctx_get_current = nullptr;
    decltype(&::cuDeviceGet) device_get = nullptr;
    decltype(&::cuDevicePrimaryCtxRetain) primary_ctx_retain = nullptr;
};

Driver g_driver;
bool g_driver_loaded = false;

bool load_driver() {
    if (g_driver_loaded)
        return true;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
        PyErr_Format(PyExc_RuntimeError, "deep_kernels: cannot open the CUDA driver (libcuda.so.1): %s", dlerror());
        return false;
    }
    const char* missing = nullptr;
    const auto resolve = [&](auto& fn, const char* name) {
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
        if (fn == nullptr)
            missing = name;
        return fn != nullptr;
    };
    if (!(resolve(g_driver.launch_kernel_ex, "cuLaunchKernelEx") &&
          resolve(g_driver.tensor_map_encode_tiled, "cuTensorMapEncodeTiled") &&
          resolve(g_driver.get_error_name, "cuGetErrorName") &&
          resolve(g_driver.ctx_set_current, "cuCtxSetCurrent") &&
          resolve(g_driver.ctx_get_current, "cuCtxGetCurrent") &&
          resolve(g_driver.device_get, "cuDeviceGet") &&
          resolve(g_driver.primary_ctx_retain, "cuDevicePrimaryCtxRetain"))) {
        PyErr_Format(PyExc_RuntimeError, "deep_kernels: the CUDA driver lacks %s (needs a CUDA 12.4+ driver)", missing);
        return false;
    }
    g_driver_loaded = true;
    return true;
}

PyObject* raise_cuda_error(CUresult result, const char* what) {
    const char* name = "unknown";
    g_driver.get_error_name(result, &name);
    PyErr_Format(PyExc_RuntimeError, "deep_kernels: %s failed with %s (%d)", what, name, static_cast<int>(result));
    return nullptr;
}

// Reads a sequence (tuple, torch.Size) of `count` Python ints into `out`, innermost (last) first.
template <typename T>
bool read_reversed(PyObject* sequence, Py_ssize_t count, T* out, const char* what) {
    if (!PyTuple_Check(sequence) || PyTuple_GET_SIZE(sequence) != count) {
        PyErr_Format(PyExc_ValueError, "deep_kernels: %s must be a tuple of %zd ints", what, count);
        return false;
    }
    for (Py_ssize_t i = 0; i < count; ++i) {
        out[i] = static_cast<T>(PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(sequence, count - 1 - i)));
        if (PyErr_Occurred())
            return false;
    }
    return true;
}

// Encodes one tiled CUtensorMap from a spec tuple (address, dtype, element_bytes, shape, strides, box,
// swizzle): shape, strides (in elements) and box are outermost first, like torch's; the innermost
// dimension must be dense.
bool encode_tiled(CUtensorMap* tensor_map, PyObject* spec) {
    unsigned long long address;
    int dtype, element_bytes, swizzle;
    PyObject *shape_obj, *strides_obj, *box_obj;
    if (!PyTuple_Check(spec) ||
        !PyArg_ParseTuple(spec, "KiiOOOi", &address, &dtype, &element_bytes, &shape_obj, &strides_obj, &box_obj,
                          &swizzle)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "deep_kernels: a tensor map parameter must be a spec tuple");
        return false;
    }
    const Py_ssize_t rank = PyTuple_Check(shape_obj) ? PyTuple_GET_SIZE(shape_obj) : 0;
    if (rank < 1 || rank > 5) {
        PyErr_SetString(PyExc_ValueError, "deep_kernels: a tensor map has rank 1 to 5");
        return false;
    }
    cuuint64_t dims[5], strides[5];
    cuuint32_t box[5], element_strides[5] = {1, 1, 1, 1, 1};
    if (!read_reversed(shape_obj, rank, dims, "shape") || !read_reversed(strides_obj, rank, strides, "strides") ||
        !read_reversed(box_obj, rank, box, "box"))
        return false;
    if (strides[0] != 1) {
        PyErr_SetString(PyExc_ValueError, "deep_kernels: a tensor map's innermost dimension must be dense");
        return false;
    }
    // The driver takes the rank - 1 outer strides, in bytes.
    for (Py_ssize_t i = 1; i < rank; ++i)
        strides[i - 1] = strides[i] * element_bytes;
    if (!load_driver())
        return false;
    const CUresult result = g_driver.tensor_map_encode_tiled(
        tensor_map, static_cast<CUtensorMapDataType>(dtype), static_cast<cuuint32_t>(rank),
        reinterpret_cast<void*>(address), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
        static_cast<CUtensorMapSwizzle>(swizzle), CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (result != CUDA_SUCCESS) {
        raise_cuda_error(result, "cuTensorMapEncodeTiled");
        return false;
    }
    return true;
}

constexpr int kMaxParams = 32;

// One kernel parameter's storage; CUtensorMap needs its 64-byte alignment.
union alignas(64) ParamSlot {
    CUtensorMap tensor_map;
    uint64_t u64;
    uint32_t u32;
    float f32;
};

// Fills slots[0, num_params) from the parameter values (kinds: one letter per parameter, T tensor map (a spec
// tuple, encoded here), P pointer / u64, I u32, i i32, f f32); false with a Python error set on a bad value.
bool fill_slots(ParamSlot* slots, const char* kinds, Py_ssize_t num_kinds, PyObject* params) {
    const Py_ssize_t num_params = PyTuple_GET_SIZE(params);
    if (num_params != num_kinds || num_params > kMaxParams) {
        PyErr_Format(PyExc_ValueError, "deep_kernels: %zd parameters for a signature of %zd (at most %d)",
                     num_params, num_kinds, kMaxParams);
        return false;
    }
    for (Py_ssize_t i = 0; i < num_params; ++i) {
        PyObject* value = PyTuple_GET_ITEM(params, i);
        switch (kinds[i]) {
            case 'T':
                if (!encode_tiled(&slots[i].tensor_map, value))
                    return false;
                break;
            case 'P': slots[i].u64 = PyLong_AsUnsignedLongLong(value); break;
            case 'I': slots[i].u32 = static_cast<uint32_t>(PyLong_AsUnsignedLong(value)); break;
            case 'i': slots[i].u32 = static_cast<uint32_t>(static_cast<int32_t>(PyLong_AsLong(value))); break;
            case 'f': slots[i].f32 = static_cast<float>(PyFloat_AsDouble(value)); break;
            default:
                PyErr_Format(PyExc_ValueError, "deep_kernels: unknown parameter kind '%c'", kinds[i]);
                return false;
        }
        if (PyErr_Occurred())
            return false;
    }
    return true;
}

// A launch's configuration but for its stream: grid, block, shared memory, and the cluster and cooperative
// attributes (config.attrs points into attributes).
struct LaunchShape {
    CUlaunchConfig config;
    CUlaunchAttribute attributes[2];
};

void make_launch_shape(LaunchShape* shape, unsigned int grid_x, unsigned int grid_y, unsigned int grid_z,
                       unsigned int block, unsigned int smem_bytes, unsigned int cluster, int cooperative) {
    unsigned int num_attributes = 0;
    if (cluster > 1) {
        shape->attributes[num_attributes].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        shape->attributes[num_attributes].value.clusterDim.x = cluster;
        shape->attributes[num_attributes].value.clusterDim.y = 1;
        shape->attributes[num_attributes].value.clusterDim.z = 1;
        ++num_attributes;
    }
    if (cooperative) {
        shape->attributes[num_attributes].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
        shape->attributes[num_attributes].value.cooperative = 1;
        ++num_attributes;
    }
    CUlaunchConfig& config = shape->config;
    config.gridDimX = grid_x;
    config.gridDimY = grid_y;
    config.gridDimZ = grid_z;
    config.blockDimX = block;
    config.blockDimY = 1;
    config.blockDimZ = 1;
    config.sharedMemBytes = smem_bytes;
    config.hStream = nullptr;
    config.attrs = shape->attributes;
    config.numAttrs = num_attributes;
}

constexpr int kMaxDevices = 64;
// Each device's primary context (the one torch works in), retained on first use and kept.
CUcontext g_primary_contexts[kMaxDevices] = {};

bool primary_context(int device, CUcontext* context) {
    if (device < 0 || device >= kMaxDevices) {
        PyErr_Format(PyExc_ValueError, "deep_kernels: device index %d is out of range", device);
        return false;
    }
    if (g_primary_contexts[device] == nullptr) {
        CUdevice cu_device;
        CUresult result = g_driver.device_get(&cu_device, device);
        if (result == CUDA_SUCCESS)
            result = g_driver.primary_ctx_retain(&g_primary_contexts[device], cu_device);
        if (result != CUDA_SUCCESS) {
            g_primary_contexts[device] = nullptr;
            raise_cuda_error(result, "cuDevicePrimaryCtxRetain");
            return false;
        }
    }
    *context = g_primary_contexts[device];
    return true;
}

// Launches a kernel of a LaunchShape on a stream of `device` with its parameters' addresses.
// NOTE: a launch on a default stream (0) runs in the current context, whatever device the tensors are on: the
// device's primary context is made current for the launch, as torch's device guard does, and the caller's put back.
PyObject* launch_shaped(unsigned long long kernel, LaunchShape* shape, int device, unsigned long long stream,
                        void** param_ptrs) {
    if (!load_driver())
        return nullptr;
    CUcontext context, previous = nullptr;
    if (!primary_context(device, &context))
        return nullptr;
    CUresult result = g_driver.ctx_get_current(&previous);
    if (result == CUDA_SUCCESS && previous != context)
        result = g_driver.ctx_set_current(context);
    if (result != CUDA_SUCCESS)
        return raise_cuda_error(result, "cuCtxSetCurrent");
    shape->config.hStream = reinterpret_cast<CUstream>(stream);
    result = g_driver.launch_kernel_ex(&shape->config, reinterpret_cast<CUfunction>(kernel), param_ptrs, nullptr);
    if (previous != context)
        g_driver.ctx_set_current(previous);
    if (result != CUDA_SUCCESS)
        return raise_cuda_error(result, "cuLaunchKernelEx");
    Py_RETURN_NONE;
}

// Launches a kernel whose parameters are slots[0, num_params).
PyObject* launch_slots(unsigned long long kernel, unsigned int grid_x, unsigned int grid_y, unsigned int grid_z,
                       unsigned int block, unsigned int smem_bytes, unsigned int cluster, int device,
                       unsigned long long stream, ParamSlot* slots, Py_ssize_t num_params, int cooperative) {
    void* param_ptrs[kMaxParams];
    for (Py_ssize_t i = 0; i < num_params; ++i)
        param_ptrs[i] = &slots[i];
    LaunchShape shape;
    make_launch_shape(&shape, grid_x, grid_y, grid_z, block, smem_bytes, cluster, cooperative);
    return launch_shaped(kernel, &shape, device, stream, param_ptrs);
}

// launch(kernel, grid, block, smem_bytes, cluster, device, stream, kinds, params[, cooperative])
// params: one value per letter of kinds (fill_slots). cooperative (default false): every block is resident at
// once, or the launch fails.
PyObject* launch(PyObject*, PyObject* args) {
    unsigned long long kernel, stream;
    unsigned int grid_x, grid_y, grid_z, block, smem_bytes, cluster;
    int device;
    const char* kinds;
    Py_ssize_t num_kinds;
    PyObject* params;
    int cooperative = 0;
    if (!PyArg_ParseTuple(args, "K(III)IIIiKs#O!|p", &kernel, &grid_x, &grid_y, &grid_z, &block, &smem_bytes,
                          &cluster, &device, &stream, &kinds, &num_kinds, &PyTuple_Type, &params, &cooperative))
        return nullptr;
    ParamSlot slots[kMaxParams];
    if (!fill_slots(slots, kinds, num_kinds, params))
        return nullptr;
    return launch_slots(kernel, grid_x, grid_y, grid_z, block, smem_bytes, cluster, device, stream, slots,
                        PyTuple_GET_SIZE(params), cooperative);
}

// encode(kinds, params) -> bytes: the parameters as launch_encoded takes them, tensor maps encoded once
// (a launch then costs no encoding: callers cache this per set of addresses).
PyObject* encode(PyObject*, PyObject* args) {
    const char* kinds;
    Py_ssize_t num_kinds;
    PyObject* params;
    if (!PyArg_ParseTuple(args, "s#O!", &kinds, &num_kinds, &PyTuple_Type, &params))
        return nullptr;
    ParamSlot slots[kMaxParams] = {};  // zeroed: the bytes past each scalar are part of the encoding
    if (!fill_slots(slots, kinds, num_kinds, params))
        return nullptr;
    return PyBytes_FromStringAndSize(reinterpret_cast<const char*>(slots),
                                     PyTuple_GET_SIZE(params) * static_cast<Py_ssize_t>(sizeof(ParamSlot)));
}

// The number of parameters a bytes object from encode() holds; -1 with a Python error set if it is no encoding.
Py_ssize_t encoded_params(Py_ssize_t num_bytes) {
    const Py_ssize_t num_params = num_bytes / static_cast<Py_ssize_t>(sizeof(ParamSlot));
    if (num_bytes % static_cast<Py_ssize_t>(sizeof(ParamSlot)) != 0 || num_params > kMaxParams) {
        PyErr_Format(PyExc_ValueError, "deep_kernels: %zd bytes are not the encoding of at most %d parameters",
                     num_bytes, kMaxParams);
        return -1;
    }
    return num_params;
}

// launch_encoded(kernel, grid, block, smem_bytes, cluster, device, stream, encoded[, cooperative]): launch with
// parameters from encode().
PyObject* launch_encoded(PyObject*, PyObject* args) {
    unsigned long long kernel, stream;
    unsigned int grid_x, grid_y, grid_z, block, smem_bytes, cluster;
    int device;
    const char* encoded;
    Py_ssize_t num_bytes;
    int cooperative = 0;
    if (!PyArg_ParseTuple(args, "K(III)IIIiKy#|p", &kernel, &grid_x, &grid_y, &grid_z, &block, &smem_bytes,
                          &cluster, &device, &stream, &encoded, &num_bytes, &cooperative))
        return nullptr;
    const Py_ssize_t num_params = encoded_params(num_bytes);
    if (num_params < 0)
        return nullptr;
    // NOTE: copied into aligned storage: a bytes object's buffer has no 64-byte alignment (CUtensorMap's).
    ParamSlot slots[kMaxParams];
    std::memcpy(slots, encoded, num_bytes);
    return launch_slots(kernel, grid_x, grid_y, grid_z, block, smem_bytes, cluster, device, stream, slots,
                        num_params, cooperative);
}

// A launch fixed but for its stream (prepare()): its one method, launch(stream), costs the driver call alone.
struct PreparedLaunch {
    PyObject_HEAD
    unsigned long long kernel;
    int device;
    LaunchShape shape;
    void* param_ptrs[kMaxParams];
    // NOTE: raw bytes, the slots placed at the first 64-byte boundary inside (CUtensorMap's alignment): the object's
    // memory (PyType_GenericAlloc) is aligned to 16 bytes only, so a ParamSlot member would be misaligned.
    char slot_storage[kMaxParams * sizeof(ParamSlot) + 64];
};

PyObject* prepared_launch_launch(PyObject* self, PyObject* stream_obj) {
    auto* prepared = reinterpret_cast<PreparedLaunch*>(self);
    const unsigned long long stream = PyLong_AsUnsignedLongLong(stream_obj);
    if (PyErr_Occurred())
        return nullptr;
    return launch_shaped(prepared->kernel, &prepared->shape, prepared->device, stream, prepared->param_ptrs);
}

PyMethodDef prepared_launch_methods[] = {
    {"launch", prepared_launch_launch, METH_O, "launch(stream): launch on a stream (a raw CUstream handle)."},
    {nullptr, nullptr, 0, nullptr},
};

PyTypeObject prepared_launch_type = {
    PyVarObject_HEAD_INIT(nullptr, 0)
};

// prepare(kernel, grid, block, smem_bytes, cluster, device, encoded[, cooperative]) -> PreparedLaunch: a launch
// with parameters from encode(), everything fixed but the stream.
PyObject* prepare(PyObject*, PyObject* args) {
    unsigned long long kernel;
    unsigned int grid_x, grid_y, grid_z, block, smem_bytes, cluster;
    int device;
    const char* encoded;
    Py_ssize_t num_bytes;
    int cooperative = 0;
    if (!PyArg_ParseTuple(args, "K(III)IIIiy#|p", &kernel, &grid_x, &grid_y, &grid_z, &block, &smem_bytes,
                          &cluster, &device, &encoded, &num_bytes, &cooperative))
        return nullptr;
    const Py_ssize_t num_params = encoded_params(num_bytes);
    if (num_params < 0)
        return nullptr;
    PyObject* object = PyType_GenericAlloc(&prepared_launch_type, 0);
    if (object == nullptr)
        return nullptr;
    auto* prepared = reinterpret_cast<PreparedLaunch*>(object);
    prepared->kernel = kernel;
    prepared->device = device;
    make_launch_shape(&prepared->shape, grid_x, grid_y, grid_z, block, smem_bytes, cluster, cooperative);
    char* slots = prepared->slot_storage;
    slots += (64 - reinterpret_cast<uintptr_t>(slots) % 64) % 64;
    std::memcpy(slots, encoded, num_bytes);
    for (Py_ssize_t i = 0; i < num_params; ++i)
        prepared->param_ptrs[i] = slots + i * static_cast<Py_ssize_t>(sizeof(ParamSlot));
    return object;
}

PyMethodDef methods[] = {
    {"launch", launch, METH_VARARGS, "Launch a kernel with cuLaunchKernelEx on a stream."},
    {"encode", encode, METH_VARARGS, "A launch's parameters encoded (tensor maps included), for launch_encoded."},
    {"launch_encoded", launch_encoded, METH_VARARGS, "Launch a kernel with parameters from encode()."},
    {"prepare", prepare, METH_VARARGS, "A launch with parameters from encode(), fixed but for its stream."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_dk_launcher", "deep_kernels launch hot path", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__dk_launcher() {
    prepared_launch_type.tp_name = "_dk_launcher.PreparedLaunch";
    prepared_launch_type.tp_basicsize = sizeof(PreparedLaunch);
    prepared_launch_type.tp_flags = Py_TPFLAGS_DEFAULT;
    prepared_launch_type.tp_doc = "A kernel launch fixed but for its stream (prepare()).";
    prepared_launch_type.tp_methods = prepared_launch_methods;
    if (PyType_Ready(&prepared_launch_type) < 0)
        return nullptr;
    return PyModule_Create(&module);
}
