"""The quantization family: casts to the low-precision formats the GEMMs read, and back.

One module per format or fused operation; `common` holds the scale layouts and checks they share.
"""

from deep_kernels.quant import e5m6, fp8, requant
from deep_kernels.quant.common import (
    DEFAULT_AMAX_CLAMP, E4M3_MAX, ScaleLayout, ScaleMode, check_scales, empty_scales, scale_layout_of,
    supported_group_sizes, unpack_ue8m0,
)
from deep_kernels.quant.e5m6 import E5M6_MAX, per_token_cast_back_e5m6, per_token_cast_to_e5m6
from deep_kernels.quant.fp8 import BLOCK_SIZES, per_block_cast_to_fp8, per_token_cast_back, per_token_cast_to_fp8
from deep_kernels.quant.requant import requant_per_block_to_per_token

__all__ = [
    "BLOCK_SIZES", "DEFAULT_AMAX_CLAMP", "E4M3_MAX", "ScaleLayout", "ScaleMode", "check_scales", "empty_scales",
    "per_block_cast_to_fp8", "per_token_cast_back", "per_token_cast_to_fp8", "scale_layout_of",
    "supported_group_sizes", "unpack_ue8m0",
    "E5M6_MAX", "per_token_cast_back_e5m6", "per_token_cast_to_e5m6", "requant_per_block_to_per_token",
]

_MODULES = (fp8, e5m6, requant)


def precompile_specs() -> list:
    """The specializations `python -m deep_kernels precompile` builds for this family."""
    return [spec for module in _MODULES for spec in module.precompile_specs()]
