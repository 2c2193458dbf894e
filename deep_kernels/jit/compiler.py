"""Compilation of generated sources to cubins, with nvcc (default) or in-process with NVRTC
(DK_JIT_USE_NVRTC), and the identity that enters cache keys."""

import functools
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

from deep_kernels import envs
from deep_kernels.jit.cache import CSRC_ROOT, REPO_ROOT

NVCC_FLAGS = ("-std=c++20", "-O3", "--expt-relaxed-constexpr", "-Xptxas=--warn-on-spills")
# NVRTC 13 takes neither -O3 (a host flag for nvcc) nor --expt-relaxed-constexpr; --dopt=on is the device
# optimization nvcc applies by default. -default-device: NVRTC rejects unannotated (host) functions, which
# cuda.h's driver API, render()'s instantiating function and the lambdas in kernels are; it makes them
# device functions (nothing calls the first two, so they leave no code).
NVRTC_FLAGS = ("-std=c++20", "--dopt=on", "-default-device", "--ptxas-options=--warn-on-spills")
# NVRTC has no C or C++ standard library: the standard headers our kernels and cuda.h include are given
# to it in memory, mapped to libcu++ (<cuda/std/...>, the toolkit's CCCL, NVRTC-ready), and std:: names
# resolve to cuda::std through the using-directive. NVRTC predefines size_t, all cuda.h takes from
# <stdlib.h>. <type_traits> and <utility> map to libcu++'s per-facility headers of what the kernels use:
# the whole <cuda/std/type_traits> adds ~1.1 s to every NVRTC compile. A kernel using another facility
# fails under NVRTC with 'namespace "std" has no member': add its header here.
_STD_TO_CUDA_STD = "namespace std { using namespace cuda::std; }\n"
NVRTC_STD_HEADERS = {
    "cstdint": "#include <cuda/std/cstdint>\n",
    "stdint.h": "#include <cuda/std/cstdint>\n",
    "stdlib.h": "",
    "type_traits": "#include <cuda/std/__type_traits/integral_constant.h>\n"
                   "#include <cuda/std/__type_traits/is_same.h>\n" + _STD_TO_CUDA_STD,
    "utility": "#include <cuda/std/__utility/integer_sequence.h>\n" + _STD_TO_CUDA_STD,
}
SOURCE_NAME = "kernel.cu"
PTX_NAME = "kernel.ptx"


def use_nvrtc() -> bool:
    return envs.get("DK_JIT_USE_NVRTC")


def nvcc_path() -> str:
    """DK_JIT_NVCC, else nvcc on PATH, else $CUDA_HOME/bin/nvcc, else /usr/local/cuda/bin/nvcc."""
    configured = envs.get("DK_JIT_NVCC")
    candidates = [configured] if configured else [
        shutil.which("nvcc"),
        os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"),
        "/usr/local/cuda/bin/nvcc",
    ]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise RuntimeError(
        "nvcc not found: install the CUDA toolkit (12.8 or newer) or set DK_JIT_NVCC to its path"
        + (f" (DK_JIT_NVCC={configured!r} is not an executable)" if configured else "")
    )


def cuda_include() -> Path:
    """The CUDA toolkit's include folder (cuda.h), next to nvcc or under $CUDA_HOME."""
    nvcc_dir = Path(nvcc_path()).resolve().parent
    for candidate in (nvcc_dir.parent / "include", Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include",
                      Path("/usr/local/cuda/include")):
        if (candidate / "cuda.h").is_file():
            return candidate
    raise RuntimeError(f"cuda.h not found next to {nvcc_dir} or under $CUDA_HOME: set CUDA_HOME to the toolkit")


@functools.lru_cache(maxsize=None)
def nvcc_version(path: str) -> str:
    """The release line of `nvcc --version`, e.g. 'Cuda compilation tools, release 13.0, V13.0.88'."""
    output = subprocess.run([path, "--version"], check=True, capture_output=True, text=True).stdout
    return next(line for line in output.splitlines() if "release" in line).strip()


def cutlass_include() -> Path:
    """CUTLASS/CuTe headers: DK_CUTLASS_INCLUDE, else third_party/cutlass/include (linked by install.sh)."""
    configured = envs.get("DK_CUTLASS_INCLUDE")
    path = Path(configured) if configured else REPO_ROOT / "third_party" / "cutlass" / "include"
    if not (path / "cute").is_dir():
        raise RuntimeError(
            f"CUTLASS headers not found at {path}: run ./install.sh (links the nvidia-cutlass wheel's "
            "headers there) or set DK_CUTLASS_INCLUDE to a CUTLASS include folder"
        )
    return path


def compile_command(source: Path, output: Path, arch: str, *, ptx: bool = False) -> list:
    target = f"-gencode=arch=compute_{arch},code={'compute' if ptx else 'sm'}_{arch}"
    verbose = ["-Xptxas=-v"] if envs.get("DK_JIT_PTXAS_VERBOSE") and not ptx else []
    return [
        nvcc_path(), *NVCC_FLAGS, target, "-ptx" if ptx else "-cubin", *verbose,
        f"-I{CSRC_ROOT}", f"-I{cutlass_include()}", str(source), "-o", str(output),
    ]


def compiler_identity(arch: str) -> str:
    """What besides the source decides the binary: backend and compiler version, flags, toolkit headers,
    target and CUTLASS version."""
    cutlass_version = (cutlass_include() / "cutlass" / "version.h").read_text()
    # nvcc's version also names the toolkit whose headers (cuda_bf16.h, CCCL) NVRTC compiles.
    toolkit = nvcc_version(nvcc_path())
    if use_nvrtc():
        backend = [nvrtc_version(), toolkit, " ".join(NVRTC_FLAGS), repr(sorted(NVRTC_STD_HEADERS.items()))]
    else:
        backend = [toolkit, " ".join(NVCC_FLAGS)]
    return "\n".join([*backend, arch, cutlass_version])


