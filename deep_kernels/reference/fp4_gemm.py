"""Plain-torch references of deep_kernels.fp4_gemm: dequantize the MXFP4 weights (e2m1 code times its 32-group's
UE8M0 scale) or the NVFP4 ones (e2m1 code times its 16-group's E4M3 scale times the global scale) and the FP8
activations, then multiply in float64 (per expert for the grouped GEMMs)."""

import torch

from deep_kernels.reference.gemm import contiguous_row_groups, dequantize_a, grouped_contiguous, grouped_masked
from deep_kernels.reference.quant.fp4 import e2m1_to_float, e8m0_to_float, unpack_e2m1

SCALE_BLOCK = 128
MXFP4_GROUP_SIZE = 32
NVFP4_GROUP_SIZE = 16


def dequantize_mxfp4(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """codes [N, K / 2] (float4_e2m1fn_x2 or uint8) with UE8M0 scales [N, K / 32] to float64 [N, K]."""
    values = e2m1_to_float(unpack_e2m1(codes)).double()
    scale = e8m0_to_float(scales).double()
    return values * scale.repeat_interleave(MXFP4_GROUP_SIZE, dim=1)


def dequantize_nvfp4(codes: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """codes [N, K / 2] (float4_e2m1fn_x2 or uint8) with E4M3 scales [N, K / 16] and an FP32 global scale (one
    element) to float64 [N, K]."""
    values = e2m1_to_float(unpack_e2m1(codes)).double()
    scale = scales.view(torch.float8_e4m3fn).double() * global_scale.double().reshape(())
    return values * scale.repeat_interleave(NVFP4_GROUP_SIZE, dim=1)


def fp8_fp4_gemm_nt(a, b, d: torch.Tensor, c: torch.Tensor = None) -> torch.Tensor:
    """d = a @ b^T (+ c) in float64 from the dequantized inputs, then cast to d's dtype; b is (codes, sfb) for
    MXFP4 or (codes, sfb, global_scale) for NVFP4."""
    (a, sfa) = a
    weights = dequantize_nvfp4(*b) if len(b) == 3 else dequantize_mxfp4(*b)
    result = dequantize_a(a, sfa) @ weights.T
    if c is not None:
        result += c.double()
    return d.copy_(result)


def m_grouped_fp8_fp4_gemm_nt_contiguous(a, b, d: torch.Tensor, m_indices: torch.Tensor) -> torch.Tensor:
    """d[r] = a[r] @ b[g]^T (float64, then d's dtype) for every row r of expert g; padding rows are left as they
    are."""
    return grouped_contiguous(a, b, d, contiguous_row_groups(a[0].shape[0], m_indices), dequantize_mxfp4)


def m_grouped_fp8_fp4_gemm_nt_masked(a, b, d: torch.Tensor, masked_m: torch.Tensor, expected_m: int) -> torch.Tensor:
    """d[g, :masked_m[g]] = a[g, :masked_m[g]] @ b[g]^T (float64, then d's dtype); later rows are left as they are."""
    return grouped_masked(a, b, d, masked_m, dequantize_mxfp4)
