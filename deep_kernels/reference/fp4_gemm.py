"""Plain-torch references of deep_kernels.fp4_gemm: dequantize the MXFP4 weights (e2m1 code times its 32-group's
UE8M0 scale) and the FP8 activations, then multiply in float64 (per expert for the grouped GEMMs)."""

import torch

from deep_kernels.reference.common import ceil_div, unpack_scales
from deep_kernels.reference.gemm import contiguous_row_groups, dequantize_a
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
    (a, sfa), (b, sfb) = a, b
    m_total, k = a.shape
    groups = contiguous_row_groups(m_total, m_indices)
    sfa = unpack_scales(sfa, m_total, ceil_div(k, SCALE_BLOCK))
    for g in range(b.shape[0]):
        rows = (groups == g).nonzero().flatten()
        if rows.numel():
            expert_a = a.view(torch.uint8)[rows].view(a.dtype)
            d[rows] = (dequantize_a(expert_a, sfa[rows]) @ dequantize_mxfp4(b[g], sfb[g]).T).to(d.dtype)
    return d


def m_grouped_fp8_fp4_gemm_nt_masked(a, b, d: torch.Tensor, masked_m: torch.Tensor, expected_m: int) -> torch.Tensor:
    """d[g, :masked_m[g]] = a[g, :masked_m[g]] @ b[g]^T (float64, then d's dtype); later rows are left as they are."""
    (a, sfa), (b, sfb) = a, b
    m_max, k = a.shape[1:]
    for g, rows in enumerate(masked_m.tolist()):
        rows = max(0, min(rows, m_max))
        if rows:
            sfa_g = unpack_scales(sfa[g], m_max, ceil_div(k, SCALE_BLOCK))[:rows]
            d[g, :rows] = (dequantize_a(a[g, :rows], sfa_g) @ dequantize_mxfp4(b[g], sfb[g]).T).to(d.dtype)
    return d
