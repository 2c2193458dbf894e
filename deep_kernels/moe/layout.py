"""Token-to-expert layouts of the routed slots, as the grouped GEMMs read them.

moe_layout: slot s = t * k + j of topk_idx [T, k]; -1 (or any index outside [0, E)) drops a slot.
    contiguous layout: expert segments in expert order, each padded to CONTIGUOUS_ALIGNMENT rows,
    slots in ascending order within a segment; sized for the worst case so that no host sync is needed
    masked layout: [E, max_tokens] slots per expert and the per-expert valid count
    One cooperative launch: every block fills its share of the rows and masked positions no slot takes
    with -1 and counts its slots per expert; after a grid barrier each block reads every block's counts and
    writes its slots' rows. Positions never depend on atomics: counts, exclusive scans, then ranks by
    counting earlier slots.
"""

import functools
from dataclasses import dataclass
from typing import NamedTuple

import torch

from deep_kernels.device import get_num_sms
from deep_kernels.jit.definition import PTR, U32, KernelDef, Param
from deep_kernels.jit.registry import precompiled
from deep_kernels.jit.runtime import current_raw_stream, get_kernel, remember_launch
from deep_kernels.jit.source import KernelSpec
from deep_kernels.moe.gate import MAX_EXPERTS
from deep_kernels.validation import (
    INT32_LIMIT, ceil_div, check_cuda_device, check_dtype, check_int_range, check_rank, is_traced,
)
from deep_kernels.workspace import persistent_empty

CONTIGUOUS_ALIGNMENT = 128

_LAYOUT_WARPS = 16
_LAYOUT_SLOTS_PER_THREAD = 2
# A block ranks its slots in chunks of this many (csrc/kernels/smxx_moe_layout.cuh).
LAYOUT_CHUNK_SLOTS = _LAYOUT_WARPS * 32 * _LAYOUT_SLOTS_PER_THREAD
_FILL_INTS_PER_BLOCK = 8192
# The workspace's grid-barrier counter has a 128-byte line to itself; the block counts follow.
_COUNTER_INTS = 32


@dataclass(frozen=True)
class MoeLayout:
    """Where each routed slot (s = t * k + j of topk_idx [T, k]) goes; every tensor int32 on the device.

    counts [E]: slots routed to each expert.
    num_rows [1]: rows the contiguous layout uses (each expert's count rounded up to CONTIGUOUS_ALIGNMENT).
    m_indices [max_rows]: each row's expert, -1 for padding rows and rows from num_rows on.
    row_to_slot [max_rows]: each row's slot, -1 where m_indices is -1.
    slot_to_row [T, k]: each slot's row, -1 for dropped slots.
    masked_slots [E, max_tokens] or None: expert e's first max_tokens slots in ascending order, then -1.
    masked_m [E] or None: min(counts, max_tokens), the valid length of each row of masked_slots.
    """

    counts: torch.Tensor
    num_rows: torch.Tensor
    m_indices: torch.Tensor
    row_to_slot: torch.Tensor
    slot_to_row: torch.Tensor
    masked_slots: torch.Tensor = None
    masked_m: torch.Tensor = None


def contiguous_max_rows(num_slots: int, num_experts: int) -> int:
    """Rows of the contiguous layout in the worst case: every slot, plus up to alignment - 1 padding rows
    for each expert that received any slot."""
    padding = (CONTIGUOUS_ALIGNMENT - 1) * min(num_experts, num_slots)
    return ceil_div(num_slots + padding, CONTIGUOUS_ALIGNMENT) * CONTIGUOUS_ALIGNMENT


def fill_blocks(num_ints: int) -> int:
    """Blocks that share the -1 fill of num_ints int32 (a few 16-byte stores per thread each)."""
    return max(1, min(get_num_sms(), ceil_div(num_ints, _FILL_INTS_PER_BLOCK)))


