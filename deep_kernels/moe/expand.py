"""MoE token expansion into the grouped-GEMM layouts, and the weighted reduction back to tokens.

moe_expand: row r of the contiguous layout [max_rows, H] is x[row_to_slot[r] // k] (slot s = t * k + j);
    row (e, i) of the masked layout [E, max_tokens, H] is x[masked_slots[e, i] // k]. Rows without a slot
    (padding within an expert's segment, masked rows from masked_m on) are zero, or left unwritten with
    zero_padding=False; rows of the contiguous layout from num_rows on belong to no expert and are never
    written. FP8 rows bring their per-token scales, gathered into the scale layout the grouped GEMM reads.
    Token-major: each token row is read once and stored to its slots' rows (slot_to_row); the same launch's
    blocks also zero the rows without a slot (a share of at most 32 rows each, found through row_to_slot or
    masked_slots).
moe_expand_cast_to_fp8: the same expansion fused with per_token_cast_to_fp8 (1 x 128 groups), bit for bit;
    each token is cast once and its codes and scales stored to its k rows.
moe_reduce: out[t] = sum over j of weights[t, j] * y[row of slot t * k + j], in FP32, slots in order,
    dropped slots skipped: acc = 0; acc = acc + w_j * y_j (IEEE products and sums, never fused); out = RNE(acc).
Scales of expanded rows (quant.common's layouts, over the expanded rows): contiguous [rows, G] as in quant;
masked [E, max_tokens, G] with each expert's [max_tokens, G] block in that layout, experts one after another
(mn_major: strides (G * M_ALIGNED, 1, M_ALIGNED) with M_ALIGNED = max_tokens rounded up to 4).
"""

import functools
from typing import NamedTuple

import torch

from deep_kernels.device import get_num_sms
from deep_kernels.jit.definition import F32, PTR, U32, KernelDef, Param
from deep_kernels.jit.registry import precompiled
from deep_kernels.jit.runtime import get_kernel
from deep_kernels.jit.source import KernelSpec
from deep_kernels.moe.gate import MAX_TOP_K
from deep_kernels.moe.layout import MoeLayout, contiguous_max_rows
from deep_kernels.quant.common import (
    DEFAULT_AMAX_CLAMP, MAX_ROW_BLOCKS, NUM_WARPS, PASSES, ScaleLayout, ScaleMode, check_amax_clamp,
    parse_layout, parse_scale_mode, scale_geometry, scale_layout_of,
)
from deep_kernels.validation import (
    INT32_LIMIT, ceil_div, check_aligned, check_bool, check_cuda_device, check_dtype, check_no_overlap, check_rank,
    check_row_major_rows, is_traced, tma_aligned_size,
)

GROUP_SIZE = 128
EXPAND_DTYPES = (torch.bfloat16, torch.float32, torch.float8_e4m3fn)
CAST_DTYPES = (torch.bfloat16, torch.float32)
REDUCE_DTYPES = (torch.bfloat16, torch.float32, torch.float8_e4m3fn)
OUT_DTYPES = (torch.bfloat16, torch.float32)


class ExpandTile(NamedTuple):
    """moe_expand's launch tile (csrc/kernels/smxx_moe_expand.cuh): a block of column_threads * token_lanes
    threads covers token_lanes tokens of a chunk of column_threads * vectors 16-byte vectors of their rows
    (a row of more vectors takes several chunks); each thread has `vectors` row loads and, for FP8 scales,
    scale_loads scale loads in flight."""
    column_threads: int
    token_lanes: int
    vectors: int
    scale_loads: int = 1

    @property
    def chunk_vectors(self) -> int:
        return self.column_threads * self.vectors

    @property
    def threads(self) -> int:
        return self.column_threads * self.token_lanes


# The tile of every row size: no other tile measured faster (scripts/bench_moe_expand_tiles.py times the
# candidates). A 7168-element row is 448 (FP8) or 896 (bf16) vectors, so 1/8 of the column threads idle in its
# last chunk.
EXPAND_TILE = ExpandTile(128, 2, 4)
# moe_expand's row shares with scales are whole 32-byte sectors of the MN-major layouts' columns (8 rows of
# 4-byte words; whole wherever a column starts on a sector, as in the contiguous layout of 8-row multiples), so
# no sector is written partly by two blocks: measured 4% faster at T = 16384 than shares of any row count.
SCALE_SHARE_ROW_ALIGNMENT = 8
# The most rows without a slot one expand block checks and zeroes (a warp ballot: csrc/common/moe_rows.cuh),
# and the blocks per SM that smaller shares aim for. Shares of 8 rows rather than 32 balance the SMs' zeroing at
# decode (H200, bf16: 83 -> 95% of copy bandwidth at T = 512) and cost nothing at T >= 4096.
_PADDING_ROWS_PER_BLOCK, _PADDING_BLOCKS_PER_SM = 8, 8
# moe_expand's scale shares take up to this many rows where the token blocks then cover every row: blocks added
# only for 8-row shares cost more than they balance (H200, FP8 + scales, 8-row shares against these: 357 against
# 332 us at T = 16384, 112.0 against 112.4 at 4096; at T <= 512 the token blocks do not cover the rows).
_SCALE_ROWS_PER_TOKEN_BLOCK = 32
# moe_expand zeroes the rows without a slot by bulk copies where the output has more than this many rows a slot.
_BULK_ZERO_ROWS_PER_SLOT = 2
# Expand-cast: a thread casts 16 elements of a token (one 16-byte store of codes per row), loaded as
# element-size 16-byte vectors; PASSES counts its loads (csrc/kernels/smxx_moe_expand_cast.cuh).
_CAST_ELEMENTS_PER_THREAD = 16
# Reduce: 128 threads along a row's vectors, 1 token per block; each thread loads its token's k rows.
_REDUCE_COLUMN_THREADS, _REDUCE_TOKEN_LANES = 128, 1
# CUDA's limit on a grid's y dimension (the reduce grid's token blocks spill into z beyond it).
_GRID_Y_LIMIT = 65535
_LAYOUT_FIELDS = ("counts", "num_rows", "m_indices", "row_to_slot", "slot_to_row")


