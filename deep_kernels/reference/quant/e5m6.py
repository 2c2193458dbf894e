"""Plain-torch reference of deep_kernels.quant.e5m6: the definition the kernels match bit for bit.

Runs on any device. Rounding to e5m6 is written on the FP32 bit pattern (integer arithmetic), not the
way the kernel computes it (an FP32 add-and-subtract), so the two check each other.
"""

import torch

from deep_kernels.reference.common import DEFAULT_AMAX_CLAMP, divides
from deep_kernels.reference.quant.fp8 import scale_and_multiplier

# The largest finite e5m6 value: the top 12 bits of IEEE half 65024 (0x7BF0) are e5m6's 0x7BF.
E5M6_MAX = 65024.0
E5M6_NAN = 0x7FF
E5M6_SIGN = 0x800
_FP32_TWO_POW_16 = 0x47800000   # FP32 bits of 2^16, what every magnitude >= 65280 rounds to (e5m6's inf)
_FP32_TWO_POW_MINUS_14 = 0x38800000  # FP32 bits of 2^-14, e5m6's smallest normal


def round_to_e5m6(values: torch.Tensor) -> torch.Tensor:
    """FP32 values to e5m6 codes (int32 in [0, 4096)): round to nearest even on the grid of the top 12
    bits of an IEEE half; magnitudes >= 65280 (inf included) give inf (0x7C0 | sign), every NaN 0x7FF,
    -0 and negative values that round to zero keep their sign (0x800)."""
    bits = values.float().view(torch.int32)
    magnitude = (bits & 0x7FFFFFFF).clamp(max=_FP32_TWO_POW_16)
    # Normal: drop 17 of FP32's 23 mantissa bits (+0xFFFF and the kept LSB: ties to even), rebias 127 -> 15.
    normal = ((magnitude + 0xFFFF + ((magnitude >> 17) & 1)) >> 17) - ((127 - 15) << 6)
    # Subnormal (below 2^-14): a multiple of 2^-20; the scaling by 2^20 is exact, torch.round is RNE.
    subnormal = torch.round(magnitude.view(torch.float32) * 2.0 ** 20).int()
    codes = torch.where(magnitude >= _FP32_TWO_POW_MINUS_14, normal, subnormal) | ((bits >> 20) & E5M6_SIGN)
    return torch.where(torch.isnan(values), E5M6_NAN, codes)


def e5m6_to_float(codes: torch.Tensor) -> torch.Tensor:
    """e5m6 codes (any integer dtype, values in [0, 4096)) to the FP32 values they encode (exactly: each is
    the IEEE half with bits code << 4)."""
    half_bits = codes.int() << 4
    return (((half_bits ^ 0x8000) - 0x8000).to(torch.int16)).view(torch.float16).float()


def pack_e5m6(codes: torch.Tensor) -> torch.Tensor:
    """Codes [M, K] (K a multiple of 8) to int32 [M, 3K/8]: code i of each 8 occupies bits [12i, 12i + 12)
    of a little-endian 96-bit group, word w of the group its bits [32w, 32w + 32)."""
    m, k = codes.shape
    c = codes.long().view(m, k // 8, 8).unbind(dim=2)
    words = torch.stack([
        c[0] | (c[1] << 12) | (c[2] << 24),
        (c[2] >> 8) | (c[3] << 4) | (c[4] << 16) | (c[5] << 28),
        (c[5] >> 4) | (c[6] << 8) | (c[7] << 20),
    ], dim=2) & 0xFFFFFFFF
    return ((words ^ 0x80000000) - 0x80000000).int().view(m, k // 8 * 3)


def unpack_e5m6(packed: torch.Tensor) -> torch.Tensor:
    """pack_e5m6's inverse: int32 [M, 3K/8] to codes int32 [M, K]."""
    m, num_words = packed.shape
    w = packed.int().reshape(m, num_words // 3, 3).unbind(dim=2)
    codes = torch.stack([
        w[0] & 0xFFF, (w[0] >> 12) & 0xFFF, ((w[0] >> 24) & 0xFF) | ((w[1] & 0xF) << 8),
        (w[1] >> 4) & 0xFFF, (w[1] >> 16) & 0xFFF, ((w[1] >> 28) & 0xF) | ((w[2] & 0xFF) << 4),
        (w[2] >> 8) & 0xFFF, (w[2] >> 20) & 0xFFF,
    ], dim=2)
    return codes.view(m, num_words // 3 * 8)


def per_token_cast_to_e5m6(x: torch.Tensor, ue8m0: bool = False, amax_clamp: float = DEFAULT_AMAX_CLAMP,
                           scale_mode: str = "mul"):
    xf = x.float()
    scale, multiplier = scale_and_multiplier(xf.abs().amax(dim=1).clamp(min=amax_clamp), ue8m0, E5M6_MAX)
    if divides(scale_mode):
        scaled = xf / scale.unsqueeze(1)
    else:
        scaled = xf * multiplier.unsqueeze(1)
    return pack_e5m6(round_to_e5m6(scaled)), scale


def per_token_cast_back_e5m6(packed: torch.Tensor, scales: torch.Tensor,
                             out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    y = e5m6_to_float(unpack_e5m6(packed)) * scales.unsqueeze(1)
    return y.to(out_dtype)
