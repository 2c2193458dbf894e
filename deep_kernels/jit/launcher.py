"""Build (once, into the kernel cache) and import the native launcher, launcher.cpp beside this file.

It is plain CPython C API code with no torch headers, so it builds in about a second; the CUDA
driver is opened at run time, so it builds and imports without a GPU.
"""

import functools
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from deep_kernels import envs
from deep_kernels.jit import cache, compiler

SOURCE = Path(__file__).with_name("launcher.cpp")
MODULE_NAME = "_dk_launcher"


def host_compiler() -> str:
    # NOTE: not $CXX: some images set it to a wrapper whose extensions crash at their first call.
    configured = envs.get("DK_JIT_HOST_CXX")
    for candidate in ([configured] if configured else ["/usr/bin/g++", shutil.which("g++")]):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise RuntimeError("no host C++ compiler: install g++ or set DK_JIT_HOST_CXX")


def _build_command(output: Path) -> list:
    return [
        host_compiler(), "-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden",
        f"-I{sysconfig.get_paths()['include']}", f"-I{compiler.cuda_include()}", str(SOURCE), "-o", str(output), "-ldl",
    ]


@functools.lru_cache(maxsize=None)
def load():
    """The imported launcher module, built on first use."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    key = hashlib.sha256(SOURCE.read_bytes() + suffix.encode() + host_compiler().encode()).hexdigest()[:32]
    entry = cache.cache_dir() / "launcher" / key
    library = entry / (MODULE_NAME + suffix)

    def build(staging: Path) -> bytes:
        output = staging / (MODULE_NAME + suffix)
        result = subprocess.run(_build_command(output), capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"building the deep_kernels launcher failed:\n{result.stderr}")
        return output.read_bytes()

    cache.get_or_build(entry, build, binary_name=library.name)
    spec = importlib.util.spec_from_file_location(MODULE_NAME, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[MODULE_NAME] = module
    return module
