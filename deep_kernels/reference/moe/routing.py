"""Plain-torch reference of deep_kernels.moe.routing: topk_gate, then moe_layout of its indices."""

from deep_kernels.reference.moe.gate import topk_gate
from deep_kernels.reference.moe.layout import moe_layout


def topk_gate_with_layout(logits, k, scoring="softmax", bias=None, num_groups=0, topk_groups=0, renormalize=True,
                          routed_scaling_factor=1.0, max_tokens=None):
    weights, indices = topk_gate(logits, k, scoring, bias, num_groups, topk_groups, renormalize, routed_scaling_factor)
    return weights, indices, moe_layout(indices, logits.shape[1], max_tokens)
