"""Plain-torch references of the routing family, one module per module of deep_kernels.moe."""

from deep_kernels.reference.moe.expand import moe_expand, moe_expand_cast_to_fp8, moe_reduce, slot_rows
from deep_kernels.reference.moe.expert_parallel import map_global_to_local_experts
from deep_kernels.reference.moe.gate import (
    descending_order, gate_scores, rank_keys, topk_gate, topk_gate_backward, warp_lane_sum,
)
from deep_kernels.reference.moe.layout import moe_layout
from deep_kernels.reference.moe.routing import topk_gate_with_layout

__all__ = [
    "descending_order", "gate_scores", "map_global_to_local_experts", "moe_expand", "moe_expand_cast_to_fp8",
    "moe_layout", "moe_reduce", "rank_keys", "slot_rows", "topk_gate", "topk_gate_backward", "topk_gate_with_layout",
    "warp_lane_sum",
]
