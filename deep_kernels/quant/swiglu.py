"""SwiGLU fused with the per-token FP8 cast (forward, plain and masked layouts) and its backward.

Numerics (bit-exact with deep_kernels.reference.quant.swiglu when the reference runs on the GPU), per
element in FP32, every step one IEEE operation (no fused multiply-add):
    gc = min(gate, c), uc = max(min(up, c), -c)     c = clamp (None: no clamp); NaN propagates
    silu(gc) = gc / (1 + expf(-gc))                  CUDA's expf (torch.exp on the GPU calls it too)
    y = (silu(gc) * uc) * w                          w = the row's weight (no product without weights)
then y is cast per token to e4m3 in 1x128 groups exactly as per_token_cast_to_fp8 casts an FP32 input
(see deep_kernels.quant.fp8), or rounded to bf16 (swiglu_forward). IEEE special values follow the formula: a
gate of -inf gives silu = -inf / inf = NaN (as torch.nn.functional.silu does), +inf gives inf; a clamp
maps +inf gates and +-inf ups to +-c. A NaN or inf y affects its group as in per_token_cast_to_fp8.
Backward (swiglu_backward), with e = expf(-gc), d = 1 + e, s = 1 / d, dyw = dy * w:
    dgate = (dyw * uc) * (s * (1 + gc * (1 - s))), zero where gate > c
    dup = dyw * (gc / d), zero where up > c or up < -c
    dweights = sum over H of dy * (silu(gc) * uc), in the fixed order of csrc/kernels/smxx_swiglu_backward.cuh
The clamp's gradient is zero where the clamp changed the value, one elsewhere (NaN inputs propagate).
expf is accurate to 2 ulp but not correctly rounded, so torch.exp on the CPU may differ from it in the
last bit: the reference matches the kernels bit for bit only when evaluated on the GPU.

Rows: `weights` (FP32) gives each row a weight, weights.view(-1)[pos[row]] with a position map `pos`
(int32, e.g. MoeLayout.row_to_slot), else weights.view(-1)[row]. A row whose position is -1 (padding) is
SKIPPED: not read, and its outputs (codes, scales, y, dx, dweights) are not written, keeping whatever `out`
held. The masked layout x [E, T_max, 2H] skips rows t >= masked_m[e] in the same way.
"""

import functools
import struct
from dataclasses import dataclass

import torch

from deep_kernels.device import get_num_sms
from deep_kernels.jit.definition import F32, PTR, U32, KernelDef, Param
from deep_kernels.jit.registry import precompiled
from deep_kernels.jit.runtime import get_kernel
from deep_kernels.jit.source import KernelSpec
from deep_kernels.quant.common import (
    DEFAULT_AMAX_CLAMP, MAX_ROW_BLOCKS, NUM_WARPS, ScaleLayout, ScaleMode, check_amax_clamp, check_output,
    check_scale_geometry, check_vector_output, kernel_scale_stride, parse_layout, parse_scale_mode, scale_geometry,
)
from deep_kernels.validation import (
    INT32_LIMIT, ceil_div, check_bool, check_cuda_device, check_dtype, check_fp32_number, check_rank,
    check_row_major_rows, is_traced,
)

GROUP_SIZE = 128
# Positions are int32: without weights every non-negative one selects its row.
NO_POSITION_LIMIT = INT32_LIMIT + 1
UINT32_LIMIT = 2**32 - 1
_BACKWARD_WARPS = 8


