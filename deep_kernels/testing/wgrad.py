"""Inputs of the weight-gradient GEMMs (FP8 recipe (1, 1, 128): fp8_gemm_nt's dense one and the k-grouped one; the
k-grouped BF16 one), shared by tests/test_wgrad_gemm.py, tests/test_k_grouped_gemm.py and the wgrad_gemm and k_grouped_gemm benchmarks.

Both operands are activation-like: each row has its own power-of-two magnitude 2^e (e in [-8, 8]) times 2^f per
128-column group (f in [-2, 2]) (testing.gemm.gemm_activations), so a wrong row's or column's scale, or a wrong K
block's, changes the product by a factor of 2 or more. The k-grouped operands are cast as training casts them:
per_channel_cast_transpose_to_fp8 of the token-major [sum k, rows] tensor (the package's on the GPU, the
reference on the CPU), whose output goes to the GEMM as it is; the BF16 ones are the token-major tensors themselves.
"""

import random

import torch

from deep_kernels.reference.quant import per_channel_cast_transpose_to_fp8 as reference_cast_transpose
from deep_kernels.testing.gemm import TILE, cast_activations, gemm_activations

K_ALIGNMENT = 128


def make_wgrad_inputs(m: int, n: int, k: int, device="cuda", seed: int = 0) -> tuple:
    """((a [m, k] e4m3, sfa [m, ceil(k / 128)]), (b [n, k] e4m3, sfb [n, ceil(k / 128)])) with MN-major FP32 scales.
    K not a multiple of 128 (but of 16): cast at K rounded up to 128 with the columns past K zero, then cut to K."""
    padded_k = -(-k // TILE) * TILE
    x = gemm_activations(m, padded_k, device, seed)
    y = gemm_activations(n, padded_k, device, seed + 1)
    x[:, k:] = 0
    y[:, k:] = 0
    (qa, sfa), (qb, sfb) = cast_activations(x), cast_activations(y)
    if padded_k != k:
        qa, qb = qa[:, :k].contiguous(), qb[:, :k].contiguous()
    return (qa, sfa), (qb, sfb)


def group_sizes(num_groups: int, mean_k: int, rng: random.Random, spread: float = 0.3, empty: int = 0,
                alignment: int = K_ALIGNMENT) -> list:
    """Tokens per group: mean_k times a factor in [1 - spread, 1 + spread], each rounded up to `alignment` (128, the
    FP8 kind's K block; the BF16 kind's is 64); `empty` groups (chosen at random) get none."""
    sizes = [-(-int(mean_k * rng.uniform(1 - spread, 1 + spread)) // alignment) * alignment
             for _ in range(num_groups)]
    for g in rng.sample(range(num_groups), empty):
        sizes[g] = 0
    return sizes


def _cast_transpose(x: torch.Tensor) -> tuple:
    if x.is_cuda:
        import deep_kernels

        return deep_kernels.per_channel_cast_transpose_to_fp8(x)
    return reference_cast_transpose(x)


def make_k_grouped_inputs(ks: list, m: int, n: int, device="cuda", seed: int = 0) -> tuple:
    """((a [m, sum k], sfa [m, sum k / 128]), (b [n, sum k], sfb [n, sum k / 128]), ks_tensor [G] int32) as
    per_channel_cast_transpose_to_fp8 casts the token-major output gradient [sum k, m] and activations [sum k, n]."""
    total_k = sum(ks)
    dy = gemm_activations(m, total_k, device, seed).T.contiguous()
    x = gemm_activations(n, total_k, device, seed + 1).T.contiguous()
    ks_tensor = torch.tensor(ks, dtype=torch.int32, device=device)
    return _cast_transpose(dy), _cast_transpose(x), ks_tensor


def make_k_grouped_bf16_inputs(ks: list, m: int, n: int, device="cuda", seed: int = 0) -> tuple:
    """(dy [sum k, m], x [sum k, n], ks_tensor [G] int32): the token-major bf16 output gradient and activations of
    the k-grouped BF16 GEMM (its tn layout takes them as they are), with testing.gemm's per-row and per-128-column
    power-of-two magnitudes along the rows of dy.T and x.T."""
    total_k = sum(ks)
    dy = gemm_activations(m, total_k, device, seed).T.contiguous()
    x = gemm_activations(n, total_k, device, seed + 1).T.contiguous()
    return dy, x, torch.tensor(ks, dtype=torch.int32, device=device)