# ---- geometry and checks ----

def expanded_scale_geometry(num_experts, rows: int, num_groups: int, layout: ScaleLayout) -> tuple:
    """(dtype, shape, strides) of the scales of expanded rows: quant.common.scale_geometry for the contiguous
    layout (num_experts None), else [E, rows, columns] with one such block per expert."""
    dtype, shape, strides = scale_geometry(rows, num_groups, layout)
    if num_experts is None:
        return dtype, shape, strides
    block = shape[1] * (rows if layout == ScaleLayout.row_major else tma_aligned_size(rows, 4))
    return dtype, (num_experts, *shape), (block, *strides)


def _matches(t: torch.Tensor, geometry: tuple) -> bool:
    dtype, shape, strides = geometry
    return t.dtype == dtype and tuple(t.shape) == shape and all(
        size <= 1 or stride == want for size, stride, want in zip(shape, t.stride(), strides))


def _check_geometry(t, name: str, geometry: tuple, layout: ScaleLayout) -> None:
    check_dtype(t, name, (geometry[0],))
    if not _matches(t, geometry):
        raise ValueError(f"{name} must have shape {geometry[1]} with strides {geometry[2]} ({layout.name} scales), "
                         f"got shape {tuple(t.shape)} strides {tuple(t.stride())}")


def _expanded_scale_layout_of(scales, num_experts, rows: int, num_groups: int) -> ScaleLayout:
    """The layout of scales over expanded rows (as expanded_scale_geometry describes), or a clear error."""
    if num_experts is None:
        return scale_layout_of(scales, rows, num_groups)
    check_dtype(scales, "scales", (torch.float32, torch.int32))
    check_rank(scales, "scales", 3)
    # NOTE: with one group the FP32 layouts differ only in the expert stride, so each is tried.
    candidates = (ScaleLayout.packed_ue8m0,) if scales.dtype == torch.int32 else (
        (ScaleLayout.row_major, ScaleLayout.mn_major) if scales.stride(-1) == 1 else
        (ScaleLayout.mn_major, ScaleLayout.row_major))
    for layout in candidates:
        if _matches(scales, expanded_scale_geometry(num_experts, rows, num_groups, layout)):
            return layout
    _check_geometry(scales, "scales", expanded_scale_geometry(num_experts, rows, num_groups, candidates[0]),
                    candidates[0])


def _kernel_strides(geometry: tuple, rows: int) -> tuple:
    """(batch_rows, batch_stride, row_stride, column_stride) of ScaleStrides (csrc/common/moe_rows.cuh)."""
    _, shape, strides = geometry
    if len(shape) == 2:
        return (max(rows, 1), 0, *strides)
    return (rows, *strides)


