"""Plain-torch reference of deep_kernels.quant.fp4: the definition the kernels match bit for bit.

Runs on any device. Divisions are tensor-by-tensor on purpose (a division by a Python scalar becomes a
multiplication by its reciprocal). e2m1 rounding is written as comparisons with the midpoints between
neighbouring e2m1 values (ties to the even code), independent of the kernels' FMA formulation.
"""

import torch

from deep_kernels.reference.common import (
    DEFAULT_AMAX_CLAMP, E4M3_MAX, ceil_div, divides, name_of, pack_scales, ue8m0_bytes, unpack_ue8m0_bytes,
)
from deep_kernels.reference.quant.fp8 import ceil_to_power_of_two, per_token_cast_to_fp8

E2M1_MAX = 6.0
MXFP4_GROUP_SIZE = 32
NVFP4_GROUP_SIZE = 16
DEFAULT_FP4_AMAX_CLAMP = 1e-12
# The e2m1 value of each code 0..15 (bit 3 the sign).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
# Midpoints between neighbouring magnitudes: a tie rounds down where the lower code is even (strict), up
# where the upper one is.
_ROUND_UP_ABOVE = (0.25, 1.25, 2.5, 5.0)
_ROUND_UP_FROM = (0.75, 1.75, 3.5)
E4M3_MIN_SUBNORMAL = 2.0 ** -9


# NOTE: inductor generates no code for the fp4 and e8m0 dtypes, so reinterpreting to or from them stays eager
# (a graph break): torch.compile of these functions, the benchmarks' peer, then compiles all the arithmetic.
@torch.compiler.disable
def _bytes_as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.view(dtype)


def e2m1_codes(scaled: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """uint8 e2m1 codes (0..15) of FP32 `scaled`: RNE, saturating at 6, NaN -> 6; the sign bit is that of the
    FP32 `inputs` (same shape)."""
    magnitude = torch.fmin(scaled.abs(), torch.full_like(scaled, E2M1_MAX))
    code = sum((magnitude > t).to(torch.uint8) for t in _ROUND_UP_ABOVE)
    code = code + sum((magnitude >= t).to(torch.uint8) for t in _ROUND_UP_FROM)
    return code + (inputs.view(torch.int32) < 0).to(torch.uint8) * 8


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [M, K] to float4_e2m1fn_x2 [M, K / 2], element 2i in the low nibble."""
    return _bytes_as((codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous(), torch.float4_e2m1fn_x2)


def unpack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """float4_e2m1fn_x2 (or uint8) [M, K / 2] to uint8 codes [M, K]."""
    packed = _bytes_as(codes, torch.uint8)
    return torch.stack([packed & 0xF, packed >> 4], dim=2).reshape(packed.shape[0], -1)


def e2m1_to_float(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes to their FP32 values."""
    return torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)[codes.long()]


def e8m0_to_float(exponents: torch.Tensor) -> torch.Tensor:
    """UE8M0 bytes to FP32: 2^(e - 127), e = 0 the subnormal 2^-127, 0xFF NaN (0x7FFFFFFF)."""
    e = _bytes_as(exponents, torch.uint8).int()
    bits = torch.where(e == 0xFF, 0x7FFFFFFF, torch.where(e == 0, 0x00400000, e << 23))
    return bits.view(torch.float32)


