"""Gating and layout together: topk_gate then moe_layout of its indices, in one launch for few tokens.

topk_gate_with_layout returns exactly what topk_gate followed by moe_layout returns. Up to FUSED_MAX_SLOTS
routed slots (T * k) one cooperative kernel does both: every block (at most one per SM) gates its tokens,
fills its share of the layout's -1 rows and counts its slots per expert; after a grid barrier every block
sums those counts and writes its own slots' rows, positions from counts and scans as in moe_layout.
Larger inputs take the two-stage path (two launches: topk_gate, then moe_layout).
"""

import functools
from typing import NamedTuple

import torch
from torch.compiler import is_compiling, is_dynamo_compiling, is_exporting

from deep_kernels.device import get_num_sms
from deep_kernels.jit.definition import F32, PTR, U32, KernelDef, Param
from deep_kernels.jit.registry import precompiled
from deep_kernels.jit.runtime import current_raw_stream, get_kernel, remember_launch
from deep_kernels.jit.source import KernelSpec
from deep_kernels.moe.gate import check_gate_args, gate_signature, kernel_groups, scoring_cpp, topk_gate
from deep_kernels.moe.layout import (
    CONTIGUOUS_ALIGNMENT, LayoutInts, block_counts_offset, block_counts_row_ints, check_layout_args, fill_blocks,
    moe_layout,
)
from deep_kernels.moe.layout import layout_workspace as _workspace
from deep_kernels.validation import ceil_div, check_cuda_device

# The fused kernel's blocks gate their tokens one per warp at a time: beyond this the two-stage path is faster.
FUSED_MAX_SLOTS = 65536


class FusedTile(NamedTuple):
    """The fused kernel's block: `warps` warps, each gating a token at a time, at most one block per SM; a block
    ranks at most one chunk of warps * 32 * slots_per_thread slots (csrc/kernels/smxx_topk_gate_layout.cuh)."""
    warps: int
    slots_per_thread: int

    @property
    def block_slots(self) -> int:
        return self.warps * 32 * self.slots_per_thread


# Up to two tokens per warp of 8-warp blocks: the fewest warps in the count and scan steps (H200: 7.6 against
# 9.1 us at T = 128, 9.3 against 11.7 at 512, 15.4 against 16.5 at 2048 for 16 warps). Beyond, 16-warp blocks.
_FUSED_FEW_TOKENS_TILE = FusedTile(8, 1)
_FUSED_TILE = FusedTile(16, 2)
_FUSED_FEW_TOKENS_PER_WARP = 2
# A block gates at least this many tokens, spread over the SMs above that.
_FUSED_MIN_BLOCK_TOKENS = 8


def _fused_tile(num_tokens: int) -> FusedTile:
    """The fused kernel's block for num_tokens tokens."""
    few = _FUSED_FEW_TOKENS_TILE
    return few if ceil_div(num_tokens, get_num_sms()) <= _FUSED_FEW_TOKENS_PER_WARP * few.warps else _FUSED_TILE


TOPK_GATE_LAYOUT = KernelDef(
    "kernels/smxx_topk_gate_layout.cuh", "smxx_topk_gate_layout_impl",
    template=("InT", "NUM_EXPERTS", "NUM_GROUPS", "kScoring", "kNumWarps", "kSlotsPerThread", "kAlignment"),
    params=(Param("logits", PTR), Param("bias", PTR), Param("weights", PTR), Param("indices", PTR),
            Param("counts", PTR), Param("num_rows", PTR), Param("m_indices", PTR), Param("row_to_slot", PTR),
            Param("slot_to_row", PTR), Param("masked_slots", PTR), Param("masked_m", PTR), Param("block_counts", PTR),
            Param("barrier", PTR), Param("num_tokens", U32), Param("tokens_per_block", U32),
            Param("logits_row_stride", U32), Param("top_k", U32), Param("topk_groups", U32), Param("renormalize", U32),
            Param("scaling_factor", F32), Param("max_rows", U32), Param("max_tokens", U32)),
    threads=lambda t: t["kNumWarps"] * 32, cooperative=True)


def _fused_spec(dtype: torch.dtype, num_experts: int, num_groups: int, scoring: str, tile: FusedTile) -> KernelSpec:
    return TOPK_GATE_LAYOUT.spec(InT=dtype, NUM_EXPERTS=num_experts, NUM_GROUPS=num_groups,
                                 kScoring=scoring_cpp(scoring), kNumWarps=tile.warps,
                                 kSlotsPerThread=tile.slots_per_thread, kAlignment=CONTIGUOUS_ALIGNMENT)


