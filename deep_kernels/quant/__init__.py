"""The quantization family: casts to the low-precision formats the GEMMs read, and back.

One module per format or fused operation; `common` holds the scale layouts and checks they share.
"""

from deep_kernels.quant import e5m6, fp4, fp8, requant, swiglu, transpose
from deep_kernels.quant.common import (
    DEFAULT_AMAX_CLAMP, E4M3_MAX, ScaleLayout, ScaleMode, check_scales, empty_scales, scale_layout_of,
    supported_group_sizes, unpack_ue8m0,
)
from deep_kernels.quant.e5m6 import E5M6_MAX, per_token_cast_back_e5m6, per_token_cast_to_e5m6
from deep_kernels.quant.fp4 import (
    DEFAULT_FP4_AMAX_CLAMP, mxfp4_cast_back, mxfp4_requant_to_fp8, nvfp4_cast_back, nvfp4_global_scale,
    per_token_cast_to_mxfp4, per_token_cast_to_nvfp4,
)
from deep_kernels.quant.fp8 import (
    BLOCK_SIZES, max_row_group_size, per_block_cast_to_fp8, per_token_cast_back, per_token_cast_to_fp8,
)
from deep_kernels.quant.requant import requant_per_block_to_per_token
from deep_kernels.quant.swiglu import swiglu_backward, swiglu_cast_to_fp8, swiglu_cast_to_fp8_masked, swiglu_forward
from deep_kernels.quant.transpose import batched_transpose, per_channel_cast_transpose_to_fp8

__all__ = [
    "BLOCK_SIZES", "DEFAULT_AMAX_CLAMP", "DEFAULT_FP4_AMAX_CLAMP", "E4M3_MAX", "E5M6_MAX", "ScaleLayout", "ScaleMode",
    "batched_transpose", "check_scales", "empty_scales", "max_row_group_size", "mxfp4_cast_back",
    "mxfp4_requant_to_fp8", "nvfp4_cast_back", "nvfp4_global_scale", "per_block_cast_to_fp8",
    "per_channel_cast_transpose_to_fp8", "per_token_cast_back", "per_token_cast_back_e5m6", "per_token_cast_to_e5m6",
    "per_token_cast_to_fp8", "per_token_cast_to_mxfp4", "per_token_cast_to_nvfp4", "requant_per_block_to_per_token",
    "scale_layout_of", "supported_group_sizes", "swiglu_backward", "swiglu_cast_to_fp8", "swiglu_cast_to_fp8_masked",
    "swiglu_forward", "unpack_ue8m0",
]

def precompile_specs() -> list:
    """The specializations `python -m deep_kernels precompile` builds for this family (its modules register
    them: deep_kernels.jit.registry)."""
    from deep_kernels.jit import registry

    return registry.precompile_specs(["quant"])
