"""Every DK_* environment variable: name, type, default and one line of doc.

This module is the only reader of ``os.environ`` in the package. Values are read at call time so a
test (or a user) can change them in-process; hot paths cache what they derive from them.
"""

import functools
import os
from dataclasses import dataclass
from typing import Callable, Optional


@dataclass(frozen=True)
class EnvVar:
    name: str
    parse: Callable[[str], object]
    default: object
    doc: str


def _flag(text: str) -> bool:
    if text.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if text.strip().lower() in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected a flag (0/1, true/false), got {text!r}")


def _optional_str(text: str) -> Optional[str]:
    return text or None


def _optional_int(text: str) -> Optional[int]:
    return int(text) if text else None


VARIABLES = {
    v.name: v
    for v in (
        EnvVar("DK_JIT_CACHE_DIR", _optional_str, None,
               "kernel cache directory (default: jit_cache/ in a source checkout, else ~/.cache/deep_kernels)"),
        EnvVar("DK_JIT_NVCC", _optional_str, None,
               "path of nvcc (default: nvcc on PATH, then $CUDA_HOME/bin/nvcc, then /usr/local/cuda/bin/nvcc)"),
        EnvVar("DK_JIT_USE_NVRTC", _flag, False,
               "compile in-process with NVRTC (the nvidia-cuda-nvrtc wheel) instead of nvcc"),
        EnvVar("DK_JIT_ARCH", _optional_str, None,
               "target architecture such as 90a (default: from the GPU; 90a when there is none, for compile-only use)"),
        EnvVar("DK_CUTLASS_INCLUDE", _optional_str, None,
               "CUTLASS include folder (default: third_party/cutlass/include, linked by install.sh)"),
        EnvVar("DK_JIT_DEBUG", _flag, False,
               "print every compile command, its time and cache hits/misses"),
        EnvVar("DK_JIT_KEEP_SOURCE", _flag, False,
               "keep the generated .cu and the PTX next to each cached cubin"),
        EnvVar("DK_JIT_PTXAS_VERBOSE", _flag, False,
               "print ptxas resource usage (registers, shared memory, spills) of each compile"),
        EnvVar("DK_JIT_HOST_CXX", _optional_str, None,
               "host C++ compiler for the launcher extension (default: /usr/bin/g++, then g++ on PATH)"),
        EnvVar("DK_FP8_GEMM_CONFIG", _optional_str, None,
               "override the FP8 GEMM heuristics for experiments, e.g. block_m=128,block_n=112,stages=5,multicast=2"),
        EnvVar("DK_NUM_SMS", _optional_int, None,
               "number of SMs the persistent kernels use (default: all of the device's)"),
    )
}


def get(name: str):
    """The parsed value of a DK_* variable, or its default when unset or empty."""
    var = VARIABLES[name]
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return var.default
    try:
        return var.parse(raw)
    except ValueError as error:
        raise ValueError(f"environment variable {name}={raw!r} is invalid: {error}") from None


@functools.lru_cache(maxsize=None)
def get_once(name: str):
    """get(name) read at the first call and kept: for values hot paths consult on every call."""
    return get(name)


def describe() -> list:
    """(name, current value, default, doc) for every variable, as `python -m deep_kernels info` prints it."""
    return [(v.name, get(v.name), v.default, v.doc) for v in VARIABLES.values()]
