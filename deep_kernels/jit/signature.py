"""A kernel's declaration (KernelDef) checked against its binary, so that Python and C++ cannot drift apart.

At load time (jit/runtime.py) the driver gives each parameter's offset and size (cuKernelGetParamInfo) and
the most threads a block may have; `check_param_layout` and `check_block_threads` compare them with the
declaration and raise SignatureError naming the kernel and the parameter. Sizes tell a tensor map (128
bytes) from a pointer (8) from a 4-byte scalar, not uint32_t from float: the CPU tests also read the
cubin's ELF info with cuobjdump (the parameter sizes the driver reports, EIATTR_KPARAM_INFO, and the
__launch_bounds__, EIATTR_MAX_THREADS) and demangle the kernel's symbol for the C++ parameter types
(`cubin_signature`, `check_param_types`).
"""

import re
import shutil
import subprocess
from pathlib import Path
from typing import NamedTuple

from deep_kernels.jit.definition import F32, I32, PTR, TENSOR_MAP, U32


class SignatureError(RuntimeError):
    """A kernel's binary does not take the parameters (or threads) its declaration says."""


def _describe(definition, spec=None) -> str:
    where = f"{definition.name} ({definition.header})"
    return where if spec is None else f"{where} <{', '.join(map(str, spec.template_args))}>"


def check_param_layout(definition, layout, spec=None) -> None:
    """layout: the binary's (offset, size) of each parameter, in order. Raises SignatureError at the first
    parameter whose size differs from the declaration's, or where one of the two has more parameters."""
    declared = definition.params
    for index in range(max(len(declared), len(layout))):
        if index < len(declared) and index < len(layout) and declared[index].type.size == layout[index][1]:
            continue
        if index >= len(layout):
            problem = (f"parameter {index} '{declared[index].name}' ({declared[index].type.name}) is declared, but "
                       f"the kernel takes {len(layout)} parameters")
        elif index >= len(declared):
            problem = (f"the kernel's parameter {index} ({layout[index][1]} bytes) is not declared: the declaration "
                       f"lists {len(declared)} parameters")
        else:
            param = declared[index]
            problem = (f"parameter {index} '{param.name}' is declared {param.type.name} ({param.type.size} bytes), "
                       f"the kernel's parameter {index} has {layout[index][1]} bytes")
        raise SignatureError(f"deep_kernels: {_describe(definition, spec)} does not match its KernelDef: {problem} "
                             f"(the kernel's parameter sizes: {[size for _, size in layout]})")


def check_block_threads(definition, block_threads: int, max_threads: int, spec=None, exact: bool = False) -> None:
    """The declaration's block size against the kernel's limit (its __launch_bounds__): at most it, or with
    exact (a cubin's declared bound) equal to it."""
    if block_threads > max_threads or (exact and block_threads != max_threads):
        raise SignatureError(f"deep_kernels: {_describe(definition, spec)} is declared to run {block_threads} "
                             f"threads a block, the kernel's launch bounds allow {max_threads}")


# ---- reading a cubin (CPU: tests and scripts) ----

class CubinSignature(NamedTuple):
    symbol: str  # the kernel's mangled name
    layout: list  # (offset, size) of each parameter, in order
    max_threads: int  # __launch_bounds__' threads (x * y * z)


_KPARAM = re.compile(r"Ordinal\s*:\s*(0x[0-9a-f]+)\s+Offset\s*:\s*(0x[0-9a-f]+)\s+Size\s*:\s*(0x[0-9a-f]+)")
_MAX_THREADS = re.compile(r"Attribute:\s*EIATTR_MAX_THREADS\s+Format:\s*\S+\s+Value:\s*((?:0x[0-9a-f]+\s*)+)")
_INFO_SECTION = re.compile(r"^\.nv\.info\.(\S+)", re.MULTILINE)


