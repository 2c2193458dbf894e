"""Gating and layout together: topk_gate then moe_layout of its indices, in one launch.

topk_gate_with_layout returns exactly what topk_gate followed by moe_layout returns. Up to fused_max_tokens(k)
tokens (255 tokens and 2048 routed slots per SM) one cooperative kernel does both: every block (at most one per SM)
gates its tokens, fills its share of the layout's -1 rows and counts its slots per expert (one byte each); after
a grid barrier every block sums those counts and writes its own slots' rows, positions from counts and scans as
in moe_layout. Larger inputs take the two-stage path (two launches: topk_gate, then moe_layout).
"""

import dataclasses
import functools
from typing import NamedTuple

import torch

from deep_kernels.device import get_num_sms
from deep_kernels.jit.definition import F32, PTR, U32, KernelDef, Param
from deep_kernels.jit.registry import precompiled
from deep_kernels.jit.runtime import current_raw_stream, get_kernel, remember_launch
from deep_kernels.jit.source import KernelSpec
from deep_kernels.moe.gate import MAX_TOP_K, check_gate_args, gate_signature, kernel_groups, scoring_cpp, topk_gate
from deep_kernels.moe.layout import (
    CONTIGUOUS_ALIGNMENT, LayoutInts, MoeLayout, block_counts_offset, block_counts_row_ints, check_layout_args,
    fill_blocks, moe_layout,
)
from deep_kernels.moe.layout import layout_workspace as _workspace
from deep_kernels.validation import (
    ceil_div, check_aligned, check_cuda_device, check_int_range, check_no_overlap, is_traced,
)

class FusedTile(NamedTuple):
    """The fused kernel's block: `warps` warps, each gating tokens_per_warp tokens at a time (interleaved), at most
    one block per SM; a block ranks at most one chunk of warps * 32 * slots_per_thread slots
    (csrc/kernels/smxx_topk_gate_layout.cuh)."""
    warps: int
    slots_per_thread: int
    tokens_per_warp: int = 1

    @property
    def block_slots(self) -> int:
        return self.warps * 32 * self.slots_per_thread


# Up to two tokens per warp of 8-warp blocks: the fewest warps in the count and scan steps (H200: 7.6 against
# 9.1 us at T = 128, 9.3 against 11.7 at 512, 15.4 against 16.5 at 2048 for 16 warps). Beyond, 16-warp blocks. A warp
# with two or more tokens gates two at once (H200, T = 2048 / 4096 / 8192: 14.7 / 20.8 / 30.4 us against 15.6 / 21.2
# / 31.1 one at a time; at T = 1024, one token per warp, 14.3 against 12.1).
_FUSED_FEW_TOKENS_TILE = FusedTile(8, 1)
_FUSED_TILE = FusedTile(16, 2, 2)
_FUSED_FEW_TOKENS_PER_WARP = 2
# Above two rounds of the 16-warp blocks' tokens, 32-warp blocks gating one token per warp at a time (two would
# spill at their 64 registers): H200, DeepSeek-V3 routing, L2 flushed, T = 10240 / 14336 / 16384: 27.3 / 35.4 /
# 38.5 us against 30.4 / 39.0 / 39.8; two such blocks per SM (32 registers) took 42.4 us at T = 16384.
_FUSED_MANY_TOKENS_TILE = FusedTile(32, 2)
_FUSED_TILE_MAX_BLOCK_TOKENS = 2 * _FUSED_TILE.warps * _FUSED_TILE.tokens_per_warp
# A block gates at least this many tokens, spread over the SMs above that.
_FUSED_MIN_BLOCK_TOKENS = 8
# The blocks exchange their per-expert counts as bytes, summed in 16-bit halves.
_FUSED_MAX_BLOCK_TOKENS = 255
_FUSED_MAX_TOKENS = 65535


def _fused_tile(num_tokens: int) -> FusedTile:
    """The fused kernel's block for num_tokens tokens."""
    few = _FUSED_FEW_TOKENS_TILE
    tokens_per_block = ceil_div(num_tokens, get_num_sms())
    if tokens_per_block > _FUSED_TILE_MAX_BLOCK_TOKENS:
        return _FUSED_MANY_TOKENS_TILE
    if tokens_per_block > _FUSED_FEW_TOKENS_PER_WARP * few.warps:
        return _FUSED_TILE
    return few._replace(tokens_per_warp=2) if tokens_per_block > few.warps else few


