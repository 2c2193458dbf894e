"""Plain-torch reference of deep_kernels.moe.expand: the definition the kernels match bit for bit.

Runs on any device. The reference writes every row: the contiguous rows from num_rows on (zeros, which the
kernels leave unwritten: compare the first num_rows rows) and, whatever zero_padding says, the rows without a
slot (zeros, which the kernels leave unwritten with zero_padding=False: compare the rows with a slot). The
reduction adds FP32 products w * y in slot order, each a separate tensor operation (never a fused multiply-add).
"""

import torch

from deep_kernels.reference.common import (
    DEFAULT_AMAX_CLAMP, batched_scale_geometry, name_of, pack_scales, unpack_scales,
)
from deep_kernels.reference.quant.fp8 import per_token_cast_to_fp8

# FP8 rows carry one scale per 128 columns.
GROUP_SIZE = 128


def _batches(layout, masked: bool) -> tuple:
    """(number of experts or None, rows per expert or in all) of the expanded rows."""
    if masked:
        return layout.masked_slots.shape
    return None, layout.row_to_slot.shape[0]


def expanded_tokens(layout, masked: bool = False) -> torch.Tensor:
    """int64 [rows]: the token each expanded row copies, -1 for a row without a slot."""
    k = layout.slot_to_row.shape[1]
    slots = (layout.masked_slots if masked else layout.row_to_slot).reshape(-1).long()
    return torch.where(slots >= 0, slots // k, -1)


def slot_rows(layout, masked: bool = False) -> torch.Tensor:
    """int64 [T, k]: each slot's row in the (flattened) layout, -1 for a slot without one. Masked: the
    slot's position in masked_slots (slots beyond max_tokens have none)."""
    if not masked:
        return layout.slot_to_row.long()
    num_tokens, k = layout.slot_to_row.shape
    flat = layout.masked_slots.reshape(-1).long()
    rows = torch.full((num_tokens * k,), -1, dtype=torch.int64, device=flat.device)
    kept = flat >= 0
    rows[flat[kept]] = torch.arange(flat.numel(), device=flat.device)[kept]
    return rows.view(num_tokens, k)


def _gather_rows(values: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """values[tokens] with zero rows where tokens is -1 (on the raw bytes: any dtype, FP8 included)."""
    raw = values.contiguous().view(torch.uint8)
    if raw.shape[0] == 0:
        return raw.new_zeros((tokens.numel(), raw.shape[1])).view(values.dtype)
    gathered = raw[tokens.clamp(min=0)]
    return torch.where((tokens >= 0).unsqueeze(1), gathered, torch.zeros_like(gathered)).view(values.dtype)


def _write_scales(columns: torch.Tensor, layout, masked: bool, num_groups: int, scale_layout: str):
    """Scale columns [rows, C] of expanded rows (FP32 values, or packed words already) in their layout."""
    batches, batch_rows = _batches(layout, masked)
    dtype, shape, strides = batched_scale_geometry(batches, batch_rows, num_groups, scale_layout)
    out = torch.empty_strided(shape, strides, dtype=dtype, device=columns.device)
    out.copy_(columns.reshape(shape))
    return out


def moe_expand(x: torch.Tensor, layout, scales: torch.Tensor = None, masked: bool = False, zero_padding: bool = True):
    tokens = expanded_tokens(layout, masked)
    batches, batch_rows = _batches(layout, masked)
    rows = _gather_rows(x, tokens)
    rows = rows.view(batches, batch_rows, x.shape[1]) if masked else rows
    if scales is None:
        return rows
    num_groups = x.shape[1] // GROUP_SIZE
    dense = scales.new_empty(scales.shape).copy_(scales)  # FP32 values or packed words, row-major
    # FP32 scales (either layout) come out MN-major; packed ones (int32) stay packed.
    out_layout = "packed_ue8m0" if scales.dtype == torch.int32 else "mn_major"
    return rows, _write_scales(_gather_rows(dense, tokens), layout, masked, num_groups, out_layout)


def moe_expand_cast_to_fp8(x: torch.Tensor, layout, masked: bool = False, ue8m0: bool = False,
                           scale_layout: str = "mn_major", amax_clamp: float = DEFAULT_AMAX_CLAMP,
                           scale_mode: str = "mul", zero_padding: bool = True):
    rows = moe_expand(x, layout, masked=masked)
    flat = rows.reshape(-1, x.shape[1])
    q, values = per_token_cast_to_fp8(flat, GROUP_SIZE, ue8m0, "row_major", amax_clamp, scale_mode)
    kind = name_of(scale_layout)
    columns = pack_scales(values, kind) if kind == "packed_ue8m0" else values
    return q.view(rows.shape), _write_scales(columns, layout, masked, x.shape[1] // GROUP_SIZE, kind)


def _row_scales(scales: torch.Tensor, num_rows: int, num_groups: int) -> torch.Tensor:
    """FP32 [rows, G] scale values of expanded rows, from any layout (batched or not)."""
    dense = scales.new_empty(scales.shape).copy_(scales).reshape(num_rows, -1)
    return unpack_scales(dense, num_rows, num_groups)


def moe_reduce(y: torch.Tensor, layout, weights: torch.Tensor, scales: torch.Tensor = None, masked: bool = False,
               out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    hidden = y.shape[-1]
    flat = y.reshape(-1, hidden)
    rows = slot_rows(layout, masked)
    num_tokens, k = rows.shape
    row_scales = None if scales is None else _row_scales(scales, flat.shape[0], hidden // GROUP_SIZE)
    acc = torch.zeros((num_tokens, hidden), dtype=torch.float32, device=y.device)
    for j in range(k):
        kept = rows[:, j] >= 0
        source = rows[:, j].clamp(min=0)
        values = flat.view(torch.uint8)[source].view(flat.dtype).float()
        if row_scales is not None:
            groups = values.view(num_tokens, hidden // GROUP_SIZE, GROUP_SIZE) * row_scales[source].unsqueeze(2)
            values = groups.view(num_tokens, hidden)
        contribution = weights[:, j:j + 1].float() * values
        acc = torch.where(kept.unsqueeze(1), acc + contribution, acc)
    return acc.to(out_dtype)
