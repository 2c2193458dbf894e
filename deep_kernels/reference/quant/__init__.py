"""Plain-torch references of the quantization family, one module per module of deep_kernels.quant."""

from deep_kernels.reference.quant.e5m6 import (
    e5m6_to_float, pack_e5m6, per_token_cast_back_e5m6, per_token_cast_to_e5m6, round_to_e5m6, unpack_e5m6,
)
from deep_kernels.reference.quant.fp4 import (
    mxfp4_cast_back, mxfp4_requant_to_fp8, nvfp4_cast_back, nvfp4_global_scale, per_token_cast_to_mxfp4,
    per_token_cast_to_nvfp4,
)
from deep_kernels.reference.quant.fp8 import (
    ceil_to_power_of_two, pack_scales, per_block_cast_to_fp8, per_token_cast_back, per_token_cast_to_fp8,
    scale_and_multiplier, to_e4m3, unpack_scales,
)
from deep_kernels.reference.quant.requant import dequantize_per_block, requant_per_block_to_per_token
from deep_kernels.reference.quant.swiglu import (
    swiglu_backward, swiglu_cast_to_fp8, swiglu_cast_to_fp8_masked, swiglu_forward,
)
from deep_kernels.reference.quant.transpose import batched_transpose, per_channel_cast_transpose_to_fp8

__all__ = [
    "batched_transpose", "ceil_to_power_of_two", "dequantize_per_block", "e5m6_to_float", "mxfp4_cast_back",
    "mxfp4_requant_to_fp8", "nvfp4_cast_back", "nvfp4_global_scale", "pack_e5m6", "pack_scales",
    "per_block_cast_to_fp8", "per_channel_cast_transpose_to_fp8", "per_token_cast_back", "per_token_cast_back_e5m6",
    "per_token_cast_to_e5m6", "per_token_cast_to_fp8", "per_token_cast_to_mxfp4", "per_token_cast_to_nvfp4",
    "requant_per_block_to_per_token", "round_to_e5m6", "scale_and_multiplier", "swiglu_backward",
    "swiglu_cast_to_fp8", "swiglu_cast_to_fp8_masked", "swiglu_forward", "to_e4m3", "unpack_e5m6", "unpack_scales",
]