def _layout_sizes(layout, masked: bool) -> tuple:
    """(T, k, E, max_rows, max_tokens) of a consistent MoeLayout; max_tokens None unless masked."""
    if not isinstance(layout, MoeLayout):
        raise TypeError(f"layout must be a MoeLayout (from moe_layout), got {type(layout).__name__}")
    check_bool(masked, "masked")
    fields = _LAYOUT_FIELDS + (("masked_slots", "masked_m") if masked else ())
    if masked and layout.masked_slots is None:
        raise ValueError("masked=True needs a layout with the masked tensors: moe_layout(..., max_tokens=...)")
    for name in fields:
        t = getattr(layout, name)
        check_dtype(t, f"layout.{name}", (torch.int32,))
        if not t.is_contiguous():
            raise ValueError(f"layout.{name} must be contiguous, got strides {tuple(t.stride())}")
    check_rank(layout.slot_to_row, "layout.slot_to_row", 2)
    check_rank(layout.counts, "layout.counts", 1)
    num_tokens, k = layout.slot_to_row.shape
    num_experts = layout.counts.shape[0]
    max_rows = contiguous_max_rows(num_tokens * k, num_experts)
    expected = {"num_rows": (1,), "m_indices": (max_rows,), "row_to_slot": (max_rows,)}
    max_tokens = None
    if masked:
        check_rank(layout.masked_slots, "layout.masked_slots", 2)
        max_tokens = layout.masked_slots.shape[1]
        expected.update(masked_slots=(num_experts, max_tokens), masked_m=(num_experts,))
    for name, shape in expected.items():
        if tuple(getattr(layout, name).shape) != shape:
            raise ValueError(f"layout.{name} must have shape {shape} for a layout of {num_tokens} tokens, k = {k} "
                             f"and {num_experts} experts, got {tuple(getattr(layout, name).shape)}")
    if not 1 <= k <= MAX_TOP_K:
        raise ValueError(f"layout.slot_to_row.shape[1] (k) must be in [1, {MAX_TOP_K}], got {k}")
    if masked and (max_tokens < 1 or num_experts * max_tokens > INT32_LIMIT):
        raise ValueError(f"layout.masked_slots has an invalid shape {tuple(layout.masked_slots.shape)}")
    return num_tokens, k, num_experts, max_rows, max_tokens


def _check_layout_device(layout, masked: bool, like: torch.Tensor) -> None:
    for name in _LAYOUT_FIELDS + (("masked_slots",) if masked else ()):
        check_cuda_device(getattr(layout, name), f"layout.{name}", like=like)


def _check_x(x, layout, masked: bool, dtypes: tuple) -> tuple:
    check_dtype(x, "x", dtypes)
    check_rank(x, "x", 2)
    sizes = _layout_sizes(layout, masked)
    if x.shape[0] != sizes[0]:
        raise ValueError(f"x has {x.shape[0]} tokens but the layout was built for {sizes[0]}")
    if x.shape[1] * x.element_size() % 16 != 0:
        raise ValueError(f"x rows must be whole 16-byte vectors: H = {x.shape[1]} {x.dtype} elements")
    check_row_major_rows(x, "x")
    return sizes


def _expanded_shape(sizes: tuple, hidden: int, masked: bool) -> tuple:
    _, _, num_experts, max_rows, max_tokens = sizes
    return (num_experts, max_tokens, hidden) if masked else (max_rows, hidden)


def _check_out(t, name: str, shape: tuple, dtype: torch.dtype) -> None:
    """A contiguous, 16-byte aligned output of the given shape and dtype (its device is checked later)."""
    check_dtype(t, name, (dtype,))
    if tuple(t.shape) != shape or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous tensor of shape {shape}, got shape {tuple(t.shape)} "
                         f"strides {tuple(t.stride())}")
    check_aligned(t, name)


def _unpack_out(out, count: int) -> tuple:
    if count == 1:
        return (out,)
    if not isinstance(out, (tuple, list)) or len(out) != count:
        raise TypeError(f"out must be a pair (rows, scales), got {type(out).__name__}")
    return tuple(out)


def _row_slots(layout, masked: bool) -> torch.Tensor:
    return layout.masked_slots if masked else layout.row_to_slot


def _layout_params(layout, masked: bool, num_tokens: int, num_out_rows: int, max_tokens) -> dict:
    """The expand kernels' layout parameters: masked_slots 0 and masked_tokens 0 for the contiguous layout,
    num_rows 0 for the masked one."""
    return dict(slot_to_row=layout.slot_to_row.data_ptr(), m_indices=layout.m_indices.data_ptr(),
                masked_slots=layout.masked_slots.data_ptr() if masked else 0,
                row_slots=_row_slots(layout, masked).data_ptr(), num_rows=0 if masked else layout.num_rows.data_ptr(),
                num_tokens=num_tokens, num_out_rows=num_out_rows, masked_tokens=max_tokens if masked else 0)


def _padding_share(num_out_rows: int, token_blocks: int, columns: int, row_shares: bool, num_sms=None,
                   row_alignment: int = 1, max_share: int = _PADDING_ROWS_PER_BLOCK) -> tuple:
    """(blocks along the token dimension, rows per block) of an expand launch whose grid is that many blocks
    times `columns`: enough blocks for every token, and with row_shares (zero padding, or moe_expand's
    scales) for every row in shares of at most max_share rows (at most 32), spread evenly over all the
    blocks, rounded up to a multiple of row_alignment (a divisor of max_share). Given num_sms, the shares are
    smaller where that gives each SM _PADDING_BLOCKS_PER_SM blocks (a small layout is mostly padding rows)."""
    if not row_shares or num_out_rows == 0:
        return token_blocks, 0
    share = max_share
    if num_sms is not None:
        share = max(1, min(share, ceil_div(num_out_rows, _PADDING_BLOCKS_PER_SM * num_sms)))
    blocks = max(token_blocks, ceil_div(ceil_div(num_out_rows, share), columns))
    share = ceil_div(ceil_div(num_out_rows, blocks * columns), row_alignment) * row_alignment
    return max(token_blocks, ceil_div(ceil_div(num_out_rows, share), columns)), share


