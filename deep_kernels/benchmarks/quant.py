"""Suite `quant`: the per-token FP8 cast and cast-back, against copy bandwidth and the torch reference."""

import torch

import deep_kernels
from deep_kernels.benchmarks.report import BenchContext, memory_bound_row
from deep_kernels.reference import quant as reference
from deep_kernels.testing import assert_bitwise_equal, random_activations
from deep_kernels.testing.bench import time_kernel_us

SHAPES = ((4096, 7168), (16384, 7168))
GROUP_SIZE = 128
VARIANTS = (("fp32 mn_major", False, "mn_major"), ("ue8m0 packed", True, "packed_ue8m0"))


def run(ctx: BenchContext) -> list:
    rows = []
    for m, k in SHAPES:
        x = random_activations(m, k, torch.bfloat16)
        scale_bytes = m * (k // GROUP_SIZE) * 4
        for label, ue8m0, layout in VARIANTS:
            kwargs = dict(group_size=GROUP_SIZE, ue8m0=ue8m0, scale_layout=layout)
            q, scales = deep_kernels.per_token_cast_to_fp8(x, **kwargs)
            q_ref, scales_ref = reference.per_token_cast_to_fp8(x, **kwargs)
            assert_bitwise_equal(q, q_ref, "q")
            assert_bitwise_equal(scales, scales_ref, "scales")
            us = time_kernel_us(lambda: deep_kernels.per_token_cast_to_fp8(x, **kwargs), ctx.flusher)
            peer_us = time_kernel_us(lambda: reference.per_token_cast_to_fp8(x, **kwargs), ctx.flusher, reps=20)
            rows.append(memory_bound_row(
                "per_token_cast_to_fp8", {"m": m, "k": k, "group": GROUP_SIZE}, f"bf16 in, {label}", us,
                m * k * 3 + scale_bytes, ctx, "torch reference (eager)", peer_us, "bitwise equal"))

            y = deep_kernels.per_token_cast_back(q, scales, GROUP_SIZE)
            assert_bitwise_equal(y, reference.per_token_cast_back(q_ref, scales_ref, GROUP_SIZE), "y")
            us = time_kernel_us(lambda: deep_kernels.per_token_cast_back(q, scales, GROUP_SIZE), ctx.flusher)
            peer_us = time_kernel_us(lambda: reference.per_token_cast_back(q, scales, GROUP_SIZE), ctx.flusher, reps=20)
            rows.append(memory_bound_row(
                "per_token_cast_back", {"m": m, "k": k, "group": GROUP_SIZE}, f"bf16 out, {label}", us,
                m * k * 3 + scale_bytes, ctx, "torch reference (eager)", peer_us, "bitwise equal"))
    return rows
