"""Inputs of the grouped (MoE) FP8 GEMMs, shared by tests/test_grouped_gemm.py and the grouped_gemm benchmark.

Scale formats: "fp32" (per_token_cast_to_fp8's MN-major sfa, per_block_cast_to_fp8's FP32 sfb) or "ue8m0"
(power-of-two scales, sfa packed UE8M0 int32, sfb packed UE8M0 int32 [G, ceil(N / 128), ceil(K / 512)]).
"""

import random

import torch

from deep_kernels.moe.layout import CONTIGUOUS_ALIGNMENT
from deep_kernels.quant import ScaleLayout
from deep_kernels.reference import quant as reference_quant
from deep_kernels.testing import random_activations
from deep_kernels.validation import ceil_div

SCALE_FORMATS = ("fp32", "ue8m0")


def expert_sizes(num_groups: int, total: int, rng: random.Random, mode: str = "random") -> list:
    """Tokens per expert summing to `total`: "random" (about a quarter of the experts get none), or "one"
    (a single expert gets everything)."""
    if mode == "one":
        sizes = [0] * num_groups
        sizes[rng.randrange(num_groups)] = total
        return sizes
    weights = [0.0 if num_groups > 1 and rng.random() < 0.25 else rng.random() + 0.05 for _ in range(num_groups)]
    if not any(weights):
        weights[0] = 1.0
    sizes = [int(total * w / sum(weights)) for w in weights]
    sizes[max(range(num_groups), key=lambda g: weights[g])] += total - sum(sizes)
    return sizes


def _cast_activations(x: torch.Tensor, scale_format: str) -> tuple:
    ue8m0 = scale_format == "ue8m0"
    layout = "packed_ue8m0" if ue8m0 else "mn_major"
    if x.is_cuda:
        import deep_kernels

        return deep_kernels.per_token_cast_to_fp8(x, ue8m0=ue8m0, scale_layout=layout)
    return reference_quant.per_token_cast_to_fp8(x, ue8m0=ue8m0, scale_layout=layout)


def make_weights(num_groups: int, n: int, k: int, scale_format: str = "fp32", device="cuda") -> tuple:
    """(b [G, N, K] e4m3, sfb [G, ceil(N / 128), K / 128] FP32, or packed UE8M0 int32)."""
    ue8m0 = scale_format == "ue8m0"
    w = torch.randn((num_groups, n, k), device=device, dtype=torch.bfloat16)
    b = torch.empty((num_groups, n, k), device=device, dtype=torch.float8_e4m3fn)
    sfb = []
    for g in range(num_groups):
        q, scales = reference_quant.per_block_cast_to_fp8(w[g], ue8m0=ue8m0)
        b[g] = q
        sfb.append(reference_quant.pack_scales(scales, ScaleLayout.packed_ue8m0) if ue8m0 else scales)
    return b, torch.stack(sfb)


def contiguous_layout(sizes: list, device="cuda") -> tuple:
    """(m_indices [M_total], offsets [G + 1]) of experts of `sizes` tokens, segments padded to the alignment."""
    segments = [ceil_div(s, CONTIGUOUS_ALIGNMENT) * CONTIGUOUS_ALIGNMENT for s in sizes]
    m_indices = torch.full((sum(segments),), -1, dtype=torch.int32)
    start = 0
    for g, (size, segment) in enumerate(zip(sizes, segments)):
        m_indices[start:start + size] = g
        start += segment
    offsets = torch.tensor([0] + sizes, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return m_indices.to(device), offsets.to(device)


def make_contiguous_inputs(sizes: list, n: int, k: int, scale_format: str = "fp32", device="cuda") -> tuple:
    """((a, sfa), (b, sfb), m_indices, offsets) of the contiguous layout; padding rows of a hold random
    values too (the kernel must not let them reach a valid row)."""
    m_indices, offsets = contiguous_layout(sizes, device)
    a = _cast_activations(random_activations(m_indices.numel(), k, device=device), scale_format)
    return a, make_weights(len(sizes), n, k, scale_format, device), m_indices, offsets


def make_masked_inputs(masked_m: list, m_max: int, n: int, k: int, scale_format: str = "fp32", device="cuda") -> tuple:
    """((a [G, M_max, K], sfa [G, M_max, ...]), (b, sfb), masked_m [G] int32). FP32 sfa is MN-major per group
    (what the kernel reads without conversion); rows past masked_m hold random values too."""
    from deep_kernels.gemm import get_mn_major_tma_aligned_tensor

    num_groups = len(masked_m)
    q, scales = _cast_activations(random_activations(num_groups * m_max, k, device=device), scale_format)
    sfa = scales.view(num_groups, m_max, -1)
    if scale_format == "fp32":
        sfa = get_mn_major_tma_aligned_tensor(sfa)
    a = (q.view(num_groups, m_max, k), sfa)
    return a, make_weights(num_groups, n, k, scale_format, device), torch.tensor(masked_m, dtype=torch.int32, device=device)
