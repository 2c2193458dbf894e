"""The mixture-of-experts routing family: top-k gating, the layouts the grouped GEMMs read, and the moves
of token rows into those layouts and back.

One module per stage of the pipeline between the router logits and the grouped GEMMs.
"""

from deep_kernels.moe import expand, expert_parallel, gate, layout, routing
from deep_kernels.moe.expand import moe_expand, moe_expand_cast_to_fp8, moe_reduce
from deep_kernels.moe.expert_parallel import map_global_to_local_experts
from deep_kernels.moe.gate import MAX_EXPERTS, MAX_GROUPS, MAX_TOP_K, SCORINGS, topk_gate, topk_gate_backward
from deep_kernels.moe.layout import CONTIGUOUS_ALIGNMENT, MoeLayout, contiguous_max_rows, moe_layout
from deep_kernels.moe.routing import fused_max_tokens, topk_gate_with_layout

__all__ = [
    "CONTIGUOUS_ALIGNMENT", "MAX_EXPERTS", "MAX_GROUPS", "MAX_TOP_K", "SCORINGS", "MoeLayout", "contiguous_max_rows",
    "fused_max_tokens", "map_global_to_local_experts", "moe_expand", "moe_expand_cast_to_fp8", "moe_layout",
    "moe_reduce", "topk_gate", "topk_gate_backward", "topk_gate_with_layout",
]

def precompile_specs() -> list:
    """The specializations `python -m deep_kernels precompile` builds for this family (its modules register
    them: deep_kernels.jit.registry)."""
    from deep_kernels.jit import registry

    return registry.precompile_specs(["moe"])