@dataclass(frozen=True)
class ForwardConfig:
    """The structure of the forward kernel (csrc/kernels/smxx_swiglu_cast.cuh's template arguments): every
    structure gives the same bytes. The API runs FORWARD; scripts/bench_swiglu_variants.py times others.

    rows_per_warp: the rows a warp's lanes cover in a pass (4: one group of each, 1: 4 groups of one row, so
    that a row's gates decide alone whether the warp takes the fallback); passes: rows a thread takes;
    in_flight: passes whose loads are issued up front, each finished pass then issuing the loads of the pass
    in_flight further (None: all passes); range_check: silu by the fast steps (common/swiglu.cuh's fast_silu),
    and by the scaled ones (exact for every bf16 gate, twice the instructions) for a thread's 8 gates of a row
    when one is below 2^-20 in magnitude, inf or NaN; without it the scaled steps for every gate; min_blocks: the
    blocks per SM the launch bounds ask for (a register cap), 0 for none; num_warps: warps of a block.
    """
    rows_per_warp: int = 1
    passes: int = 2
    in_flight: int = None
    range_check: bool = True
    min_blocks: int = 0
    num_warps: int = NUM_WARPS

    def __post_init__(self):
        if self.in_flight is None:
            object.__setattr__(self, "in_flight", self.passes)

    @property
    def block_rows(self) -> int:
        """Rows of a block: a warp covers rows_per_warp rows a pass."""
        return self.rows_per_warp * self.num_warps * self.passes

    @property
    def block_columns(self) -> int:
        """Columns of y a block covers: 16 per thread, 32 // rows_per_warp threads a row."""
        return 16 * 32 // self.rows_per_warp


@dataclass(frozen=True)
class BackwardConfig:
    """The structure of the backward kernel (csrc/kernels/smxx_swiglu_backward.cuh's template arguments): every
    structure gives the same bytes. chunks_ahead: 256-column chunks a warp's loads run ahead of its computation;
    min_blocks: the blocks per SM the launch bounds ask for (a register cap)."""
    chunks_ahead: int = 1
    min_blocks: int = 4


# The structures the API runs, the fastest measured (scripts/bench_swiglu_variants.py). Forward: one row per warp
# pass, so that a row of large gates sends only its own warp down the scaled steps, and two passes of loads in
# flight with no register cap (under a tight one the float-clamp path, which keeps the bf16 pairs, spills).
# Backward: one chunk of loads ahead at 4 blocks per SM (two chunks ahead need a 3-block cap, and the fewer warps
# per SM cost more than the loads ahead gain).
FORWARD = ForwardConfig()
BACKWARD = BackwardConfig()
# Forward, when FORWARD's grid would leave SMs idle (decode: a few hundred rows): one row a thread and 4 warps a
# block, so that the rows spread over 4x the blocks and each thread's chain of loads and math is half as long.
FEW_ROWS_FORWARD = ForwardConfig(passes=1, num_warps=4)


def forward_config(num_rows: int, hidden: int) -> ForwardConfig:
    """The structure swiglu_cast_to_fp8 runs for x [num_rows, 2 * hidden]: FORWARD, or FEW_ROWS_FORWARD where
    FORWARD's grid has fewer blocks than the device has SMs."""
    blocks = ceil_div(hidden, FORWARD.block_columns) * ceil_div(num_rows, FORWARD.block_rows)
    return FEW_ROWS_FORWARD if blocks < get_num_sms() else FORWARD


SWIGLU_CAST = KernelDef(
    "kernels/smxx_swiglu_cast.cuh", "smxx_swiglu_cast_impl",
    template=("kNumWarps", "kRowsPerWarp", "kPasses", "kPassesInFlight", "kRangeCheck", "kMinBlocks", "kClamped",
              "kBf16Clamp", "kQuantize", "kUE8M0", "kLayout", "kScaleMode"),
    params=(Param("x", PTR), Param("out", PTR), Param("scales", PTR), Param("weights", PTR), Param("pos", PTR),
            Param("masked_m", PTR), Param("num_rows", U32), Param("hidden", U32), Param("x_row_stride", U32),
            Param("scale_stride", U32), Param("scale_expert_stride", U32), Param("pos_limit", U32),
            Param("clamp", F32), Param("amax_clamp", F32)),
    threads=lambda t: t["kNumWarps"] * 32)


