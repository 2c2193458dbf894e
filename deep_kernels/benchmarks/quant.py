"""Suite `quant`: the per-token and per-block FP8 casts and the cast-back, against copy bandwidth and the
torch reference."""

import torch

import deep_kernels
from deep_kernels.benchmarks import quant_e5m6
from deep_kernels.benchmarks.report import BenchContext, memory_bound_row
from deep_kernels.reference import quant as reference
from deep_kernels.testing import assert_bitwise_equal, random_activations
from deep_kernels.testing.bench import time_kernel_us

SHAPES = ((4096, 7168), (16384, 7168))
GROUP_SIZE = 128
VARIANTS = (("fp32 mn_major", False, "mn_major", "mul"), ("ue8m0 packed", True, "packed_ue8m0", "mul"),
            ("fp32 mn_major, divide", False, "mn_major", "div"))
BLOCK_VARIANTS = (("block 128, fp32", 128, False, "mul"), ("block 128, fp32, divide", 128, False, "div"),
                  ("block 32, ue8m0", 32, True, "mul"))


def run(ctx: BenchContext) -> list:
    rows = []
    for m, k in SHAPES:
        x = random_activations(m, k, torch.bfloat16)
        scale_bytes = m * (k // GROUP_SIZE) * 4
        for label, ue8m0, layout, scale_mode in VARIANTS:
            kwargs = dict(group_size=GROUP_SIZE, ue8m0=ue8m0, scale_layout=layout, scale_mode=scale_mode)
            rows.append(_checked_cast_row("per_token_cast_to_fp8", {"m": m, "k": k, "group": GROUP_SIZE},
                                          f"bf16 in, {label}", x, kwargs, m * k * 3 + scale_bytes, ctx))
            q, scales = reference.per_token_cast_to_fp8(x, **kwargs)
            y = deep_kernels.per_token_cast_back(q, scales, GROUP_SIZE)
            assert_bitwise_equal(y, reference.per_token_cast_back(q, scales, GROUP_SIZE), "y")
            us = time_kernel_us(lambda: deep_kernels.per_token_cast_back(q, scales, GROUP_SIZE), ctx.flusher)
            peer_us = time_kernel_us(lambda: reference.per_token_cast_back(q, scales, GROUP_SIZE), ctx.flusher, reps=20)
            rows.append(memory_bound_row(
                "per_token_cast_back", {"m": m, "k": k, "group": GROUP_SIZE}, f"bf16 out, {label}", us,
                m * k * 3 + scale_bytes, ctx, "torch reference (eager)", peer_us, "bitwise equal"))
        for label, block_size, ue8m0, scale_mode in BLOCK_VARIANTS:
            kwargs = dict(block_size=block_size, ue8m0=ue8m0, scale_mode=scale_mode)
            scale_bytes = -(-m // block_size) * (k // block_size) * 4
            rows.append(_checked_cast_row("per_block_cast_to_fp8", {"m": m, "k": k, "block": block_size},
                                          f"bf16 in, {label}", x, kwargs, m * k * 3 + scale_bytes, ctx))
    return rows + quant_e5m6.run(ctx)


def _checked_cast_row(op: str, shape: dict, config: str, x: torch.Tensor, kwargs: dict, num_bytes: int,
                      ctx: BenchContext) -> dict:
    """The kernel `op` checked bit for bit against its reference, then both timed."""
    kernel, peer = getattr(deep_kernels, op), getattr(reference, op)
    q, scales = kernel(x, **kwargs)
    q_ref, scales_ref = peer(x, **kwargs)
    assert_bitwise_equal(q, q_ref, "q")
    assert_bitwise_equal(scales, scales_ref, "scales")
    us = time_kernel_us(lambda: kernel(x, **kwargs), ctx.flusher)
    peer_us = time_kernel_us(lambda: peer(x, **kwargs), ctx.flusher, reps=20)
    return memory_bound_row(op, shape, config, us, num_bytes, ctx, "torch reference (eager)", peer_us, "bitwise equal")