# The one launch against the two launches, in turns (H200, 2026-12-03, L2 flushed), kernel time / stream time
# (CUDA events, the host ahead): DeepSeek-V3 routing 1.02 / 1.08x at T = 8192, 0.99 / 1.03x at 10240-12288,
# 0.96 / 0.99x at 14336-16384, 1.01-1.07 / 1.03-1.09x at 20480-28672, 1.00 / 1.01x at 32768; 384 and 512 experts
# above T = 8192 0.97-1.04 / 1.00-1.05x. The fused kernel runs the two kernels' instructions (Nsight Compute at
# T = 16384: 19.0M against 17.4M + 1.8M) and saves the gap between them; its gate has fewer warps to hide latency.
def fused_max_tokens(k: int) -> int:
    """The most tokens topk_gate_with_layout routes in one launch at top-k k on the current device (255 tokens and
    2048 routed slots per SM); more take two launches. Raises ValueError unless k is an integer in [1, MAX_TOP_K]."""
    check_int_range(k, "k", 1, MAX_TOP_K)
    block_tokens = min(_FUSED_MAX_BLOCK_TOKENS, _FUSED_MANY_TOKENS_TILE.block_slots // k)
    return min(_FUSED_MAX_TOKENS, block_tokens * get_num_sms())


TOPK_GATE_LAYOUT = KernelDef(
    "kernels/smxx_topk_gate_layout.cuh", "smxx_topk_gate_layout_impl",
    template=("InT", "NUM_EXPERTS", "NUM_GROUPS", "kScoring", "kNumWarps", "kSlotsPerThread", "kAlignment",
              "kTokensPerWarp"),
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
                                 kSlotsPerThread=tile.slots_per_thread, kAlignment=CONTIGUOUS_ALIGNMENT,
                                 kTokensPerWarp=tile.tokens_per_warp)


@functools.lru_cache(maxsize=None)
def _fused_kernel(dtype: torch.dtype, num_experts: int, num_groups: int, scoring: str, tile: FusedTile):
    return get_kernel(_fused_spec(dtype, num_experts, num_groups, scoring, tile))


def _fused_tokens_per_block(num_tokens: int, k: int):
    """Tokens each block of the fused kernel (of _fused_tile(num_tokens)) gates, so that its grid fits on the SMs;
    None where the two-stage path serves the input (more than a chunk of slots or 255 tokens per block)."""
    tile = _fused_tile(num_tokens)
    tokens_per_block = max(_FUSED_MIN_BLOCK_TOKENS, ceil_div(num_tokens, get_num_sms()))
    if tokens_per_block * k > tile.block_slots or tokens_per_block > _FUSED_MAX_BLOCK_TOKENS:
        return None
    if num_tokens > _FUSED_MAX_TOKENS:
        return None
    return tokens_per_block


def topk_gate_with_layout(logits: torch.Tensor, k: int, scoring: str = "softmax", bias: torch.Tensor = None,
                          num_groups: int = 0, topk_groups: int = 0, renormalize: bool = True,
                          routed_scaling_factor: float = 1.0, max_tokens: int = None, out: tuple = None):
    """topk_gate, then moe_layout of its indices over the same experts.

    Args:
        logits, k, scoring, bias, num_groups, topk_groups, renormalize, routed_scaling_factor: as topk_gate.
        max_tokens: as moe_layout (with a value, also the masked layout).
        out: optional (weights, indices, layout) to write instead of allocating, shaped, typed and laid out as
            this call returns them (a previous call's outputs serve), on logits' device; the tensors must not
            overlap each other or the inputs, and m_indices, row_to_slot and masked_slots must start 16-byte
            aligned.

    Returns:
        (weights, indices, layout): topk_gate's outputs and moe_layout(indices, E, max_tokens) (out's tensors
        when given).

    Notes:
        Bit-exact with deep_kernels.reference.moe.topk_gate_with_layout, deterministic, no host
        synchronization (CUDA-graph safe). Up to fused_max_tokens(k) tokens (33660 at k <= 8 on 132 SMs) it is
        one cooperative launch (at most one block per SM) whose workspace (a grid-barrier counter and per-block
        counts) is kept per (device, stream) (a captured graph zeroes its own in a memset node), so calls may
        overlap only on different streams. Without out, weights, indices and the layout's tensors are views of one
        4-byte-element allocation (none overlaps another, each starts 16-byte aligned): the call's host time is
        mostly its allocation and views, which out= saves (a decode loop passes the previous step's outputs). On
        the two-stage path the results are copied into out.
    """
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.topk_gate_with_layout(logits, k, scoring, bias, num_groups, topk_groups, renormalize,
                                         routed_scaling_factor, max_tokens, out)
    if out is not None:
        # A call into out= repeating an earlier one's metadata and addresses launches what that call prepared.
        try:
            out_key = _out_call_key(logits, k, scoring, bias, num_groups, topk_groups, renormalize,
                                    routed_scaling_factor, max_tokens, out)
            call = _out_calls.get(out_key)
        except (AttributeError, TypeError, ValueError):  # not tensors, or not the form out takes: the checks say how
            out_key = call = None
        if call is not None and call.num_sms == get_num_sms():
            stream = current_raw_stream(call.device_index)
            launch = call.launches.get(_workspace(call.device_index, call.workspace_ints, stream).data_ptr())
            if launch is not None:
                launch.launch(stream)
                return tuple(out)
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
        results = (weights, indices, moe_layout(indices, logits.shape[1], max_tokens))
        if out is None:
            return results
        for written, result in zip(_written_outputs(plan, out), (*results[:2], *_layout_fields(results[2]))):
            if written is not None:
                written.copy_(result)
        return tuple(out)
    device_index = plan.device.index
    stream = current_raw_stream(device_index)
    workspace_ints = plan.token_blocks * block_counts_row_ints(plan.num_experts)
    workspace = _workspace(device_index, workspace_ints, stream)
    bias_address = 0 if bias is None else bias.data_ptr()
    if out is None:
        ints = torch.empty(plan.ints.numel, dtype=torch.int32, device=plan.device)
        key = (logits.data_ptr(), bias_address, ints.data_ptr(), workspace.data_ptr())
        launch = plan.launches.get(key)
        if launch is None:
            launch = _prepare_launch(plan, plan.launches, key, key[3], plan.ints.pointers(key[2]), logits,
                                     bias_address, k, topk_groups, renormalize, routed_scaling_factor, max_tokens)
        launch.launch(stream)
        return plan.ints.carve(ints)
    outputs = _written_outputs(plan, out)
    _check_written_addresses(outputs, logits, bias)
    out_key = _out_call_key(logits, k, scoring, bias, num_groups, topk_groups, renormalize, routed_scaling_factor,
                            max_tokens, out)
    call = _out_calls.get(out_key)
    if call is None or call.num_sms != plan.num_sms:
        call = remember_launch(_out_calls, out_key, _OutCall(plan.num_sms, device_index, workspace_ints, {}))
    pointers = dict(zip(_OUTPUT_NAMES, (0 if t is None else t.data_ptr() for t in outputs)))
    launch = _prepare_launch(plan, call.launches, workspace.data_ptr(), workspace.data_ptr(), pointers, logits,
                             bias_address, k, topk_groups, renormalize, routed_scaling_factor, max_tokens)
    launch.launch(stream)
    return tuple(out)


class _OutCall(NamedTuple):
    """A valid call into out= (by _out_call_key): what its launch needs, and its prepared launches by the address of
    their workspace (layout_workspace: one per stream)."""

    num_sms: int  # the SM count it was planned for
    device_index: int
    workspace_ints: int
    launches: dict


# Calls into out= (_out_call_key) -> their _OutCall: a repeated call runs no check but this look-up.
_out_calls = {}


def _out_call_key(logits, k, scoring, bias, num_groups, topk_groups, renormalize, routed_scaling_factor, max_tokens,
                  out) -> tuple:
    """What a call into out= depends on: gate_signature's arguments and max_tokens with their types, the inputs'
    addresses and out's (_out_key). Raises AttributeError for non-tensors, TypeError or ValueError for an out of
    another form; hashing it raises TypeError for unhashable arguments."""
    # NOTE: logits' and bias' addresses stand for their devices (the address space is unified).
    return (logits.data_ptr(), logits.dtype, logits.shape, logits.stride(),
            None if bias is None else (bias.data_ptr(), bias.dtype, bias.shape, bias.stride()),
            k, scoring, num_groups, topk_groups, renormalize, routed_scaling_factor, max_tokens,
            type(k), type(scoring), type(num_groups), type(topk_groups), type(renormalize),
            type(routed_scaling_factor), type(max_tokens), _out_key(out))


def _out_key(out) -> tuple:
    """The device, addresses and metadata of out's tensors (a prepared launch's key; the device too: a freed address
    may come back on another device)."""
    weights, indices, routed = out
    counts, num_rows, m_indices = routed.counts, routed.num_rows, routed.m_indices
    row_to_slot, slot_to_row, masked_slots, masked_m = (routed.row_to_slot, routed.slot_to_row, routed.masked_slots,
                                                        routed.masked_m)
    # NOTE: written out rather than looped: this is most of the call's host time.
    return (weights.get_device(), weights.data_ptr(), weights.dtype, weights.shape, weights.stride(),
            indices.data_ptr(), indices.dtype, indices.shape, indices.stride(),
            counts.data_ptr(), counts.dtype, counts.shape, counts.stride(),
            num_rows.data_ptr(), num_rows.dtype, num_rows.shape, num_rows.stride(),
            m_indices.data_ptr(), m_indices.dtype, m_indices.shape, m_indices.stride(),
            row_to_slot.data_ptr(), row_to_slot.dtype, row_to_slot.shape, row_to_slot.stride(),
            slot_to_row.data_ptr(), slot_to_row.dtype, slot_to_row.shape, slot_to_row.stride(),
            None if masked_slots is None else (masked_slots.data_ptr(), masked_slots.dtype, masked_slots.shape,
                                               masked_slots.stride()),
            None if masked_m is None else (masked_m.data_ptr(), masked_m.dtype, masked_m.shape, masked_m.stride()))


# out's tensors in order: weights, indices, then the MoeLayout's fields.
_OUTPUT_NAMES = ("weights", "indices") + tuple(field.name for field in dataclasses.fields(MoeLayout))
# Outputs the kernel stores with 16-byte vectors (its -1 fill).
_VECTOR_STORED = ("m_indices", "row_to_slot", "masked_slots")


def _layout_fields(layout: MoeLayout) -> tuple:
    return tuple(getattr(layout, name) for name in _OUTPUT_NAMES[2:])


def check_out_form(out) -> None:
    """out is (weights, indices, MoeLayout)."""
    if not isinstance(out, (tuple, list)) or len(out) != 3 or not isinstance(out[2], MoeLayout):
        raise TypeError("out must be (weights, indices, layout) as topk_gate_with_layout returns them")


def _written_outputs(plan, out) -> tuple:
    """out's tensors in _OUTPUT_NAMES order, after checking them against the outputs a call of plan returns."""
    check_out_form(out)
    outputs = (out[0], out[1], *_layout_fields(out[2]))
    for name, tensor, wanted in zip(_OUTPUT_NAMES, outputs, plan.out_signature):
        if wanted is None and tensor is not None:
            raise ValueError(f"out's {name} must be None without max_tokens")
        if wanted is None:
            continue
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"out's {name} must be a torch.Tensor, got {type(tensor).__name__}")
        dtype, shape, stride, device = wanted
        if tensor.dtype != dtype or tuple(tensor.shape) != tuple(shape) or tensor.stride() != stride:
            raise ValueError(f"out's {name} must be a contiguous {dtype} tensor of shape {tuple(shape)}, got "
                             f"{tensor.dtype} of shape {tuple(tensor.shape)} strides {tuple(tensor.stride())}")
        if tensor.get_device() != device:
            raise ValueError(f"out's {name} must be on logits' device cuda:{device}, got {tensor.device}")
    return outputs


