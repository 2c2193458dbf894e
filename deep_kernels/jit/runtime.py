"""Loading cubins through the CUDA driver (cuda-python) and launching them on torch's current stream.

`get_kernel` is the one entry: an in-process table maps a specialization to its loaded kernel, so a
repeated call costs one dict lookup, with no file hashing and no disk access. On a miss the binary
comes from the disk cache or is compiled, then it is loaded as a CUDA library whose single kernel is
checked against its KernelDef (parameter count and sizes from the driver, block size against the launch
bounds: jit/signature.py) and gets its dynamic shared-memory limit raised on every device once.
"""

import itertools
import sys
import time

import torch

from deep_kernels import envs
from deep_kernels.device import target_arch
from deep_kernels.jit import cache, compiler, launcher, signature
from deep_kernels.jit.definition import F32, I32, TENSOR_MAP
from deep_kernels.jit.source import KernelSpec

# cuTensorMapEncodeTiled data types and swizzle modes (cuda.h: CUtensorMapDataType, CUtensorMapSwizzle).
TMA_DTYPES = {
    torch.uint8: 0, torch.float8_e4m3fn: 0, torch.int32: 4, torch.float32: 7, torch.bfloat16: 9,
}
SWIZZLE_MODES = {0: 0, 32: 1, 64: 2, 128: 3}
SM90 = (9, 0)


def _check(result_and_values, what: str):
    from cuda.bindings import driver

    result, *values = result_and_values if isinstance(result_and_values, tuple) else (result_and_values,)
    if result != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"deep_kernels: {what} failed with {result.name}")
    return values[0] if len(values) == 1 else values


def build_binary(spec: KernelSpec, arch: str) -> bytes:
    """The cubin of a specialization: from the disk cache, else compiled and published."""
    source = spec.render()
    key = cache.cache_key(source, compiler.compiler_identity(arch))
    entry = cache.entry_dir(spec.name, key)
    start = time.perf_counter()
    binary = cache.get_or_build(entry, lambda workdir: compiler.compile_source(source, workdir, arch))
    if envs.get("DK_JIT_DEBUG"):
        print(f"[deep_kernels.jit] {spec.name} {key} ready in {time.perf_counter() - start:.3f} s", file=sys.stderr)
    return binary


class Kernel:
    """A loaded kernel and how it is launched: `launch(grid, device_index, **params)` takes every parameter of its
    KernelDef by name (tensor maps from `tensor_map`, pointers as int addresses, scalars as Python numbers) and
    launches on torch's current stream of the device; a missing or unknown name raises TypeError before
    anything is launched. `encode(**params)` checks and encodes the same parameters into bytes once,
    `launch_encoded(grid, device_index, encoded)` launches from them, and `prepare(grid, device_index, encoded)`
    makes of them a launch fixed but for its stream (the hot path of callers that cache them). A
    cooperative kernel has every block resident at once (or fails to launch), so that its blocks may wait for each
    other."""

    __slots__ = ("name", "handle", "library", "definition", "block_threads", "smem_bytes", "cluster_size",
                 "cooperative", "_param_kinds")

    def __new__(cls, definition, *args):
        # Each KernelDef launches through a subclass whose launch() takes exactly its parameters.
        return object.__new__(_kernel_class(definition) if cls is Kernel else cls)

    def __init__(self, definition, handle: int, library, block_threads: int, smem_bytes: int, cluster_size: int):
        self.name = definition.name
        self.handle = handle
        self.library = library
        self.definition = definition
        self.block_threads = block_threads
        self.smem_bytes = smem_bytes
        self.cluster_size = cluster_size
        self.cooperative = definition.cooperative
        self._param_kinds = definition.param_kinds

    def launch_encoded(self, grid, device_index: int, encoded: bytes) -> None:
        """Launch with parameters from this kernel's encode(...) (which checked them): no tensor map is encoded
        here, so a caller that keeps the encodings of its calls' addresses pays for the launch alone."""
        _native_launch_encoded(self.handle, grid, self.block_threads, self.smem_bytes, self.cluster_size, device_index,
                               torch._C._cuda_getCurrentRawStream(device_index), encoded, self.cooperative)

    def prepare(self, grid, device_index: int, encoded: bytes):
        """A launch of this kernel with parameters from its encode(...) (which checked them), fixed but for the
        stream: its `launch(stream)` (a raw stream handle, as torch._C._cuda_getCurrentRawStream gives) costs the
        driver call alone, for callers that keep one per set of their calls' addresses."""
        return _native_prepare(self.handle, grid, self.block_threads, self.smem_bytes, self.cluster_size,
                               device_index, encoded, self.cooperative)

    def _parameter_value_error(self, values: tuple, error: Exception) -> Exception:
        """The native launcher rejected a value: name the first parameter whose value does not fit its type."""
        for param, value in zip(self.definition.params, values):
            if param.type is TENSOR_MAP:
                fits = isinstance(value, tuple)
            elif param.type is F32:
                fits = isinstance(value, (int, float))
            else:
                low, high = (-2**31, 2**31) if param.type is I32 else (0, 2**(8 * param.type.size))
                fits = isinstance(value, int) and low <= value < high
            if not fits:
                return type(error)(f"{self.name}.launch: parameter {param.name} ({param.type.name}) cannot take "
                                   f"{value!r}: {error}")
        return error