def _forward_spec(config: ForwardConfig, clamped: bool, quantize: bool, ue8m0: bool = False,
                  layout: ScaleLayout = ScaleLayout.mn_major, mode: ScaleMode = ScaleMode.mul,
                  bf16_clamp: bool = False) -> KernelSpec:
    """bf16_clamp: the clamp is a bf16 value, so the kernel clamps the loaded bf16 pairs (fewer instructions)."""
    return SWIGLU_CAST.spec(kNumWarps=config.num_warps, kRowsPerWarp=config.rows_per_warp, kPasses=config.passes,
                            kPassesInFlight=config.in_flight, kRangeCheck=bool(config.range_check),
                            kMinBlocks=config.min_blocks, kClamped=clamped, kBf16Clamp=bf16_clamp, kQuantize=quantize,
                            kUE8M0=ue8m0, kLayout=layout, kScaleMode=mode)


@functools.lru_cache(maxsize=None)
def _forward_kernel(config: ForwardConfig, clamped: bool, quantize: bool, ue8m0: bool = False,
                    layout: ScaleLayout = ScaleLayout.mn_major, mode: ScaleMode = ScaleMode.mul,
                    bf16_clamp: bool = False):
    return get_kernel(_forward_spec(config, clamped, quantize, ue8m0, layout, mode, bf16_clamp))


def _is_bf16(value: float) -> bool:
    """Whether bf16 holds value exactly: an FP32 value whose low 16 bits are zero. (Plain arithmetic: this runs
    on every clamped launch, where a tensor round trip would cost microseconds.)"""
    try:
        bits, = struct.unpack("<I", struct.pack("<f", value))
    except OverflowError:  # beyond FP32's range
        return False
    return bits & 0xFFFF == 0 and struct.unpack("<f", struct.pack("<I", bits))[0] == value


SWIGLU_BACKWARD = KernelDef(
    "kernels/smxx_swiglu_backward.cuh", "smxx_swiglu_backward_impl",
    template=("kNumWarps", "kChunksAhead", "kMinBlocks", "kClamped"),
    params=(Param("x", PTR), Param("dy", PTR), Param("dx", PTR), Param("dweights", PTR), Param("weights", PTR),
            Param("pos", PTR), Param("num_rows", U32), Param("hidden", U32), Param("x_row_stride", U32),
            Param("dy_row_stride", U32), Param("pos_limit", U32), Param("clamp", F32)),
    threads=lambda t: t["kNumWarps"] * 32)


def _backward_spec(config: BackwardConfig, clamped: bool) -> KernelSpec:
    return SWIGLU_BACKWARD.spec(kNumWarps=_BACKWARD_WARPS, kChunksAhead=config.chunks_ahead,
                                kMinBlocks=config.min_blocks, kClamped=clamped)


@functools.lru_cache(maxsize=None)
def _backward_kernel(config: BackwardConfig, clamped: bool):
    return get_kernel(_backward_spec(config, clamped))


def _check_x(x, rank: int) -> int:
    """x is bf16 of `rank` dimensions, [..., 2H] with H a multiple of 128; returns H."""
    check_dtype(x, "x", (torch.bfloat16,))
    check_rank(x, "x", rank)
    width = x.shape[-1]
    if width % (2 * GROUP_SIZE) != 0:
        raise ValueError(f"x.shape[-1] (2H = {width}) must be 2H with H a multiple of {GROUP_SIZE} "
                         f"(gate and up halves of whole 1x{GROUP_SIZE} groups)")
    return width // 2


def _check_row_blocks(num_rows: int, config: ForwardConfig) -> None:
    if ceil_div(num_rows, config.block_rows) > MAX_ROW_BLOCKS:
        raise ValueError(f"x has too many rows ({num_rows}) for one launch: split it")


def _check_rows_layout(t: torch.Tensor, name: str) -> None:
    """check_row_major_rows, and a row stride the kernels' uint32 parameter holds."""
    check_row_major_rows(t, name)
    if t.shape[0] > 1 and t.stride(0) > UINT32_LIMIT:
        raise ValueError(f"{name}'s row stride ({t.stride(0)}) is too large for one launch: at most {UINT32_LIMIT}")