# ---- expand ----

MOE_EXPAND = KernelDef(
    "kernels/smxx_moe_expand.cuh", "smxx_moe_expand_impl",
    template=("kTopK", "kColumnThreads", "kTokenLanes", "kVectorsPerThread", "kScaleLoads", "kBulkZero"),
    params=(Param("x", PTR), Param("out", PTR), Param("x_scales", PTR), Param("out_scales", PTR),
            Param("slot_to_row", PTR), Param("m_indices", PTR), Param("masked_slots", PTR), Param("row_slots", PTR),
            Param("num_rows", PTR), Param("num_tokens", U32), Param("num_out_rows", U32), Param("masked_tokens", U32),
            Param("row_vectors", U32), Param("x_row_vectors", U32), Param("rows_per_block", U32),
            Param("zero_padding", U32), Param("scale_columns", U32), Param("x_scale_row_stride", U32),
            Param("x_scale_column_stride", U32), Param("scale_batch_rows", U32), Param("scale_batch_stride", U32),
            Param("scale_column_stride", U32)),
    threads=lambda t: t["kColumnThreads"] * t["kTokenLanes"])


def _expand_spec(k: int, tile: ExpandTile = EXPAND_TILE, bulk_zero: bool = False) -> KernelSpec:
    return MOE_EXPAND.spec(kTopK=k, kColumnThreads=tile.column_threads, kTokenLanes=tile.token_lanes,
                           kVectorsPerThread=tile.vectors, kScaleLoads=tile.scale_loads, kBulkZero=bulk_zero)


@functools.lru_cache(maxsize=None)
def _expand_kernel(k: int, tile: ExpandTile, bulk_zero: bool = False):
    return get_kernel(_expand_spec(k, tile, bulk_zero))


def moe_expand(x: torch.Tensor, layout: MoeLayout, scales: torch.Tensor = None, masked: bool = False,
               zero_padding: bool = True, out=None):
    """Gather token rows into a grouped-GEMM layout: each routed slot gets a copy of its token's row.

    Args:
        x: [T, H] bfloat16, float32 or float8_e4m3fn CUDA tensor; rows contiguous and 16-byte aligned
            (row stride >= H), H * element size a multiple of 16 (and of 128 elements for FP8).
        layout: moe_layout's result for these T tokens (slot s = t * k + j).
        scales: FP8 x only (and then required): its per-token scales of 1 x 128 groups in any layout of
            quant.common (row_major, mn_major or packed_ue8m0).
        masked: False: the contiguous layout [max_rows, H]; True: the masked layout [E, max_tokens, H]
            (the layout must hold the masked tensors).
        zero_padding: write zeros to the rows without a slot (and zero scales); False leaves them unwritten,
            which the grouped GEMM tolerates (rows are independent) and saves most of the traffic at decode.
        out: optional output(s) to write into, shaped, typed and strided as the ones returned.

    Returns:
        The expanded rows (x's dtype, contiguous), or for FP8 x a pair (rows, scales) with the scales in
        mn_major (FP32 x) or packed_ue8m0 (packed x) over the expanded rows (see the module docstring).

    Notes:
        Rows without a slot are zero (scale 0 for FP8) unless zero_padding is False; contiguous rows from
        layout.num_rows on are never written. Each token row is read once and stored to the rows of its slots;
        every output element has one writer: deterministic. No host synchronization or allocation besides
        `out`: CUDA-graph safe.
    """
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.moe_expand(x, layout, scales, masked, zero_padding, out)
    return _expand(EXPAND_TILE, x, layout, scales, masked, zero_padding, out)


