"""The SwiGLU kernels' structures (deep_kernels.quant.swiglu.FORWARD_VARIANTS and BACKWARD_VARIANTS) timed side
by side.

Each variant at [16384, 2 x 7168] and [16384, 2 x 2048], in the `quant` suite's cases (forward: fp32
mn_major; clamp 7, ue8m0 packed, weights[pos]; backward: clamp 7, weights[pos]) and on two inputs: the
suite's random_activations (row magnitudes 2^-8..2^7, so that the rows from 2^5 up have gates outside the
fast division's range and take the scaled steps) and "narrow" (unit normal rows: the fast range almost
everywhere). Every output is compared byte
for byte with the default variant's. Prints us, GB/s (bytes read + written) and the fraction of the copy
bandwidth measured in the same run. About 30 s on an H200 once the kernels are compiled
(`python -m deep_kernels precompile --family quant` builds them in parallel).

Usage (GPU): PYTHONPATH=$PWD python scripts/bench_swiglu_variants.py [variant ...]
"""

import sys

import torch

import deep_kernels
from deep_kernels.benchmarks import quant_swiglu
from deep_kernels.device import info
from deep_kernels.quant import swiglu
from deep_kernels.testing import assert_bitwise_equal
from deep_kernels.testing.bench import L2Flusher, copy_bandwidth_gbps, time_kernel_us

SHAPES = ((16384, 7168), (16384, 2048))
CASES = quant_swiglu.CASES
INPUTS = ("activations", "narrow")
# Per op: the module's config function the variants replace, and the variants (the first is the default).
VARIANTS = {"swiglu_cast_to_fp8": ("_forward_config", swiglu.FORWARD_VARIANTS),
            "swiglu_backward": ("_backward_config", swiglu.BACKWARD_VARIANTS)}


def _with_variant(op: str, config, call):
    """call() with the structure `config` of op's kernel (as DK_SWIGLU_CAST_CONFIG sets the forward's)."""
    attribute = VARIANTS[op][0]
    previous = getattr(swiglu, attribute)
    setattr(swiglu, attribute, lambda: config)
    try:
        return call()
    finally:
        setattr(swiglu, attribute, previous)


def _arguments(num_rows: int, hidden: int, options: dict, with_rows: bool, backward: bool, data: str,
               device: str = "cuda") -> tuple:
    args, kwargs = quant_swiglu._arguments(num_rows, hidden, options, with_rows, backward, device=device)
    if data == "narrow":
        args = (torch.randn_like(args[0]), *args[1:])
    return args, kwargs


def main(names: list) -> None:
    known = {name for _, variants in VARIANTS.values() for name in variants}
    unknown = set(names) - known
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}: choose among {sorted(known)}")
    flusher = L2Flusher(info().l2_bytes)
    copy_gbps = copy_bandwidth_gbps(flusher)
    print(f"{torch.cuda.get_device_name()}, copy bandwidth {copy_gbps:.0f} GB/s")
    for _, variants in VARIANTS.values():
        for name, config in variants.items():
            print(f"  {name:12s} {config}")
    print(f"{'shape':>14s} {'case':36s} {'input':12s} {'variant':12s} {'us':>8s} {'GB/s':>7s} {'copy':>6s}")
    for num_rows, hidden in SHAPES:
        for label, options, with_rows, op in CASES:
            backward = op == "swiglu_backward"
            variants = VARIANTS[op][1]
            default = next(iter(variants.values()))
            for data in INPUTS:
                args, kwargs = _arguments(num_rows, hidden, options, with_rows, backward, data)
                call = lambda: getattr(deep_kernels, op)(*args, **kwargs)
                expected = _with_variant(op, default, call)
                num_bytes = quant_swiglu._num_bytes(num_rows, hidden, with_rows, backward, options)
                for name, config in variants.items():
                    if names and name not in names:
                        continue
                    for index, (actual, want) in enumerate(zip(_with_variant(op, config, call), expected)):
                        assert_bitwise_equal(actual, want, f"{name} output {index} ({label}, {data})")
                    us = _with_variant(op, config, lambda: time_kernel_us(call, flusher, warmup=5, reps=30))
                    gbps = num_bytes / us / 1e3
                    print(f"{num_rows:>6d} x {hidden:<5d} {label:36s} {data:12s} {name:12s} {us:8.1f} {gbps:7.0f} "
                          f"{gbps / copy_gbps:6.1%}")


if __name__ == "__main__":
    main(sys.argv[1:])
