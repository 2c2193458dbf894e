"""Inputs of the grouped (MoE) FP8 GEMMs, shared by tests/test_grouped_gemm.py and the grouped_gemm benchmark.

Scale formats: "fp32" (per_token_cast_to_fp8's MN-major sfa, per_block_cast_to_fp8's FP32 sfb) or "ue8m0"
(power-of-two scales, sfa packed UE8M0 int32, sfb packed UE8M0 int32 [G, ceil(N / 128), ceil(K / 512)]).
"""

import random

import torch

from deep_kernels.moe.layout import CONTIGUOUS_ALIGNMENT
from deep_kernels.testing.gemm import (
    SCALE_FORMATS, assert_gemm_close, cast_activations, cast_weights, gemm_activations, gemm_weights,
)
from deep_kernels.validation import ceil_div

__all__ = ["SCALE_FORMATS", "assert_masked_close", "contiguous_layout", "expert_sizes", "make_contiguous_inputs",
           "make_masked_inputs", "make_weights", "masked_problem", "psum_ends"]


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


def masked_problem(num_groups: int, expected_m: int, rng: random.Random) -> tuple:
    """(masked_m, M_max, the expected_m hint) of a decode step as the masked GEMM's targets count it: valid rows
    round(expected_m * U(0.7, 1.3)) per group, M_max = 1.3 * expected_m rounded up to 128, the host hint
    int(1.2 * expected_m)."""
    masked_m = [round(expected_m * rng.uniform(0.7, 1.3)) for _ in range(num_groups)]
    return masked_m, ceil_div(ceil_div(13 * expected_m, 10), 128) * 128, int(1.2 * expected_m)


def make_weights(num_groups: int, n: int, k: int, scale_format: str = "fp32", device="cuda", seed: int = 1) -> tuple:
    """(b [G, N, K] e4m3, sfb [G, ceil(N / 128), K / 128] FP32, or packed UE8M0 int32), each 128 x 128 block of
    each expert of its own power-of-two magnitude (testing.gemm.gemm_weights)."""
    w = gemm_weights(n, k, device, seed, num_groups=num_groups)
    casts = [cast_weights(w[g], scale_format) for g in range(num_groups)]
    return torch.stack([q for q, _ in casts]), torch.stack([scales for _, scales in casts])


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


def psum_ends(sizes: list, device="cuda") -> torch.Tensor:
    """DeepGEMM's psum layout argument [G] int32 of the layout contiguous_layout builds: each expert's row end."""
    ends, start = [], 0
    for size in sizes:
        ends.append(start + size)
        start += ceil_div(size, CONTIGUOUS_ALIGNMENT) * CONTIGUOUS_ALIGNMENT
    return torch.tensor(ends, dtype=torch.int32, device=device)


def make_contiguous_inputs(sizes: list, n: int, k: int, scale_format: str = "fp32", device="cuda",
                           seed: int = 0) -> tuple:
    """((a, sfa), (b, sfb), m_indices, offsets) of the contiguous layout; padding rows of a hold random
    values too (the kernel must not let them reach a valid row)."""
    m_indices, offsets = contiguous_layout(sizes, device)
    a = cast_activations(gemm_activations(m_indices.numel(), k, device, seed), scale_format)
    return a, make_weights(len(sizes), n, k, scale_format, device, seed + 1), m_indices, offsets


def make_masked_inputs(masked_m: list, m_max: int, n: int, k: int, scale_format: str = "fp32", device="cuda",
                       seed: int = 0) -> tuple:
    """((a [G, M_max, K], sfa [G, M_max, ...]), (b, sfb), masked_m [G] int32). FP32 sfa is MN-major per group
    (what the kernel reads without conversion); rows past masked_m hold random values too."""
    from deep_kernels.gemm import get_mn_major_tma_aligned_tensor

    num_groups = len(masked_m)
    q, scales = cast_activations(gemm_activations(num_groups * m_max, k, device, seed), scale_format)
    sfa = scales.view(num_groups, m_max, -1)
    if scale_format == "fp32":
        sfa = get_mn_major_tma_aligned_tensor(sfa)
    a = (q.view(num_groups, m_max, k), sfa)
    masked_m = torch.tensor(masked_m, dtype=torch.int32, device=device)
    return a, make_weights(num_groups, n, k, scale_format, device, seed + 1), masked_m


def assert_masked_close(actual: torch.Tensor, expected: torch.Tensor, masked_m) -> None:
    """A masked GEMM's output [G, M_max, N] (poisoned before the launch) against its float64 reference: each group's
    first masked_m rows with assert_gemm_close, the rows past them still NaN (masked_m: a list or a tensor)."""
    for g, rows in enumerate(int(r) for r in masked_m):
        if rows:
            assert_gemm_close(actual[g, :rows], expected[g, :rows], name=f"d[{g}]")
        assert torch.isnan(actual[g, rows:]).all(), f"d[{g}]: a row past masked_m = {rows} was written"
