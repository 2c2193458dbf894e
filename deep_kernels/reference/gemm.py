"""Plain-torch references of deep_kernels.gemm and deep_kernels.grouped_gemm: dequantize, then multiply in
float64 (per expert for the grouped GEMMs)."""

import torch

from deep_kernels.reference.common import ceil_div, unpack_scales

SCALE_BLOCK = 128
# Each expert's segment of the contiguous layout starts at a multiple of 128 rows.
CONTIGUOUS_ALIGNMENT = 128


def dequantize_a(a: torch.Tensor, sfa: torch.Tensor) -> torch.Tensor:
    """A [M, K] e4m3 with 1 x 128 scales [M, ceil(K / 128)] (FP32 of any strides, or packed UE8M0) to float64 (also
    B of the weight-gradient recipe (1, 1, 128), whose scales are per row too)."""
    m, k = a.shape
    scale = unpack_scales(sfa, m, ceil_div(k, SCALE_BLOCK)).double()
    return a.double() * scale.repeat_interleave(SCALE_BLOCK, dim=1)[:, :k]


def dequantize_b(b: torch.Tensor, sfb: torch.Tensor) -> torch.Tensor:
    """B [N, K] e4m3 with 128 x 128 block scales [ceil(N / 128), ceil(K / 128)] (FP32, or packed UE8M0) to
    float64."""
    n, k = b.shape
    scale = unpack_scales(sfb, ceil_div(n, SCALE_BLOCK), ceil_div(k, SCALE_BLOCK)).double()
    return b.double() * scale.repeat_interleave(SCALE_BLOCK, dim=0)[:n].repeat_interleave(SCALE_BLOCK, dim=1)[:, :k]


def fp8_gemm_nt(a, b, d: torch.Tensor, c: torch.Tensor = None, recipe=None) -> torch.Tensor:
    """d = a @ b^T (+ c), computed in float64 from the dequantized inputs, then cast to d's dtype. recipe None or
    (1, 128, 128): 128 x 128 block scales on b; (1, 1, 128): 1 x 128 scales on b as on a (the weight gradient's)."""
    (a, sfa), (b, sfb) = a, b
    per_channel = recipe is not None and tuple(recipe) == (1, 1, 128)
    if recipe is not None and not per_channel and tuple(recipe) != (1, 128, 128):
        raise ValueError(f"unknown recipe {recipe!r}")
    b_values = dequantize_a(b, sfb) if per_channel else dequantize_b(b, sfb)
    result = dequantize_a(a, sfa) @ b_values.T
    if c is not None:
        result += c.double()
    return d.copy_(result)


def fp8_gemm_nn(a, b, d: torch.Tensor, c: torch.Tensor = None, recipe=None) -> torch.Tensor:
    """d = a @ b (+ c): b = (b [K, N], sfb) the transposed pair of fp8_gemm_nt's."""
    return fp8_gemm_nt(a, (b[0].T, b[1].T), d, c, recipe)


def fp8_gemm_tn(a, b, d: torch.Tensor, c: torch.Tensor = None, recipe=None) -> torch.Tensor:
    """d = a^T @ b (+ c): a = (a [K, M], sfa) and b = (b [K, N], sfb) the transposed pairs of fp8_gemm_nt's."""
    return fp8_gemm_nt((a[0].T, a[1].T), (b[0].T, b[1].T), d, c, recipe)


def fp8_gemm_tt(a, b, d: torch.Tensor, c: torch.Tensor = None, recipe=None) -> torch.Tensor:
    """d = a^T @ b^T (+ c): a = (a [K, M], sfa) the transposed pair of fp8_gemm_nt's."""
    return fp8_gemm_nt((a[0].T, a[1].T), b, d, c, recipe)


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
    return grouped_contiguous(a, b, d, contiguous_row_groups(a[0].shape[0], m_indices, offsets), dequantize_b)


def m_grouped_fp8_gemm_nn_contiguous(a, b, d: torch.Tensor, m_indices: torch.Tensor = None, *,
                                     offsets: torch.Tensor = None) -> torch.Tensor:
    """m_grouped_fp8_gemm_nt_contiguous with b = (b [G, K, N], sfb [G, ceil(K / 128), ceil(N / 128)])."""
    return m_grouped_fp8_gemm_nt_contiguous(a, (b[0].mT, b[1].mT), d, m_indices, offsets=offsets)


def grouped_contiguous(a, b, d: torch.Tensor, groups: torch.Tensor, dequantize_weights) -> torch.Tensor:
    """The contiguous layout's per-expert products: d[rows of g] = a[rows] @ dequantize_weights(b[g], sfb[g])^T for
    each expert g, groups the rows' experts (other ids: padding, left as it is)."""
    (a, sfa), (b, sfb) = a, b
    m_total, k = a.shape
    sfa = unpack_scales(sfa, m_total, ceil_div(k, SCALE_BLOCK))
    for g in range(b.shape[0]):
        rows = (groups == g).nonzero().flatten()
        if rows.numel():
            # NOTE: rows gathered as bytes: not every torch build indexes float8 tensors on every device.
            expert_a = a.view(torch.uint8)[rows].view(a.dtype)
            d[rows] = (dequantize_a(expert_a, sfa[rows]) @ dequantize_weights(b[g], sfb[g]).T).to(d.dtype)
    return d


def m_grouped_fp8_gemm_nt_masked(a, b, d: torch.Tensor, masked_m: torch.Tensor, expected_m: int) -> torch.Tensor:
    """d[g, :masked_m[g]] = a[g, :masked_m[g]] @ b[g]^T (float64, then d's dtype); rows at or past masked_m[g]
    are left as they are (masked_m clamped to [0, M_max]). expected_m is only the kernel's tiling hint."""
    return grouped_masked(a, b, d, masked_m, dequantize_b)


def grouped_masked(a, b, d: torch.Tensor, masked_m: torch.Tensor, dequantize_weights) -> torch.Tensor:
    """The masked layout's per-expert products: d[g, :masked_m[g]] = a[g, :masked_m[g]] @
    dequantize_weights(b[g], sfb[g])^T (masked_m clamped to [0, M_max]; later rows left as they are)."""
    (a, sfa), (b, sfb) = a, b
    m_max, k = a.shape[1:]
    for g, rows in enumerate(masked_m.tolist()):
        rows = max(0, min(rows, m_max))
        if rows:
            sfa_g = unpack_scales(sfa[g], m_max, ceil_div(k, SCALE_BLOCK))[:rows]
            d[g, :rows] = (dequantize_a(a[g, :rows], sfa_g) @ dequantize_weights(b[g], sfb[g]).T).to(d.dtype)
    return d
