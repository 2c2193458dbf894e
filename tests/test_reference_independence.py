"""The references are written from the recipe: no module of deep_kernels.reference takes code from the kernel
modules (a reference that shares a helper with a kernel shares its bugs). A reference imports only torch, the
standard library and other reference modules; the one exception is the public MoeLayout type, a frozen dataclass
of tensors with no computation, which the kernels that read a layout (moe_expand, moe_reduce) require by type."""

import ast
import importlib
import inspect
import pkgutil
import sys
import types

import pytest

import deep_kernels.reference

REFERENCE = "deep_kernels.reference"
# (module, name) pairs a reference may take from outside the reference package.
ALLOWED_NAMES = {("deep_kernels.moe.layout", "MoeLayout")}


def _reference_modules() -> list:
    return [REFERENCE] + sorted(info.name for info in pkgutil.walk_packages(deep_kernels.reference.__path__,
                                                                          REFERENCE + "."))


def _allowed_module(name: str) -> bool:
    top = name.partition(".")[0]
    return name == REFERENCE or name.startswith(REFERENCE + ".") or top == "torch" or top in sys.stdlib_module_names


def _forbidden_imports(source: str, package: str) -> list:
    """(module, name) of every import statement of the source (nested ones included, relative ones resolved)
    that reaches outside torch, the standard library and the references."""
    forbidden = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            forbidden += [(alias.name, None) for alias in node.names if not _allowed_module(alias.name)]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(parts + ([module] if module else []))
            for alias in node.names:
                # "from deep_kernels import gemm" names a module (or a re-exported kernel function): judge it whole.
                target = f"{module}.{alias.name}" if module == "deep_kernels" else module
                if (module, alias.name) not in ALLOWED_NAMES and not _allowed_module(target):
                    forbidden.append((module, alias.name))
    return forbidden


def _foreign_globals(namespace: dict) -> list:
    """Names of the namespace bound to modules, functions or classes from outside the allowed modules, however
    they got there."""
    foreign = []
    for attribute, value in namespace.items():
        if attribute.startswith("__"):
            continue
        if isinstance(value, types.ModuleType):
            origin, name = value.__name__, None
        else:
            origin, name = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
        if isinstance(origin, str) and origin != "builtins" and (origin, name) not in ALLOWED_NAMES:
            if not _allowed_module(origin):
                foreign.append(f"{attribute} (from {origin})")
    return foreign


def _package(module: types.ModuleType) -> str:
    return module.__name__ if hasattr(module, "__path__") else module.__name__.rpartition(".")[0]


@pytest.mark.parametrize("name", _reference_modules())
def test_reference_imports_only_torch_stdlib_and_references(name):
    module = importlib.import_module(name)
    assert _forbidden_imports(inspect.getsource(module), _package(module)) == []


@pytest.mark.parametrize("name", _reference_modules())
def test_reference_globals_come_from_references(name):
    assert _foreign_globals(vars(importlib.import_module(name))) == []


def test_every_reference_family_is_checked():
    names = _reference_modules()
    assert {f"{REFERENCE}.{name}" for name in ("gemm", "common", "quant.fp8", "quant.swiglu", "moe.expand")} <= set(names)


def test_the_checks_catch_a_kernel_helper():
    # A module that takes a kernel helper, in each way a reference could: both checks reject it.
    source = ("from deep_kernels.quant.common import unpack_ue8m0\n"
              "from deep_kernels import gemm\n"
              "from ...moe import layout\n"
              "def f():\n    import deep_kernels.jit.runtime\n"
              "from deep_kernels.reference.common import ceil_div\n"
              "import torch\n")
    assert _forbidden_imports(source, REFERENCE + ".quant") == [
        ("deep_kernels.quant.common", "unpack_ue8m0"), ("deep_kernels", "gemm"), ("deep_kernels.moe", "layout"),
        ("deep_kernels.jit.runtime", None)]
    namespace = {}
    exec(compile("\n".join(source.splitlines()[:2]), "<planted>", "exec"), namespace)
    assert _foreign_globals(namespace) == ["unpack_ue8m0 (from deep_kernels.quant.common)",
                                           "gemm (from deep_kernels.gemm)"]
