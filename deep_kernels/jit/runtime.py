"""Loading cubins through the CUDA driver (cuda-python) and launching them on torch's current stream.

`get_kernel` is the one entry: an in-process table maps a specialization to its loaded kernel, so a
repeated call costs one dict lookup, with no file hashing and no disk access. On a miss the binary
comes from the disk cache or is compiled, then it is loaded as a CUDA library whose single kernel
gets its dynamic shared-memory limit raised on every device once.
"""

import sys
import time
from dataclasses import dataclass

import torch

from deep_kernels import envs
from deep_kernels.device import target_arch
from deep_kernels.jit import cache, compiler, launcher
from deep_kernels.jit.source import KernelSpec

# cuTensorMapEncodeTiled data types and swizzle modes (cuda.h: CUtensorMapDataType, CUtensorMapSwizzle).
TMA_DTYPES = {
    torch.uint8: 0, torch.float8_e4m3fn: 0, torch.int32: 4, torch.float32: 7, torch.bfloat16: 9,
}
SWIZZLE_MODES = {0: 0, 32: 1, 64: 2, 128: 3}


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


@dataclass(frozen=True)
class Kernel:
    """A loaded kernel and how it is launched.

    param_kinds has one letter per kernel parameter: T tensor map (from `tensor_map`), P pointer,
    I uint32, i int32, f float. A cooperative kernel has every block resident at once (or fails to launch),
    so that its blocks may wait for each other.
    """

    name: str
    handle: int
    library: object
    param_kinds: str
    block_threads: int
    smem_bytes: int
    cluster_size: int
    cooperative: bool = False

    def launch(self, grid, params: tuple, device_index: int) -> None:
        """Launch on torch's current stream of the device."""
        stream = torch._C._cuda_getCurrentRawStream(device_index)
        _native_launch(self.handle, grid, self.block_threads, self.smem_bytes, self.cluster_size,
                       device_index, stream, self.param_kinds, params, self.cooperative)


def _native_launch(*args) -> None:
    # Rebinds itself to the native function on first use: no lookup on later calls.
    global _native_launch
    _native_launch = launcher.load().launch
    _native_launch(*args)


def load_kernel(binary: bytes, name: str, *, param_kinds: str, block_threads: int, smem_bytes: int,
                cluster_size: int = 1, cooperative: bool = False) -> Kernel:
    from cuda.bindings import driver

    torch.cuda.init()
    _check(driver.cuInit(0), "cuInit")
    library = _check(driver.cuLibraryLoadData(binary, None, None, 0, None, None, 0), "cuLibraryLoadData")
    count = _check(driver.cuLibraryGetKernelCount(library), "cuLibraryGetKernelCount")
    if count != 1:
        raise RuntimeError(f"deep_kernels: the cubin of {name} holds {count} kernels, expected 1")
    (kernel,) = _check(driver.cuLibraryEnumerateKernels(1, library), "cuLibraryEnumerateKernels")
    attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    for device_index in range(torch.cuda.device_count()):
        device = _check(driver.cuDeviceGet(device_index), "cuDeviceGet")
        _check(driver.cuKernelSetAttribute(attribute, smem_bytes, kernel, device), "cuKernelSetAttribute")
    return Kernel(name, int(kernel), library, param_kinds, block_threads, smem_bytes, cluster_size, cooperative)


_kernels = {}


def get_kernel(spec: KernelSpec, *, param_kinds: str, block_threads: int, smem_bytes: int = 0,
               cluster_size: int = 1, cooperative: bool = False) -> Kernel:
    """The loaded kernel of a specialization; compiled or read from disk on the first call only."""
    key = (spec, param_kinds, block_threads, smem_bytes, cluster_size, cooperative)
    kernel = _kernels.get(key)
    if kernel is None:
        binary = build_binary(spec, target_arch())
        kernel = load_kernel(binary, spec.name, param_kinds=param_kinds, block_threads=block_threads,
                             smem_bytes=smem_bytes, cluster_size=cluster_size, cooperative=cooperative)
        _kernels[key] = kernel
    return kernel


def tensor_map(tensor: torch.Tensor, box: tuple, swizzle_bytes: int = 0, transpose: bool = False) -> tuple:
    """A kernel parameter of kind T: a tiled TMA descriptor, encoded by the launcher.

    The tensor's last dimension must be dense (its first, with transpose=True: the descriptor then
    sees the transposed tensor, as tensor.t() would give, without making the view). box is outermost
    first, like the tensor's shape.
    """
    shape, strides = tensor.shape, tensor.stride()
    if transpose:
        shape, strides, box = shape[::-1], strides[::-1], box[::-1]
    return (tensor.data_ptr(), TMA_DTYPES[tensor.dtype], tensor.element_size(), shape, strides, box,
            SWIZZLE_MODES[swizzle_bytes])