def _check_clamp(clamp) -> float:
    """The clamp as the kernels take it (unused by the unclamped kernels: inf for None)."""
    if clamp is None:
        return float("inf")
    try:
        return check_fp32_number(clamp, "clamp", positive=True)
    except ValueError:
        raise ValueError(f"clamp must be None or a positive finite FP32 number, got {clamp!r}") from None


def _check_rows(weights, pos, rows_shape: tuple, check_pos: bool) -> int:
    """weights and pos fit rows of rows_shape; returns the bound positions must stay below."""
    check_bool(check_pos, "check_pos")
    num_rows = 1
    for size in rows_shape:
        num_rows *= size
    limit = NO_POSITION_LIMIT
    if weights is not None:
        check_dtype(weights, "weights", (torch.float32,))
        if not weights.is_contiguous():
            raise ValueError(f"weights must be contiguous, got strides {tuple(weights.stride())}")
        if weights.numel() > INT32_LIMIT:
            raise ValueError(f"weights has too many elements ({weights.numel()}) for int32 positions")
        if pos is None and weights.numel() != num_rows:
            raise ValueError(f"weights must hold one weight per row ({num_rows}) without pos, "
                             f"got shape {tuple(weights.shape)}")
        limit = weights.numel()
    if pos is not None:
        check_dtype(pos, "pos", (torch.int32,))
        if tuple(pos.shape) != tuple(rows_shape) or not pos.is_contiguous():
            raise ValueError(f"pos must be a contiguous tensor of shape {tuple(rows_shape)} (one position per "
                             f"row), got shape {tuple(pos.shape)} strides {tuple(pos.stride())}")
        if check_pos and not (pos.is_cuda and torch.cuda.is_current_stream_capturing()) and pos.numel():
            # NOTE: no comparison with NO_POSITION_LIMIT, which int32 cannot hold (torch would wrap it).
            bad = ((pos < -1) | (pos >= limit) if weights is not None else pos < -1).view(-1).nonzero()
            if bad.numel():
                row = int(bad[0])
                raise ValueError(f"pos must hold -1 (a skipped row) or positions in [0, {limit}), got "
                                 f"{int(pos.view(-1)[row])} for row {row}")
    return limit


def _check_forward_rows(x, clamp, weights, pos, check_pos: bool, config: ForwardConfig) -> tuple:
    """The checks of a plain-layout forward's x, clamp, weights and pos: (N, H, the kernels' clamp, the
    position bound)."""
    hidden = _check_x(x, 2)
    num_rows = x.shape[0]
    _check_row_blocks(num_rows, config)
    _check_rows_layout(x, "x")
    return num_rows, hidden, _check_clamp(clamp), _check_rows(weights, pos, (num_rows,), check_pos)


def _check_devices(x: torch.Tensor, **tensors) -> None:
    check_cuda_device(x, "x")
    for name, t in tensors.items():
        if t is not None:
            check_cuda_device(t, name, like=x)


def _pointer(t) -> int:
    return 0 if t is None else t.data_ptr()


def _masked_scale_geometry(num_experts: int, max_tokens: int, num_groups: int, layout: ScaleLayout) -> tuple:
    """(dtype, shape, strides) of masked-layout scales: expert e's [T_max, G] block is laid out as
    per_token_cast_to_fp8 lays out the scales of T_max rows, and the blocks follow one another."""
    dtype, shape, strides = scale_geometry(max_tokens, num_groups, layout)
    expert_stride = shape[0] * shape[1] if layout == ScaleLayout.row_major else shape[1] * strides[1]
    return dtype, (num_experts, *shape), (expert_stride, *strides)


def empty_masked_scales(num_experts: int, max_tokens: int, num_groups: int, layout: ScaleLayout,
                        like: torch.Tensor) -> torch.Tensor:
    """Uninitialised masked-layout scales [E, T_max, G] (see _masked_scale_geometry), on like's device."""
    dtype, shape, strides = _masked_scale_geometry(num_experts, max_tokens, num_groups, layout)
    return like.new_empty_strided(shape, strides, dtype=dtype)