def swizzle_128x4(scales: torch.Tensor) -> torch.Tensor:
    """Row-major scale bytes [M, G] into the 128x4 tiled layout [ceil(M / 128) * 128, ceil(G / 4) * 4]."""
    m, g = scales.shape
    rows, cols = ceil_div(m, 128) * 128, ceil_div(g, 4) * 4
    padded = torch.zeros((rows, cols), dtype=torch.uint8, device=scales.device)
    padded[:m, :g] = scales.view(torch.uint8)
    tiles = padded.view(rows // 128, 4, 32, cols // 4, 4).permute(0, 3, 2, 1, 4)
    return tiles.reshape(rows, cols).view(scales.dtype)


def unswizzle_128x4(scales: torch.Tensor, m: int, g: int) -> torch.Tensor:
    """The inverse of swizzle_128x4: [M, G] row-major."""
    rows, cols = scales.shape
    tiles = scales.view(torch.uint8).view(rows // 128, cols // 4, 32, 4, 4).permute(0, 3, 2, 1, 4)
    return tiles.reshape(rows, cols)[:m, :g].contiguous().view(scales.dtype)


def _groups(x: torch.Tensor, group_size: int) -> torch.Tensor:
    m, k = x.shape
    return x.float().reshape(m, k // group_size, group_size)


def _mx_scales(amax: torch.Tensor):
    """(scale, UE8M0 bytes) of clamped amax values."""
    scale = ceil_to_power_of_two(amax / torch.full_like(amax, E2M1_MAX))
    return scale, ue8m0_bytes(scale)


def _nv_scales(amax: torch.Tensor, global_scale: torch.Tensor):
    """(scale, E4M3 bytes) of clamped amax values."""
    g = global_scale.float().reshape(())
    unit = amax / torch.full_like(amax, E2M1_MAX)
    block = torch.maximum(unit / g, torch.full_like(unit, E4M3_MIN_SUBNORMAL))
    # The kernels' conversion saturates (inf included) and makes every NaN 0x7F.
    fp8 = block.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    fp8 = torch.where(block.isnan(), 0x7F, fp8.int()).to(torch.uint8)
    return fp8.view(torch.float8_e4m3fn).float() * g, fp8


def _cast_codes(groups: torch.Tensor, scale: torch.Tensor, scale_mode: str, divide_allowed: bool) -> torch.Tensor:
    scale = scale.unsqueeze(2)
    if divides(scale_mode) and divide_allowed:
        scaled = groups / scale
    else:
        scaled = groups * (torch.ones_like(scale) / scale)
    m = groups.shape[0]
    return pack_e2m1(e2m1_codes(scaled, groups).reshape(m, -1))


def _fp4_layout(scale_layout, allowed: tuple) -> str:
    layout = name_of(scale_layout)
    if layout not in allowed:
        raise ValueError(f"scale_layout must be one of {allowed}, got {scale_layout!r}")
    return layout


def nvfp4_global_scale(x: torch.Tensor, amax_clamp: float = DEFAULT_FP4_AMAX_CLAMP) -> torch.Tensor:
    """max(amax(|x|), amax_clamp) / (448 * 6) (IEEE division) as float32 [1] on x's device (NaN if x has one)."""
    amax = x.abs().amax().float() if x.numel() else torch.zeros((), dtype=torch.float32, device=x.device)
    amax = amax.clamp(min=amax_clamp).reshape(1)
    return amax / torch.full_like(amax, E4M3_MAX * E2M1_MAX)


def per_token_cast_to_mxfp4(x: torch.Tensor, scale_layout: str = "row_major",
                            amax_clamp: float = DEFAULT_FP4_AMAX_CLAMP, scale_mode: str = "mul"):
    groups = _groups(x, MXFP4_GROUP_SIZE)
    scale, exponents = _mx_scales(groups.abs().amax(dim=2).clamp(min=amax_clamp))
    codes = _cast_codes(groups, scale, scale_mode, divide_allowed=False)
    if _fp4_layout(scale_layout, ("row_major", "packed_ue8m0")) == "packed_ue8m0":
        return codes, pack_scales(scale, "packed_ue8m0")
    return codes, _bytes_as(exponents, torch.float8_e8m0fnu)


def per_token_cast_to_nvfp4(x: torch.Tensor, global_scale: torch.Tensor, scale_layout: str = "row_major",
                            amax_clamp: float = DEFAULT_FP4_AMAX_CLAMP, scale_mode: str = "mul"):
    groups = _groups(x, NVFP4_GROUP_SIZE)
    scale, fp8 = _nv_scales(groups.abs().amax(dim=2).clamp(min=amax_clamp), global_scale)
    codes = _cast_codes(groups, scale, scale_mode, divide_allowed=True)
    scales = fp8.view(torch.float8_e4m3fn)
    if _fp4_layout(scale_layout, ("row_major", "swizzled")) == "swizzled":
        return codes, swizzle_128x4(scales)
    return codes, scales


def mxfp4_cast_back(codes: torch.Tensor, scales: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    values = _groups(e2m1_to_float(unpack_e2m1(codes)), MXFP4_GROUP_SIZE)
    m, num_groups = values.shape[:2]
    if scales.dtype == torch.int32:
        scales = unpack_ue8m0_bytes(scales, m, num_groups)
    scale = e8m0_to_float(scales)
    return (values * scale.unsqueeze(2)).reshape(m, -1).to(out_dtype)


def nvfp4_cast_back(codes: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor,
                    scale_layout: str = "row_major", out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    values = _groups(e2m1_to_float(unpack_e2m1(codes)), NVFP4_GROUP_SIZE)
    m, num_groups = values.shape[:2]
    if _fp4_layout(scale_layout, ("row_major", "swizzled")) == "swizzled":
        scales = unswizzle_128x4(scales, m, num_groups)
    scale = scales.view(torch.float8_e4m3fn).float() * global_scale.float().reshape(())
    return (values * scale.unsqueeze(2)).reshape(m, -1).to(out_dtype)


def mxfp4_requant_to_fp8(codes: torch.Tensor, scales: torch.Tensor, scale_layout: str = "mn_major",
                         amax_clamp: float = DEFAULT_AMAX_CLAMP):
    values = mxfp4_cast_back(codes, scales, torch.float32)
    return per_token_cast_to_fp8(values, 128, ue8m0=True, scale_layout=scale_layout, amax_clamp=amax_clamp)


__all__ = [
    "E2M1_VALUES", "e2m1_codes", "e2m1_to_float", "e8m0_to_float", "mxfp4_cast_back", "mxfp4_requant_to_fp8",
    "nvfp4_cast_back", "nvfp4_global_scale", "pack_e2m1", "per_token_cast_to_mxfp4", "per_token_cast_to_nvfp4",
    "swizzle_128x4", "unpack_e2m1", "unswizzle_128x4",
]