def _expand(tile: ExpandTile, x, layout, scales, masked, zero_padding, out):
    """moe_expand (its arguments in order) by the expand kernel of `tile`."""
    sizes = _check_x(x, layout, masked, EXPAND_DTYPES)
    check_bool(zero_padding, "zero_padding")
    num_tokens, k, num_experts, _, max_tokens = sizes
    hidden = x.shape[1]
    shape = _expanded_shape(sizes, hidden, masked)
    num_out_rows = shape[0] * (shape[1] if masked else 1)
    batches, batch_rows = (num_experts, max_tokens) if masked else (None, num_out_rows)
    is_fp8 = x.dtype == torch.float8_e4m3fn
    if is_fp8 != (scales is not None):
        raise ValueError("scales must be given for float8_e4m3fn x, and only then")
    if is_fp8:
        if hidden % GROUP_SIZE != 0:
            raise ValueError(f"x.shape[1] (H = {hidden}) must be a multiple of {GROUP_SIZE} for FP8 x")
        num_groups = hidden // GROUP_SIZE
        x_layout = scale_layout_of(scales, num_tokens, num_groups)
        out_layout = ScaleLayout.packed_ue8m0 if x_layout == ScaleLayout.packed_ue8m0 else ScaleLayout.mn_major
        out_geometry = expanded_scale_geometry(batches, batch_rows, num_groups, out_layout)
    if out is not None:
        given = _unpack_out(out, 2 if is_fp8 else 1)
        _check_out(given[0], "out[0]" if is_fp8 else "out", shape, x.dtype)
        if is_fp8:
            _check_geometry(given[1], "out[1]", out_geometry, out_layout)
        check_no_overlap([("out[0]" if is_fp8 else "out", given[0])] + ([("out[1]", given[1])] if is_fp8 else []),
                         [("x", x)] + ([("scales", scales)] if is_fp8 else []), "out and the inputs")
    check_cuda_device(x, "x")
    _check_layout_device(layout, masked, x)
    if is_fp8:
        check_cuda_device(scales, "scales", like=x)
    if out is not None:
        for i, t in enumerate(given):
            check_cuda_device(t, f"out[{i}]" if is_fp8 else "out", like=x)

    if out is None:
        given = (x.new_empty(shape),)
        if is_fp8:
            given += (x.new_empty_strided(out_geometry[1], out_geometry[2], dtype=out_geometry[0]),)
    rows, out_scales = given if is_fp8 else (given[0], None)
    result = (rows, out_scales) if is_fp8 else rows
    if num_out_rows == 0 or hidden == 0:
        return result

    row_vectors = hidden * x.element_size() // 16
    scale_params = dict(scale_columns=0, x_scale_row_stride=0, x_scale_column_stride=0, scale_batch_rows=1,
                        scale_batch_stride=0, scale_column_stride=0)
    if is_fp8:
        x_strides = (num_groups, 1) if x_layout == ScaleLayout.row_major else (1, scales.stride(1))
        batch_rows_arg, batch_stride, _, column_stride = _kernel_strides(out_geometry, batch_rows)
        scale_params = dict(scale_columns=scales.shape[1], x_scale_row_stride=x_strides[0],
                            x_scale_column_stride=x_strides[1], scale_batch_rows=batch_rows_arg,
                            scale_batch_stride=batch_stride, scale_column_stride=column_stride)
    chunks = ceil_div(row_vectors, tile.chunk_vectors)
    token_blocks = ceil_div(num_tokens, tile.token_lanes)
    # NOTE: scales are written by row shares (csrc/kernels/smxx_moe_expand.cuh says why), so FP8 always has them.
    max_share = _PADDING_ROWS_PER_BLOCK
    if is_fp8 and token_blocks * chunks * _SCALE_ROWS_PER_TOKEN_BLOCK >= num_out_rows:
        max_share = _SCALE_ROWS_PER_TOKEN_BLOCK
    blocks, rows_per_block = _padding_share(num_out_rows, token_blocks, chunks, zero_padding or is_fp8, get_num_sms(),
                                            SCALE_SHARE_ROW_ALIGNMENT if is_fp8 else 1, max_share)
    if blocks == 0:
        return result
    # NOTE: where rows without a slot are most of the output (decode), bulk copies of a zeroed shared-memory row
    # write them faster (H200, bf16: 90 -> 94% of copy bandwidth at T = 128, 92 -> 95% at 512); at T >= 4096 the
    # threads' stores are 1-2% faster.
    bulk_zero = zero_padding and num_out_rows > _BULK_ZERO_ROWS_PER_SLOT * num_tokens * k
    _expand_kernel(k, tile, bulk_zero).launch(
        (blocks, chunks, 1), x.get_device(), x=x.data_ptr(), out=rows.data_ptr(),
        x_scales=scales.data_ptr() if is_fp8 else 0, out_scales=out_scales.data_ptr() if is_fp8 else 0,
        **_layout_params(layout, masked, num_tokens, num_out_rows, max_tokens), row_vectors=row_vectors,
        x_row_vectors=x.stride(0) * x.element_size() // 16, rows_per_block=rows_per_block,
        zero_padding=int(zero_padding), **scale_params)
    return result


# ---- fused expand + per-token FP8 cast ----

def _cast_block_tokens(dtype: torch.dtype) -> int:
    """Tokens of one expand-cast block: the kernel's TokenGroupTile::BLOCK_ROWS."""
    lanes_per_group = GROUP_SIZE // _CAST_ELEMENTS_PER_THREAD
    return 32 // lanes_per_group * NUM_WARPS * (PASSES * (16 // dtype.itemsize) // _CAST_ELEMENTS_PER_THREAD)


MOE_EXPAND_CAST = KernelDef(
    "kernels/smxx_moe_expand_cast.cuh", "smxx_moe_expand_cast_impl",
    template=("InT", "kTopK", "GROUP_SIZE", "kUE8M0", "kPackedScales", "kScaleMode", "kNumWarps", "kPasses"),
    params=(Param("x", PTR), Param("q", PTR), Param("scales", PTR), Param("slot_to_row", PTR),
            Param("m_indices", PTR), Param("masked_slots", PTR), Param("row_slots", PTR), Param("num_rows", PTR),
            Param("num_tokens", U32), Param("num_out_rows", U32), Param("masked_tokens", U32), Param("shape_k", U32),
            Param("x_row_stride", U32), Param("zero_rows_per_block", U32), Param("scale_batch_rows", U32),
            Param("scale_batch_stride", U32), Param("scale_row_stride", U32), Param("scale_column_stride", U32),
            Param("amax_clamp", F32)),
    threads=lambda t: t["kNumWarps"] * 32)


