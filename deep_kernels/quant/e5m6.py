"""E5M6 casts: one scale per row, 12-bit codes packed 8 to 3 int32 words, and the inverse.

Format (csrc/common/e5m6.cuh): a code is the top 12 bits of an IEEE half (sign, 5 exponent bits of bias 15,
6 mantissa bits), so it encodes the half with bits code << 4: largest finite 65024 = (2 - 2^-6) * 2^15,
smallest normal 2^-14, subnormals multiples of 2^-20, inf 0x7C0, NaN 0x7FF.
Packing: code i of each 8 consecutive codes of a row occupies bits [12i, 12i + 12) of a little-endian
96-bit group, word w of the group holds its bits [32w, 32w + 32); a row of K codes is 3K/8 int32 words.

Numerics (bit-exact with deep_kernels.reference.quant.e5m6), per row:
    amax  = max |x| over the row, clamped below by amax_clamp (NaN propagates)
    scale = amax / 65024                                             (IEEE division, FP32)
    scale_mode="mul" (default): code = RNE_e5m6(x * (65024 / amax))  (IEEE division, FP32 product)
    scale_mode="div":           code = RNE_e5m6(x / scale)
    ue8m0: scale = 2^ceil(log2(amax / 65024)), code = RNE_e5m6(x * (1 / scale)); both modes give these bits
RNE_e5m6 rounds the FP32 value once, to nearest even on the e5m6 grid (not through a half). Overflow is
IEEE's: magnitudes >= 65280 (inf included) give inf; finite rows never reach it (|x * multiplier| <= 65024
up to FP32 roundings) unless amax_clamp is so small that the scale is subnormal. Every NaN gives 0x7FF; -0
and negative values that round to zero give -0 (0x800); scaled magnitudes below 2^-14 get subnormal codes
(steps of 2^-20), those up to 2^-21 zero. A NaN in a row makes its scale and all its codes NaN; an infinity
makes the scale inf, its own code NaN and the row's finite codes (signed) zero. The cast-back computes
y = RNE(float(code) * scale) in the output dtype.
"""

import functools
import math

import torch

from deep_kernels.jit.definition import F32, PTR, U32, KernelDef, Param
from deep_kernels.jit.registry import precompiled
from deep_kernels.jit.runtime import get_kernel
from deep_kernels.jit.source import KernelSpec
from deep_kernels.quant.common import (
    DEFAULT_AMAX_CLAMP, FLOAT_TYPES, ScaleMode, check_amax_clamp, check_output, check_vector_output, output_or_new,
    parse_scale_mode,
)
from deep_kernels.validation import (
    ceil_div, check_aligned, check_cuda_device, check_dtype, check_rank, check_row_major_rows, is_traced,
)

E5M6_MAX = 65024.0
CODES_PER_GROUP = 8
WORDS_PER_GROUP = 3
# Bytes of the rows and codes one CTA of the cast stages in shared memory (Hopper allows 227 KiB per CTA).
MAX_STAGED_BYTES = 224 * 1024
# The cast-back counts groups of 8 codes in 32-bit integers.
MAX_GROUPS = 2**31

_CAST_WARPS = 4
_CAST_BACK_WARPS = 8
_CAST_BACK_TILES = 2  # warp tiles of 128 groups per warp
_CAST_BACK_TILE_GROUPS = 128


def packed_words(k: int) -> int:
    """int32 words of a packed row of k codes."""
    return k // CODES_PER_GROUP * WORDS_PER_GROUP


def rows_per_block(k: int) -> int:
    """Rows per CTA of the cast: the fewest (1, 2 or 4) with rows * K a multiple of 32, so that every CTA's
    packed output starts 16-byte aligned."""
    return 4 // math.gcd(k // CODES_PER_GROUP, 4)


