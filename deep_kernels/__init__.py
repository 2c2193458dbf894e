"""deep_kernels: JIT-compiled CUDA kernels for LLM training and inference on NVIDIA Hopper.

The public API, re-exported by name from the module that defines each function (importing them also
registers every kernel family: deep_kernels.jit.registry), and the torch custom ops that torch.compile traces in
their place (deep_kernels.ops: torch.ops.deep_kernels.*).
"""

from deep_kernels.bf16_gemm import (
    bf16_gemm_nn, bf16_gemm_nt, bf16_gemm_tn, bf16_gemm_tt, m_grouped_bf16_gemm_nn_contiguous,
    m_grouped_bf16_gemm_nt_contiguous, m_grouped_bf16_gemm_nt_masked,
)
from deep_kernels.device import get_num_sms, set_num_sms
from deep_kernels.fp4_gemm import (
    fp8_fp4_gemm_nt, m_grouped_fp8_fp4_gemm_nt_contiguous, m_grouped_fp8_fp4_gemm_nt_masked,
)
from deep_kernels.fp4_weights import prepare_fp4_weights
from deep_kernels.gemm import (fp8_gemm_nn, fp8_gemm_nt, fp8_gemm_tn, fp8_gemm_tt, get_col_major_tma_aligned_tensor,
                               get_mn_major_tma_aligned_tensor)
from deep_kernels.grouped_gemm import (
    fp8_m_grouped_gemm_nt_masked, get_k_alignment_for_contiguous_layout, get_m_alignment_for_contiguous_layout,
    get_mk_alignment_for_contiguous_layout,
    get_theoretical_mk_alignment_for_contiguous_layout, m_grouped_fp8_gemm_nn_contiguous, m_grouped_fp8_gemm_nt_contiguous,
    m_grouped_fp8_gemm_nt_masked, set_mk_alignment_for_contiguous_layout,
)
from deep_kernels.k_grouped_bf16_gemm import k_grouped_bf16_gemm_nt_contiguous, k_grouped_bf16_gemm_tn_contiguous
from deep_kernels.k_grouped_gemm import k_grouped_fp8_gemm_nt_contiguous, k_grouped_fp8_gemm_tn_contiguous
from deep_kernels.moe.expand import moe_expand, moe_expand_cast_to_fp8, moe_reduce
from deep_kernels.moe.expert_parallel import map_global_to_local_experts
from deep_kernels.moe.gate import topk_gate, topk_gate_backward
from deep_kernels.moe.layout import MoeLayout, moe_layout
from deep_kernels.moe.routing import topk_gate_with_layout
from deep_kernels.quant.e5m6 import per_token_cast_back_e5m6, per_token_cast_to_e5m6
from deep_kernels.quant.fp4 import (
    mxfp4_cast_back, mxfp4_requant_to_fp8, nvfp4_cast_back, nvfp4_global_scale, per_token_cast_to_mxfp4,
    per_token_cast_to_nvfp4,
)
from deep_kernels.quant.fp8 import per_block_cast_to_fp8, per_token_cast_back, per_token_cast_to_fp8
from deep_kernels.quant.requant import requant_per_block_to_per_token
from deep_kernels.quant.swiglu import swiglu_backward, swiglu_cast_to_fp8, swiglu_cast_to_fp8_masked, swiglu_forward
from deep_kernels.quant.transpose import batched_transpose, per_channel_cast_transpose_to_fp8
from deep_kernels.scale_layout import get_tma_aligned_size, transform_sf_into_required_layout
from deep_kernels import ops  # noqa: F401  (registers torch.ops.deep_kernels)
from deep_kernels import nn  # noqa: F401  (layers built from the kernels: deep_kernels.nn.MoE)

tma_aligned_size = get_tma_aligned_size  # the older public name; the kernels call validation.tma_aligned_size

__version__ = "0.1.0"

__all__ = [
    # GEMMs
    "bf16_gemm_nn", "bf16_gemm_nt", "bf16_gemm_tn", "bf16_gemm_tt", "m_grouped_bf16_gemm_nn_contiguous",
    "m_grouped_bf16_gemm_nt_contiguous", "m_grouped_bf16_gemm_nt_masked", "fp8_fp4_gemm_nt", "m_grouped_fp8_fp4_gemm_nt_contiguous",
    "m_grouped_fp8_fp4_gemm_nt_masked", "prepare_fp4_weights", "fp8_gemm_nn", "fp8_gemm_nt", "fp8_gemm_tn", "fp8_gemm_tt",
    "get_k_alignment_for_contiguous_layout", "get_m_alignment_for_contiguous_layout",
    "get_mk_alignment_for_contiguous_layout", "get_tma_aligned_size",
    "get_theoretical_mk_alignment_for_contiguous_layout", "set_mk_alignment_for_contiguous_layout",
    "transform_sf_into_required_layout", "fp8_m_grouped_gemm_nt_masked",
    "get_col_major_tma_aligned_tensor", "get_mn_major_tma_aligned_tensor", "k_grouped_bf16_gemm_nt_contiguous",
    "k_grouped_bf16_gemm_tn_contiguous",
    "k_grouped_fp8_gemm_nt_contiguous", "k_grouped_fp8_gemm_tn_contiguous",
    "m_grouped_fp8_gemm_nn_contiguous", "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked",
    "tma_aligned_size",
    # MoE routing
    "MoeLayout", "map_global_to_local_experts", "moe_expand", "moe_expand_cast_to_fp8", "moe_layout", "moe_reduce",
    "topk_gate", "topk_gate_backward", "topk_gate_with_layout",
    # Quantization
    "batched_transpose", "mxfp4_cast_back", "mxfp4_requant_to_fp8", "nvfp4_cast_back", "nvfp4_global_scale",
    "per_block_cast_to_fp8", "per_channel_cast_transpose_to_fp8", "per_token_cast_back", "per_token_cast_to_fp8",
    "per_token_cast_back_e5m6", "per_token_cast_to_e5m6", "per_token_cast_to_mxfp4", "per_token_cast_to_nvfp4",
    "requant_per_block_to_per_token", "swiglu_backward", "swiglu_cast_to_fp8", "swiglu_cast_to_fp8_masked",
    "swiglu_forward",
    # Device
    "get_num_sms", "set_num_sms",
]