def _expand_cast_spec(dtype: torch.dtype, k: int, ue8m0: bool, layout: ScaleLayout, mode: ScaleMode) -> KernelSpec:
    return MOE_EXPAND_CAST.spec(InT=dtype, kTopK=k, GROUP_SIZE=GROUP_SIZE, kUE8M0=ue8m0,
                                kPackedScales=layout == ScaleLayout.packed_ue8m0, kScaleMode=mode, kNumWarps=NUM_WARPS,
                                kPasses=PASSES)


@functools.lru_cache(maxsize=None)
def _expand_cast_kernel(dtype: torch.dtype, k: int, ue8m0: bool, layout: ScaleLayout, mode: ScaleMode):
    return get_kernel(_expand_cast_spec(dtype, k, ue8m0, layout, mode))


def _scale_stride_params(geometry: tuple, rows: int) -> dict:
    """_kernel_strides as the kernels' ScaleStrides parameters."""
    batch_rows, batch_stride, row_stride, column_stride = _kernel_strides(geometry, rows)
    return dict(scale_batch_rows=batch_rows, scale_batch_stride=batch_stride, scale_row_stride=row_stride,
                scale_column_stride=column_stride)


def moe_expand_cast_to_fp8(x: torch.Tensor, layout: MoeLayout, masked: bool = False, ue8m0: bool = False,
                           scale_layout: str = "mn_major", amax_clamp: float = DEFAULT_AMAX_CLAMP,
                           scale_mode: str = "mul", zero_padding: bool = True, out=None):
    """moe_expand of x fused with per_token_cast_to_fp8 (1 x 128 groups) of the expanded rows.

    Args:
        x: [T, H] bfloat16 or float32 CUDA tensor, H a multiple of 128; rows contiguous and 16-byte aligned.
        layout: moe_layout's result for these T tokens.
        masked: False: the contiguous layout [max_rows, H]; True: the masked layout [E, max_tokens, H].
        ue8m0, scale_layout, amax_clamp, scale_mode: as for per_token_cast_to_fp8.
        zero_padding: as for moe_expand: False leaves the rows without a slot (codes and scales) unwritten.
        out: optional (q, scales) to write into, shaped, typed and strided as the ones returned.

    Returns:
        (q, scales): q float8_e4m3fn, contiguous, shaped as moe_expand's rows; scales in `scale_layout` over
        the expanded rows (the module docstring).

    Notes:
        Bit-exact with per_token_cast_to_fp8(moe_expand(x, layout, masked=masked)) of the reference: rows
        without a slot are zero rows (codes 0, scale amax_clamp / 448 or its UE8M0 rounding); contiguous rows
        from layout.num_rows on are not written. Each token is read and cast once, its codes and scales stored
        to the rows of its slots; every output element has one writer: deterministic. CUDA-graph safe.
    """
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.moe_expand_cast_to_fp8(x, layout, masked, ue8m0, scale_layout, amax_clamp, scale_mode, zero_padding,
                                          out)
    sizes = _check_x(x, layout, masked, CAST_DTYPES)
    check_bool(zero_padding, "zero_padding")
    num_tokens, k, num_experts, _, max_tokens = sizes
    hidden = x.shape[1]
    if hidden % GROUP_SIZE != 0:
        raise ValueError(f"x.shape[1] (H = {hidden}) must be a multiple of the group size {GROUP_SIZE}")
    layout_kind = parse_layout(scale_layout, ue8m0)
    mode = parse_scale_mode(scale_mode, ue8m0)
    check_amax_clamp(amax_clamp)
    shape = _expanded_shape(sizes, hidden, masked)
    num_out_rows = shape[0] * (shape[1] if masked else 1)
    num_groups = hidden // GROUP_SIZE
    token_blocks = ceil_div(num_tokens, _cast_block_tokens(x.dtype))
    # NOTE: the launch's shares (for the SM count) are smaller only where the rows then come to
    # _PADDING_BLOCKS_PER_SM blocks per SM, far below the limit: the largest shares decide it.
    if _padding_share(num_out_rows, token_blocks, max(num_groups, 1), zero_padding)[0] > MAX_ROW_BLOCKS:
        raise ValueError(f"the layout has too many rows ({num_out_rows}) or tokens ({num_tokens}) for one launch: "
                         "split the tokens")
    batches, batch_rows = (num_experts, max_tokens) if masked else (None, num_out_rows)
    geometry = expanded_scale_geometry(batches, batch_rows, num_groups, layout_kind)
    if out is not None:
        q, scales = _unpack_out(out, 2)
        _check_out(q, "out[0]", shape, torch.float8_e4m3fn)
        _check_geometry(scales, "out[1]", geometry, layout_kind)
        check_no_overlap([("out[0]", q), ("out[1]", scales)], [("x", x)], "out and the inputs")
    check_cuda_device(x, "x")
    _check_layout_device(layout, masked, x)
    if out is None:
        q = x.new_empty(shape, dtype=torch.float8_e4m3fn)
        scales = x.new_empty_strided(geometry[1], geometry[2], dtype=geometry[0])
    else:
        check_cuda_device(q, "out[0]", like=x)
        check_cuda_device(scales, "out[1]", like=x)
    if num_out_rows == 0 or hidden == 0:
        return q, scales
    row_blocks, padding_rows = _padding_share(num_out_rows, token_blocks, num_groups, zero_padding, get_num_sms())
    if row_blocks == 0:  # no tokens, and no padding rows to write
        return q, scales

    kernel = _expand_cast_kernel(x.dtype, k, ue8m0, layout_kind, mode)
    kernel.launch(
        (num_groups, row_blocks, 1), x.get_device(), x=x.data_ptr(), q=q.data_ptr(), scales=scales.data_ptr(),
        **_layout_params(layout, masked, num_tokens, num_out_rows, max_tokens), shape_k=hidden,
        x_row_stride=x.stride(0), zero_rows_per_block=padding_rows, **_scale_stride_params(geometry, batch_rows),
        amax_clamp=float(amax_clamp))
    return q, scales


