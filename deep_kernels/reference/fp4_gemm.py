"""Plain-torch references of deep_kernels.fp4_gemm: dequantize the MXFP4 weights (e2m1 code times its 32-group's
UE8M0 scale) and the FP8 activations, then multiply in float64 (per expert for the grouped GEMMs)."""

import torch

from deep_kernels.reference.gemm import contiguous_row_groups, dequantize_a, grouped_contiguous, grouped_masked
from deep_kernels.reference.quant.fp4 import e2m1_to_float, e8m0_to_float, unpack_e2m1

SCALE_BLOCK = 128
MXFP4_GROUP_SIZE = 32


def dequantize_mxfp4(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """codes [N, K / 2] (float4_e2m1fn_x2 or uint8) with UE8M0 scales [N, K / 32] to float64 [N, K]."""
    values = e2m1_to_float(unpack_e2m1(codes)).double()
    scale = e8m0_to_float(scales).double()
    return values * scale.repeat_interleave(MXFP4_GROUP_SIZE, dim=1)


def fp8_fp4_gemm_nt(a, b, d: torch.Tensor, c: torch.Tensor = None) -> torch.Tensor:
    """d = a @ b^T (+ c) in float64 from the dequantized inputs, then cast to d's dtype."""
    (a, sfa), (b, sfb) = a, b
    result = dequantize_a(a, sfa) @ dequantize_mxfp4(b, sfb).T
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
