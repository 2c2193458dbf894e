"""Kernel declarations: each kernel is declared once, as a KernelDef, next to its public function.

A KernelDef names the kernel's header and entry, its C++ template parameters and its launch parameters
with their types, in declaration order, and how many threads a block runs (the kernel's __launch_bounds__).
Everything else derives from it: the specializations (`spec`, which also keys the cache), the parameter
kinds the native launcher encodes, the keyword launch (`Kernel.launch`, jit/runtime.py), and the check
of the declaration against the binary (jit/signature.py: at load time through the driver, in tests
through cuobjdump).

    PER_TOKEN_CAST = KernelDef(
        "kernels/smxx_per_token_cast.cuh", "smxx_per_token_cast_impl",
        template=("InT", "GROUP_SIZE", "kUE8M0", ...),
        params=(Param("x", PTR), Param("q", PTR), ..., Param("shape_m", U32), ..., Param("amax_clamp", F32)),
        threads=lambda t: t["kNumWarps"] * 32)
    spec = PER_TOKEN_CAST.spec(InT=torch.bfloat16, GROUP_SIZE=128, kUE8M0=False, ...)
    get_kernel(spec).launch(grid, device_index, x=x.data_ptr(), ..., amax_clamp=1e-4)
"""

import keyword
from dataclasses import dataclass
from typing import Callable, NamedTuple, Union

import torch

from deep_kernels.jit.source import CPP_TYPES, KernelSpec


class ParamType(NamedTuple):
    """A launch parameter's type: its name in messages, the native launcher's letter for it
    (jit/launcher.cpp) and its size in the kernel's parameter buffer."""

    name: str
    code: str
    size: int


TENSOR_MAP = ParamType("CUtensorMap", "T", 128)  # a `const __grid_constant__ CUtensorMap`, from runtime.tensor_map
PTR = ParamType("pointer", "P", 8)  # any device pointer (an int address; 0 for nullptr)
U32 = ParamType("uint32_t", "I", 4)
I32 = ParamType("int32_t", "i", 4)
F32 = ParamType("float", "f", 4)
PARAM_TYPES = (TENSOR_MAP, PTR, U32, I32, F32)


class Param(NamedTuple):
    """One launch parameter: its name (the C++ one) and type."""

    name: str
    type: ParamType


# Names the generated Kernel.launch(grid, device_index, /, **params) uses itself (jit/runtime.py).
_RESERVED_NAMES = ("self", "grid", "device_index", "values", "error", "torch")


def cpp_argument(value):
    """A template argument as the generated source spells it: bools as true/false, torch dtypes as their C++
    types, enums with a `cpp` property as that; ints and strings as given."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, torch.dtype):
        return CPP_TYPES[value]
    cpp = getattr(value, "cpp", None)
    if isinstance(cpp, str):
        return cpp
    if isinstance(value, (int, str)):
        return value
    raise TypeError(f"cannot spell {value!r} ({type(value).__name__}) as a C++ template argument")


@dataclass(frozen=True, eq=False)
class KernelDef:
    """The one declaration of a kernel (module docstring).

    header: under csrc/, defining `deep_kernels::<entry>` and nothing else global.
    template: the C++ template parameter names, in declaration order.
    params: the launch parameters (Param), in declaration order, named as in C++.
    threads: threads per block, the __launch_bounds__ of the kernel: an int, or a function of the
        specialization's template arguments by name (values as `spec` spells them).
    cluster: CTAs per cluster, likewise (1: no cluster).
    cooperative: every block must be resident at once (the kernel's blocks wait for each other).
    """

    header: str
    entry: str
    template: tuple
    params: tuple
    threads: Union[int, Callable[[dict], int]]
    cluster: Union[int, Callable[[dict], int]] = 1
    cooperative: bool = False

    def __post_init__(self):
        for param in self.params:
            if not isinstance(param, Param) or param.type not in PARAM_TYPES:
                raise TypeError(f"{self.entry}: parameters are Param(name, type) with a type of "
                                f"{', '.join(t.name for t in PARAM_TYPES)}, got {param!r}")
            if (param.name in _RESERVED_NAMES or param.name.startswith("_") or not param.name.isidentifier()
                    or keyword.iskeyword(param.name)):
                raise ValueError(f"{self.entry}: {param.name!r} cannot name a parameter")
        names = [p.name for p in self.params]
        for what, given in (("template parameter", list(self.template)), ("parameter", names)):
            duplicates = sorted({n for n in given if given.count(n) > 1})
            if duplicates:
                raise ValueError(f"{self.entry}: {what}s declared twice: {duplicates}")
        from deep_kernels.jit import registry

        registry.add_definition(self)

    @property
    def name(self) -> str:
        return self.entry.removesuffix("_impl")

    @property
    def param_names(self) -> tuple:
        return tuple(p.name for p in self.params)

    @property
    def param_kinds(self) -> str:
        """The native launcher's signature string: one letter per parameter."""
        return "".join(p.type.code for p in self.params)

    def spec(self, *args, **kwargs) -> KernelSpec:
        """The specialization with these template arguments, bound like a call: positionally in declaration
        order, or by name; each spelled by cpp_argument."""
        if len(args) > len(self.template):
            raise TypeError(f"{self.name} takes {len(self.template)} template arguments "
                            f"({', '.join(self.template)}), got {len(args)}")
        values = dict(zip(self.template, args))
        for name, value in kwargs.items():
            if name not in self.template:
                raise TypeError(f"{self.name} has no template parameter {name!r} "
                                f"(it takes {', '.join(self.template)})")
            if name in values:
                raise TypeError(f"{self.name}: template argument {name!r} given twice")
            values[name] = value
        missing = [name for name in self.template if name not in values]
        if missing:
            raise TypeError(f"{self.name}: template arguments missing: {', '.join(missing)}")
        arguments = tuple(cpp_argument(values[name]) for name in self.template)
        return KernelSpec(self.header, self.entry, arguments, definition=self)

    def template_arguments(self, spec: KernelSpec) -> dict:
        """A specialization's template arguments by name."""
        return dict(zip(self.template, spec.template_args))

    def block_threads(self, spec: KernelSpec) -> int:
        return self.threads(self.template_arguments(spec)) if callable(self.threads) else self.threads

    def cluster_size(self, spec: KernelSpec) -> int:
        return self.cluster(self.template_arguments(spec)) if callable(self.cluster) else self.cluster