# ---- reduce ----

MOE_REDUCE = KernelDef(
    "kernels/smxx_moe_reduce.cuh", "smxx_moe_reduce_impl",
    template=("InT", "OutT", "kTopK", "GROUP_SIZE", "kPackedScales", "kColumnThreads", "kTokenLanes"),
    params=(Param("y", PTR), Param("y_scales", PTR), Param("weights", PTR), Param("slot_to_row", PTR),
            Param("m_indices", PTR), Param("masked_slots", PTR), Param("out", PTR), Param("num_tokens", U32),
            Param("row_vectors", U32), Param("masked_tokens", U32), Param("scale_batch_rows", U32),
            Param("scale_batch_stride", U32), Param("scale_row_stride", U32), Param("scale_column_stride", U32)),
    threads=lambda t: t["kColumnThreads"] * t["kTokenLanes"])


def _reduce_spec(in_dtype: torch.dtype, out_dtype: torch.dtype, k: int, packed: bool) -> KernelSpec:
    return MOE_REDUCE.spec(InT=in_dtype, OutT=out_dtype, kTopK=k, GROUP_SIZE=GROUP_SIZE, kPackedScales=packed,
                           kColumnThreads=_REDUCE_COLUMN_THREADS, kTokenLanes=_REDUCE_TOKEN_LANES)


@functools.lru_cache(maxsize=None)
def _reduce_kernel(in_dtype: torch.dtype, out_dtype: torch.dtype, k: int, packed: bool):
    return get_kernel(_reduce_spec(in_dtype, out_dtype, k, packed))