def _check_written_addresses(outputs: tuple, logits, bias) -> None:
    """out's vector-stored tensors are 16-byte aligned, and no two of out's tensors and the inputs overlap."""
    for name, tensor in zip(_OUTPUT_NAMES, outputs):
        if name in _VECTOR_STORED and tensor is not None:
            check_aligned(tensor, f"out's {name}")
    written = [(name, t) for name, t in zip(_OUTPUT_NAMES, outputs) if t is not None]
    check_no_overlap(written, [("logits", logits)] + ([("bias", bias)] if bias is not None else []),
                     "out's tensors and the inputs")


def _prepare_launch(plan, launches: dict, key, workspace: int, pointers: dict, logits, bias_address: int, k,
                    topk_groups, renormalize, routed_scaling_factor, max_tokens):
    """The fused kernel's launch writing the outputs at pointers (by _OUTPUT_NAMES) with the workspace at address
    workspace, cached in launches by key."""
    masked = max_tokens is not None
    encoded = plan.kernel.encode(
        logits=logits.data_ptr(), bias=bias_address, weights=pointers["weights"], indices=pointers["indices"],
        counts=pointers["counts"], num_rows=pointers["num_rows"], m_indices=pointers["m_indices"],
        row_to_slot=pointers["row_to_slot"], slot_to_row=pointers["slot_to_row"],
        masked_slots=pointers["masked_slots"] if masked else 0, masked_m=pointers["masked_m"] if masked else 0,
        block_counts=workspace + block_counts_offset(), barrier=workspace,
        num_tokens=logits.shape[0], tokens_per_block=plan.tokens_per_block, logits_row_stride=logits.stride(0),
        top_k=k, topk_groups=topk_groups, renormalize=int(renormalize), scaling_factor=float(routed_scaling_factor),
        max_rows=plan.max_rows, max_tokens=max_tokens if masked else 0)
    return remember_launch(launches, key, plan.kernel.prepare((plan.num_blocks, 1, 1), plan.device.index, encoded))


