"""Plain-torch reference of deep_kernels.quant.fp8: the definition the kernels match bit for bit.

Runs on any device. Divisions are tensor-by-tensor on purpose: torch turns a division by a Python
scalar into a multiplication by its reciprocal, which is not the IEEE quotient the kernels compute.
"""

import torch

from deep_kernels.reference.common import (
    DEFAULT_AMAX_CLAMP, E4M3_MAX, ceil_div, divides, pack_scales, unpack_scales,
)


def ceil_to_power_of_two(s: torch.Tensor) -> torch.Tensor:
    """The smallest power of two >= s for finite positive FP32 s; inf and NaN pass through."""
    bits = s.view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    rounded = ((exponent + ((bits & 0x7FFFFF) != 0).int()) << 23).view(torch.float32)
    return torch.where(exponent >= 0xFF, s, rounded)


def scale_and_multiplier(amax: torch.Tensor, ue8m0: bool, format_max: float = E4M3_MAX):
    """(scale, quantizing multiplier) of clamped amax values: amax / format_max and format_max / amax, or
    with ue8m0 the power of two >= amax / format_max and its exact reciprocal."""
    if ue8m0:
        scale = ceil_to_power_of_two(amax / torch.full_like(amax, format_max))
        return scale, torch.ones_like(scale) / scale
    return amax / torch.full_like(amax, format_max), torch.full_like(amax, format_max) / amax


def to_e4m3(values: torch.Tensor, scale: torch.Tensor, multiplier: torch.Tensor, scale_mode: str) -> torch.Tensor:
    """values brought into range by `scale_mode` ("mul": * multiplier, "div": / scale), then rounded to e4m3
    (RNE); scale and multiplier broadcast against values."""
    scaled = values / scale if divides(scale_mode) else values * multiplier
    return scaled.to(torch.float8_e4m3fn)


def per_token_cast_to_fp8(x: torch.Tensor, group_size=128, ue8m0: bool = False,
                          scale_layout: str = "mn_major", amax_clamp: float = DEFAULT_AMAX_CLAMP,
                          scale_mode: str = "mul"):
    """group_size None means one group per row (group size K)."""
    m, k = x.shape
    group_size = k if group_size is None else group_size
    groups = x.float().reshape(m, k // group_size, group_size)
    scale, multiplier = scale_and_multiplier(groups.abs().amax(dim=2).clamp(min=amax_clamp), ue8m0)
    q = to_e4m3(groups, scale.unsqueeze(2), multiplier.unsqueeze(2), scale_mode).reshape(m, k)
    return q, pack_scales(scale, scale_layout)


def per_token_cast_back(q: torch.Tensor, scales: torch.Tensor, group_size: int = 128,
                        out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    m, k = q.shape
    scale = unpack_scales(scales, m, k // group_size)
    y = q.float().reshape(m, k // group_size, group_size) * scale.unsqueeze(2)
    return y.reshape(m, k).to(out_dtype)


def per_block_cast_to_fp8(x: torch.Tensor, block_size: int = 128, ue8m0: bool = False,
                          amax_clamp: float = DEFAULT_AMAX_CLAMP, scale_mode: str = "mul"):
    """x [N, K] to e4m3 with one FP32 scale per block_size x block_size block: (q [N, K], scales
    [ceil(N / block), K / block] row-major). The numerics of per_token_cast_to_fp8, per block; rows
    padding N to whole blocks are zeros."""
    n, k = x.shape
    padded_n = ceil_div(n, block_size) * block_size
    padded = torch.zeros((padded_n, k), dtype=torch.float32, device=x.device)
    padded[:n] = x.float()
    blocks = padded.view(padded_n // block_size, block_size, k // block_size, block_size)
    scale, multiplier = scale_and_multiplier(blocks.abs().amax(dim=(1, 3)).clamp(min=amax_clamp), ue8m0)
    q = to_e4m3(blocks, scale[:, None, :, None], multiplier[:, None, :, None], scale_mode)
    return q.view(padded_n, k)[:n].contiguous(), scale
