"""The routed experts' steps of the MoE layer between the layout and the reduce (deep_kernels/nn/moe.py's
docstring), shared by the single-GPU layer and the expert-parallel one, over a table of the kernel functions they
call (the package's; a test passes their plain-torch references, which take the same arguments)."""

from typing import NamedTuple

import torch

from deep_kernels.grouped_gemm import m_grouped_fp8_gemm_nt_contiguous, m_grouped_fp8_gemm_nt_masked
from deep_kernels.moe.expand import moe_expand, moe_expand_cast_to_fp8, moe_reduce
from deep_kernels.moe.expert_parallel import map_global_to_local_experts
from deep_kernels.moe.gate import topk_gate
from deep_kernels.moe.layout import moe_layout
from deep_kernels.moe.routing import topk_gate_with_layout
from deep_kernels.quant.fp8 import per_token_cast_to_fp8
from deep_kernels.quant.swiglu import swiglu_cast_to_fp8, swiglu_cast_to_fp8_masked
from deep_kernels.validation import ceil_div, tma_aligned_size


class ExpertKernels(NamedTuple):
    """The functions the layer's steps call (the package's kernels; a test passes their references)."""

    topk_gate: object
    topk_gate_with_layout: object
    moe_layout: object
    map_global_to_local_experts: object
    moe_expand_cast_to_fp8: object
    m_grouped_fp8_gemm_nt_contiguous: object
    m_grouped_fp8_gemm_nt_masked: object
    swiglu_cast_to_fp8: object
    swiglu_cast_to_fp8_masked: object
    moe_reduce: object
    per_token_cast_to_fp8: object
    moe_expand: object


KERNELS = ExpertKernels(topk_gate, topk_gate_with_layout, moe_layout, map_global_to_local_experts,
                        moe_expand_cast_to_fp8, m_grouped_fp8_gemm_nt_contiguous, m_grouped_fp8_gemm_nt_masked,
                        swiglu_cast_to_fp8, swiglu_cast_to_fp8_masked, moe_reduce, per_token_cast_to_fp8, moe_expand)


def routed_experts(kernels: ExpertKernels, x, weights: torch.Tensor, layout, experts: tuple,
                   expected_m: int = None) -> torch.Tensor:
    """The experts' down-projected rows of every slot the layout places (the module docstring's steps from the
    expand to the down-projection): bf16 [max_rows, H] (contiguous, expected_m None) or [E, max_tokens, H]
    (masked); the routing weights [T, k] applied in the SwiGLU cast. Rows no slot takes are not written.
    x: bf16 [T, H] tokens, or their per_token_cast_to_fp8 (e4m3, FP32 row-major scales), which expands to the
    same FP8 rows as the bf16 tokens' expand and cast."""
    gate_up, down = experts
    masked = expected_m is not None
    if isinstance(x, tuple):
        tokens = kernels.moe_expand(x[0], layout, scales=x[1], masked=masked, zero_padding=False)
    else:
        tokens = kernels.moe_expand_cast_to_fp8(x, layout, masked=masked, zero_padding=False)
    two_intermediate, hidden = gate_up[0].shape[1:]
    rows = tuple(layout.masked_slots.shape) if masked else (layout.m_indices.shape[0],)
    projected = torch.empty((*rows, two_intermediate), dtype=torch.bfloat16, device=weights.device)
    expert_out = torch.empty((*rows, hidden), dtype=torch.bfloat16, device=weights.device)
    if masked:
        kernels.m_grouped_fp8_gemm_nt_masked(tokens, gate_up, projected, layout.masked_m, expected_m)
        activated = kernels.swiglu_cast_to_fp8_masked(projected, layout.masked_m, weights=weights,
                                                      pos=layout.masked_slots, check_pos=False)
        kernels.m_grouped_fp8_gemm_nt_masked(activated, down, expert_out, layout.masked_m, expected_m)
        return expert_out
    kernels.m_grouped_fp8_gemm_nt_contiguous(tokens, gate_up, projected, layout.m_indices)
    activated = kernels.swiglu_cast_to_fp8(projected, weights=weights, pos=layout.row_to_slot, check_pos=False)
    kernels.m_grouped_fp8_gemm_nt_contiguous(activated, down, expert_out, layout.m_indices)
    return expert_out


def masked_capacity(num_tokens: int, max_tokens) -> int:
    """The masked layout's rows per expert: max_tokens, or T rounded up to a multiple of 4."""
    # NOTE: a default of whole 16-byte units of FP32 scales leaves the masked activations' MN-major scales unpadded,
    # so that torch.export and dynamo add no guard on T % 4 through their strides.
    return max_tokens or tma_aligned_size(num_tokens, 4)


def moe_forward(kernels: ExpertKernels, x: torch.Tensor, logits: torch.Tensor, gate_config: tuple, experts: tuple,
                mode: str, max_tokens) -> torch.Tensor:
    """The single-GPU layer's output [T, H] bf16 from its router logits (nn.MoE.forward without a process group):
    the gate and layout in one call, the experts' steps, the reduce. The masked capacity is masked_capacity's."""
    num_tokens = x.shape[0]
    masked = mode == "masked"
    capacity = masked_capacity(num_tokens, max_tokens) if masked else None
    weights, _, layout = kernels.topk_gate_with_layout(logits, *gate_config, max_tokens=capacity)
    num_experts = logits.shape[1]
    # The tile hint: the average slots per expert (a wrong guess costs time only).
    expected_m = min(capacity, ceil_div(num_tokens * weights.shape[1], num_experts)) if masked else None
    expert_out = routed_experts(kernels, x, weights, layout, experts, expected_m)
    # The routing weights are in the experts' rows already: each slot's row counts once.
    return kernels.moe_reduce(expert_out, layout, torch.ones_like(weights), masked=masked)