def _check_scales_out(scales, geometry: tuple, layout: ScaleLayout, like: torch.Tensor) -> None:
    check_scale_geometry(scales, "out[1]", geometry, layout)
    check_cuda_device(scales, "out[1]", like=like)


def _launch_forward(x, out, scales, weights, pos, masked_m, num_experts: int, num_rows: int, hidden: int,
                    quantize: bool, ue8m0: bool, layout: ScaleLayout, mode: ScaleMode, geometry, limit: int,
                    clamp: float, amax_clamp: float, config: ForwardConfig) -> None:
    clamped = clamp != float("inf")
    bf16_clamp = clamped and _is_bf16(clamp)
    kernel = (_forward_kernel(config, clamped, quantize, ue8m0, layout, mode, bf16_clamp) if quantize
              else _forward_kernel(config, clamped, False, bf16_clamp=bf16_clamp))
    scale_stride = scale_expert_stride = 0
    if quantize:
        _, _, strides = geometry
        # Packed scales are addressed in bytes: four per int32 word.
        bytes_per_unit = 4 if layout == ScaleLayout.packed_ue8m0 else 1
        scale_stride = kernel_scale_stride(scales, layout)
        scale_expert_stride = strides[0] * bytes_per_unit if len(strides) == 3 else 0
    grid = (ceil_div(hidden, config.block_columns), ceil_div(num_rows, config.block_rows), num_experts)
    kernel.launch(grid, x.get_device(), x=x.data_ptr(), out=out.data_ptr(), scales=_pointer(scales),
                  weights=_pointer(weights), pos=_pointer(pos), masked_m=_pointer(masked_m), num_rows=num_rows,
                  hidden=hidden, x_row_stride=x.stride(0), scale_stride=scale_stride,
                  scale_expert_stride=scale_expert_stride, pos_limit=limit, clamp=clamp, amax_clamp=float(amax_clamp))


def swiglu_cast_to_fp8(x: torch.Tensor, clamp: float = None, weights: torch.Tensor = None, pos: torch.Tensor = None,
                       ue8m0: bool = False, scale_layout: str = "mn_major", amax_clamp: float = DEFAULT_AMAX_CLAMP,
                       scale_mode: str = "mul", check_pos: bool = True, out=None):
    """y = silu(min(gate, c)) * clamp(up, -c, c) * w of x = [gate | up], cast per token to FP8 e4m3.

    Args:
        x: [N, 2H] bfloat16 CUDA tensor (gate columns [0, H), up columns [H, 2H)), H a multiple of 128;
            rows contiguous, row stride 16-byte aligned.
        clamp: c > 0, or None for no clamp.
        weights: optional FP32 contiguous tensor of row weights: weights.view(-1)[pos[row]] with pos,
            else one per row (N elements).
        pos: optional int32 [N] row -> position map (e.g. MoeLayout.row_to_slot); rows at -1 are skipped
            (neither read nor written).
        ue8m0, scale_layout, amax_clamp, scale_mode: as for per_token_cast_to_fp8 (1x128 groups).
        check_pos: check on the host that every position is -1 or indexes weights (one device sync;
            skipped while a CUDA graph is being captured). Unchecked, the kernel skips any row whose
            position is outside [0, weights.numel()) like a -1 row.
        out: optional (q, scales) to write into, shaped, typed and strided as the ones returned.

    Returns:
        (q, scales): q [N, H] float8_e4m3fn, contiguous; scales [N, H / 128] in `scale_layout`, as
        per_token_cast_to_fp8 returns them.

    Notes:
        The module docstring gives the numerics and the skipped rows. Deterministic; bit-exact with
        deep_kernels.reference.quant.swiglu_cast_to_fp8 evaluated on the GPU.
    """
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.swiglu_cast_to_fp8(x, clamp, weights, pos, ue8m0, scale_layout, amax_clamp, scale_mode, check_pos,
                                      out)
    return _cast_to_fp8(None, x, clamp, weights, pos, ue8m0, scale_layout, amax_clamp, scale_mode, check_pos, out)


