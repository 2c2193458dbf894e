"""Plain-torch reference of deep_kernels.gemm: dequantize, then multiply in float64."""

import torch

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