# NOTE: generated once per KernelDef, as collections.namedtuple generates its class: Python binds the keyword
# arguments to the declared names in C (a missing or unknown one raises TypeError naming it) and the values go
# to the native launcher in declaration order, at half the cost of a dict and an itemgetter.
_LAUNCH_TEMPLATE = """\
def launch(self, grid, device_index, /, *, {names}):
    values = ({names},)
    try:
        _native_launch(self.handle, grid, self.block_threads, self.smem_bytes, self.cluster_size, device_index,
                       torch._C._cuda_getCurrentRawStream(device_index), self._param_kinds, values, self.cooperative)
    except (TypeError, OverflowError) as error:
        raise self._parameter_value_error(values, error) from error
"""
_ENCODE_TEMPLATE = """\
def encode(self, /, *, {names}):
    values = ({names},)
    try:
        return _native_encode(self._param_kinds, values)
    except (TypeError, OverflowError) as error:
        raise self._parameter_value_error(values, error) from error
"""
_kernel_classes = {}


def _kernel_class(definition) -> type:
    cls = _kernel_classes.get(definition)
    if cls is None:
        namespace = {}
        # The function's globals are this module's: _native_launch rebinds itself here on first use.
        exec(_LAUNCH_TEMPLATE.format(names=", ".join(definition.param_names)), globals(), namespace)
        exec(_ENCODE_TEMPLATE.format(names=", ".join(definition.param_names)), globals(), namespace)
        launch, encode = namespace["launch"], namespace["encode"]
        launch.__qualname__ = f"{definition.name}.launch"
        launch.__doc__ = f"Launch {definition.name} with its parameters ({', '.join(definition.param_names)}) by name."
        encode.__qualname__ = f"{definition.name}.encode"
        encode.__doc__ = (f"{definition.name}'s parameters ({', '.join(definition.param_names)}) by name, encoded for "
                          "launch_encoded (tensor maps included).")
        cls = _kernel_classes[definition] = type(f"{definition.name}_kernel", (Kernel,),
                                                 {"__slots__": (), "launch": launch, "encode": encode})
    return cls


def _no_cuda_stream(device_index: int) -> int:
    raise RuntimeError("deep_kernels: this torch build has no CUDA")


# The raw handle of torch's current stream on a device (torch.cuda.current_stream(i).cuda_stream without making a
# Stream): what a prepared launch (Kernel.prepare) takes.
current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", _no_cuda_stream)


def _native_launch(*args) -> None:
    # Rebinds itself to the native function on first use: no lookup on later calls.
    global _native_launch
    _native_launch = launcher.load().launch
    _native_launch(*args)


def _native_encode(*args) -> bytes:
    global _native_encode
    _native_encode = launcher.load().encode
    return _native_encode(*args)


def _native_launch_encoded(*args) -> None:
    global _native_launch_encoded
    _native_launch_encoded = launcher.load().launch_encoded
    _native_launch_encoded(*args)


def _native_prepare(*args):
    global _native_prepare
    _native_prepare = launcher.load().prepare
    return _native_prepare(*args)


# Launches kept per call signature (remember_launch): a caching allocator hands the same few addresses out again and
# again, so a handful covers steady state; the bound keeps a stream of fresh addresses from growing it.
LAUNCHES_PER_SIGNATURE = 64


def remember_launch(cache: dict, key, launch):
    """Stores a launch made for a set of addresses (Kernel.prepare) in cache under key (those addresses), evicting
    the oldest entry beyond LAUNCHES_PER_SIGNATURE; returns launch."""
    if len(cache) >= LAUNCHES_PER_SIGNATURE:
        del cache[next(iter(cache))]
    cache[key] = launch
    return launch


def _param_layout(driver, kernel) -> list:
    """(offset, size) of each of the kernel's parameters, from the driver."""
    layout = []
    for index in itertools.count():
        result, *values = driver.cuKernelGetParamInfo(kernel, index)
        if result == driver.CUresult.CUDA_ERROR_INVALID_VALUE:  # past the last parameter
            return layout
        offset, size = _check((result, values), "cuKernelGetParamInfo")
        layout.append((int(offset), int(size)))


