"""Plain-torch references of the quantization family, one module per module of deep_kernels.quant."""

from deep_kernels.reference.quant.e5m6 import (
    e5m6_to_float, pack_e5m6, per_token_cast_back_e5m6, per_token_cast_to_e5m6, round_to_e5m6, unpack_e5m6,
)
from deep_kernels.reference.quant.fp8 import (
    ceil_to_power_of_two, pack_scales, per_block_cast_to_fp8, per_token_cast_back, per_token_cast_to_fp8,
    scale_and_multiplier, to_e4m3, unpack_scales,
)
from deep_kernels.reference.quant.requant import dequantize_per_block, requant_per_block_to_per_token

__all__ = [
    "ceil_to_power_of_two", "pack_scales", "per_block_cast_to_fp8", "per_token_cast_back", "per_token_cast_to_fp8",
    "scale_and_multiplier", "to_e4m3", "unpack_scales",
    "e5m6_to_float", "pack_e5m6", "per_token_cast_back_e5m6", "per_token_cast_to_e5m6", "round_to_e5m6", "unpack_e5m6",
    "dequantize_per_block", "requant_per_block_to_per_token",
]