def check_layout_args(num_slots: int, num_experts: int, max_tokens) -> int:
    """moe_layout's checks of the sizes; returns contiguous_max_rows(num_slots, num_experts)."""
    check_int_range(num_experts, "num_experts", 1, MAX_EXPERTS)
    max_rows = contiguous_max_rows(num_slots, num_experts)
    if max_rows > INT32_LIMIT:
        raise ValueError(f"topk_idx has too many slots ({num_slots}) for int32 row indices: split it")
    if max_tokens is not None:
        check_int_range(max_tokens, "max_tokens", 1, INT32_LIMIT // num_experts)
    return max_rows


def new_layout(like: torch.Tensor, num_tokens: int, k: int, num_experts: int, max_tokens) -> MoeLayout:
    """The int32 tensors of a layout on like's device: uninitialized, or their final values when there are no slots."""
    # NOTE: torch.empty with the device, not like.new_empty: half the host time per tensor, and there are up to seven.
    new_int32 = functools.partial(torch.empty, dtype=torch.int32, device=like.device)
    max_rows = contiguous_max_rows(num_tokens * k, num_experts)
    layout = MoeLayout(
        counts=new_int32((num_experts,)), num_rows=new_int32((1,)), m_indices=new_int32((max_rows,)),
        row_to_slot=new_int32((max_rows,)), slot_to_row=new_int32((num_tokens, k)),
        masked_slots=None if max_tokens is None else new_int32((num_experts, max_tokens)),
        masked_m=None if max_tokens is None else new_int32((num_experts,)),
    )
    if num_tokens * k == 0:
        for t in (layout.counts, layout.num_rows, layout.masked_m):
            if t is not None:
                t.zero_()
        if layout.masked_slots is not None:
            layout.masked_slots.fill_(-1)
    return layout


class LayoutInts:
    """Where a layout's int32 tensors (and, with_gate, topk_gate's weights and indices) lie in one 4-byte-element
    allocation: one allocation and a few views cost the host less than a tensor each. Every tensor starts 16-byte
    aligned (the kernels fill m_indices, row_to_slot and masked_slots with 16-byte stores) and none overlaps
    another."""

    def __init__(self, num_tokens: int, k: int, num_experts: int, max_tokens, with_gate: bool = False):
        max_rows = contiguous_max_rows(num_tokens * k, num_experts)
        self.token_shape = (num_tokens, k)
        self.masked_shape = None if max_tokens is None else (num_experts, max_tokens)
        pieces = [("m_indices", max_rows), ("row_to_slot", max_rows)]
        pieces += [("masked_slots", num_experts * max_tokens)] if self.masked_shape else []
        pieces += [("weights", num_tokens * k), ("indices", num_tokens * k)] if with_gate else []
        pieces += [("slot_to_row", num_tokens * k), ("counts", num_experts)]
        pieces += [("masked_m", num_experts)] if self.masked_shape else []
        pieces += [("num_rows", 1)]
        # split_with_sizes covers the allocation: a piece not a multiple of 16 bytes is followed by its padding.
        self.split_sizes, self.offsets, self._part = [], {}, {}
        for name, size in pieces:
            self._part[name] = len(self.split_sizes)
            self.offsets[name] = sum(self.split_sizes)
            padding = -size % 4 if name != "num_rows" else 0
            self.split_sizes += [size, padding] if padding else [size]
        self.numel = sum(self.split_sizes)
        self.with_gate = with_gate

    def pointers(self, address: int) -> dict:
        """The address of each tensor (by its MoeLayout field name, weights and indices) in an allocation at
        address."""
        return {name: address + 4 * offset for name, offset in self.offsets.items()}

    def carve(self, ints: torch.Tensor):
        """The tensors, as views of ints ([numel] int32): the MoeLayout, or (weights, indices, MoeLayout)
        with_gate (weights reinterpreted as float32)."""
        parts = ints.split_with_sizes(self.split_sizes)
        part = self._part
        masked = self.masked_shape is not None
        layout = MoeLayout(
            parts[part["counts"]], parts[part["num_rows"]], parts[part["m_indices"]], parts[part["row_to_slot"]],
            parts[part["slot_to_row"]].view(self.token_shape),
            parts[part["masked_slots"]].view(self.masked_shape) if masked else None,
            parts[part["masked_m"]] if masked else None)
        if not self.with_gate:
            return layout
        weights = parts[part["weights"]].view(torch.float32).view(self.token_shape)
        return weights, parts[part["indices"]].view(self.token_shape), layout


MOE_LAYOUT = KernelDef(
    "kernels/smxx_moe_layout.cuh", "smxx_moe_layout_impl",
    template=("IndexT", "kSlotsPerThread", "kAlignment", "kNumWarps"),
    params=(Param("topk_idx", PTR), Param("counts", PTR), Param("num_rows", PTR), Param("m_indices", PTR),
            Param("row_to_slot", PTR), Param("slot_to_row", PTR), Param("masked_slots", PTR), Param("masked_m", PTR),
            Param("block_counts", PTR), Param("barrier", PTR), Param("num_slots", U32), Param("num_experts", U32),
            Param("slots_per_block", U32), Param("num_rank_blocks", U32), Param("max_rows", U32),
            Param("max_tokens", U32)),
    threads=lambda t: t["kNumWarps"] * 32, cooperative=True)


def _layout_spec(dtype: torch.dtype) -> KernelSpec:
    return MOE_LAYOUT.spec(IndexT=dtype, kSlotsPerThread=_LAYOUT_SLOTS_PER_THREAD, kAlignment=CONTIGUOUS_ALIGNMENT,
                           kNumWarps=_LAYOUT_WARPS)


@functools.lru_cache(maxsize=None)
def _layout_kernel(dtype: torch.dtype):
    return get_kernel(_layout_spec(dtype))


_workspaces = {}


def layout_workspace(device_index: int, num_block_counts: int, stream: int = None) -> torch.Tensor:
    """The int32 workspace of the cooperative layout kernels: [0] their grid-barrier counter (bits 0-30 zero
    between launches, each launch flips bit 31), then from block_counts_offset() on room for num_block_counts
    per-block expert counts. One per stream (stream: the current one's raw handle, current_raw_stream(device_index),
    if the caller has it), grown as needed, or while capturing a CUDA graph a fresh one whose zeroing the graph
    replays."""
    # NOTE: a counter cached from inside a capture would hold garbage until the first replay.
    size = _COUNTER_INTS + num_block_counts
    if torch._C._cuda_isCurrentStreamCapturing():
        return torch.zeros(size, dtype=torch.int32, device=f"cuda:{device_index}")
    key = (device_index, current_raw_stream(device_index) if stream is None else stream)
    workspace = _workspaces.get(key)
    if workspace is None or workspace.numel() < size:
        workspace = _workspaces[key] = persistent_empty(size, torch.int32, device_index).zero_()
    return workspace


def block_counts_offset() -> int:
    """Bytes from the start of layout_workspace to its block counts (16-byte aligned)."""
    return 4 * _COUNTER_INTS


def block_counts_row_ints(num_experts: int) -> int:
    """The int32 of one block's row of expert counts in the workspace: E rounded up to 16 bytes."""
    return ceil_div(num_experts, 4) * 4


def layout_blocks(num_slots: int) -> tuple:
    """(slots_per_block, blocks) of moe_layout's ranking: whole chunks, at most one block per SM."""
    chunks_per_block = ceil_div(ceil_div(num_slots, LAYOUT_CHUNK_SLOTS), get_num_sms())
    slots_per_block = chunks_per_block * LAYOUT_CHUNK_SLOTS
    return slots_per_block, ceil_div(num_slots, slots_per_block)


def moe_layout(topk_idx: torch.Tensor, num_experts: int, max_tokens: int = None) -> MoeLayout:
    """The contiguous (and optionally masked) grouped-GEMM layouts of routed slots.

    Args:
        topk_idx: [T, k] int32 or int64 CUDA tensor, contiguous; -1 (or any index outside [0, E)) drops
            a slot.
        num_experts: E, 1 <= E <= 512.
        max_tokens: with a value, also build the masked layout [E, max_tokens]; slots of an expert
            beyond the first max_tokens are left out of it (compare masked_m with counts to detect it).

    Returns:
        MoeLayout (see its docstring); the contiguous tensors have contiguous_max_rows(T * k, E) rows.

    Notes:
        One cooperative launch (at most one block per SM), no host synchronization, so it can be
        captured in a CUDA graph. Deterministic, whatever the SM count. Its workspace (a grid-barrier counter
        and per-block counts) is kept per (device, stream) (a captured graph zeroes its own in a memset
        node), so calls may overlap only on different streams. The layout's tensors are views of one int32
        allocation (none overlaps another, each starts 16-byte aligned); a call whose topk_idx has the dtype,
        shape, strides and device of an earlier valid call (same arguments, same SM count) reuses its checks
        and plan.
    """
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.moe_layout(topk_idx, num_experts, max_tokens)
    try:
        # NOTE: the types too: 8 == 8.0 == True for the dict, not for the checks.
        signature = (topk_idx.dtype, topk_idx.shape, topk_idx.stride(), topk_idx.get_device(), num_experts, max_tokens,
                     type(num_experts), type(max_tokens))
        plan = _plans.get(signature)
    except (AttributeError, TypeError):  # not a tensor, or unhashable arguments: the full check below says which
        signature = plan = None
    if plan is None or plan.num_sms != get_num_sms():
        plan = _plan(topk_idx, num_experts, max_tokens)
        if signature is not None:
            _plans[signature] = plan
    if plan.kernel is None:  # no slots: the layout's final values, no launch
        return new_layout(topk_idx, *topk_idx.shape, num_experts, max_tokens)

    ints = torch.empty(plan.ints.numel, dtype=torch.int32, device=plan.device)
    layout = plan.ints.carve(ints)
    device_index = plan.device.index
    stream = current_raw_stream(device_index)
    workspace = layout_workspace(device_index, plan.rank_blocks * block_counts_row_ints(num_experts), stream)
    key = (topk_idx.data_ptr(), ints.data_ptr(), workspace.data_ptr())
    launch = plan.launches.get(key)
    if launch is None:
        launch = _prepare_launch(plan, key, num_experts, max_tokens)
    launch.launch(stream)
    return layout


class _Plan(NamedTuple):
    """What a valid call's signature fixes: the kernel and its grid (kernel None: no slots), the ranking blocks, where
    the layout's tensors lie in one allocation, and the prepared launches by the call's addresses."""

    num_sms: int  # the SM count it was planned for
    device: torch.device
    kernel: object = None
    num_slots: int = 0
    num_blocks: int = 0
    slots_per_block: int = 0
    rank_blocks: int = 0
    max_rows: int = 0
    ints: LayoutInts = None
    launches: dict = None


# Signatures of valid calls (the tensor's dtype, shape, strides and device, the other arguments with their types) ->
# their _Plan: a repeated call runs no check but the signature's look-up (and the SM count's).
_plans = {}


def _plan(topk_idx, num_experts, max_tokens) -> _Plan:
    """Every check of a call (raising its error), and its _Plan."""
    check_dtype(topk_idx, "topk_idx", (torch.int32, torch.int64))
    check_rank(topk_idx, "topk_idx", 2)
    num_tokens, k = topk_idx.shape
    num_slots = num_tokens * k
    max_rows = check_layout_args(num_slots, num_experts, max_tokens)
    if not topk_idx.is_contiguous():
        raise ValueError(f"topk_idx must be contiguous, got strides {tuple(topk_idx.stride())}")
    check_cuda_device(topk_idx, "topk_idx")
    num_sms = get_num_sms()
    if num_slots == 0:
        return _Plan(num_sms, topk_idx.device)
    num_masked = num_experts * max_tokens if max_tokens is not None else 0
    slots_per_block, rank_blocks = layout_blocks(num_slots)
    # NOTE: both terms are at most the SM count, so one block per SM makes the whole grid resident.
    num_blocks = max(rank_blocks, fill_blocks(2 * max_rows + num_masked))
    return _Plan(num_sms, topk_idx.device, _layout_kernel(topk_idx.dtype), num_slots, num_blocks, slots_per_block,
                 rank_blocks, max_rows, LayoutInts(num_tokens, k, num_experts, max_tokens), {})


def _prepare_launch(plan: _Plan, key: tuple, num_experts: int, max_tokens):
    """The layout kernel's launch at the addresses of key (moe_layout's), cached in the plan."""
    topk_idx_ptr, ints_ptr, workspace_ptr = key
    pointers = plan.ints.pointers(ints_ptr)
    masked = max_tokens is not None
    encoded = plan.kernel.encode(
        topk_idx=topk_idx_ptr, counts=pointers["counts"], num_rows=pointers["num_rows"],
        m_indices=pointers["m_indices"], row_to_slot=pointers["row_to_slot"], slot_to_row=pointers["slot_to_row"],
        masked_slots=pointers["masked_slots"] if masked else 0, masked_m=pointers["masked_m"] if masked else 0,
        block_counts=workspace_ptr + block_counts_offset(), barrier=workspace_ptr, num_slots=plan.num_slots,
        num_experts=num_experts, slots_per_block=plan.slots_per_block, num_rank_blocks=plan.rank_blocks,
        max_rows=plan.max_rows, max_tokens=max_tokens if masked else 0)
    return remember_launch(plan.launches, key, plan.kernel.prepare((plan.num_blocks, 1, 1), plan.device.index, encoded))


@precompiled
def precompile_specs() -> list:
    """The specializations `python -m deep_kernels precompile` builds for this module."""
    return [_layout_spec(dtype) for dtype in (torch.int32, torch.int64)]
