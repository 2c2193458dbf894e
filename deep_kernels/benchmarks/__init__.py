"""Benchmark suites: each module defines `run(context) -> list of rows` (shared/BENCHMARKS.md's schema).

`python -m deep_kernels bench` runs them, writes benchmarks/results/<gpu>/<suite>.json and a PNG
chart per suite, and prints a table.
"""
