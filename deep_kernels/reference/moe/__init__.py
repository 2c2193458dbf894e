"""Plain-torch references of the routing family, one module per module of deep_kernels.moe."""

from deep_kernels.reference.moe.expand import moe_expand, moe_expand_cast_to_fp8, moe_reduce, slot_rows
from deep_kernels.reference.moe.gate import descending_order, gate_scores, rank_keys, topk_gate, warp_lane_sum
from deep_kernels.reference.moe.layout import moe_layout

__all__ = ["descending_order", "gate_scores", "moe_layout", "rank_keys", "topk_gate", "warp_lane_sum"]
__all__ += ["moe_expand", "moe_expand_cast_to_fp8", "moe_reduce", "slot_rows"]
