"""Transposing casts and moves for the backward GEMMs: the per-channel FP8 cast with transpose, and the batched
transpose.

per_channel_cast_transpose_to_fp8(x) is per_token_cast_to_fp8(x.T) with group size 128 in one pass: the codes of
x [M, K] come out K-major as q [K, M] with one scale per column of x and block of 128 rows, scales [K,
ceil(M / 128)] in the layouts and numerics of deep_kernels.quant.fp8 (module docstring). When M is not a
multiple of 128 the last block's missing rows count as zeros (they never raise an amax).
"""

import functools

import torch

from deep_kernels.jit.definition import F32, PTR, U32, KernelDef, Param
from deep_kernels.jit.registry import precompiled
from deep_kernels.jit.runtime import get_kernel
from deep_kernels.jit.source import KernelSpec
from deep_kernels.quant.common import (
    DEFAULT_AMAX_CLAMP, FLOAT_TYPES, MAX_ROW_BLOCKS, ScaleLayout, ScaleMode, cast_outputs, check_amax_clamp,
    output_or_new, parse_layout, parse_scale_mode, kernel_scale_stride,
)
from deep_kernels.validation import (
    ceil_div, check_cuda_device, check_dtype, check_rank, check_row_major_rows, is_traced,
)

# Rows of x per scale, and the kernels' CTA size (csrc/kernels/smxx_per_channel_cast_transpose.cuh,
# smxx_batched_transpose.cuh; the loader checks it against their __launch_bounds__): 128-byte tile rows, 64 threads.
CHANNEL_BLOCK = 128
TILE_BYTES = 128
NUM_THREADS = 64
TRANSPOSE_TYPES = (torch.float8_e4m3fn, torch.bfloat16, torch.float32)
# CUDA's limit on gridDim.z, where the batches go.
MAX_BATCHES = 65535
UINT32_LIMIT = 2**32 - 1


PER_CHANNEL_CAST_TRANSPOSE = KernelDef(
    "kernels/smxx_per_channel_cast_transpose.cuh", "smxx_per_channel_cast_transpose_impl",
    template=("InT", "kUE8M0", "kLayout", "kScaleMode"),
    params=(Param("x", PTR), Param("q", PTR), Param("scales", PTR), Param("shape_m", U32), Param("shape_k", U32),
            Param("x_row_stride", U32), Param("scale_stride", U32), Param("amax_clamp", F32)),
    threads=NUM_THREADS)


def _cast_transpose_spec(dtype: torch.dtype, ue8m0: bool, layout: ScaleLayout, mode: ScaleMode) -> KernelSpec:
    return PER_CHANNEL_CAST_TRANSPOSE.spec(InT=dtype, kUE8M0=ue8m0, kLayout=layout, kScaleMode=mode)


@functools.lru_cache(maxsize=None)
def _cast_transpose_kernel(dtype: torch.dtype, ue8m0: bool, layout: ScaleLayout, mode: ScaleMode):
    return get_kernel(_cast_transpose_spec(dtype, ue8m0, layout, mode))


