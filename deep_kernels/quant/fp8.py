"""FP8 e4m3 casts: per-token-group (group_size=None: one group per row) and per-block, and the per-token inverse.

Numerics (bit-exact with deep_kernels.reference.quant), per group (per-token) or block (per-block):
    amax  = max |x| over the group, clamped below by amax_clamp (NaN propagates)
    scale = amax / 448                                                 (IEEE division, FP32)
    scale_mode="mul" (default): q = RNE_e4m3(x * (448 / amax))        (IEEE division, FP32 product)
    scale_mode="div":           q = RNE_e4m3(x / scale)               (the serving engines' convention)
    ue8m0: scale = 2^ceil(log2(amax / 448)), q = RNE_e4m3(x * (1 / scale)); no value saturates, and both
           scale modes give the same bits (dividing by a power of two is multiplying by its exact inverse)
The two modes differ in the last bit of x's scaled value for some inputs, so a few codes differ (by one
e4m3 step at most); pick the one the consumer's dequantization was calibrated with. The kernels get "div"'s
quotient from one reciprocal per group and three FP32 operations per element that give IEEE division's codes
(csrc/common/quant.cuh, divide_by_scale). Rounding to e4m3 is round-to-nearest-even saturating at +-448 (-0
stays -0). A NaN in a group makes its scale and all its codes NaN; an infinity makes the scale inf, its own
code NaN and the group's finite codes zeros of their sign.
Scale layouts: see deep_kernels.quant.common.
"""

import functools
from typing import NamedTuple

import torch

from deep_kernels.jit.definition import F32, PTR, U32, KernelDef, Param
from deep_kernels.jit.registry import precompiled
from deep_kernels.jit.runtime import current_raw_stream, get_kernel, remember_launch
from deep_kernels.jit.source import KernelSpec
from deep_kernels.quant.common import (
    DEFAULT_AMAX_CLAMP, FLOAT_TYPES, MAX_ROW_BLOCKS, NUM_WARPS, PASSES, ScaleLayout, ScaleMode, block_rows,
    cast_outputs, check_amax_clamp, check_group_size, check_output, check_vector_output, kernel_scale_stride,
    output_or_new, parse_layout, parse_scale_mode, scale_layout_of, supported_group_sizes,
)
from deep_kernels.validation import (
    ceil_div, check_aligned, check_cuda_device, check_dtype, check_rank, check_row_major_rows, is_traced,
)


PER_TOKEN_CAST = KernelDef(
    "kernels/smxx_per_token_cast.cuh", "smxx_per_token_cast_impl",
    template=("InT", "GROUP_SIZE", "kUE8M0", "kLayout", "kNumWarps", "kPasses", "kScaleMode"),
    params=(Param("x", PTR), Param("q", PTR), Param("scales", PTR), Param("shape_m", U32), Param("shape_k", U32),
            Param("x_row_stride", U32), Param("scale_stride", U32), Param("amax_clamp", F32)),
    threads=lambda t: t["kNumWarps"] * 32)


def _cast_spec(dtype: torch.dtype, group_size: int, ue8m0: bool, layout: ScaleLayout,
               mode: ScaleMode = ScaleMode.mul) -> KernelSpec:
    return PER_TOKEN_CAST.spec(InT=dtype, GROUP_SIZE=group_size, kUE8M0=ue8m0, kLayout=layout, kNumWarps=NUM_WARPS,
                               kPasses=PASSES, kScaleMode=mode)


@functools.lru_cache(maxsize=None)
def _cast_kernel(dtype: torch.dtype, group_size: int, ue8m0: bool, layout: ScaleLayout,
                 mode: ScaleMode = ScaleMode.mul):
    return get_kernel(_cast_spec(dtype, group_size, ue8m0, layout, mode))


# Per-row cast (group_size None or K where K is no per-token group size): one CTA of ROW_THREADS threads per row,
# each holding up to 16 vectors (csrc/kernels/smxx_per_row_cast.cuh, whose __launch_bounds__ the loader checks).
ROW_THREADS = 256
ROW_VECTORS = (1, 2, 4, 8, 16)


