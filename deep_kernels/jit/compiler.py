"""Compilation of generated sources to cubins with nvcc, and the identity that enters cache keys."""

import functools
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from deep_kernels import envs
from deep_kernels.jit.cache import CSRC_ROOT, REPO_ROOT

NVCC_FLAGS = ("-std=c++20", "-O3", "--expt-relaxed-constexpr", "-Xptxas=--warn-on-spills")
SOURCE_NAME = "kernel.cu"
PTX_NAME = "kernel.ptx"


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
    """What besides the source decides the binary: compiler version, flags, target and CUTLASS version."""
    cutlass_version = (cutlass_include() / "cutlass" / "version.h").read_text()
    return "\n".join([nvcc_version(nvcc_path()), " ".join(NVCC_FLAGS), arch, cutlass_version])


def run_compile(command: list) -> None:
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    if envs.get("DK_JIT_DEBUG"):
        print(f"[deep_kernels.jit] {' '.join(command)} ({time.perf_counter() - start:.2f} s)", file=sys.stderr)
    if result.returncode != 0:
        raise RuntimeError(f"nvcc failed ({result.returncode}):\n{' '.join(command)}\n{result.stderr}")
    if envs.get("DK_JIT_PTXAS_VERBOSE") and result.stderr:
        print(result.stderr, file=sys.stderr, end="")


def compile_source(source: str, workdir: Path, arch: str) -> bytes:
    """Compile `source` in workdir to a cubin; with DK_JIT_KEEP_SOURCE the .cu and a .ptx stay there."""
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
