"""The quantization family: casts to the low-precision formats the GEMMs read, and back.

One module per format or fused operation; `common` holds the scale layouts and checks they share.
"""

from deep_kernels.quant import fp4, fp8, swiglu, transpose
from deep_kernels.quant.common import (
    DEFAULT_AMAX_CLAMP, E4M3_MAX, ScaleLayout, ScaleMode, check_scales, empty_scales, scale_layout_of,
    supported_group_sizes, unpack_ue8m0,
)
from deep_kernels.quant.fp4 import (
    DEFAULT_FP4_AMAX_CLAMP, mxfp4_cast_back, mxfp4_requant_to_fp8, nvfp4_cast_back, nvfp4_global_scale,
    per_token_cast_to_mxfp4, per_token_cast_to_nvfp4,
)
from deep_kernels.quant.fp8 import (
    BLOCK_SIZES, max_row_group_size, per_block_cast_to_fp8, per_token_cast_back, per_token_cast_to_fp8,
)
from deep_kernels.quant.swiglu import swiglu_backward, swiglu_cast_to_fp8, swiglu_cast_to_fp8_masked, swiglu_forward
from deep_kernels.quant.transpose import batched_transpose, per_channel_cast_transpose_to_fp8

__all__ = [
    "batched_transpose", "max_row_group_size", "per_channel_cast_transpose_to_fp8",
    "BLOCK_SIZES", "DEFAULT_AMAX_CLAMP", "E4M3_MAX", "ScaleLayout", "ScaleMode", "check_scales", "empty_scales",
    "per_block_cast_to_fp8", "per_token_cast_back", "per_token_cast_to_fp8", "scale_layout_of",
    "supported_group_sizes", "unpack_ue8m0",
    "DEFAULT_FP4_AMAX_CLAMP", "mxfp4_cast_back", "mxfp4_requant_to_fp8", "nvfp4_cast_back", "nvfp4_global_scale",
    "per_token_cast_to_mxfp4", "per_token_cast_to_nvfp4",
    "swiglu_backward", "swiglu_cast_to_fp8", "swiglu_cast_to_fp8_masked", "swiglu_forward",
]

_MODULES = (fp8, fp4, swiglu, transpose)


def precompile_specs() -> list:
    """The specializations `python -m deep_kernels precompile` builds for this family."""
    return [spec for module in _MODULES for spec in module.precompile_specs()]
