"""Disassembly checks of compiled kernels: SASS text and resource usage through cuobjdump.

cuobjdump comes from the toolkit or from the nvidia-cuda-cuobjdump wheel (the `test` extra).
"""

import functools
import importlib.metadata
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@functools.lru_cache(maxsize=None)
def cuobjdump_path() -> str:
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        files = importlib.metadata.files("nvidia-cuda-cuobjdump") or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.name == "cuobjdump":
            return str(Path(file.locate()).resolve())
    raise RuntimeError("cuobjdump not found: pip install nvidia-cuda-cuobjdump (the `test` extra)")


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
    return subprocess.run([cuobjdump_path(), "--dump-sass", str(cubin)], check=True, capture_output=True,
                          text=True).stdout


def local_memory_instructions(sass_text: str) -> list:
    """Loads and stores to local memory (spills or arrays indexed at run time)."""
    return re.findall(r"\b(?:LDL|STL)\b[^;]*;", sass_text)