@functools.lru_cache(maxsize=None)
def _fused_kernel(dtype: torch.dtype, num_experts: int, num_groups: int, scoring: str, tile: FusedTile):
    return get_kernel(_fused_spec(dtype, num_experts, num_groups, scoring, tile))


def _fused_tokens_per_block(num_tokens: int, k: int):
    """Tokens each block of the fused kernel (of _fused_tile(num_tokens)) gates, so that its grid fits on the SMs;
    None where the two-stage path serves the input (too many slots, or more than a chunk of them per block)."""
    tile = _fused_tile(num_tokens)
    tokens_per_block = max(_FUSED_MIN_BLOCK_TOKENS, ceil_div(num_tokens, get_num_sms()))
    if num_tokens * k > FUSED_MAX_SLOTS or tokens_per_block * k > tile.block_slots:
        return None
    return tokens_per_block


def topk_gate_with_layout(logits: torch.Tensor, k: int, scoring: str = "softmax", bias: torch.Tensor = None,
                          num_groups: int = 0, topk_groups: int = 0, renormalize: bool = True,
                          routed_scaling_factor: float = 1.0, max_tokens: int = None):
    """topk_gate, then moe_layout of its indices over the same experts.

    Args:
        logits, k, scoring, bias, num_groups, topk_groups, renormalize, routed_scaling_factor: as topk_gate.
        max_tokens: as moe_layout (with a value, also the masked layout).

    Returns:
        (weights, indices, layout): topk_gate's outputs and moe_layout(indices, E, max_tokens).

    Notes:
        Bit-exact with deep_kernels.reference.moe.topk_gate_with_layout, deterministic, no host
        synchronization (CUDA-graph safe). Up to FUSED_MAX_SLOTS slots it is one cooperative launch (at
        most one block per SM) whose workspace (a grid-barrier counter and per-block counts) is kept per
        (device, stream) (a captured graph zeroes its own in a memset node), so calls may overlap only on
        different streams. indices and the layout's tensors are views of one int32 allocation (none overlaps
        another, each starts 16-byte aligned).
    """
    if is_compiling() and (is_dynamo_compiling() or is_exporting()):  # traced: the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.topk_gate_with_layout(logits, k, scoring, bias, num_groups, topk_groups, renormalize,
                                         routed_scaling_factor, max_tokens)
    try:
        signature = gate_signature(logits, k, scoring, bias, num_groups, topk_groups, renormalize,
                                   routed_scaling_factor) + (max_tokens, type(max_tokens))
        plan = _plans.get(signature)
    except (AttributeError, TypeError):  # not tensors, or unhashable arguments: the full check below says which
        signature = plan = None
    if plan is None or plan.num_sms != get_num_sms():
        plan = _plan(logits, k, scoring, bias, num_groups, topk_groups, renormalize, routed_scaling_factor,
                     max_tokens)
        if signature is not None:
            _plans[signature] = plan

    if plan.kernel is None:
        gate_args = (k, scoring, bias, num_groups, topk_groups, renormalize, routed_scaling_factor)
        weights, indices = topk_gate(logits, *gate_args)
        return weights, indices, moe_layout(indices, logits.shape[1], max_tokens)
    weights = torch.empty(plan.weights_shape, dtype=torch.float32, device=plan.device)
    ints = torch.empty(plan.ints.numel, dtype=torch.int32, device=plan.device)
    indices, layout = plan.ints.carve(ints)
    device_index = plan.device.index
    stream = current_raw_stream(device_index)
    workspace = _workspace(device_index, plan.token_blocks * block_counts_row_ints(plan.num_experts), stream)
    key = (logits.data_ptr(), 0 if bias is None else bias.data_ptr(), weights.data_ptr(), ints.data_ptr(),
           workspace.data_ptr())
    launch = plan.launches.get(key)
    if launch is None:
        launch = _prepare_launch(plan, key, logits, k, topk_groups, renormalize, routed_scaling_factor, max_tokens)
    launch.launch(stream)
    return weights, indices, layout


