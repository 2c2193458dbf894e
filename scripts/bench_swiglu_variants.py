"""Tuning harness: SwiGLU kernel structures other than the API's, timed side by side with it.

The API runs one structure per kernel (deep_kernels.quant.swiglu.FORWARD and BACKWARD); this script holds the
candidates (FORWARD_VARIANTS, BACKWARD_VARIANTS, or any structure given on the command line), which are neither
precompiled nor tested by the suite: the first run compiles them. Each runs through the module's own call path
with the structure given (swiglu._cast_to_fp8, swiglu._backward), at [16384, 2 x 7168] and [16384, 2 x 2048], in
the `quant` suite's cases (forward: fp32 mn_major; clamp 7, ue8m0 packed, weights[pos]; backward: clamp 7,
weights[pos]) and on two inputs: the suite's random_activations (row magnitudes 2^-8..2^7, so that the rows from
2^5 up have gates outside the fast division's range and take the scaled steps) and "narrow" (unit normal rows:
the fast range almost everywhere). Every output is compared byte for byte with the API structure's. Prints us,
GB/s (bytes read + written) and the fraction of the copy bandwidth measured in the same run.

Usage (GPU): PYTHONPATH=$PWD python scripts/bench_swiglu_variants.py [variant ...]
    [--forward rows_per_warp=4,passes=4,in_flight=2,range_check=1,min_blocks=3 ...]
    [--backward chunks_ahead=2,min_blocks=3 ...]
"""

import argparse
import dataclasses
import inspect

import torch

import deep_kernels
from deep_kernels.benchmarks import quant_swiglu
from deep_kernels.device import info
from deep_kernels.quant import swiglu
from deep_kernels.quant.swiglu import BackwardConfig, ForwardConfig
from deep_kernels.testing import assert_bitwise_equal
from deep_kernels.testing.bench import L2Flusher, copy_bandwidth_gbps, time_kernel_us

SHAPES = ((16384, 7168), (16384, 2048))
CASES = quant_swiglu.CASES
INPUTS = ("activations", "narrow")
# The candidates; the first of each is the API's structure. p2_row_in1: one pass of loads in flight (fewer
# registers); ahead2_b3: two chunks of loads ahead at 3 blocks per SM.
FORWARD_VARIANTS = {"p2_row": swiglu.FORWARD, "p2_row_in1": ForwardConfig(in_flight=1)}
BACKWARD_VARIANTS = {"ahead1": swiglu.BACKWARD, "ahead2_b3": BackwardConfig(chunks_ahead=2, min_blocks=3)}
# Per op: the module's call path that takes the structure first, and the variants.
VARIANTS = {"swiglu_cast_to_fp8": (swiglu._cast_to_fp8, FORWARD_VARIANTS),
            "swiglu_backward": (swiglu._backward, BACKWARD_VARIANTS)}


def parse_structure(text: str, kind):
    """A ForwardConfig or BackwardConfig from "field=integer,..." (fields left out keep their defaults)."""
    known = {field.name for field in dataclasses.fields(kind)}
    values = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, _, value = item.partition("=")
        if key.strip() not in known or not value.strip().isdigit():
            raise ValueError(f"expected {'/'.join(sorted(known))}=<integer> items, got {item!r}")
        values[key.strip()] = int(value)
    if "range_check" in values:
        values["range_check"] = bool(values["range_check"])
    return kind(**values)


def run_with(op: str, config, args: tuple, kwargs: dict):
    """deep_kernels.<op>(*args, **kwargs) by the kernel of structure `config`."""
    bound = inspect.signature(getattr(deep_kernels, op)).bind(*args, **kwargs)
    bound.apply_defaults()
    return VARIANTS[op][0](config, *bound.args)


def _arguments(num_rows: int, hidden: int, options: dict, with_rows: bool, backward: bool, data: str,
               device: str = "cuda") -> tuple:
    args, kwargs = quant_swiglu._arguments(num_rows, hidden, options, with_rows, backward, device=device)
    if data == "narrow":
        args = (torch.randn_like(args[0]), *args[1:])
    return args, kwargs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="variants to time (default: all)")
    parser.add_argument("--forward", nargs="+", default=[], help="more forward structures, field=value,...")
    parser.add_argument("--backward", nargs="+", default=[], help="more backward structures, field=value,...")
    options = parser.parse_args()
    FORWARD_VARIANTS.update({text: parse_structure(text, ForwardConfig) for text in options.forward})
    BACKWARD_VARIANTS.update({text: parse_structure(text, BackwardConfig) for text in options.backward})
    names = options.names + options.forward + options.backward
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
        for label, case_options, with_rows, op in CASES:
            backward = op == "swiglu_backward"
            variants = VARIANTS[op][1]
            default = next(iter(variants.values()))
            for data in INPUTS:
                args, kwargs = _arguments(num_rows, hidden, case_options, with_rows, backward, data)
                expected = run_with(op, default, args, kwargs)
                num_bytes = quant_swiglu._num_bytes(num_rows, hidden, with_rows, backward, case_options)
                for name, config in variants.items():
                    if names and name not in names:
                        continue
                    call = lambda: run_with(op, config, args, kwargs)
                    for index, (actual, want) in enumerate(zip(call(), expected)):
                        assert_bitwise_equal(actual, want, f"{name} output {index} ({label}, {data})")
                    us = time_kernel_us(call, flusher, warmup=5, reps=30)
                    gbps = num_bytes / us / 1e3
                    print(f"{num_rows:>6d} x {hidden:<5d} {label:36s} {data:12s} {name:12s} {us:8.1f} {gbps:7.0f} "
                          f"{gbps / copy_gbps:6.1%}")


if __name__ == "__main__":
    main()
