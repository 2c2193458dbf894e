"""Inputs of the FP8 x MXFP4 GEMM tests and benchmarks: MXFP4 weights drawn code by code, so every e2m1 code
occurs equally often and the 32-wide sub-blocks of each 128-deep block spread their scales over chosen exponent
distances (the expansion's shift)."""

import torch

from deep_kernels.testing.gemm import cast_activations, gemm_activations

MXFP4_GROUP_SIZE = 32
SUB_BLOCKS = 4  # 32-wide sub-blocks of a 128-deep K block


def mxfp4_weights(n: int, k: int, device="cuda", seed: int = 1, num_groups: int = None, max_shift: int = 3) -> tuple:
    """(codes [n, k / 2] float4_e2m1fn_x2, scales [n, k / 32] float8_e8m0fnu) (or [num_groups, ...]): uniform
    random code bytes; per row and 128-deep block an exponent in 127 + [-8, 8], and per 32-wide sub-block that
    exponent minus a shift in [0, max_shift] (one sub-block of each block keeps shift 0)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    lead = () if num_groups is None else (num_groups,)
    codes = torch.randint(0, 256, (*lead, n, k // 2), generator=generator, device=device, dtype=torch.uint8)
    k_blocks = k // (MXFP4_GROUP_SIZE * SUB_BLOCKS)
    block = torch.randint(119, 136, (*lead, n, k_blocks, 1), generator=generator, device=device)
    shift = torch.randint(0, max_shift + 1, (*lead, n, k_blocks, SUB_BLOCKS), generator=generator, device=device)
    keep = torch.randint(0, SUB_BLOCKS, (*lead, n, k_blocks, 1), generator=generator, device=device)
    shift = shift.scatter(-1, keep, 0)
    scales = (block - shift).clamp(0, 254).to(torch.uint8).reshape(*lead, n, k // MXFP4_GROUP_SIZE)
    return codes.view(torch.float4_e2m1fn_x2), scales.view(torch.float8_e8m0fnu)


def make_fp4_gemm_inputs(m: int, n: int, k: int, device="cuda", seed: int = 0, max_shift: int = 3) -> tuple:
    """((a, sfa), (codes, sfb)) of fp8_fp4_gemm_nt: activations as for the FP8 GEMM tests, MXFP4 weights."""
    a = cast_activations(gemm_activations(m, k, device, seed))
    return a, mxfp4_weights(n, k, device, seed + 1, max_shift=max_shift)