class _Plan(NamedTuple):
    """What a valid call's signature fixes: the outputs' (dtype, shape, strides, device) as the call returns them
    (None where absent), the fused kernel and its grid (kernel None: the two-stage path, or no tokens), the
    workspace's blocks, where the outputs lie in one allocation, and the prepared launches by the call's addresses."""

    num_sms: int  # the SM count it was planned for
    out_signature: tuple
    kernel: object = None
    tokens_per_block: int = 0
    token_blocks: int = 0
    num_blocks: int = 0
    max_rows: int = 0
    device: torch.device = None
    num_experts: int = 0
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
    device = logits.get_device()
    slots = (torch.Size((num_tokens, k)), (k, 1), device)
    rows = (torch.Size((max_rows,)), (1,), device)
    experts = (torch.Size((num_experts,)), (1,), device)
    masked = max_tokens is not None
    out_signature = (
        (torch.float32, *slots), (torch.int32, *slots), (torch.int32, *experts),
        (torch.int32, torch.Size((1,)), (1,), device), (torch.int32, *rows), (torch.int32, *rows),
        (torch.int32, *slots),
        (torch.int32, torch.Size((num_experts, max_tokens)), (max_tokens, 1), device) if masked else None,
        (torch.int32, *experts) if masked else None)
    tokens_per_block = _fused_tokens_per_block(num_tokens, k)
    if tokens_per_block is None or num_tokens == 0:  # the two-stage path (no launch without tokens)
        return _Plan(num_sms, out_signature)
    num_masked = num_experts * max_tokens if max_tokens is not None else 0
    # NOTE: both terms are at most the SM count, so one block per SM makes the whole grid resident. Only the
    # blocks holding tokens keep per-block counts.
    token_blocks = ceil_div(num_tokens, tokens_per_block)
    num_blocks = max(token_blocks, fill_blocks(2 * max_rows + num_masked))
    kernel = _fused_kernel(logits.dtype, num_experts, kernel_groups(num_groups), scoring, _fused_tile(num_tokens))
    return _Plan(num_sms, out_signature, kernel, tokens_per_block, token_blocks, num_blocks, max_rows, logits.device,
                 num_experts, LayoutInts(num_tokens, k, num_experts, max_tokens, with_gate=True), {})


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
        for tile in (_FUSED_FEW_TOKENS_TILE, _FUSED_FEW_TOKENS_TILE._replace(tokens_per_warp=2), _FUSED_TILE,
                     _FUSED_MANY_TOKENS_TILE)
    ]
