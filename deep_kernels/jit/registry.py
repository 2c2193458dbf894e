"""Where kernels and families register themselves, so that no list has to be kept in sync by hand.

Every KernelDef registers itself when it is declared. A module declares the specializations
`python -m deep_kernels precompile` builds with a function decorated by `precompiled`; its family is the
package part of the module's name (deep_kernels.quant.fp8 -> "quant", deep_kernels.gemm -> "gemm").
Importing deep_kernels imports every family (its public API), which registers them all.
"""

import importlib

_definitions = {}  # entry -> KernelDef
_precompile_functions = {}  # (module, qualified name) -> (family, function), in registration order


def _declaration(definition) -> tuple:
    return definition.header, definition.entry, definition.template, definition.params


def add_definition(definition) -> None:
    """Called by KernelDef itself. A second, different declaration of one entry is an error (a module
    reloaded re-declares the same kernel, which replaces it)."""
    known = _definitions.get(definition.entry)
    if known is not None and _declaration(known) != _declaration(definition):
        raise ValueError(f"kernel {definition.entry} is declared twice, with different headers, template or "
                         "launch parameters")
    _definitions[definition.entry] = definition


def family_of(module_name: str) -> str:
    parts = module_name.split(".")
    if len(parts) < 2 or parts[0] != "deep_kernels":
        raise ValueError(f"a precompile list must live in a module of deep_kernels, not {module_name}")
    return parts[1]


def precompiled(function):
    """Decorator: function() -> list of KernelSpec is what its family precompiles."""
    key = (function.__module__, function.__qualname__)
    _precompile_functions[key] = (family_of(function.__module__), function)
    return function


def _load_all() -> None:
    importlib.import_module("deep_kernels")


def definitions() -> list:
    """Every declared kernel."""
    _load_all()
    return list(_definitions.values())


def families() -> tuple:
    """The families' names, in registration order."""
    _load_all()
    return tuple(dict.fromkeys(family for family, _ in _precompile_functions.values()))


def precompile_specs(family_names=None) -> list:
    """What the families (default: all) precompile, in registration order."""
    _load_all()
    wanted = families() if family_names is None else tuple(family_names)
    unknown = sorted(set(wanted) - set(families()))
    if unknown:
        raise ValueError(f"unknown kernel families {unknown}: the families are {', '.join(families())}")
    return [spec for name in wanted for family, function in _precompile_functions.values() if family == name
            for spec in function()]
