"""Plain-torch references of deep_kernels.k_grouped_gemm: per group, dequantize the group's K segment of both
operands (1 x 128 scales per row) and multiply in float64."""

import torch

from deep_kernels.reference.gemm import SCALE_BLOCK, dequantize_a


def k_grouped_fp8_gemm_nt_contiguous(a, b, d: torch.Tensor, ks, ks_tensor: torch.Tensor = None,
                                     c: torch.Tensor = None, recipe=(1, 1, 128)) -> torch.Tensor:
    """d[g] = a[:, K_g] @ b[:, K_g]^T (+ c[g]) in float64, then d's dtype, K_g the g-th segment of ks[g] columns of
    a [M, sum k] and b [N, sum k] (scales [rows, sum k / 128]); an empty group gives c[g] (zeros without c).
    ks_tensor is the kernel's copy of ks (unused here), or with ks None the sizes themselves, whose sum may fall short
    of the columns (the rest is not read)."""
    if tuple(recipe) != (1, 1, 128):
        raise ValueError(f"the k-grouped GEMM takes recipe (1, 1, 128), got {recipe!r}")
    (a, sfa), (b, sfb) = a, b
    a_values, b_values = dequantize_a(a, sfa), dequantize_a(b, sfb)
    sizes = ks_tensor.tolist() if ks is None else ks
    begin = 0
    for g, k in enumerate(sizes):
        product = a_values[:, begin:begin + k] @ b_values[:, begin:begin + k].T
        if c is not None:
            product = product + c[g].double()
        d[g] = product.to(d.dtype)
        begin += k
    assert (begin <= a.shape[1] if ks is None else begin == a.shape[1]) and all(k % SCALE_BLOCK == 0 for k in sizes), \
        "ks must tile sum k (or a part of it, ks None) in multiples of 128"
    return d


def k_grouped_fp8_gemm_tn_contiguous(a, b, d: torch.Tensor, ks, ks_tensor: torch.Tensor = None,
                                     c: torch.Tensor = None, recipe=(1, 1, 128)) -> torch.Tensor:
    """The nt reference of the transposed operands: a (a [sum k, M], sfa [sum k / 128, M]), b likewise."""
    (a, sfa), (b, sfb) = a, b
    return k_grouped_fp8_gemm_nt_contiguous((a.T, sfa.T), (b.T, sfb.T), d, ks, ks_tensor, c, recipe)


def k_grouped_bf16_gemm_nt_contiguous(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, ks,
                                      ks_tensor: torch.Tensor = None, c: torch.Tensor = None) -> torch.Tensor:
    """d[g] = a[:, K_g] @ b[:, K_g]^T (+ c[g]) in float64, then d's dtype, K_g the g-th segment of ks[g] columns of
    bf16 a [M, sum k] and b [N, sum k]; an empty group gives c[g] (zeros without c). ks_tensor is the kernel's copy of
    ks (unused here)."""
    a_values, b_values = a.double(), b.double()
    begin = 0
    for g, k in enumerate(ks):
        product = a_values[:, begin:begin + k] @ b_values[:, begin:begin + k].T
        if c is not None:
            product = product + c[g].double()
        d[g] = product.to(d.dtype)
        begin += k
    assert begin == a.shape[1], "ks must tile sum k"
    return d


def k_grouped_bf16_gemm_tn_contiguous(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, ks,
                                      ks_tensor: torch.Tensor = None, c: torch.Tensor = None) -> torch.Tensor:
    """The nt reference of the transposed operands a [sum k, M] and b [sum k, N]."""
    return k_grouped_bf16_gemm_nt_contiguous(a.T, b.T, d, ks, ks_tensor, c)
