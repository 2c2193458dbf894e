"""Rows of the FP4 casts and cast-backs (MXFP4, NVFP4) for suite `quant`: against copy bandwidth and
the reference (torch.compile of it at 16384 rows, eager at 4096)."""

import torch

import deep_kernels
from deep_kernels.benchmarks.report import COMPILED_PEER_ROWS, BenchContext, checked_memory_row
from deep_kernels.reference.quant import fp4 as reference
from deep_kernels.testing import random_activations

SHAPES = ((4096, 7168), (16384, 7168))


def cases(m: int, k: int, device="cuda") -> list:
    """(op, shape, config, kernel, reference function, bytes read + written) of each row at [m, k] bf16."""
    x = random_activations(m, k, torch.bfloat16, device=device)
    g = reference.nvfp4_global_scale(x)
    mx = reference.per_token_cast_to_mxfp4(x)
    nv = reference.per_token_cast_to_nvfp4(x, g, scale_layout="swizzled")
    mx_bytes, nv_bytes = m * k * 2 + m * k // 2 + m * k // 32, m * k * 2 + m * k // 2 + nv[1].numel()
    mx_shape, nv_shape = {"m": m, "k": k, "group": 32}, {"m": m, "k": k, "group": 16}
    return [
        ("per_token_cast_to_mxfp4", mx_shape, "bf16 in, e8m0 row-major", lambda: deep_kernels.per_token_cast_to_mxfp4(x),
         lambda: reference.per_token_cast_to_mxfp4(x), mx_bytes),
        ("mxfp4_cast_back", mx_shape, "bf16 out, e8m0 row-major", lambda: deep_kernels.mxfp4_cast_back(*mx),
         lambda: reference.mxfp4_cast_back(*mx), mx_bytes),
        ("per_token_cast_to_nvfp4", nv_shape, "bf16 in, e4m3 swizzled",
         lambda: deep_kernels.per_token_cast_to_nvfp4(x, g, scale_layout="swizzled"),
         lambda: reference.per_token_cast_to_nvfp4(x, g, scale_layout="swizzled"), nv_bytes),
        ("nvfp4_cast_back", nv_shape, "bf16 out, e4m3 swizzled", lambda: deep_kernels.nvfp4_cast_back(*nv, g, "swizzled"),
         lambda: reference.nvfp4_cast_back(*nv, g, "swizzled"), nv_bytes),
    ]


def rows(ctx: BenchContext) -> list:
    return [checked_memory_row(op, shape, config, kernel, peer, num_bytes, ctx, compiled=m == COMPILED_PEER_ROWS)
            for m, k in SHAPES for op, shape, config, kernel, peer, num_bytes in cases(m, k)]
