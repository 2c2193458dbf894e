"""Plain-torch references of deep_kernels.gemm and deep_kernels.grouped_gemm: dequantize, then multiply in
float64 (per expert for the grouped GEMMs)."""

import torch

from deep_kernels.moe.layout import CONTIGUOUS_ALIGNMENT
from deep_kernels.quant import unpack_ue8m0
from deep_kernels.reference.quant import unpack_scales
from deep_kernels.validation import ceil_div

SCALE_BLOCK = 128


def dequantize_a(a: torch.Tensor, sfa: torch.Tensor) -> torch.Tensor:
    """A [M, K] e4m3 with 1 x 128 scales (any layout deep_kernels.quant writes) to float64."""
    m, k = a.shape
    scale = unpack_scales(sfa, m, k // SCALE_BLOCK).double()
    return a.double() * scale.repeat_interleave(SCALE_BLOCK, dim=1)


def dequantize_b(b: torch.Tensor, sfb: torch.Tensor) -> torch.Tensor:
    """B [N, K] e4m3 with 128 x 128 block scales [ceil(N / 128), K / 128] to float64."""
    n, k = b.shape
    scale = unpack_scales(sfb, ceil_div(n, SCALE_BLOCK), k // SCALE_BLOCK).double()
    return b.double() * scale.repeat_interleave(SCALE_BLOCK, dim=0)[:n].repeat_interleave(SCALE_BLOCK, dim=1)


def fp8_gemm_nt(a, b, d: torch.Tensor, c: torch.Tensor = None) -> torch.Tensor:
    """d = a @ b^T (+ c), computed in float64 from the dequantized inputs, then cast to d's dtype."""
    (a, sfa), (b, sfb) = a, b
    result = dequantize_a(a, sfa) @ dequantize_b(b, sfb).T
    if c is not None:
        result += c.double()
    return d.copy_(result)



def _fp32_scales(scales: torch.Tensor, rows: int, k_blocks: int) -> torch.Tensor:
    """[rows, K / 128] scales of any strides, FP32 or packed UE8M0 (int32), as float64."""
    return (unpack_ue8m0(scales, rows, k_blocks) if scales.dtype == torch.int32 else scales).double()


def _expert_product(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor) -> torch.Tensor:
    """a [M, K] @ b [N, K]^T in float64 from the dequantized inputs; scales FP32 or packed, any strides."""
    (m, k), n = a.shape, b.shape[0]
    k_blocks = k // SCALE_BLOCK
    x = a.double() * _fp32_scales(sfa, m, k_blocks).repeat_interleave(SCALE_BLOCK, dim=1)
    sb = _fp32_scales(sfb, ceil_div(n, SCALE_BLOCK), k_blocks)
    w = b.double() * sb.repeat_interleave(SCALE_BLOCK, dim=0)[:n].repeat_interleave(SCALE_BLOCK, dim=1)
    return x @ w.T


def contiguous_row_groups(m_total: int, m_indices: torch.Tensor = None, offsets: torch.Tensor = None,
                          alignment: int = CONTIGUOUS_ALIGNMENT) -> torch.Tensor:
    """Each row's expert (-1 for padding) of the contiguous layout, from per-row ids or from the prefix sum
    of the expert sizes (segments in expert order, each padded to `alignment` rows)."""
    if offsets is None:
        return m_indices.long()
    groups = torch.full((m_total,), -1, dtype=torch.long)
    start = 0
    for g, count in enumerate((offsets[1:] - offsets[:-1]).tolist()):
        groups[start:start + count] = g
        start += ceil_div(count, alignment) * alignment
    return groups[:m_total].to(offsets.device)


def m_grouped_fp8_gemm_nt_contiguous(a, b, d: torch.Tensor, m_indices: torch.Tensor = None, *,
                                     offsets: torch.Tensor = None) -> torch.Tensor:
    """d[r] = a[r] @ b[g]^T (float64, then d's dtype) for every row r of expert g; padding rows (ids outside
    [0, G)) are left as they are."""
    (a, sfa), (b, sfb) = a, b
    m_total, k = a.shape
    groups = contiguous_row_groups(m_total, m_indices, offsets)
    sfa = _fp32_scales(sfa, m_total, k // SCALE_BLOCK)
    for g in range(b.shape[0]):
        rows = (groups == g).nonzero().flatten()
        if rows.numel():
            # NOTE: rows gathered as bytes: not every torch build indexes float8 tensors on every device.
            expert_a = a.view(torch.uint8)[rows].view(a.dtype)
            d[rows] = _expert_product(expert_a, sfa[rows], b[g], sfb[g]).to(d.dtype)
    return d


def m_grouped_fp8_gemm_nt_masked(a, b, d: torch.Tensor, masked_m: torch.Tensor, expected_m: int) -> torch.Tensor:
    """d[g, :masked_m[g]] = a[g, :masked_m[g]] @ b[g]^T (float64, then d's dtype); rows at or past masked_m[g]
    are left as they are (masked_m clamped to [0, M_max]). expected_m is only the kernel's tiling hint."""
    (a, sfa), (b, sfb) = a, b
    m_max, k = a.shape[1:]
    for g, rows in enumerate(masked_m.tolist()):
        rows = max(0, min(rows, m_max))
        if rows:
            sfa_g = _fp32_scales(sfa[g], m_max, k // SCALE_BLOCK)[:rows]
            d[g, :rows] = _expert_product(a[g, :rows], sfa_g, b[g], sfb[g]).to(d.dtype)
    return d
