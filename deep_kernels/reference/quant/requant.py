"""Plain-torch reference of deep_kernels.quant.requant: dequantize, then the per-token FP8 cast."""

import torch

from deep_kernels.reference.common import DEFAULT_AMAX_CLAMP
from deep_kernels.reference.quant.fp8 import per_token_cast_to_fp8

BLOCK_SIZE = 128


def dequantize_per_block(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float(q) * its 128 x 128 block's scale, FP32 [M, K]."""
    m, _ = q.shape
    block_scale = scales.repeat_interleave(BLOCK_SIZE, dim=0)[:m].repeat_interleave(BLOCK_SIZE, dim=1)
    return q.float() * block_scale


def requant_per_block_to_per_token(q: torch.Tensor, scales: torch.Tensor, ue8m0: bool = False,
                                   scale_layout: str = "mn_major", amax_clamp: float = DEFAULT_AMAX_CLAMP,
                                   scale_mode: str = "mul"):
    return per_token_cast_to_fp8(dequantize_per_block(q, scales), BLOCK_SIZE, ue8m0, scale_layout, amax_clamp,
                                 scale_mode)
