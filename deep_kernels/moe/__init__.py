"""The mixture-of-experts routing family: top-k gating, then the layouts the grouped GEMMs read.

One module per stage of the pipeline between the router logits and the grouped GEMMs.
"""

from deep_kernels.moe import expand, gate, layout
from deep_kernels.moe.expand import moe_expand, moe_expand_cast_to_fp8, moe_reduce
from deep_kernels.moe.gate import MAX_EXPERTS, MAX_GROUPS, MAX_TOP_K, SCORINGS, topk_gate
from deep_kernels.moe.layout import CONTIGUOUS_ALIGNMENT, MoeLayout, contiguous_max_rows, moe_layout

__all__ = [
    "CONTIGUOUS_ALIGNMENT", "MAX_EXPERTS", "MAX_GROUPS", "MAX_TOP_K", "SCORINGS", "MoeLayout", "contiguous_max_rows",
    "moe_layout", "topk_gate",
    "moe_expand", "moe_expand_cast_to_fp8", "moe_reduce",
]

_MODULES = (gate, layout, expand)


def precompile_specs() -> list:
    """The specializations `python -m deep_kernels precompile` builds for this family."""
    return [spec for module in _MODULES for spec in module.precompile_specs()]
