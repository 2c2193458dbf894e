"""Plain-torch references of deep_kernels.bf16_gemm: the product in float64 (per expert for the grouped GEMMs), then
cast to d's dtype."""

import torch

from deep_kernels.reference.gemm import contiguous_row_groups


def bf16_gemm_nt(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor = None) -> torch.Tensor:
    """d = a @ b^T (+ c), a [M, K], b [N, K], in float64."""
    result = a.double() @ b.double().T
    if c is not None:
        result += c.double()
    return d.copy_(result)


def bf16_gemm_nn(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor = None) -> torch.Tensor:
    """d = a @ b (+ c), a [M, K], b [K, N]."""
    return bf16_gemm_nt(a, b.T, d, c)


def bf16_gemm_tn(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor = None) -> torch.Tensor:
    """d = a^T @ b (+ c), a [K, M], b [K, N]."""
    return bf16_gemm_nt(a.T, b.T, d, c)


def bf16_gemm_tt(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor = None) -> torch.Tensor:
    """d = a^T @ b^T (+ c), a [K, M], b [N, K]."""
    return bf16_gemm_nt(a.T, b, d, c)


def m_grouped_bf16_gemm_nt_contiguous(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor,
                                      m_indices: torch.Tensor) -> torch.Tensor:
    """d[r] = a[r] @ b[g]^T (float64, then d's dtype) for every row r of expert g; padding rows (ids outside
    [0, G)) are left as they are."""
    groups = contiguous_row_groups(a.shape[0], m_indices)
    for g in range(b.shape[0]):
        rows = (groups == g).nonzero().flatten()
        if rows.numel():
            d[rows] = (a[rows].double() @ b[g].double().T).to(d.dtype)
    return d


def m_grouped_bf16_gemm_nn_contiguous(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor,
                                      m_indices: torch.Tensor) -> torch.Tensor:
    """m_grouped_bf16_gemm_nt_contiguous with b [G, K, N]."""
    return m_grouped_bf16_gemm_nt_contiguous(a, b.mT, d, m_indices)


def m_grouped_bf16_gemm_nt_masked(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, masked_m: torch.Tensor,
                                  expected_m: int) -> torch.Tensor:
    """d[g, :masked_m[g]] = a[g, :masked_m[g]] @ b[g]^T (float64, then d's dtype); rows at or past masked_m[g] are
    left as they are (masked_m clamped to [0, M_max]). expected_m is only the kernel's tiling hint."""
    m_max = a.shape[1]
    for g, rows in enumerate(masked_m.tolist()):
        rows = max(0, min(rows, m_max))
        if rows:
            d[g, :rows] = (a[g, :rows].double() @ b[g].double().T).to(d.dtype)
    return d
