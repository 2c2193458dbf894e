"""The routed experts' steps of the MoE layer between the layout and the reduce (deep_kernels/nn/moe.py's
docstring), shared by the single-GPU layer and the expert-parallel one, over a table of the kernel functions they
call (the package's; a test passes their plain-torch references, which take the same arguments)."""

from typing import NamedTuple

import torch

from deep_kernels.grouped_gemm import m_grouped_fp8_gemm_nt_contiguous, m_grouped_fp8_gemm_nt_masked
from deep_kernels.moe.expand import moe_expand_cast_to_fp8, moe_reduce
from deep_kernels.moe.expert_parallel import map_global_to_local_experts
from deep_kernels.moe.gate import topk_gate
from deep_kernels.moe.layout import moe_layout
from deep_kernels.moe.routing import topk_gate_with_layout
from deep_kernels.quant.swiglu import swiglu_cast_to_fp8, swiglu_cast_to_fp8_masked
from deep_kernels.validation import ceil_div


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


KERNELS = ExpertKernels(topk_gate, topk_gate_with_layout, moe_layout, map_global_to_local_experts,
                        moe_expand_cast_to_fp8, m_grouped_fp8_gemm_nt_contiguous, m_grouped_fp8_gemm_nt_masked,
                        swiglu_cast_to_fp8, swiglu_cast_to_fp8_masked, moe_reduce)


def routed_experts(kernels: ExpertKernels, x: torch.Tensor, weights: torch.Tensor, layout, experts: tuple,
                   expected_m: int = None) -> torch.Tensor:
    """The experts' down-projected rows of every slot the layout places (the module docstring's steps from the
    expand to the down-projection): bf16 [max_rows, H] (contiguous, expected_m None) or [E, max_tokens, H]
    (masked); the routing weights [T, k] applied in the SwiGLU cast. Rows no slot takes are not written."""
    gate_up, down = experts
    masked = expected_m is not None
    tokens = kernels.moe_expand_cast_to_fp8(x, layout, masked=masked, zero_padding=False)
    num_experts, two_intermediate, hidden = gate_up[0].shape
    if masked:
        rows = tuple(layout.masked_slots.shape)
        projected = kernels.m_grouped_fp8_gemm_nt_masked(tokens, gate_up, x.new_empty((*rows, two_intermediate)),
                                                         layout.masked_m, expected_m)
        activated = kernels.swiglu_cast_to_fp8_masked(projected, layout.masked_m, weights=weights,
                                                      pos=layout.masked_slots, check_pos=False)
        return kernels.m_grouped_fp8_gemm_nt_masked(activated, down, x.new_empty((*rows, hidden)), layout.masked_m,
                                                    expected_m)
    rows = (layout.m_indices.shape[0],)
    projected = kernels.m_grouped_fp8_gemm_nt_contiguous(tokens, gate_up, x.new_empty((*rows, two_intermediate)),
                                                         layout.m_indices)
    activated = kernels.swiglu_cast_to_fp8(projected, weights=weights, pos=layout.row_to_slot, check_pos=False)
    return kernels.m_grouped_fp8_gemm_nt_contiguous(activated, down, x.new_empty((*rows, hidden)), layout.m_indices)


def moe_forward(kernels: ExpertKernels, x: torch.Tensor, logits: torch.Tensor, gate_config: tuple, experts: tuple,
                mode: str, max_tokens) -> torch.Tensor:
    """The single-GPU layer's output [T, H] bf16 from its router logits (nn.MoE.forward without a process group):
    the gate and layout in one call, the experts' steps, the reduce. The masked capacity is max_tokens, or T."""
    num_tokens = x.shape[0]
    masked = mode == "masked"
    capacity = (max_tokens or num_tokens) if masked else None
    weights, _, layout = kernels.topk_gate_with_layout(logits, *gate_config, max_tokens=capacity)
    num_experts = logits.shape[1]
    # The tile hint: the average slots per expert (a wrong guess costs time only).
    expected_m = min(capacity, ceil_div(num_tokens * weights.shape[1], num_experts)) if masked else None
    expert_out = routed_experts(kernels, x, weights, layout, experts, expected_m)
    # The routing weights are in the experts' rows already: each slot's row counts once.
    return kernels.moe_reduce(expert_out, layout, torch.ones_like(weights), masked=masked)
