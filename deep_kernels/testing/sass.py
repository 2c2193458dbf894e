"""Disassembly checks of compiled kernels: SASS text and resource usage through cuobjdump.

cuobjdump, and the nvdisasm that its --dump-sass runs, come from the toolkit (on PATH) or from the
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels (the `test` extra).
"""

import functools
import importlib.metadata
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


def _tool_path(name: str, wheel: str) -> str:
    """An executable on PATH, else the one the wheel installs."""
    found = shutil.which(name)
    if found:
        return found
    try:
        files = importlib.metadata.files(wheel) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.name == name:
            return str(Path(file.locate()).resolve())
    raise RuntimeError(f"{name} not found: pip install {wheel} (the `test` extra)")


@functools.lru_cache(maxsize=None)
def cuobjdump_path() -> str:
    return _tool_path("cuobjdump", "nvidia-cuda-cuobjdump")


@functools.lru_cache(maxsize=None)
def nvdisasm_path() -> str:
    return _tool_path("nvdisasm", "nvidia-cuda-nvdisasm")


@dataclass(frozen=True)
class ResourceUsage:
    registers: int
    stack_bytes: int
    local_bytes: int
    shared_bytes: int


def resource_usage(cubin: Path) -> ResourceUsage:
    text = subprocess.run([cuobjdump_path(), "--dump-resource-usage", str(cubin)], check=True,
                          capture_output=True, text=True).stdout
    fields = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", text))
    return ResourceUsage(int(fields["REG"]), int(fields["STACK"]), int(fields["LOCAL"]), int(fields["SHARED"]))


def sass(cubin: Path) -> str:
    # NOTE: cuobjdump --dump-sass runs nvdisasm, which it looks for beside itself and on PATH only; a
    # cuobjdump found on PATH need not have the wheel's nvdisasm beside it, so nvdisasm's folder goes first.
    path = os.pathsep.join([str(Path(nvdisasm_path()).parent), os.environ.get("PATH", "")])
    return subprocess.run([cuobjdump_path(), "--dump-sass", str(cubin)], check=True, capture_output=True,
                          text=True, env=dict(os.environ, PATH=path)).stdout


def local_memory_instructions(sass_text: str) -> list:
    """Loads and stores to local memory (spills or arrays indexed at run time)."""
    return re.findall(r"\b(?:LDL|STL)\b[^;]*;", sass_text)


# SASS mnemonics a kernel must contain, by kernel name (matrix kernels on the tensor cores).
REQUIRED_INSTRUCTIONS = {"sm90_fp8_gemm": ("QGMMA",), "sm90_fp8_fp4_gemm_swap_ab": ("QGMMA",),
                         "sm90_fp8_nvfp4_gemm_swap_ab": ("HGMMA",)}


def kernel_problems(kernel_name: str, cubin: Path, required: tuple = None) -> list:
    """What a compiled kernel must not show, as messages (empty when it is clean): a stack frame, local
    memory or local loads and stores, a target other than sm_90a, a required instruction missing (`required`,
    default REQUIRED_INSTRUCTIONS of the kernel's name)."""
    problems = []
    usage = resource_usage(cubin)
    if usage.stack_bytes or usage.local_bytes:
        problems.append(f"stack or local memory: {usage}")
    text = sass(cubin)
    if ".target\tsm_90a" not in text:
        problems.append("not an sm_90a binary")
    problems += [f"local memory access: {instruction}" for instruction in local_memory_instructions(text)]
    if required is None:
        required = REQUIRED_INSTRUCTIONS.get(kernel_name, ())
    problems += [f"{mnemonic} missing" for mnemonic in required if mnemonic not in text]
    return problems