def per_channel_cast_transpose_to_fp8(x: torch.Tensor, ue8m0: bool = False, scale_layout: str = "mn_major",
                                      amax_clamp: float = DEFAULT_AMAX_CLAMP, scale_mode: str = "mul", out=None):
    """Cast x [M, K] (bf16 or fp32) to FP8 e4m3 transposed, q [K, M], with one scale per column and block of
    128 rows of x: the operand layout of the backward (K-grouped) FP8 GEMMs.

    Args:
        x: [M, K] bfloat16 or float32 CUDA tensor; rows contiguous, row stride >= K and 16-byte aligned.
            M must be a multiple of 16 (rows of q are whole 16-byte runs); K a multiple of 8 (bf16) or 4
            (fp32), whole 16-byte vectors.
        ue8m0: round each scale up to a power of two (the UE8M0 recipe).
        scale_layout: "mn_major" (default), "row_major" or "packed_ue8m0", as for per_token_cast_to_fp8 of a
            [K, M] tensor.
        amax_clamp: lower bound of amax, so all-zero blocks get a finite scale.
        scale_mode: "mul" or "div" (deep_kernels.quant.fp8's module docstring).
        out: optional (q, scales) to write into, shaped, typed and strided as the ones returned.

    Returns:
        (q, scales): q [K, M] float8_e4m3fn, contiguous, q[k, m] the code of x[m, k]; scales [K, ceil(M /
        128)] in scale_layout, the 1 x 128 per-token scales of q's rows.

    Notes:
        Equal bit for bit to per_token_cast_to_fp8(x.T.contiguous(), 128, ...) when M is a multiple of 128;
        otherwise the last block's missing rows count as zeros. Deterministic; bit-exact with
        deep_kernels.reference.quant.per_channel_cast_transpose_to_fp8.
    """
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.per_channel_cast_transpose_to_fp8(x, ue8m0, scale_layout, amax_clamp, scale_mode, out)
    check_dtype(x, "x", FLOAT_TYPES)
    check_rank(x, "x", 2)
    m, k = x.shape
    if m % 16 != 0:
        raise ValueError(f"x.shape[0] (M = {m}) must be a multiple of 16: q's rows are whole 16-byte runs")
    vector = 16 // x.element_size()
    if k % vector != 0:
        raise ValueError(f"x.shape[1] (K = {k}) must be a multiple of {vector} for {x.dtype} "
                         "(whole 16-byte vectors)")
    if ceil_div(m, CHANNEL_BLOCK) > MAX_ROW_BLOCKS:
        raise ValueError(f"x has too many rows ({m}) for one launch: split it")
    check_row_major_rows(x, "x")
    layout = parse_layout(scale_layout, ue8m0)
    mode = parse_scale_mode(scale_mode, ue8m0)
    check_amax_clamp(amax_clamp)
    check_cuda_device(x, "x")

    num_groups = ceil_div(m, CHANNEL_BLOCK)
    q, scales = cast_outputs(out, x, k, m, num_groups, layout)
    if m == 0 or k == 0:
        return q, scales

    kernel = _cast_transpose_kernel(x.dtype, ue8m0, layout, mode)
    grid = (ceil_div(k, TILE_BYTES // x.element_size()), num_groups, 1)
    kernel.launch(grid, x.get_device(), x=x.data_ptr(), q=q.data_ptr(), scales=scales.data_ptr(), shape_m=m,
                  shape_k=k, x_row_stride=x.stride(0), scale_stride=kernel_scale_stride(scales, layout),
                  amax_clamp=float(amax_clamp))
    return q, scales


BATCHED_TRANSPOSE = KernelDef(
    "kernels/smxx_batched_transpose.cuh", "smxx_batched_transpose_impl",
    template=("kElementBytes",),
    params=(Param("x_base", PTR), Param("y_base", PTR), Param("shape_m", U32), Param("shape_n", U32),
            Param("x_batch_stride", U32), Param("x_row_stride", U32)),
    threads=NUM_THREADS)


def _transpose_spec(element_size: int) -> KernelSpec:
    return BATCHED_TRANSPOSE.spec(kElementBytes=element_size)


@functools.lru_cache(maxsize=None)
def _transpose_kernel(element_size: int):
    return get_kernel(_transpose_spec(element_size))


def batched_transpose(x: torch.Tensor, out: torch.Tensor = None) -> torch.Tensor:
    """Transpose the last two dimensions of x [B, M, N] (float8_e4m3fn, bf16 or fp32): y [B, N, M] contiguous.

    Args:
        x: [B, M, N] CUDA tensor of float8_e4m3fn, bfloat16 or float32 with a contiguous last dimension; any
            batch and row strides (at most 2^32 - 1 elements), any M and N.
        out: optional contiguous [B, N, M] tensor of x's dtype to write into.

    Returns:
        y [B, N, M] contiguous, y[b, n, m] = x[b, m, n]: x.transpose(1, 2).contiguous(), bit for bit.

    Notes:
        16-byte loads where N, the strides and x's address allow (whole 16-byte rows), 16-byte stores where M
        does; otherwise the same kernel moves single elements. Deterministic.
    """
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.batched_transpose(x, out)
    check_dtype(x, "x", TRANSPOSE_TYPES)
    check_rank(x, "x", 3)
    b, m, n = x.shape
    if n > 1 and x.stride(2) != 1:
        raise ValueError(f"x must have a contiguous last dimension, got strides {tuple(x.stride())}")
    if b > 1 and x.stride(0) > UINT32_LIMIT or m > 1 and x.stride(1) > UINT32_LIMIT:
        raise ValueError(f"x's strides must be at most {UINT32_LIMIT} elements, got {tuple(x.stride())}")
    tile = TILE_BYTES // x.element_size()
    if b > MAX_BATCHES or ceil_div(m, tile) > MAX_ROW_BLOCKS:
        raise ValueError(f"x of shape {tuple(x.shape)} needs more than one launch (at most {MAX_BATCHES} batches "
                         f"and {MAX_ROW_BLOCKS * tile} rows): split it")
    check_cuda_device(x, "x")

    y = output_or_new(out, "out", (b, n, m), x.dtype, x)
    if y.numel() == 0:
        return y

    kernel = _transpose_kernel(x.element_size())
    grid = (ceil_div(n, tile), ceil_div(m, tile), b)
    # NOTE: strides of dimensions of size 1 are arbitrary in torch; 0 keeps the kernel's alignment test exact.
    batch_stride, row_stride = x.stride(0) if b > 1 else 0, x.stride(1) if m > 1 else 0
    kernel.launch(grid, x.get_device(), x_base=x.data_ptr(), y_base=y.data_ptr(), shape_m=m, shape_n=n,
                  x_batch_stride=batch_stride, x_row_stride=row_stride)
    return y


@precompiled
def precompile_specs() -> list:
    """The specializations `python -m deep_kernels precompile` builds for this module."""
    variants = [(False, ScaleLayout.mn_major, ScaleMode.mul), (False, ScaleLayout.row_major, ScaleMode.mul),
                (False, ScaleLayout.mn_major, ScaleMode.div), (True, ScaleLayout.mn_major, ScaleMode.mul),
                (True, ScaleLayout.packed_ue8m0, ScaleMode.mul)]
    specs = [_cast_transpose_spec(dtype, *variant) for dtype in FLOAT_TYPES for variant in variants]
    specs += [_transpose_spec(dtype.itemsize) for dtype in TRANSPOSE_TYPES]
    return specs