def parse_elf_info(text: str) -> CubinSignature:
    """The signature in `cuobjdump -elf` output of a cubin holding one kernel."""
    symbols = _INFO_SECTION.findall(text)
    if len(symbols) != 1:
        raise ValueError(f"expected the info section of one kernel, found {len(symbols)}")
    entries = sorted((int(o, 16), int(off, 16), int(s, 16)) for o, off, s in _KPARAM.findall(text))
    if [ordinal for ordinal, _, _ in entries] != list(range(len(entries))):
        raise ValueError(f"parameter ordinals are not 0..n-1: {[ordinal for ordinal, _, _ in entries]}")
    bounds = _MAX_THREADS.search(text)
    if bounds is None:
        raise ValueError("the kernel has no EIATTR_MAX_THREADS (no __launch_bounds__)")
    max_threads = 1
    for value in bounds.group(1).split():
        max_threads *= int(value, 16)
    return CubinSignature(symbols[0], [(offset, size) for _, offset, size in entries], max_threads)


def cubin_signature(cubin: Path) -> CubinSignature:
    from deep_kernels.testing.sass import cuobjdump_path

    text = subprocess.run([cuobjdump_path(), "-elf", str(cubin)], check=True, capture_output=True, text=True).stdout
    return parse_elf_info(text)


# C++ parameter types (as c++filt spells them) by their ParamType.
_CPP_PARAM_TYPES = {"CUtensorMap_st": TENSOR_MAP, "unsigned int": U32, "int": I32, "float": F32}


def demangled_param_types(symbol: str) -> list:
    """The C++ parameter types of a kernel's mangled name, through c++filt (binutils)."""
    cxxfilt = shutil.which("c++filt")
    if cxxfilt is None:
        raise RuntimeError("c++filt not found (binutils)")
    text = subprocess.run([cxxfilt, symbol], check=True, capture_output=True, text=True).stdout.strip()
    # The parameter list is the last top-level parenthesized group (template arguments may hold parentheses).
    depth, start = 0, None
    for i in range(len(text) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(text[i], 0)
        if depth == 0:
            start = i
            break
    inner = text[start + 1:-1]
    types, depth, current = [], 0, ""
    for char in inner:
        depth += {"<": 1, "(": 1, ">": -1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            types.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        types.append(current.strip())
    return types


def param_type_of(cpp_type: str):
    """The ParamType that launches a C++ parameter type: any pointer is PTR."""
    if cpp_type.endswith("*") or cpp_type.endswith("* __restrict__"):
        return PTR
    return _CPP_PARAM_TYPES.get(cpp_type.removeprefix("const ").removesuffix(" const"))


def check_param_types(definition, cpp_types: list, spec=None) -> None:
    """The declaration's parameter types against the kernel's C++ ones (demangled_param_types)."""
    if len(cpp_types) != len(definition.params):
        raise SignatureError(f"deep_kernels: {_describe(definition, spec)} does not match its KernelDef: the kernel "
                             f"takes {len(cpp_types)} parameters ({', '.join(cpp_types)}), the declaration lists "
                             f"{len(definition.params)}")
    for index, (param, cpp_type) in enumerate(zip(definition.params, cpp_types)):
        if param_type_of(cpp_type) is not param.type:
            raise SignatureError(f"deep_kernels: {_describe(definition, spec)} does not match its KernelDef: parameter "
                                 f"{index} '{param.name}' is declared {param.type.name}, the kernel's is {cpp_type}")


def check_cubin(spec, cubin: Path) -> CubinSignature:
    """Every check of a compiled specialization against its KernelDef: parameter sizes (what the driver
    reports at load time), C++ parameter types and block size (exactly the launch bounds). Returns the
    cubin's signature; raises SignatureError."""
    definition = spec.definition
    found = cubin_signature(cubin)
    check_param_layout(definition, found.layout, spec)
    check_block_threads(definition, definition.block_threads(spec), found.max_threads, spec, exact=True)
    check_param_types(definition, demangled_param_types(found.symbol), spec)
    return found