def moe_reduce(y: torch.Tensor, layout: MoeLayout, weights: torch.Tensor, scales: torch.Tensor = None,
               masked: bool = False, out_dtype: torch.dtype = torch.bfloat16, out: torch.Tensor = None) -> torch.Tensor:
    """Combine each token's expert rows: out[t] = sum over j of weights[t, j] * y[row of slot t * k + j].

    Args:
        y: the grouped GEMM's rows, contiguous: [max_rows, H] (contiguous layout) or [E, max_tokens, H]
            (masked); bfloat16, float32, or float8_e4m3fn with `scales` (H a multiple of 128).
        layout: the moe_layout that placed the slots (the one moe_expand used).
        weights: [T, k] float32 CUDA tensor, contiguous (topk_gate's weights).
        scales: FP8 y only (and then required): per-row scales of 1 x 128 groups over y's rows, in any
            layout of quant.common (masked: batched per expert, see the module docstring).
        masked: whether y is in the masked layout; slots that did not fit in max_tokens are then skipped.
        out_dtype: torch.bfloat16 or torch.float32.
        out: optional contiguous [T, H] tensor of out_dtype to write into.

    Returns:
        out [T, H] of out_dtype.

    Notes:
        FP32 in slot order without fused multiply-adds: acc = 0; for each kept slot j: acc = acc + w_j * v_j
        with v_j = y (or float(q) * scale for FP8); out = RNE(acc). A token with no kept slot gets zeros.
        One thread per output vector, no atomics: deterministic. CUDA-graph safe.
    """
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.moe_reduce(y, layout, weights, scales, masked, out_dtype, out)
    check_dtype(y, "y", REDUCE_DTYPES)
    sizes = _layout_sizes(layout, masked)
    num_tokens, k, num_experts, max_rows, max_tokens = sizes
    check_rank(y, "y", 3 if masked else 2)
    hidden = y.shape[-1]
    if tuple(y.shape) != _expanded_shape(sizes, hidden, masked):
        raise ValueError(f"y must have shape {_expanded_shape(sizes, hidden, masked)} for this layout "
                         f"(masked={masked}), got {tuple(y.shape)}")
    if not y.is_contiguous():
        raise ValueError(f"y must be contiguous, got strides {tuple(y.stride())}")
    if hidden * y.element_size() % 16 != 0 or y.data_ptr() % 16 != 0:
        raise ValueError(f"y rows must be whole 16-byte vectors at a 16-byte aligned address: H = {hidden} {y.dtype}")
    check_dtype(weights, "weights", (torch.float32,))
    if tuple(weights.shape) != (num_tokens, k) or not weights.is_contiguous():
        raise ValueError(f"weights must be a contiguous tensor of shape {(num_tokens, k)}, got shape "
                         f"{tuple(weights.shape)} strides {tuple(weights.stride())}")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be torch.bfloat16 or torch.float32, got {out_dtype}")
    is_fp8 = y.dtype == torch.float8_e4m3fn
    if is_fp8 != (scales is not None):
        raise ValueError("scales must be given for float8_e4m3fn y, and only then")
    batches, batch_rows = (num_experts, max_tokens) if masked else (None, max_rows)
    scale_params = dict(scale_batch_rows=1, scale_batch_stride=0, scale_row_stride=0, scale_column_stride=0)
    if is_fp8:
        if hidden % GROUP_SIZE != 0:
            raise ValueError(f"y.shape[-1] (H = {hidden}) must be a multiple of {GROUP_SIZE} for FP8 y")
        y_layout = _expanded_scale_layout_of(scales, batches, batch_rows, hidden // GROUP_SIZE)
        geometry = expanded_scale_geometry(batches, batch_rows, hidden // GROUP_SIZE, y_layout)
        scale_params = _scale_stride_params(geometry, batch_rows)
    if out is not None:
        _check_out(out, "out", (num_tokens, hidden), out_dtype)
        check_no_overlap([("out", out)], [("y", y), ("weights", weights)] + ([("scales", scales)] if is_fp8 else []),
                         "out and the inputs")
    check_cuda_device(y, "y")
    check_cuda_device(weights, "weights", like=y)
    _check_layout_device(layout, masked, y)
    if is_fp8:
        check_cuda_device(scales, "scales", like=y)
    if out is None:
        out = y.new_empty((num_tokens, hidden), dtype=out_dtype)
    else:
        check_cuda_device(out, "out", like=y)
    if num_tokens == 0 or hidden == 0:
        return out

    kernel = _reduce_kernel(y.dtype, out_dtype, k, is_fp8 and y_layout == ScaleLayout.packed_ue8m0)
    row_vectors = hidden * y.element_size() // 16
    token_blocks = ceil_div(num_tokens, _REDUCE_TOKEN_LANES)
    grid_y = min(token_blocks, _GRID_Y_LIMIT)
    grid = (ceil_div(row_vectors, _REDUCE_COLUMN_THREADS), grid_y, ceil_div(token_blocks, grid_y))
    kernel.launch(
        grid, y.get_device(), y=y.data_ptr(), y_scales=scales.data_ptr() if is_fp8 else 0, weights=weights.data_ptr(),
        slot_to_row=layout.slot_to_row.data_ptr(), m_indices=layout.m_indices.data_ptr(),
        masked_slots=layout.masked_slots.data_ptr() if masked else 0, out=out.data_ptr(), num_tokens=num_tokens,
        row_vectors=row_vectors, masked_tokens=max_tokens if masked else 0, **scale_params)
    return out


@precompiled
def precompile_specs() -> list:
    """The specializations `python -m deep_kernels precompile` builds for this module."""
    specs = [_expand_spec(k, EXPAND_TILE, bulk_zero) for k in (1, 6, 8) for bulk_zero in (False, True)]
    for dtype in CAST_DTYPES:
        for ue8m0, layout, mode in ((False, ScaleLayout.mn_major, ScaleMode.mul),
                                    (False, ScaleLayout.mn_major, ScaleMode.div),
                                    (True, ScaleLayout.mn_major, ScaleMode.mul),
                                    (True, ScaleLayout.packed_ue8m0, ScaleMode.mul)):
            specs.append(_expand_cast_spec(dtype, 8, ue8m0, layout, mode))
    specs.extend(_expand_cast_spec(torch.bfloat16, k, False, ScaleLayout.mn_major, ScaleMode.mul) for k in (1, 6))
    for in_dtype, packed in ((torch.bfloat16, False), (torch.float32, False), (torch.float8_e4m3fn, False),
                             (torch.float8_e4m3fn, True)):
        for out_dtype in OUT_DTYPES:
            specs.append(_reduce_spec(in_dtype, out_dtype, 8, packed))
    specs.extend(_reduce_spec(torch.bfloat16, torch.bfloat16, k, False) for k in (1, 6))
    return specs