def row_divisor(groups_per_row: int) -> tuple:
    """(magic, shift) with group // groups_per_row == (group * magic) >> shift for every group < 2^31: with
    l = ceil(log2(groups_per_row)), magic = ceil(2^(31 + l) / groups_per_row) < 2^32, whose excess over
    2^(31 + l) / groups_per_row adds less than group / 2^(31 + l) < 1 / groups_per_row to the quotient."""
    shift = 31 + (groups_per_row - 1).bit_length()
    return -(-(1 << shift) // groups_per_row), shift


def cast_smem_bytes(rows: int, k: int, dtype: torch.dtype) -> int:
    """Dynamic shared memory of the cast's carve-up (csrc/kernels/smxx_e5m6_cast.cuh): the block's rows, then
    their packed words."""
    return rows * (k * dtype.itemsize + packed_words(k) * 4)


E5M6_CAST = KernelDef(
    "kernels/smxx_e5m6_cast.cuh", "smxx_e5m6_cast_impl",
    template=("InT", "kRows", "kNumWarps", "kUE8M0", "kScaleMode"),
    params=(Param("x", PTR), Param("packed", PTR), Param("scales", PTR), Param("shape_m", U32), Param("shape_k", U32),
            Param("x_row_stride", U32), Param("amax_clamp", F32)),
    threads=lambda t: t["kNumWarps"] * 32)


def _cast_spec(dtype: torch.dtype, rows: int, ue8m0: bool, mode: ScaleMode) -> KernelSpec:
    return E5M6_CAST.spec(InT=dtype, kRows=rows, kNumWarps=_CAST_WARPS, kUE8M0=ue8m0, kScaleMode=mode)


@functools.lru_cache(maxsize=None)
def _cast_kernel(dtype: torch.dtype, rows: int, ue8m0: bool, mode: ScaleMode, smem_bytes: int):
    return get_kernel(_cast_spec(dtype, rows, ue8m0, mode), smem_bytes=smem_bytes)


def per_token_cast_to_e5m6(x: torch.Tensor, ue8m0: bool = False, amax_clamp: float = DEFAULT_AMAX_CLAMP,
                           scale_mode: str = "mul", out=None):
    """Cast x [M, K] (bf16 or fp32) to packed E5M6 codes with one FP32 scale per row.

    Args:
        x: [M, K] bfloat16 or float32 CUDA tensor, K a multiple of 8; rows contiguous, row stride >= K and
            16-byte aligned. One CTA stages rows_per_block(K) rows and their codes in shared memory, so
            rows_per_block(K) * K * (x.element_size() + 1.5) must not exceed 224 KiB (K <= 65536 for bf16
            when K % 32 == 0).
        ue8m0: round each scale up to a power of two.
        amax_clamp: lower bound of amax, so all-zero rows get a finite scale.
        scale_mode: "mul" (code = RNE(x * (65024 / amax))) or "div" (code = RNE(x / scale)).
        out: optional (packed, scales) to write into, shaped and typed as the ones returned, contiguous, packed
            16-byte aligned.

    Returns:
        (packed, scales): packed int32 [M, 3K/8] (the module docstring's packing), scales FP32 [M].

    Notes:
        Numerics in the module docstring. Deterministic; bit-exact with
        deep_kernels.reference.quant.per_token_cast_to_e5m6.
    """
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.per_token_cast_to_e5m6(x, ue8m0, amax_clamp, scale_mode, out)
    check_dtype(x, "x", FLOAT_TYPES)
    check_rank(x, "x", 2)
    m, k = x.shape
    if k % CODES_PER_GROUP != 0:
        raise ValueError(f"x.shape[1] (K = {k}) must be a multiple of {CODES_PER_GROUP}")
    rows = rows_per_block(k)
    smem_bytes = cast_smem_bytes(rows, k, x.dtype)
    if smem_bytes > MAX_STAGED_BYTES:
        raise ValueError(f"x rows are too long for the e5m6 cast: {rows} row(s) of K = {k} {x.dtype} elements "
                         f"and their codes ({smem_bytes} bytes) must fit in {MAX_STAGED_BYTES} bytes of shared memory")
    check_row_major_rows(x, "x")
    mode = parse_scale_mode(scale_mode, ue8m0)
    check_amax_clamp(amax_clamp)
    check_cuda_device(x, "x")

    if out is None:
        packed, scales = x.new_empty((m, packed_words(k)), dtype=torch.int32), x.new_empty((m,), dtype=torch.float32)
    else:
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise TypeError(f"out must be a pair (packed, scales), got {type(out).__name__}")
        packed, scales = out
        check_vector_output(packed, "out[0]", (m, packed_words(k)), torch.int32, x)
        check_output(scales, "out[1]", (m,), torch.float32, x)
    if m == 0 or k == 0:
        return packed, scales

    kernel = _cast_kernel(x.dtype, rows, ue8m0, mode, smem_bytes)
    kernel.launch((ceil_div(m, rows), 1, 1), x.get_device(), x=x.data_ptr(), packed=packed.data_ptr(),
                  scales=scales.data_ptr(), shape_m=m, shape_k=k, x_row_stride=x.stride(0), amax_clamp=float(amax_clamp))
    return packed, scales


E5M6_CAST_BACK = KernelDef(
    "kernels/smxx_e5m6_cast_back.cuh", "smxx_e5m6_cast_back_impl",
    template=("OutT", "kNumWarps", "kTiles"),
    params=(Param("packed", PTR), Param("scales", PTR), Param("y", PTR), Param("num_groups", U32),
            Param("row_magic", U32), Param("row_shift", U32)),
    threads=lambda t: t["kNumWarps"] * 32)


def _cast_back_spec(out_dtype: torch.dtype) -> KernelSpec:
    return E5M6_CAST_BACK.spec(OutT=out_dtype, kNumWarps=_CAST_BACK_WARPS, kTiles=_CAST_BACK_TILES)


@functools.lru_cache(maxsize=None)
def _cast_back_kernel(out_dtype: torch.dtype):
    return get_kernel(_cast_back_spec(out_dtype))


def per_token_cast_back_e5m6(packed: torch.Tensor, scales: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16,
                             out: torch.Tensor = None) -> torch.Tensor:
    """Dequantize per_token_cast_to_e5m6's output: y = RNE(float(code) * scale) as out_dtype [M, K].

    Args:
        packed: int32 [M, 3K/8], contiguous and 16-byte aligned (any bits: every code decodes).
        scales: FP32 [M], contiguous.
        out_dtype: torch.bfloat16 or torch.float32.
        out: optional contiguous, 16-byte aligned [M, K] tensor of out_dtype to write into.

    Returns:
        y [M, K] of out_dtype, contiguous.

    Notes:
        float(code) is exact (the half with bits code << 4); inf and NaN codes give inf and NaN, a zero code
        times an infinite scale NaN. Deterministic; bit-exact with
        deep_kernels.reference.quant.per_token_cast_back_e5m6.
    """
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.per_token_cast_back_e5m6(packed, scales, out_dtype, out)
    check_dtype(packed, "packed", (torch.int32,))
    check_rank(packed, "packed", 2)
    if out_dtype not in FLOAT_TYPES:
        raise TypeError(f"out_dtype must be torch.bfloat16 or torch.float32, got {out_dtype}")
    m, num_words = packed.shape
    if num_words % WORDS_PER_GROUP != 0:
        raise ValueError(f"packed.shape[1] ({num_words}) must be a multiple of {WORDS_PER_GROUP} (3K/8 words)")
    k = num_words // WORDS_PER_GROUP * CODES_PER_GROUP
    if not packed.is_contiguous():
        raise ValueError(f"packed must be contiguous, got strides {tuple(packed.stride())}")
    check_aligned(packed, "packed")
    if m * k // CODES_PER_GROUP > MAX_GROUPS:
        raise ValueError(f"packed has too many codes ({m} x {k}) for one launch: split it")
    check_dtype(scales, "scales", (torch.float32,))
    if tuple(scales.shape) != (m,) or not scales.is_contiguous():
        raise ValueError(f"scales must be a contiguous tensor of shape ({m},), got shape {tuple(scales.shape)} "
                         f"strides {tuple(scales.stride())}")
    check_cuda_device(packed, "packed")
    check_cuda_device(scales, "scales", like=packed)

    y = output_or_new(out, "out", (m, k), out_dtype, packed)
    check_aligned(y, "out")
    if m == 0 or k == 0:
        return y
    num_groups = m * k // CODES_PER_GROUP
    per_block = _CAST_BACK_TILES * _CAST_BACK_TILE_GROUPS * _CAST_BACK_WARPS
    row_magic, row_shift = row_divisor(k // CODES_PER_GROUP)
    _cast_back_kernel(out_dtype).launch(
        (ceil_div(num_groups, per_block), 1, 1), packed.get_device(), packed=packed.data_ptr(),
        scales=scales.data_ptr(), y=y.data_ptr(), num_groups=num_groups, row_magic=row_magic, row_shift=row_shift)
    return y


@precompiled
def precompile_specs() -> list:
    """The specializations `python -m deep_kernels precompile` builds for this module."""
    specs = []
    for dtype in FLOAT_TYPES:
        for rows in (1, 2, 4):
            specs.append(_cast_spec(dtype, rows, False, ScaleMode.mul))
        specs.append(_cast_spec(dtype, 1, True, ScaleMode.mul))
        specs.append(_cast_spec(dtype, 1, False, ScaleMode.div))
        specs.append(_cast_back_spec(dtype))
    return specs
