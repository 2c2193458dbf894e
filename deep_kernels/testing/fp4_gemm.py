"""Inputs of the FP8 x MXFP4 and FP8 x NVFP4 GEMM tests and benchmarks: weights drawn code by code, so every e2m1
code occurs equally often; MXFP4's 32-wide sub-blocks of each 128-deep block spread their scales over chosen exponent
distances (the expansion's shift), NVFP4's 16-wide groups take random finite positive E4M3 scales (every mantissa,
subnormals included) with a global scale that is not a power of two."""

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


NVFP4_GROUP_SIZE = 16


# E4M3 scale bytes of nvfp4_weights: 2^-2 .. 3.75 with every mantissa (the default: every group weighs in the
# result), and every positive finite value, subnormals (from 2^-9, byte 1) to 448 (byte 0x7E) included.
MODERATE_E4M3_SCALES = (0x28, 0x48)
ALL_E4M3_SCALES = (0x01, 0x7F)


def nvfp4_weights(n: int, k: int, device="cuda", seed: int = 1, scale_bytes: tuple = MODERATE_E4M3_SCALES) -> tuple:
    """(codes [n, k / 2] float4_e2m1fn_x2, scales [n, k / 16] float8_e4m3fn, global_scale float32 [1]): uniform
    random code bytes; scale bytes uniform in [scale_bytes[0], scale_bytes[1]); a global scale of 0.0123 times a
    random factor in [1, 2)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    codes = torch.randint(0, 256, (n, k // 2), generator=generator, device=device, dtype=torch.uint8)
    scales = torch.randint(*scale_bytes, (n, k // NVFP4_GROUP_SIZE), generator=generator, device=device,
                           dtype=torch.uint8)
    factor = torch.rand(1, generator=generator, device=device, dtype=torch.float32)
    global_scale = 0.0123 * (1 + factor)
    return codes.view(torch.float4_e2m1fn_x2), scales.view(torch.float8_e4m3fn), global_scale


def make_nvfp4_gemm_inputs(m: int, n: int, k: int, device="cuda", seed: int = 0,
                           scale_bytes: tuple = MODERATE_E4M3_SCALES) -> tuple:
    """((a, sfa), (codes, sfb, global_scale)) of fp8_fp4_gemm_nt's NVFP4 form."""
    a = cast_activations(gemm_activations(m, k, device, seed))
    return a, nvfp4_weights(n, k, device, seed + 1, scale_bytes)