def max_row_group_size(dtype: torch.dtype) -> int:
    """The largest K the per-row cast (group_size=None) takes for a bf16 or fp32 input."""
    return ROW_THREADS * ROW_VECTORS[-1] * (16 // dtype.itemsize)


def _row_vectors(k: int, dtype: torch.dtype) -> int:
    needed = ceil_div(k // (16 // dtype.itemsize), ROW_THREADS)
    return next(vectors for vectors in ROW_VECTORS if vectors >= needed)


PER_ROW_CAST = KernelDef(
    "kernels/smxx_per_row_cast.cuh", "smxx_per_row_cast_impl",
    template=("InT", "kVectorsPerThread", "kUE8M0", "kLayout", "kScaleMode"),
    params=(Param("x", PTR), Param("q", PTR), Param("scales", PTR), Param("shape_k", U32), Param("x_row_stride", U32),
            Param("scale_stride", U32), Param("amax_clamp", F32)),
    threads=ROW_THREADS)


def _row_cast_spec(dtype: torch.dtype, vectors: int, ue8m0: bool, layout: ScaleLayout, mode: ScaleMode) -> KernelSpec:
    return PER_ROW_CAST.spec(InT=dtype, kVectorsPerThread=vectors, kUE8M0=ue8m0, kLayout=layout, kScaleMode=mode)


@functools.lru_cache(maxsize=None)
def _row_cast_kernel(dtype: torch.dtype, vectors: int, ue8m0: bool, layout: ScaleLayout, mode: ScaleMode):
    return get_kernel(_row_cast_spec(dtype, vectors, ue8m0, layout, mode))


def _is_per_row(group_size, k: int, dtype: torch.dtype) -> bool:
    """Whether the cast takes one group per row by the per-row kernel (the per-token kernel serves K that are
    per-token group sizes)."""
    return isinstance(group_size, int) and group_size == k and group_size not in supported_group_sizes(dtype)


def _check_row_size(k: int, dtype: torch.dtype) -> None:
    limit = max_row_group_size(dtype)
    if k <= 0 or k % 16 != 0 or k > limit:
        raise ValueError(f"x.shape[1] (K = {k}) must be a positive multiple of 16 up to {limit} for one group per "
                         f"row (group_size=None) with {dtype}")


def per_token_cast_to_fp8(x: torch.Tensor, group_size=128, ue8m0: bool = False,
                          scale_layout: str = "mn_major", amax_clamp: float = DEFAULT_AMAX_CLAMP,
                          scale_mode: str = "mul", out=None):
    """Cast x [M, K] (bf16 or fp32) to FP8 e4m3 with one scale per row and group of `group_size` columns.

    Args:
        x: [M, K] bfloat16 or float32 CUDA tensor; rows contiguous, row stride >= K and 16-byte aligned.
        group_size: columns per scale; K must be a multiple of it (see supported_group_sizes). None (or K)
            means one group per row: K then is any positive multiple of 16 up to max_row_group_size(x.dtype).
        ue8m0: round each scale up to a power of two (the UE8M0 recipe).
        scale_layout: "mn_major" (default, what fp8_gemm_nt reads), "row_major" or "packed_ue8m0".
        amax_clamp: lower bound of amax, so all-zero groups get a finite scale.
        scale_mode: "mul" (q = RNE(x * (448 / amax))) or "div" (q = RNE(x / scale)); see the module docstring.
        out: optional (q, scales) to write into, shaped, typed and strided as the ones returned.

    Returns:
        (q, scales): q [M, K] float8_e4m3fn, contiguous; scales as the module docstring describes ([M, 1]
        with one group per row).

    Notes:
        Deterministic; bit-exact with deep_kernels.reference.quant.per_token_cast_to_fp8.
    """
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.per_token_cast_to_fp8(x, group_size, ue8m0, scale_layout, amax_clamp, scale_mode, out)
    signature = None
    if out is None:
        try:
            # NOTE: the types too: 128 == 128.0 == True for the dict, not for the checks.
            signature = (x.dtype, x.shape, x.stride(), x.get_device(), group_size, ue8m0, scale_layout, amax_clamp,
                         scale_mode, type(group_size), type(ue8m0), type(scale_layout), type(amax_clamp),
                         type(scale_mode))
            plan = _plans.get(signature)
        except (AttributeError, TypeError):  # not a tensor, or unhashable arguments: the full check below says which
            signature = plan = None
        if plan is not None:  # checked before, but for x's address
            x_ptr = x.data_ptr()
            if x_ptr % 16 != 0:
                raise ValueError("x must start at a 16-byte aligned address")
            q = torch.empty(plan.q_shape, dtype=torch.float8_e4m3fn, device=plan.device)
            scales = torch.empty_strided(plan.scales_shape, plan.scales_strides, dtype=plan.scales_dtype,
                                         device=plan.device)
            if plan.kernel is not None:
                key = (x_ptr, q.data_ptr(), scales.data_ptr())
                launch = plan.launches.get(key)
                if launch is None:
                    launch = _prepare_launch(plan, key)
                launch.launch(current_raw_stream(plan.device.index))
            return q, scales

    check_dtype(x, "x", (torch.bfloat16, torch.float32))
    check_rank(x, "x", 2)
    m, k = x.shape
    group_size = k if group_size is None else group_size
    per_row = _is_per_row(group_size, k, x.dtype)
    if per_row:
        _check_row_size(k, x.dtype)
        group_size = k
    else:
        check_group_size(group_size, m, k, x.dtype, "x")
    check_row_major_rows(x, "x")
    layout = parse_layout(scale_layout, ue8m0)
    mode = parse_scale_mode(scale_mode, ue8m0)
    check_amax_clamp(amax_clamp)
    check_cuda_device(x, "x")

    num_groups = k // group_size
    q, scales = cast_outputs(out, x, m, k, num_groups, layout)
    plan = _plan(x, q, scales, group_size, ue8m0, layout, mode, amax_clamp, per_row)
    if signature is not None:
        _plans[signature] = plan
    if plan.kernel is not None:
        launch = plan.kernel.prepare(plan.grid, plan.device.index, plan.kernel.encode(
            x=x.data_ptr(), q=q.data_ptr(), scales=scales.data_ptr(), **plan.params))
        launch.launch(current_raw_stream(plan.device.index))
    return q, scales


class _Plan(NamedTuple):
    """What a valid call's signature fixes: the outputs' shapes and device, the kernel (None: nothing to cast), its
    grid and parameters but for the addresses, and the prepared launches by the call's addresses."""

    q_shape: tuple
    scales_shape: tuple
    scales_strides: tuple
    scales_dtype: torch.dtype
    device: torch.device
    kernel: object = None
    grid: tuple = None
    params: dict = None
    launches: dict = None


# Signatures of valid calls without out (x's dtype, shape, strides and device, the other arguments with their types)
# -> their _Plan: a repeated call checks x's address and looks up its launch.
_plans = {}


def _plan(x, q, scales, group_size: int, ue8m0: bool, layout: ScaleLayout, mode: ScaleMode, amax_clamp,
          per_row: bool) -> _Plan:
    """The _Plan of a checked call whose outputs are q and scales."""
    m, k = x.shape
    geometry = (tuple(q.shape), tuple(scales.shape), scales.stride(), scales.dtype, x.device)
    if m == 0 or k == 0:
        return _Plan(*geometry)
    params = dict(shape_k=k, x_row_stride=x.stride(0), scale_stride=kernel_scale_stride(scales, layout),
                  amax_clamp=float(amax_clamp))
    if per_row:
        kernel = _row_cast_kernel(x.dtype, _row_vectors(k, x.dtype), ue8m0, layout, mode)
        return _Plan(*geometry, kernel, (m, 1, 1), params, {})
    kernel = _cast_kernel(x.dtype, group_size, ue8m0, layout, mode)
    # NOTE: with packed scales a CTA takes the 4 groups of a scale word (csrc/common/token_group_tile.cuh), the
    # 4 CTAs of a word column splitting the row block: group columns round up to whole words.
    num_groups = k // group_size
    group_columns = ceil_div(num_groups, 4) * 4 if layout == ScaleLayout.packed_ue8m0 else num_groups
    grid = (group_columns, ceil_div(m, block_rows(group_size, 16 // x.element_size())), 1)
    return _Plan(*geometry, kernel, grid, dict(params, shape_m=m), {})


def _prepare_launch(plan: _Plan, key: tuple):
    """The cast's launch at the addresses of key (x, q, scales), cached in the plan."""
    x_ptr, q_ptr, scales_ptr = key
    encoded = plan.kernel.encode(x=x_ptr, q=q_ptr, scales=scales_ptr, **plan.params)
    return remember_launch(plan.launches, key, plan.kernel.prepare(plan.grid, plan.device.index, encoded))


# Per-block cast: (blocks side by side in one CTA's tile, warps) by (input dtype, block size); each thread
# loads 4 16-byte vectors (8 for fp32 128-blocks). NOTE: 16 warps for 128-blocks of bf16 keeps the vectors
# held across the division's slow-path call few enough that ptxas does not spill around it.
_BLOCK_CAST_TILES = {
    (torch.bfloat16, 128): (1, 16), (torch.float32, 128): (1, 16),
    (torch.bfloat16, 32): (8, 8), (torch.float32, 32): (4, 8),
}
BLOCK_SIZES = (32, 128)


PER_BLOCK_CAST = KernelDef(
    "kernels/smxx_per_block_cast.cuh", "smxx_per_block_cast_impl",
    template=("InT", "BLOCK_SIZE", "kTileBlocks", "kNumWarps", "kUE8M0", "kScaleMode"),
    params=(Param("x", PTR), Param("q", PTR), Param("scales", PTR), Param("shape_m", U32), Param("shape_k", U32),
            Param("x_row_stride", U32), Param("amax_clamp", F32)),
    threads=lambda t: t["kNumWarps"] * 32)


def _block_cast_spec(dtype: torch.dtype, block_size: int, ue8m0: bool, mode: ScaleMode) -> KernelSpec:
    tile_blocks, num_warps = _BLOCK_CAST_TILES[dtype, block_size]
    return PER_BLOCK_CAST.spec(InT=dtype, BLOCK_SIZE=block_size, kTileBlocks=tile_blocks, kNumWarps=num_warps,
                               kUE8M0=ue8m0, kScaleMode=mode)


@functools.lru_cache(maxsize=None)
def _block_cast_kernel(dtype: torch.dtype, block_size: int, ue8m0: bool, mode: ScaleMode):
    return get_kernel(_block_cast_spec(dtype, block_size, ue8m0, mode))


def per_block_cast_to_fp8(x: torch.Tensor, block_size: int = 128, ue8m0: bool = False,
                          amax_clamp: float = DEFAULT_AMAX_CLAMP, scale_mode: str = "mul", out=None):
    """Cast x [M, K] (bf16 or fp32) to FP8 e4m3 with one FP32 scale per block_size x block_size block.

    Args:
        x: [M, K] bfloat16 or float32 CUDA tensor; rows contiguous, row stride >= K and 16-byte aligned.
        block_size: 128 or 32; K must be a multiple of it, M is any.
        ue8m0: round each scale up to a power of two (the UE8M0 recipe).
        amax_clamp: lower bound of amax, so all-zero blocks get a finite scale.
        scale_mode: "mul" or "div", as for per_token_cast_to_fp8 (the module docstring).
        out: optional (q, scales) to write into, shaped and typed as the ones returned, contiguous.

    Returns:
        (q, scales): q [M, K] float8_e4m3fn, contiguous; scales FP32 [ceil(M / block_size), K / block_size]
        row-major, what fp8_gemm_nt reads as sfb.

    Notes:
        The numerics of per_token_cast_to_fp8 with amax over the block; the last row block's rows past M
        count as zeros. Deterministic; bit-exact with deep_kernels.reference.quant.per_block_cast_to_fp8.
    """
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.per_block_cast_to_fp8(x, block_size, ue8m0, amax_clamp, scale_mode, out)
    check_dtype(x, "x", (torch.bfloat16, torch.float32))
    check_rank(x, "x", 2)
    m, k = x.shape
    if block_size not in BLOCK_SIZES or not isinstance(block_size, int):
        raise ValueError(f"block_size must be one of {BLOCK_SIZES}, got {block_size!r}")
    if k % block_size != 0:
        raise ValueError(f"x.shape[1] (K = {k}) must be a multiple of block_size = {block_size}")
    if ceil_div(m, block_size) > MAX_ROW_BLOCKS:
        raise ValueError(f"x has too many rows ({m}) for one launch: split it")
    check_row_major_rows(x, "x")
    mode = parse_scale_mode(scale_mode, ue8m0)
    check_amax_clamp(amax_clamp)
    check_cuda_device(x, "x")

    scale_shape = (ceil_div(m, block_size), k // block_size)
    if out is None:
        q = x.new_empty((m, k), dtype=torch.float8_e4m3fn)
        scales = x.new_empty(scale_shape, dtype=torch.float32)
    else:
        q, scales = out
        check_vector_output(q, "out[0]", (m, k), torch.float8_e4m3fn, x)
        check_output(scales, "out[1]", scale_shape, torch.float32, x)
    if m == 0 or k == 0:
        return q, scales

    kernel = _block_cast_kernel(x.dtype, block_size, ue8m0, mode)
    tile_blocks, _ = _BLOCK_CAST_TILES[x.dtype, block_size]
    grid = (ceil_div(k, block_size * tile_blocks), scale_shape[0], 1)
    kernel.launch(grid, x.get_device(), x=x.data_ptr(), q=q.data_ptr(), scales=scales.data_ptr(), shape_m=m,
                  shape_k=k, x_row_stride=x.stride(0), amax_clamp=float(amax_clamp))
    return q, scales


PER_TOKEN_CAST_BACK = KernelDef(
    "kernels/smxx_per_token_cast_back.cuh", "smxx_per_token_cast_back_impl",
    template=("OutT", "GROUP_SIZE", "kLayout", "kNumWarps", "kPasses"),
    params=(Param("q", PTR), Param("scales", PTR), Param("y", PTR), Param("shape_m", U32), Param("shape_k", U32),
            Param("scale_stride", U32)),
    threads=lambda t: t["kNumWarps"] * 32)


def _cast_back_spec(out_dtype: torch.dtype, group_size: int, layout: ScaleLayout) -> KernelSpec:
    return PER_TOKEN_CAST_BACK.spec(OutT=out_dtype, GROUP_SIZE=group_size, kLayout=layout, kNumWarps=NUM_WARPS,
                                    kPasses=PASSES)


@functools.lru_cache(maxsize=None)
def _cast_back_kernel(out_dtype: torch.dtype, group_size: int, layout: ScaleLayout):
    return get_kernel(_cast_back_spec(out_dtype, group_size, layout))


def per_token_cast_back(q: torch.Tensor, scales: torch.Tensor, group_size: int = 128,
                        out_dtype: torch.dtype = torch.bfloat16, out: torch.Tensor = None) -> torch.Tensor:
    """Dequantize per_token_cast_to_fp8's output: y = RNE(float(q) * scale) as out_dtype [M, K].

    Args:
        q: [M, K] float8_e4m3fn, contiguous.
        scales: in any layout per_token_cast_to_fp8 writes (recognised from dtype and strides).
        group_size: columns per scale, as in the cast (8 to 256, a power of two).
        out_dtype: torch.bfloat16 or torch.float32.
        out: optional contiguous [M, K] tensor of out_dtype to write into.
    """
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.per_token_cast_back(q, scales, group_size, out_dtype, out)
    check_dtype(q, "q", (torch.float8_e4m3fn,))
    check_rank(q, "q", 2)
    if out_dtype not in FLOAT_TYPES:
        raise TypeError(f"out_dtype must be torch.bfloat16 or torch.float32, got {out_dtype}")
    m, k = q.shape
    check_group_size(group_size, m, k, torch.bfloat16, "q")
    if not q.is_contiguous():
        raise ValueError(f"q must be contiguous, got strides {tuple(q.stride())}")
    check_aligned(q, "q")
    num_groups = k // group_size
    layout = scale_layout_of(scales, m, num_groups)
    check_cuda_device(q, "q")
    check_cuda_device(scales, "scales", like=q)

    y = output_or_new(out, "out", (m, k), out_dtype, q)
    check_aligned(y, "out")
    if m == 0 or k == 0:
        return y
    kernel = _cast_back_kernel(out_dtype, group_size, layout)
    grid = (num_groups, ceil_div(m, block_rows(group_size, 8)), 1)
    kernel.launch(grid, q.get_device(), q=q.data_ptr(), scales=scales.data_ptr(), y=y.data_ptr(), shape_m=m,
                  shape_k=k, scale_stride=kernel_scale_stride(scales, layout))
    return y


@precompiled
def precompile_specs() -> list:
    """The specializations `python -m deep_kernels precompile` builds for this module."""
    cast_variants = [(False, ScaleLayout.mn_major), (False, ScaleLayout.row_major), (True, ScaleLayout.mn_major),
                     (True, ScaleLayout.row_major), (True, ScaleLayout.packed_ue8m0)]
    specs = []
    for dtype in FLOAT_TYPES:
        for ue8m0, layout in cast_variants:
            specs.append(_cast_spec(dtype, 128, ue8m0, layout))
        specs.append(_cast_spec(dtype, 128, False, ScaleLayout.mn_major, ScaleMode.div))
        for layout in ScaleLayout:
            specs.append(_cast_back_spec(dtype, 128, layout))
        for block_size in BLOCK_SIZES:
            for ue8m0, mode in ((False, ScaleMode.mul), (True, ScaleMode.mul), (False, ScaleMode.div)):
                specs.append(_block_cast_spec(dtype, block_size, ue8m0, mode))
        specs += [_row_cast_spec(dtype, vectors, False, ScaleLayout.mn_major, ScaleMode.mul) for vectors in ROW_VECTORS]
        specs.append(_row_cast_spec(dtype, 4, True, ScaleLayout.packed_ue8m0, ScaleMode.mul))
        specs.append(_row_cast_spec(dtype, 4, False, ScaleLayout.row_major, ScaleMode.div))
    return specs