def _prepare_launch(plan, key: tuple, logits, k, topk_groups, renormalize, routed_scaling_factor, max_tokens):
    """The fused kernel's launch at the addresses of key (topk_gate_with_layout's), cached in the plan."""
    logits_ptr, bias_ptr, weights_ptr, ints_ptr, workspace_ptr = key
    pointers = plan.ints.pointers(ints_ptr)
    masked = max_tokens is not None
    encoded = plan.kernel.encode(
        logits=logits_ptr, bias=bias_ptr, weights=weights_ptr, indices=pointers["indices"], counts=pointers["counts"],
        num_rows=pointers["num_rows"], m_indices=pointers["m_indices"], row_to_slot=pointers["row_to_slot"],
        slot_to_row=pointers["slot_to_row"], masked_slots=pointers["masked_slots"] if masked else 0,
        masked_m=pointers["masked_m"] if masked else 0, block_counts=workspace_ptr + block_counts_offset(),
        barrier=workspace_ptr, num_tokens=logits.shape[0], tokens_per_block=plan.tokens_per_block,
        logits_row_stride=logits.stride(0), top_k=k, topk_groups=topk_groups, renormalize=int(renormalize),
        scaling_factor=float(routed_scaling_factor), max_rows=plan.max_rows, max_tokens=max_tokens if masked else 0)
    return remember_launch(plan.launches, key, plan.kernel.prepare((plan.num_blocks, 1, 1), plan.device.index,
                                                                   encoded))


class _Plan(NamedTuple):
    """What a valid call's signature fixes: the fused kernel and its grid (kernel None: the two-stage path, or no
    tokens), the workspace's blocks, the outputs' shapes and where the int32 ones lie in one allocation, and the
    prepared launches by the call's addresses."""

    num_sms: int  # the SM count it was planned for
    kernel: object = None
    tokens_per_block: int = 0
    token_blocks: int = 0
    num_blocks: int = 0
    max_rows: int = 0
    device: torch.device = None
    num_experts: int = 0
    weights_shape: tuple = ()
    ints: LayoutInts = None
    launches: dict = None


# Signatures of valid calls (dtypes, shapes, strides and devices of the tensors, the other arguments with their
# types) -> their _Plan: a repeated call runs no check but the signature's look-up (and the SM count's).
_plans = {}


def _plan(logits, k, scoring, bias, num_groups, topk_groups, renormalize, routed_scaling_factor, max_tokens) -> _Plan:
    """Every check of a call (raising its error), and its _Plan."""
    check_gate_args(logits, k, scoring, bias, num_groups, topk_groups, renormalize, routed_scaling_factor)
    num_tokens, num_experts = logits.shape
    max_rows = check_layout_args(num_tokens * k, num_experts, max_tokens)
    check_cuda_device(logits, "logits")
    if bias is not None:
        check_cuda_device(bias, "bias", like=logits)
    num_sms = get_num_sms()
    tokens_per_block = _fused_tokens_per_block(num_tokens, k)
    if tokens_per_block is None or num_tokens == 0:  # the two-stage path (no launch without tokens)
        return _Plan(num_sms)
    num_masked = num_experts * max_tokens if max_tokens is not None else 0
    # NOTE: both terms are at most the SM count, so one block per SM makes the whole grid resident. Only the
    # blocks holding tokens keep per-block counts.
    token_blocks = ceil_div(num_tokens, tokens_per_block)
    num_blocks = max(token_blocks, fill_blocks(2 * max_rows + num_masked))
    kernel = _fused_kernel(logits.dtype, num_experts, kernel_groups(num_groups), scoring, _fused_tile(num_tokens))
    return _Plan(num_sms, kernel, tokens_per_block, token_blocks, num_blocks, max_rows, logits.device, num_experts,
                 (num_tokens, k), LayoutInts(num_tokens, k, num_experts, max_tokens, with_indices=True), {})


@precompiled
def precompile_specs() -> list:
    """The specializations `python -m deep_kernels precompile` builds for this module."""
    return [
        _fused_spec(dtype, num_experts, num_groups, scoring, tile)
        for dtype, num_experts, num_groups, scoring in (
            (torch.float32, 256, 8, "sigmoid"),        # DeepSeek-V3
            (torch.bfloat16, 384, 0, "sigmoid"),       # Kimi-K2
            (torch.float32, 512, 8, "softmax"),        # the largest
            (torch.bfloat16, 72, 0, "sqrtsoftplus"),   # experts not a multiple of 32
        )
        for tile in (_FUSED_FEW_TOKENS_TILE, _FUSED_TILE)
    ]
