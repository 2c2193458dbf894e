"""Benchmark suites: each module defines `run(context) -> list of rows` (shared/BENCHMARKS.md's schema).

`python -m deep_kernels bench` runs them, writes benchmarks/results/<gpu>/<suite>.json and a PNG
chart per suite, and prints a table.
"""

import importlib
import pkgutil


def suites() -> tuple:
    """The suites' names: the modules of this package that define run(context), in name order (a module
    whose rows another suite includes names its function otherwise, e.g. quant_fp4.rows)."""
    return tuple(module.name for module in pkgutil.iter_modules(__path__)
                 if hasattr(importlib.import_module(f"{__name__}.{module.name}"), "run"))
