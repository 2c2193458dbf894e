"""Plain-torch references of the quantization family, one module per module of deep_kernels.quant."""

from deep_kernels.reference.quant.fp8 import (
    ceil_to_power_of_two, pack_scales, per_block_cast_to_fp8, per_token_cast_back, per_token_cast_to_fp8,
    scale_and_multiplier, to_e4m3, unpack_scales,
)
from deep_kernels.reference.quant.fp4 import (
    mxfp4_cast_back, mxfp4_requant_to_fp8, nvfp4_cast_back, nvfp4_global_scale, per_token_cast_to_mxfp4,
    per_token_cast_to_nvfp4,
)
from deep_kernels.reference.quant.transpose import batched_transpose, per_channel_cast_transpose_to_fp8
from deep_kernels.reference.quant.swiglu import (
    swiglu_backward, swiglu_cast_to_fp8, swiglu_cast_to_fp8_masked, swiglu_forward,
)

__all__ = [
    "batched_transpose", "per_channel_cast_transpose_to_fp8",
    "ceil_to_power_of_two", "pack_scales", "per_block_cast_to_fp8", "per_token_cast_back", "per_token_cast_to_fp8",
    "scale_and_multiplier", "to_e4m3", "unpack_scales",
    "mxfp4_cast_back", "mxfp4_requant_to_fp8", "nvfp4_cast_back", "nvfp4_global_scale", "per_token_cast_to_mxfp4",
    "per_token_cast_to_nvfp4",
    "swiglu_backward", "swiglu_cast_to_fp8", "swiglu_cast_to_fp8_masked", "swiglu_forward",
]