def _cast_to_fp8(config: ForwardConfig, x, clamp, weights, pos, ue8m0, scale_layout, amax_clamp, scale_mode,
                 check_pos, out):
    """swiglu_cast_to_fp8 (its arguments in order) by the forward kernel of structure `config` (None: the one
    forward_config picks)."""
    num_rows, hidden, c, limit = _check_forward_rows(x, clamp, weights, pos, check_pos, config or FORWARD)
    layout = parse_layout(scale_layout, ue8m0)
    mode = parse_scale_mode(scale_mode, ue8m0)
    check_amax_clamp(amax_clamp)
    _check_devices(x, weights=weights, pos=pos)

    geometry = scale_geometry(num_rows, hidden // GROUP_SIZE, layout)
    if out is None:
        q = x.new_empty((num_rows, hidden), dtype=torch.float8_e4m3fn)
        scales = x.new_empty_strided(geometry[1], geometry[2], dtype=geometry[0])
    else:
        q, scales = out
        check_vector_output(q, "out[0]", (num_rows, hidden), torch.float8_e4m3fn, x)
        _check_scales_out(scales, geometry, layout, x)
    if num_rows == 0 or hidden == 0:
        return q, scales
    _launch_forward(x, q, scales, weights, pos, None, 1, num_rows, hidden, True, ue8m0, layout, mode, geometry,
                    limit, c, amax_clamp, config or forward_config(num_rows, hidden))
    return q, scales


def swiglu_cast_to_fp8_masked(x: torch.Tensor, masked_m: torch.Tensor, clamp: float = None,
                              weights: torch.Tensor = None, pos: torch.Tensor = None, ue8m0: bool = False,
                              scale_layout: str = "mn_major", amax_clamp: float = DEFAULT_AMAX_CLAMP,
                              scale_mode: str = "mul", check_pos: bool = True, out=None):
    """swiglu_cast_to_fp8 over the masked MoE layout: expert e's first masked_m[e] rows of x [E, T_max, 2H].

    Args:
        x: [E, T_max, 2H] bfloat16 CUDA tensor, rows as for swiglu_cast_to_fp8, experts one after the
            other (x.stride(0) == T_max * x.stride(1)).
        masked_m: [E] int32 on x's device: the valid rows of each expert, read on the device (values
            are clamped to [0, T_max]); rows from masked_m[e] on are neither read nor written.
        clamp, ue8m0, scale_layout, amax_clamp, scale_mode: as for swiglu_cast_to_fp8.
        weights, pos: as for swiglu_cast_to_fp8 over the E * T_max rows; pos (e.g. MoeLayout.masked_slots)
            is [E, T_max], weights without pos has E * T_max elements.
        check_pos: as for swiglu_cast_to_fp8 (pass False, or capture, to keep the call free of syncs).
        out: optional (q, scales) to write into, shaped, typed and strided as the ones returned.

    Returns:
        (q, scales): q [E, T_max, H] float8_e4m3fn, contiguous; scales [E, T_max, H / 128] where expert
        e's scales scales[e] are laid out as per_token_cast_to_fp8 lays out the scales of T_max rows
        (mn_major: strides (G * T_aligned, 1, T_aligned), T_aligned = T_max rounded up to 4).

    Notes:
        No host synchronization with check_pos=False (or while capturing): CUDA-graph safe, the grid
        covers T_max rows per expert and blocks past masked_m[e] exit at once. Deterministic.
    """
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.swiglu_cast_to_fp8_masked(x, masked_m, clamp, weights, pos, ue8m0, scale_layout, amax_clamp,
                                             scale_mode, check_pos, out)
    hidden = _check_x(x, 3)
    num_experts, max_tokens = x.shape[:2]
    _check_row_blocks(max_tokens, FORWARD)
    if num_experts > MAX_ROW_BLOCKS:
        raise ValueError(f"x has too many experts ({num_experts}) for one launch: at most {MAX_ROW_BLOCKS}")
    if num_experts > 1 and max_tokens > 1 and x.stride(0) != max_tokens * x.stride(1):
        raise ValueError(f"x's experts must follow one another (stride(0) == T_max * stride(1)), got strides "
                         f"{tuple(x.stride())}")
    # The E * T_max rows as the kernel walks them (with one row per expert, stride(0) is the row stride).
    row_stride = x.stride(1) if max_tokens > 1 or num_experts <= 1 else x.stride(0)
    rows = x.as_strided((num_experts * max_tokens, 2 * hidden), (row_stride, x.stride(2)), x.storage_offset())
    _check_rows_layout(rows, "x")
    check_dtype(masked_m, "masked_m", (torch.int32,))
    if tuple(masked_m.shape) != (num_experts,) or not masked_m.is_contiguous():
        raise ValueError(f"masked_m must be a contiguous tensor of shape ({num_experts},), got shape "
                         f"{tuple(masked_m.shape)}")
    c = _check_clamp(clamp)
    limit = _check_rows(weights, pos, (num_experts, max_tokens), check_pos)
    layout = parse_layout(scale_layout, ue8m0)
    mode = parse_scale_mode(scale_mode, ue8m0)
    check_amax_clamp(amax_clamp)
    _check_devices(x, masked_m=masked_m, weights=weights, pos=pos)

    num_groups = hidden // GROUP_SIZE
    geometry = _masked_scale_geometry(num_experts, max_tokens, num_groups, layout)
    if out is None:
        q = x.new_empty((num_experts, max_tokens, hidden), dtype=torch.float8_e4m3fn)
        scales = empty_masked_scales(num_experts, max_tokens, num_groups, layout, x)
    else:
        q, scales = out
        check_vector_output(q, "out[0]", (num_experts, max_tokens, hidden), torch.float8_e4m3fn, x)
        _check_scales_out(scales, geometry, layout, x)
    if num_experts == 0 or max_tokens == 0 or hidden == 0:
        return q, scales
    _launch_forward(rows, q, scales, weights, pos, masked_m, num_experts, max_tokens, hidden, True, ue8m0, layout,
                    mode, geometry, limit, c, amax_clamp, FORWARD)
    return q, scales


def swiglu_forward(x: torch.Tensor, clamp: float = None, weights: torch.Tensor = None, pos: torch.Tensor = None,
                   check_pos: bool = True, out: torch.Tensor = None) -> torch.Tensor:
    """y = silu(min(gate, c)) * clamp(up, -c, c) * w of x = [gate | up] as bf16, without quantization.

    Args:
        x, clamp, weights, pos, check_pos: as for swiglu_cast_to_fp8.
        out: optional contiguous [N, H] bfloat16 tensor to write into.

    Returns:
        y [N, H] bfloat16, contiguous: the FP32 y of the module docstring rounded to nearest even.

    Notes:
        Rows at pos -1 are skipped. Deterministic; bit-exact with
        deep_kernels.reference.quant.swiglu_forward on the GPU.
    """
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.swiglu_forward(x, clamp, weights, pos, check_pos, out)
    num_rows, hidden, c, limit = _check_forward_rows(x, clamp, weights, pos, check_pos, FORWARD)
    _check_devices(x, weights=weights, pos=pos)

    if out is None:
        y = x.new_empty((num_rows, hidden))
    else:
        y = out
        check_vector_output(y, "out", (num_rows, hidden), torch.bfloat16, x)
    if num_rows == 0 or hidden == 0:
        return y
    _launch_forward(x, y, None, weights, pos, None, 1, num_rows, hidden, False, False, ScaleLayout.mn_major,
                    ScaleMode.mul, None, limit, c, DEFAULT_AMAX_CLAMP, FORWARD)
    return y


def swiglu_backward(x: torch.Tensor, dy: torch.Tensor, clamp: float = None, weights: torch.Tensor = None,
                    pos: torch.Tensor = None, check_pos: bool = True, out=None):
    """Gradients of y = silu(min(gate, c)) * clamp(up, -c, c) * w for training.

    Args:
        x: the forward's input, [N, 2H] bfloat16 (as for swiglu_cast_to_fp8).
        dy: [N, H] bfloat16 gradient of y; rows contiguous, row stride 16-byte aligned.
        clamp, weights, pos, check_pos: the forward's.
        out: optional (dx, dweights) to write into, shaped and typed as the ones returned, contiguous.

    Returns:
        (dx, dweights): dx [N, 2H] bfloat16 contiguous, [dgate | dup]; dweights [N] float32, the gradient of
        each row's weight (sum over H of dy * silu(gc) * uc, also without weights: the gradient of a
        weight of one).

    Notes:
        The module docstring gives the formulas, the clamp's gradient and the summation order. Rows at
        pos -1 are skipped. Deterministic; bit-exact with deep_kernels.reference.quant.swiglu_backward on
        the GPU.
    """
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.swiglu_backward(x, dy, clamp, weights, pos, check_pos, out)
    return _backward(BACKWARD, x, dy, clamp, weights, pos, check_pos, out)


def _backward(config: BackwardConfig, x, dy, clamp, weights, pos, check_pos, out):
    """swiglu_backward (its arguments in order) by the backward kernel of structure `config`."""
    hidden = _check_x(x, 2)
    num_rows = x.shape[0]
    check_dtype(dy, "dy", (torch.bfloat16,))
    if tuple(dy.shape) != (num_rows, hidden):
        raise ValueError(f"dy must have shape {(num_rows, hidden)} (x's rows, H), got {tuple(dy.shape)}")
    _check_rows_layout(x, "x")
    _check_rows_layout(dy, "dy")
    c = _check_clamp(clamp)
    limit = _check_rows(weights, pos, (num_rows,), check_pos)
    _check_devices(x, dy=dy, weights=weights, pos=pos)

    if out is None:
        dx = x.new_empty((num_rows, 2 * hidden))
        dweights = x.new_empty((num_rows,), dtype=torch.float32)
    else:
        dx, dweights = out
        check_vector_output(dx, "out[0]", (num_rows, 2 * hidden), torch.bfloat16, x)
        check_output(dweights, "out[1]", (num_rows,), torch.float32, x)
    if num_rows == 0 or hidden == 0:
        return dx, dweights
    _backward_kernel(config, c != float("inf")).launch(
        (ceil_div(num_rows, _BACKWARD_WARPS), 1, 1), x.get_device(), x=x.data_ptr(), dy=dy.data_ptr(),
        dx=dx.data_ptr(), dweights=dweights.data_ptr(), weights=_pointer(weights), pos=_pointer(pos),
        num_rows=num_rows, hidden=hidden, x_row_stride=x.stride(0), dy_row_stride=dy.stride(0), pos_limit=limit,
        clamp=c)
    return dx, dweights


@precompiled
def precompile_specs() -> list:
    """The specializations `python -m deep_kernels precompile` builds for this module."""
    cast_variants = [(False, ScaleLayout.mn_major, ScaleMode.mul), (False, ScaleLayout.row_major, ScaleMode.mul),
                     (True, ScaleLayout.mn_major, ScaleMode.mul), (True, ScaleLayout.row_major, ScaleMode.mul),
                     (True, ScaleLayout.packed_ue8m0, ScaleMode.mul), (False, ScaleLayout.mn_major, ScaleMode.div)]
    # No clamp, a clamp of any value, and a bf16 one.
    clamps = [(False, False), (True, False), (True, True)]
    return [spec for clamped, bf16_clamp in clamps for spec in
            [_forward_spec(config, clamped, True, ue8m0, layout, mode, bf16_clamp)
             for ue8m0, layout, mode in cast_variants for config in (FORWARD, FEW_ROWS_FORWARD)]
            + [_forward_spec(FORWARD, clamped, False, bf16_clamp=bf16_clamp)]] + \
        [_backward_spec(BACKWARD, clamped) for clamped in (False, True)]
