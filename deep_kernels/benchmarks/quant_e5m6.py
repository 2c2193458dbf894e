"""Rows of the `quant` suite for the E5M6 cast and cast-back and the FP8 per-block -> per-token requantization,
against copy bandwidth and the reference (torch.compile of it at 16384 rows, eager at 4096)."""

import torch

import deep_kernels
from deep_kernels.benchmarks.report import COMPILED_PEER_ROWS, BenchContext, checked_memory_row
from deep_kernels.reference import quant as reference
from deep_kernels.testing import random_activations

SHAPES = ((4096, 7168), (16384, 7168))
CAST_VARIANTS = (("fp32 scale", dict(ue8m0=False)), ("ue8m0 scale", dict(ue8m0=True)))
REQUANT_VARIANTS = (("fp32 mn_major", dict(ue8m0=False, scale_layout="mn_major")),
                    ("ue8m0 packed, lossless", dict(ue8m0=True, scale_layout="packed_ue8m0")))


def cast_bytes(m: int, k: int) -> int:
    """bf16 in, packed codes and FP32 scales out."""
    return m * k * 2 + m * k * 3 // 2 + m * 4


def cast_back_bytes(m: int, k: int) -> int:
    """Packed codes and FP32 scales in, bf16 out."""
    return m * k * 3 // 2 + m * 4 + m * k * 2


def requant_bytes(m: int, k: int) -> int:
    """e4m3 codes and 128 x 128 block scales in, e4m3 codes and 1 x 128 scales (FP32 bound) out."""
    return m * k + -(-m // 128) * (k // 128) * 4 + m * k + m * (k // 128) * 4


def rows(ctx: BenchContext) -> list:
    rows = []
    for m, k in SHAPES:
        shape = {"m": m, "k": k}
        x = random_activations(m, k, torch.bfloat16)
        for label, kwargs in CAST_VARIANTS:
            rows.append(_checked_row("per_token_cast_to_e5m6", shape, f"bf16 in, {label}",
                                     lambda: deep_kernels.per_token_cast_to_e5m6(x, **kwargs),
                                     lambda: reference.per_token_cast_to_e5m6(x, **kwargs), cast_bytes(m, k), ctx))
        packed, scales = reference.per_token_cast_to_e5m6(x)
        rows.append(_checked_row("per_token_cast_back_e5m6", shape, "bf16 out",
                                 lambda: deep_kernels.per_token_cast_back_e5m6(packed, scales),
                                 lambda: reference.per_token_cast_back_e5m6(packed, scales), cast_back_bytes(m, k),
                                 ctx))
        q, block_scales = reference.per_block_cast_to_fp8(x)
        for label, kwargs in REQUANT_VARIANTS:
            q_pair = reference.per_block_cast_to_fp8(x, ue8m0=True) if kwargs["ue8m0"] else (q, block_scales)
            rows.append(_checked_row("requant_per_block_to_per_token", {**shape, "block": 128, "group": 128},
                                     f"block 128 -> 1x128, {label}",
                                     lambda: deep_kernels.requant_per_block_to_per_token(*q_pair, **kwargs),
                                     lambda: reference.requant_per_block_to_per_token(*q_pair, **kwargs),
                                     requant_bytes(m, k), ctx))
    return rows


def _checked_row(op: str, shape: dict, config: str, kernel, reference_call, num_bytes: int,
                 ctx: BenchContext) -> dict:
    return checked_memory_row(op, shape, config, kernel, reference_call, num_bytes, ctx,
                              compiled=shape["m"] == COMPILED_PEER_ROWS)
