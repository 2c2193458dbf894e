"""deep_kernels: JIT-compiled CUDA kernels for LLM training and inference on NVIDIA Hopper."""

from deep_kernels.device import get_num_sms, set_num_sms
from deep_kernels.gemm import fp8_gemm_nt, get_mn_major_tma_aligned_tensor
from deep_kernels.moe import MoeLayout, moe_layout, topk_gate
from deep_kernels.quant import per_block_cast_to_fp8, per_token_cast_back, per_token_cast_to_fp8
from deep_kernels.quant import per_token_cast_back_e5m6, per_token_cast_to_e5m6, requant_per_block_to_per_token
from deep_kernels.validation import tma_aligned_size

__version__ = "0.1.0"

__all__ = [
    "fp8_gemm_nt",
    "get_mn_major_tma_aligned_tensor",
    "get_num_sms",
    "per_block_cast_to_fp8",
    "moe_layout",
    "MoeLayout",
    "per_token_cast_back",
    "per_token_cast_to_fp8",
    "per_token_cast_back_e5m6", "per_token_cast_to_e5m6", "requant_per_block_to_per_token",
    "set_num_sms",
    "tma_aligned_size",
    "topk_gate",
]