def _make_a_context_current(driver) -> None:
    """cuKernelGetParamInfo needs a current context, which a thread that has made no CUDA runtime call yet does not
    have (autograd's backward threads, loading a kernel the forward did not use): there, the current device's
    primary context is made current, as the runtime's first call would make it. (Retained for good: torch holds it
    for the process anyway.)"""
    if int(_check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")) != 0:
        return
    device = _check(driver.cuDeviceGet(torch.cuda.current_device()), "cuDeviceGet")
    _check(driver.cuCtxSetCurrent(_check(driver.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain")),
           "cuCtxSetCurrent")


def load_kernel(binary: bytes, spec: KernelSpec, smem_bytes: int = 0) -> Kernel:
    """Load a specialization's cubin; its parameters and block size are checked against its KernelDef
    (SignatureError on a mismatch) and its dynamic shared-memory limit raised to smem_bytes on every Hopper device."""
    from cuda.bindings import driver

    definition = spec.definition
    torch.cuda.init()
    _check(driver.cuInit(0), "cuInit")
    library = _check(driver.cuLibraryLoadData(binary, None, None, 0, None, None, 0), "cuLibraryLoadData")
    count = _check(driver.cuLibraryGetKernelCount(library), "cuLibraryGetKernelCount")
    if count != 1:
        raise RuntimeError(f"deep_kernels: the cubin of {spec.name} holds {count} kernels, expected 1")
    (kernel,) = _check(driver.cuLibraryEnumerateKernels(1, library), "cuLibraryEnumerateKernels")
    _make_a_context_current(driver)
    signature.check_param_layout(definition, _param_layout(driver, kernel), spec)
    block_threads = definition.block_threads(spec)
    smem_attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    threads_attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
    for device_index in range(torch.cuda.device_count()):
        if torch.cuda.get_device_capability(device_index) != SM90:  # the cubin runs on Hopper only
            continue
        device = _check(driver.cuDeviceGet(device_index), "cuDeviceGet")
        max_threads = _check(driver.cuKernelGetAttribute(threads_attribute, kernel, device), "cuKernelGetAttribute")
        signature.check_block_threads(definition, block_threads, max_threads, spec)
        _check(driver.cuKernelSetAttribute(smem_attribute, smem_bytes, kernel, device), "cuKernelSetAttribute")
    return Kernel(definition, int(kernel), library, block_threads, smem_bytes, definition.cluster_size(spec))


_kernels = {}


def get_kernel(spec: KernelSpec, smem_bytes: int = 0) -> Kernel:
    """The loaded kernel of a specialization (made by its KernelDef's `spec`), launched with smem_bytes of
    dynamic shared memory; compiled or read from disk on the first call only."""
    key = (spec, smem_bytes)
    kernel = _kernels.get(key)
    if kernel is None:
        if spec.definition is None:
            raise TypeError(f"get_kernel needs a spec made by its KernelDef (KernelDef.spec), got {spec}")
        binary = build_binary(spec, target_arch())
        kernel = _kernels[key] = load_kernel(binary, spec, smem_bytes)
    return kernel


def tensor_map(tensor: torch.Tensor, box: tuple, swizzle_bytes: int = 0, transpose: bool = False) -> tuple:
    """A TENSOR_MAP parameter's value: a tiled TMA descriptor's spec, encoded by the launcher.

    The tensor's last dimension must be dense (its first, with transpose=True: the descriptor then
    sees the transposed tensor, as tensor.t() would give, without making the view). box is outermost
    first, like the tensor's shape.
    """
    shape, strides = tuple(tensor.shape), list(tensor.stride())
    if transpose:
        shape, strides, box = shape[::-1], strides[::-1], box[::-1]
    # TMA never steps over a dimension of one element, but the driver wants each outer stride a multiple of 16
    # bytes: such a dimension (one row of a wider view, say) gets the smallest stride the driver takes.
    elements_per_16_bytes = 16 // tensor.element_size()
    if shape[-1] == 1:
        strides[-1] = 1
    for dim in range(len(shape) - 2, -1, -1):
        if shape[dim] == 1:
            inner = shape[dim + 1] * strides[dim + 1]
            strides[dim] = -(-inner // elements_per_16_bytes) * elements_per_16_bytes
    return (tensor.data_ptr(), TMA_DTYPES[tensor.dtype], tensor.element_size(), shape, tuple(strides), box,
            SWIZZLE_MODES[swizzle_bytes])