def run_compile(command: list) -> None:
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    if envs.get("DK_JIT_DEBUG"):
        print(f"[deep_kernels.jit] {' '.join(command)} ({time.perf_counter() - start:.2f} s)", file=sys.stderr)
    if result.returncode != 0:
        raise RuntimeError(f"nvcc failed ({result.returncode}):\n{' '.join(command)}\n{result.stderr}")
    if envs.get("DK_JIT_PTXAS_VERBOSE") and result.stderr:
        print(result.stderr, file=sys.stderr, end="")


@functools.lru_cache(maxsize=None)
def nvrtc_version() -> str:
    """'nvrtc <major>.<minor>' of the libnvrtc cuda-bindings loads (the nvidia-cuda-nvrtc wheel)."""
    from cuda.bindings import nvrtc

    try:
        major, minor = _nvrtc_check(nvrtc.nvrtcVersion(), "nvrtcVersion")
    except RuntimeError as error:
        raise RuntimeError(
            "libnvrtc cannot be loaded (DK_JIT_USE_NVRTC is on): pip install 'nvidia-cuda-nvrtc>=13.0,<14' "
            f"(the `nvrtc` extra) or turn DK_JIT_USE_NVRTC off\n{error}"
        ) from error
    return f"nvrtc {major}.{minor}"


def nvrtc_release() -> tuple:
    """(major, minor) of nvrtc_version()."""
    return tuple(int(part) for part in nvrtc_version().split()[1].split("."))


def _nvrtc_check(result_and_values, what: str):
    from cuda.bindings import nvrtc

    result, *values = result_and_values
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"nvrtc failed: {what} returned {result.name}")
    return values[0] if len(values) == 1 else values


def nvrtc_options(arch: str) -> list:
    verbose = ["--ptxas-options=-v"] if envs.get("DK_JIT_PTXAS_VERBOSE") else []
    # NVRTC 12.9+ caches compiles where a driver is present, and a cached compile runs no ptxas to report.
    if verbose and nvrtc_release() >= (12, 9):
        verbose.append("--no-cache")
    toolkit = cuda_include()
    # CUDA 13 keeps CCCL (libcu++) in include/cccl, which nvcc adds by itself; CUDA 12 in include/.
    cccl = [f"-I{toolkit / 'cccl'}"] if (toolkit / "cccl").is_dir() else []
    return [*NVRTC_FLAGS, f"--gpu-architecture=sm_{arch}", *verbose, f"-I{CSRC_ROOT}", f"-I{cutlass_include()}",
            f"-I{toolkit}", *cccl]


class NvrtcOutput(NamedTuple):
    cubin: bytes
    ptx: str


def nvrtc_compile(source: str, arch: str) -> NvrtcOutput:
    """Compile `source` in this process with NVRTC; a failure raises RuntimeError with the program log."""
    from cuda.bindings import nvrtc

    options = nvrtc_options(arch)
    names = list(NVRTC_STD_HEADERS)
    program = _nvrtc_check(nvrtc.nvrtcCreateProgram(
        source.encode(), SOURCE_NAME.encode(), len(names), [NVRTC_STD_HEADERS[n].encode() for n in names],
        [n.encode() for n in names]), "nvrtcCreateProgram")
    try:
        start = time.perf_counter()
        (result,) = nvrtc.nvrtcCompileProgram(program, len(options), [o.encode() for o in options])
        if envs.get("DK_JIT_DEBUG"):
            print(f"[deep_kernels.jit] nvrtc {' '.join(options)} ({time.perf_counter() - start:.2f} s)",
                  file=sys.stderr)
        # Logs and PTX end with a NUL.
        log = _nvrtc_output(program, nvrtc.nvrtcGetProgramLogSize, nvrtc.nvrtcGetProgramLog).rstrip(b"\0").decode()
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(f"nvrtc failed ({result.name}):\n{' '.join(options)}\n{log}")
        if envs.get("DK_JIT_PTXAS_VERBOSE") and log:
            print(log, file=sys.stderr, end="")
        return NvrtcOutput(cubin=_nvrtc_output(program, nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN),
                           ptx=_nvrtc_output(program, nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX).rstrip(b"\0").decode())
    finally:
        nvrtc.nvrtcDestroyProgram(program)


def _nvrtc_output(program, get_size, get) -> bytes:
    """One output of a compiled program: log, PTX or cubin."""
    # A bytearray: NVRTC writes into the buffer (b" " * n may be an interned bytes object).
    buffer = bytearray(_nvrtc_check(get_size(program), get_size.__name__))
    _nvrtc_check(get(program, buffer), get.__name__)
    return bytes(buffer)


def compile_source(source: str, workdir: Path, arch: str) -> bytes:
    """Compile `source` to a cubin with the selected backend; with DK_JIT_KEEP_SOURCE the .cu and a .ptx
    stay in workdir."""
    if use_nvrtc():
        output = nvrtc_compile(source, arch)
        if envs.get("DK_JIT_KEEP_SOURCE"):
            (workdir / SOURCE_NAME).write_text(source)
            (workdir / PTX_NAME).write_text(output.ptx)
        return output.cubin
    cu_path = workdir / SOURCE_NAME
    cu_path.write_text(source)
    cubin_path = workdir / "compiled.cubin"
    run_compile(compile_command(cu_path, cubin_path, arch))
    binary = cubin_path.read_bytes()
    cubin_path.unlink()
    if envs.get("DK_JIT_KEEP_SOURCE"):
        run_compile(compile_command(cu_path, workdir / PTX_NAME, arch, ptx=True))
    else:
        cu_path.unlink()
    return binary
