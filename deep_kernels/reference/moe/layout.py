"""Plain-torch reference of deep_kernels.moe.layout: the definition the kernels match bit for bit.

The result is the public MoeLayout, the one name a reference takes from a kernel module: a frozen dataclass of
tensors with no computation, which the kernels that read a layout (moe_expand, moe_reduce) require by type.
"""

import torch

from deep_kernels.moe.layout import MoeLayout
from deep_kernels.reference.common import ceil_div

# Each expert's segment starts at a multiple of 128 rows (the grouped GEMM's M alignment).
CONTIGUOUS_ALIGNMENT = 128


def contiguous_max_rows(num_slots: int, num_experts: int) -> int:
    """Rows of the contiguous layout in the worst case: every slot, with each expert that has any slot padded
    to whole segments (at most alignment - 1 rows each), rounded up to a whole segment."""
    padding = (CONTIGUOUS_ALIGNMENT - 1) * min(num_experts, num_slots)
    return ceil_div(num_slots + padding, CONTIGUOUS_ALIGNMENT) * CONTIGUOUS_ALIGNMENT


def moe_layout(topk_idx: torch.Tensor, num_experts: int, max_tokens: int = None) -> MoeLayout:
    num_tokens, k = topk_idx.shape
    device = topk_idx.device
    flat = topk_idx.reshape(-1).long()
    num_slots = flat.numel()
    kept = (flat >= 0) & (flat < num_experts)
    expert = torch.where(kept, flat, torch.full_like(flat, num_experts))  # bucket E: dropped
    counts = torch.bincount(expert, minlength=num_experts + 1)[:num_experts]
    padded = (counts + CONTIGUOUS_ALIGNMENT - 1) // CONTIGUOUS_ALIGNMENT * CONTIGUOUS_ALIGNMENT
    offsets = torch.cumsum(padded, 0) - padded
    first_of_expert = torch.cumsum(counts, 0) - counts

    slots = torch.sort(expert, stable=True).indices[: int(counts.sum())]  # kept slots by (expert, slot)
    slot_expert = expert[slots]
    rank = torch.arange(slots.numel(), device=device) - first_of_expert[slot_expert]
    rows = offsets[slot_expert] + rank

    max_rows = contiguous_max_rows(num_slots, num_experts)
    m_indices = torch.full((max_rows,), -1, dtype=torch.int32, device=device)
    row_to_slot = torch.full((max_rows,), -1, dtype=torch.int32, device=device)
    slot_to_row = torch.full((num_slots,), -1, dtype=torch.int32, device=device)
    m_indices[rows] = slot_expert.int()
    row_to_slot[rows] = slots.int()
    slot_to_row[slots] = rows.int()
    layout = dict(counts=counts.int(), num_rows=padded.sum().reshape(1).int(), m_indices=m_indices,
                  row_to_slot=row_to_slot, slot_to_row=slot_to_row.view(num_tokens, k))
    if max_tokens is not None:
        masked_slots = torch.full((num_experts, max_tokens), -1, dtype=torch.int32, device=device)
        fits = rank < max_tokens
        masked_slots[slot_expert[fits], rank[fits]] = slots[fits].int()
        layout.update(masked_slots=masked_slots, masked_m=counts.clamp(max=max_tokens).int())
    return MoeLayout(**layout)
