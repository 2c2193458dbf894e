"""Plain-torch reference of deep_kernels.quant.transpose: the definition the kernels match bit for bit."""

import torch

from deep_kernels.reference.common import DEFAULT_AMAX_CLAMP, ceil_div
from deep_kernels.reference.quant.fp8 import per_token_cast_to_fp8

CHANNEL_BLOCK = 128


def per_channel_cast_transpose_to_fp8(x: torch.Tensor, ue8m0: bool = False, scale_layout: str = "mn_major",
                                      amax_clamp: float = DEFAULT_AMAX_CLAMP, scale_mode: str = "mul"):
    """The per-token cast (group 128) of x.T, M padded with zero columns to whole groups, then cut back to M."""
    m, k = x.shape
    padded = torch.zeros((k, ceil_div(m, CHANNEL_BLOCK) * CHANNEL_BLOCK), dtype=x.dtype, device=x.device)
    padded[:, :m] = x.T
    q, scales = per_token_cast_to_fp8(padded, CHANNEL_BLOCK, ue8m0=ue8m0, scale_layout=scale_layout,
                                      amax_clamp=amax_clamp, scale_mode=scale_mode)
    return q[:, :m].contiguous(), scales


def batched_transpose(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(1, 2).contiguous()
