"""FP8 requantization from an existing (q, scales) pair: 128 x 128 block scales -> 1 x 128 per-token scales.

Numerics (bit-exact with deep_kernels.reference.quant.requant): dequantize, x = float(q) * block_scale (an FP32
product), then per_token_cast_to_fp8(x, 128, ...)'s numerics with its layouts and options (see
deep_kernels.quant.fp8). Lossless when both sides' scales are powers of two (block scales from
per_block_cast_to_fp8(..., ue8m0=True) and ue8m0=True here, with the same amax_clamp): each 1 x 128 group's
scale is then at most its block's, by a power of two, so every x is an e4m3 code times the new scale and
the dequantized values are identical. Otherwise each value is rounded once more (by at most half an e4m3
step of the new scale).
"""

import functools

import torch

from deep_kernels.jit.definition import F32, PTR, U32, KernelDef, Param
from deep_kernels.jit.registry import precompiled
from deep_kernels.jit.runtime import get_kernel
from deep_kernels.jit.source import KernelSpec
from deep_kernels.quant.common import (
    DEFAULT_AMAX_CLAMP, MAX_ROW_BLOCKS, NUM_WARPS, PASSES, ScaleLayout, ScaleMode, check_amax_clamp, cast_outputs,
    parse_layout, parse_scale_mode, kernel_scale_stride,
)
from deep_kernels.validation import ceil_div, check_aligned, check_cuda_device, check_dtype, check_rank, is_traced

BLOCK_SIZE = 128


FP8_REQUANT = KernelDef(
    "kernels/smxx_fp8_requant.cuh", "smxx_fp8_requant_impl",
    template=("kUE8M0", "kLayout", "kNumWarps", "kPasses", "kScaleMode"),
    params=(Param("q_in", PTR), Param("block_scales", PTR), Param("q", PTR), Param("scales", PTR),
            Param("shape_m", U32), Param("shape_k", U32), Param("scale_stride", U32), Param("amax_clamp", F32)),
    threads=lambda t: t["kNumWarps"] * 32)


def _requant_spec(ue8m0: bool, layout: ScaleLayout, mode: ScaleMode) -> KernelSpec:
    return FP8_REQUANT.spec(kUE8M0=ue8m0, kLayout=layout, kNumWarps=NUM_WARPS, kPasses=PASSES, kScaleMode=mode)


@functools.lru_cache(maxsize=None)
def _requant_kernel(ue8m0: bool, layout: ScaleLayout, mode: ScaleMode):
    return get_kernel(_requant_spec(ue8m0, layout, mode))


def requant_per_block_to_per_token(q: torch.Tensor, scales: torch.Tensor, ue8m0: bool = False,
                                   scale_layout: str = "mn_major", amax_clamp: float = DEFAULT_AMAX_CLAMP,
                                   scale_mode: str = "mul", out=None):
    """Requantize per_block_cast_to_fp8(x, 128)'s (q, scales) to per_token_cast_to_fp8's 1 x 128 groups.

    Args:
        q: [M, K] float8_e4m3fn, contiguous, K a multiple of 128.
        scales: FP32 [ceil(M / 128), K / 128], contiguous (one scale per 128 x 128 block).
        ue8m0, scale_layout, amax_clamp, scale_mode: as for per_token_cast_to_fp8 (group size 128).
        out: optional (q, scales) to write into, shaped, typed and strided as the ones returned.

    Returns:
        (q, scales) exactly as per_token_cast_to_fp8(float(q) * block_scale, 128, ...) returns them.

    Notes:
        Lossless with power-of-two scales on both sides (the module docstring). Deterministic; bit-exact
        with deep_kernels.reference.quant.requant_per_block_to_per_token.
    """
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.requant_per_block_to_per_token(q, scales, ue8m0, scale_layout, amax_clamp, scale_mode, out)
    check_dtype(q, "q", (torch.float8_e4m3fn,))
    check_rank(q, "q", 2)
    m, k = q.shape
    if k % BLOCK_SIZE != 0:
        raise ValueError(f"q.shape[1] (K = {k}) must be a multiple of {BLOCK_SIZE}")
    if ceil_div(m, BLOCK_SIZE) > MAX_ROW_BLOCKS:
        raise ValueError(f"q has too many rows ({m}) for one launch: split it")
    if not q.is_contiguous():
        raise ValueError(f"q must be contiguous, got strides {tuple(q.stride())}")
    check_aligned(q, "q")
    check_dtype(scales, "scales", (torch.float32,))
    block_shape = (ceil_div(m, BLOCK_SIZE), k // BLOCK_SIZE)
    if tuple(scales.shape) != block_shape or not scales.is_contiguous():
        raise ValueError(f"scales must be a contiguous tensor of shape {block_shape} (one per 128 x 128 block), "
                         f"got shape {tuple(scales.shape)} strides {tuple(scales.stride())}")
    layout = parse_layout(scale_layout, ue8m0)
    mode = parse_scale_mode(scale_mode, ue8m0)
    check_amax_clamp(amax_clamp)
    check_cuda_device(q, "q")
    check_cuda_device(scales, "scales", like=q)

    num_groups = k // BLOCK_SIZE
    q_out, scales_out = cast_outputs(out, q, m, k, num_groups, layout)
    if m == 0 or k == 0:
        return q_out, scales_out

    _requant_kernel(ue8m0, layout, mode).launch(
        (num_groups, ceil_div(m, BLOCK_SIZE), 1), q.get_device(), q_in=q.data_ptr(), block_scales=scales.data_ptr(),
        q=q_out.data_ptr(), scales=scales_out.data_ptr(), shape_m=m, shape_k=k,
        scale_stride=kernel_scale_stride(scales_out, layout), amax_clamp=float(amax_clamp))
    return q_out, scales_out


@precompiled
def precompile_specs() -> list:
    """The specializations `python -m deep_kernels precompile` builds for this module."""
    variants = [(False, ScaleLayout.mn_major), (False, ScaleLayout.row_major), (True, ScaleLayout.mn_major),
                (True, ScaleLayout.row_major), (True, ScaleLayout.packed_ue8m0)]
    return [_requant_spec(ue8m0, layout, ScaleMode.mul) for ue8m0, layout in variants] + [
        _requant_spec(False, ScaleLayout.mn_major, ScaleMode.div)]
