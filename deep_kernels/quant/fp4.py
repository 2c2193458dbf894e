"""FP4 e2m1 casts (MXFP4 and NVFP4), their cast-backs, and the exact MXFP4 -> FP8 requantization.

Numerics (bit-exact with deep_kernels.reference.quant.fp4), per row and group:
    amax  = max |x| over the group, clamped below by amax_clamp (NaN propagates)
    MXFP4 (1x32 groups, UE8M0 scales):
        scale = 2^ceil(log2(amax / 6)) (IEEE division, then the exponent rounded up), so no value saturates;
        q = e2m1(x * (1 / scale)). Dividing by a power of two is multiplying by its exact inverse, so both
        scale modes give the same bits (one kernel serves them).
    NVFP4 (1x16 groups, E4M3 scales and one FP32 global scale g, a device tensor):
        block = E4M3(max(amax / 6 / g, 2^-9))    (two IEEE divisions; RNE, saturating at 448; NaN kept)
        scale = float(block) * g                 (FP32 product: what dequantization multiplies by)
        scale_mode="mul" (default): q = e2m1(x * (1 / scale))   (IEEE reciprocal, FP32 product)
        scale_mode="div":           q = e2m1(x / scale)
        The usual recipe takes g = max(amax of the tensor, amax_clamp) / (448 * 6) (nvfp4_global_scale), so the
        tensor's largest block gets block scale 448. The floor 2^-9 (e4m3's smallest subnormal) keeps every
        block scale nonzero: a block far below the tensor's amax still gets codes rather than zeros.
        (Unlike FP8 and MXFP4, the multiplier cannot be 6 / amax: the scale was rounded to e4m3 first.)
    e2m1: magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}, round-to-nearest-even, saturating at 6; the code's sign
    bit is the input's sign bit (-0 -> 0x8). Two codes per byte, element 2i in the LOW nibble; the codes
    tensor is torch.float4_e2m1fn_x2 [M, K / 2].
    NaN and inf (e2m1 has neither): a NaN in a group makes its scale NaN (UE8M0 0xFF, E4M3 0x7F) and every
    code of the group +-6 (0x7 / 0xF by each input's sign), so the group dequantizes to NaN. An infinity
    makes an MXFP4 scale 0xFF (E8M0's NaN), its own code +-6 and the group's finite codes +-0; in NVFP4 it
    saturates the block scale to 448, its own code is +-6 and the other codes are those of the block scale.
DEFAULT_FP4_AMAX_CLAMP = 1e-12: e2m1's 3 magnitude bits lose a group's small values long before the clamp
matters, so it only has to keep the scales of all-zero groups finite and positive; 1e-12 does that while
leaving groups of genuinely small values (gradients in fp32) their own scale. amax_clamp must be at least
1e-37 so that amax / 6 stays a normal FP32 number and 1 / scale is finite.

Scale layouts (FP4_SCALE_LAYOUTS), one byte per (row m, group g), G = K / group size:
    "row_major"     [M, G] contiguous: torch.float8_e8m0fnu (MXFP4) or torch.float8_e4m3fn (NVFP4)
    "packed_ue8m0"  MXFP4 only: int32 [M, ceil(G / 4)] MN-major, as the FP8 GEMM reads (quant.common)
    "swizzled"      NVFP4 only: the layout of cuBLAS / CUTLASS block-scaled GEMMs ("1D block scaling factors
                    layout"): float8_e4m3fn [ceil(M / 128) * 128, ceil(G / 4) * 4] contiguous whose bytes are
                    tiles of 128 rows x 4 groups, 512 bytes each, ordered row-block-major (tile (m // 128,
                    g // 4) at (m // 128 * ceil(G / 4) + g // 4) * 512); inside a tile (m % 32) * 16 +
                    (m % 128 // 32) * 4 + g % 4. Padding rows and groups are zeros.

Requantization (mxfp4_requant_to_fp8): exactly per_token_cast_to_fp8(mxfp4_cast_back(codes, scales, fp32),
128, ue8m0=True), with the dequantized values e2m1 * 2^(e - 127) exact in FP32 (up to 6 * 2^127, which
overflows to inf). A code lands exactly in e4m3 when its 32-group's scale is at most 2^14 below the 128-group's
largest and the group's amax is above amax_clamp (then the FP8 scale 2^E <= 2^(e_max - 6), so every value is a
multiple of 2^-9 of it and at most 448 of it); codes of groups further below round to e4m3's subnormal steps
(RNE), and nothing saturates. A NaN scale (0xFF) makes the 128-group's FP8 scale and codes NaN.
"""

import functools
from enum import IntEnum

import torch

from deep_kernels.jit.definition import F32, PTR, U32, KernelDef, Param
from deep_kernels.jit.registry import precompiled
from deep_kernels.jit.runtime import get_kernel
from deep_kernels.jit.source import KernelSpec
from deep_kernels.quant.common import (
    DEFAULT_AMAX_CLAMP, FLOAT_TYPES, MAX_ROW_BLOCKS, NUM_WARPS, PASSES, ScaleLayout, ScaleMode, block_rows,
    cast_outputs, check_amax_clamp, check_scales, check_vector_output, kernel_scale_stride, output_or_new, parse_layout,
    parse_scale_mode, scale_geometry,
)
from deep_kernels.validation import (
    ceil_div, check_aligned, check_cuda_device, check_dtype, check_rank, check_row_major_rows, check_tensor,
    is_traced, tma_aligned_size,
)

E2M1_MAX = 6.0
MXFP4_GROUP_SIZE = 32
NVFP4_GROUP_SIZE = 16
DEFAULT_FP4_AMAX_CLAMP = 1e-12
MIN_FP4_AMAX_CLAMP = 1e-37
CODE_TYPES = (torch.float4_e2m1fn_x2, torch.uint8)
# Elements a cast thread handles per pass (a warp: 32 times as many of one row).
_THREAD_ELEMENTS = 16
# Cast-back: a lane writes one 16-byte vector of bf16 or fp32 per pass (a warp: 512 bytes of one row), with 8
# loads of codes (4 or 2 bytes) and scales in flight per thread.
_CAST_BACK_PASSES = 8
# Output 128-groups of the requantization; a thread decodes one 32-group.
_REQUANT_GROUP_SIZE = 128


class Fp4Format(IntEnum):
    mx = 0
    nv = 1

    @property
    def cpp(self) -> str:
        return "deep_kernels::Fp4Format::" + ("MX", "NV")[self.value]

    @property
    def group_size(self) -> int:
        return (MXFP4_GROUP_SIZE, NVFP4_GROUP_SIZE)[self.value]

    @property
    def scale_dtype(self) -> torch.dtype:
        return (torch.float8_e8m0fnu, torch.float8_e4m3fn)[self.value]


class Fp4ScaleLayout(IntEnum):
    row_major = 0
    packed_ue8m0 = 1
    swizzled = 2

    @property
    def cpp(self) -> str:
        return "deep_kernels::Fp4ScaleLayout::" + ("RowMajor", "MNMajorPackedUE8M0", "Swizzled128x4")[self.value]


# Cast passes by input dtype and format: 8 16-byte loads of bf16 in flight per thread (12 for NVFP4), 4 of fp32.
# These were the fastest at [16384, 7168] bf16: more passes hide more load latency until the registers they hold
# cost occupancy (NVFP4 at 8 passes takes 124 registers).
_CAST_PASSES = {(torch.bfloat16, Fp4Format.mx): 4, (torch.bfloat16, Fp4Format.nv): 6,
                (torch.float32, Fp4Format.mx): 1, (torch.float32, Fp4Format.nv): 1}

FP4_SCALE_LAYOUTS = {Fp4Format.mx: ("row_major", "packed_ue8m0"), Fp4Format.nv: ("row_major", "swizzled")}


def fp4_scale_geometry(m: int, num_groups: int, fmt: Fp4Format, layout: Fp4ScaleLayout) -> tuple:
    """(dtype, shape, strides) of the scales of [m, num_groups] groups of `fmt` in `layout`."""
    if layout == Fp4ScaleLayout.packed_ue8m0:
        return scale_geometry(m, num_groups, ScaleLayout.packed_ue8m0)
    if layout == Fp4ScaleLayout.swizzled:
        rows, cols = ceil_div(m, 128) * 128, ceil_div(num_groups, 4) * 4
        return fmt.scale_dtype, (rows, cols), (cols, 1)
    return fmt.scale_dtype, (m, num_groups), (num_groups, 1)


def empty_fp4_scales(m: int, num_groups: int, fmt: Fp4Format, layout: Fp4ScaleLayout,
                     like: torch.Tensor) -> torch.Tensor:
    dtype, shape, strides = fp4_scale_geometry(m, num_groups, fmt, layout)
    return like.new_empty_strided(shape, strides, dtype=dtype)


def _check_fp4_scales(scales, name: str, m: int, num_groups: int, fmt: Fp4Format, layout: Fp4ScaleLayout) -> None:
    if layout == Fp4ScaleLayout.packed_ue8m0:
        check_scales(scales, name, m, num_groups, ScaleLayout.packed_ue8m0)
        return
    dtype, shape, _ = fp4_scale_geometry(m, num_groups, fmt, layout)
    check_dtype(scales, name, (dtype,))
    if tuple(scales.shape) != shape or not scales.is_contiguous():
        raise ValueError(f"{name} must be a contiguous tensor of shape {shape} ({layout.name} {fmt.name}fp4 "
                         f"scales), got shape {tuple(scales.shape)} strides {tuple(scales.stride())}")


def _parse_fp4_layout(scale_layout, fmt: Fp4Format) -> Fp4ScaleLayout:
    if scale_layout not in FP4_SCALE_LAYOUTS[fmt]:
        raise ValueError(f"scale_layout must be one of {list(FP4_SCALE_LAYOUTS[fmt])} for {fmt.name.upper()}FP4, "
                         f"got {scale_layout!r}")
    return Fp4ScaleLayout[scale_layout]


def _check_fp4_amax_clamp(amax_clamp) -> None:
    """FP4 scales stay normal from MIN_FP4_AMAX_CLAMP up, and 6 / amax never overflows."""
    check_amax_clamp(amax_clamp, MIN_FP4_AMAX_CLAMP)


def _check_global_scale(global_scale, like: torch.Tensor = None) -> None:
    check_dtype(global_scale, "global_scale", (torch.float32,))
    if global_scale.numel() != 1:
        raise ValueError(f"global_scale must hold one element, got shape {tuple(global_scale.shape)}")
    if like is not None:
        check_cuda_device(global_scale, "global_scale", like=like)


def _check_rows(m: int, rows_per_block: int, argument: str) -> None:
    if ceil_div(m, rows_per_block) > MAX_ROW_BLOCKS:
        raise ValueError(f"{argument} has too many rows ({m}) for one launch: split it")


def _check_codes(codes, k_multiple: int):
    """codes [M, K / 2] of CODE_TYPES, contiguous, K a multiple of k_multiple; returns (M, K)."""
    check_dtype(codes, "codes", CODE_TYPES)
    check_rank(codes, "codes", 2)
    m, k = codes.shape[0], codes.shape[1] * 2
    if k % k_multiple != 0:
        raise ValueError(f"codes.shape[1] * 2 (K = {k}) must be a multiple of {k_multiple}")
    if not codes.is_contiguous() or codes.data_ptr() % 16 != 0:
        raise ValueError(f"codes must be contiguous and 16-byte aligned, got strides {tuple(codes.stride())}")
    return m, k


FP4_CAST = KernelDef(
    "kernels/smxx_fp4_cast.cuh", "smxx_fp4_cast_impl",
    template=("InT", "kNumWarps", "kPasses", "kFormat", "kLayout", "kScaleMode"),
    params=(Param("x", PTR), Param("codes", PTR), Param("scales", PTR), Param("global_scale", PTR),
            Param("shape_m", U32), Param("shape_k", U32), Param("x_row_stride", U32), Param("scale_rows", U32),
            Param("scale_stride", U32), Param("amax_clamp", F32)),
    threads=lambda t: t["kNumWarps"] * 32)


def _cast_spec(dtype: torch.dtype, fmt: Fp4Format, layout: Fp4ScaleLayout, mode: ScaleMode) -> KernelSpec:
    return FP4_CAST.spec(InT=dtype, kNumWarps=NUM_WARPS, kPasses=_CAST_PASSES[dtype, fmt], kFormat=fmt, kLayout=layout,
                         kScaleMode=mode)


@functools.lru_cache(maxsize=None)
def _cast_kernel(dtype: torch.dtype, fmt: Fp4Format, layout: Fp4ScaleLayout, mode: ScaleMode):
    return get_kernel(_cast_spec(dtype, fmt, layout, mode))


def _cast_to_fp4(x, global_scale, fmt: Fp4Format, scale_layout, amax_clamp, scale_mode, out):
    check_dtype(x, "x", FLOAT_TYPES)
    check_rank(x, "x", 2)
    m, k = x.shape
    if k % fmt.group_size != 0:
        raise ValueError(f"x.shape[1] (K = {k}) must be a multiple of {fmt.group_size} ({fmt.name.upper()}FP4 groups)")
    rows_per_block = NUM_WARPS * _CAST_PASSES[x.dtype, fmt]
    _check_rows(m, rows_per_block, "x")
    check_row_major_rows(x, "x")
    layout = _parse_fp4_layout(scale_layout, fmt)
    mode = parse_scale_mode(scale_mode, fmt == Fp4Format.mx)
    _check_fp4_amax_clamp(amax_clamp)
    if fmt == Fp4Format.nv:
        _check_global_scale(global_scale)
    check_cuda_device(x, "x")
    if fmt == Fp4Format.nv:
        check_cuda_device(global_scale, "global_scale", like=x)

    num_groups = k // fmt.group_size
    if out is None:
        codes = x.new_empty((m, k // 2), dtype=torch.float4_e2m1fn_x2)
        scales = empty_fp4_scales(m, num_groups, fmt, layout, x)
    else:
        codes, scales = out
        check_vector_output(codes, "out[0]", (m, k // 2), torch.float4_e2m1fn_x2, x)
        _check_fp4_scales(scales, "out[1]", m, num_groups, fmt, layout)
        check_cuda_device(scales, "out[1]", like=x)
    if m == 0 or k == 0:
        return codes, scales

    kernel = _cast_kernel(x.dtype, fmt, layout, mode)
    scale_rows = scales.shape[0] if layout == Fp4ScaleLayout.swizzled else m
    scale_stride = tma_aligned_size(m, 4) if layout == Fp4ScaleLayout.packed_ue8m0 else 0
    global_ptr = global_scale.data_ptr() if fmt == Fp4Format.nv else 0
    grid = (ceil_div(k, 32 * _THREAD_ELEMENTS), ceil_div(scale_rows, rows_per_block), 1)
    kernel.launch(grid, x.get_device(), x=x.data_ptr(), codes=codes.data_ptr(), scales=scales.data_ptr(),
                  global_scale=global_ptr, shape_m=m, shape_k=k, x_row_stride=x.stride(0), scale_rows=scale_rows,
                  scale_stride=scale_stride, amax_clamp=float(amax_clamp))
    return codes, scales


def per_token_cast_to_mxfp4(x: torch.Tensor, scale_layout: str = "row_major",
                            amax_clamp: float = DEFAULT_FP4_AMAX_CLAMP, scale_mode: str = "mul", out=None):
    """Cast x [M, K] (bf16 or fp32) to MXFP4: e2m1 codes with one UE8M0 scale per row and 32 columns.

    Args:
        x: [M, K] bfloat16 or float32 CUDA tensor, K a multiple of 32; rows contiguous, row stride >= K and
            16-byte aligned.
        scale_layout: "row_major" (default; float8_e8m0fnu [M, K / 32]) or "packed_ue8m0" (int32 MN-major).
        amax_clamp: lower bound of amax (>= 1e-37), so all-zero groups get a finite scale.
        scale_mode: "mul" or "div"; identical bits with power-of-two scales (accepted for symmetry with FP8).
        out: optional (codes, scales) to write into, shaped, typed and strided as the ones returned.

    Returns:
        (codes, scales): codes [M, K / 2] torch.float4_e2m1fn_x2, contiguous (element 2i in the low nibble of
        byte i); scales as the module docstring describes.

    Notes:
        Deterministic; bit-exact with deep_kernels.reference.quant.per_token_cast_to_mxfp4. NaN and inf: see
        the module docstring.
    """
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.per_token_cast_to_mxfp4(x, scale_layout, amax_clamp, scale_mode, out)
    return _cast_to_fp4(x, None, Fp4Format.mx, scale_layout, amax_clamp, scale_mode, out)


def per_token_cast_to_nvfp4(x: torch.Tensor, global_scale: torch.Tensor, scale_layout: str = "row_major",
                            amax_clamp: float = DEFAULT_FP4_AMAX_CLAMP, scale_mode: str = "mul", out=None):
    """Cast x [M, K] (bf16 or fp32) to NVFP4: e2m1 codes with one E4M3 scale per row and 16 columns, times
    one FP32 global scale.

    Args:
        x: [M, K] bfloat16 or float32 CUDA tensor, K a multiple of 16; rows contiguous, row stride >= K and
            16-byte aligned.
        global_scale: float32 CUDA tensor of one element, positive and finite (read on the device, so the
            call is CUDA-graph safe; nvfp4_global_scale computes the usual one).
        scale_layout: "row_major" (default; float8_e4m3fn [M, K / 16]) or "swizzled" (128x4 GEMM tiles).
        amax_clamp: lower bound of each block's amax (>= 1e-37).
        scale_mode: "mul" (q = e2m1(x * (1 / scale))) or "div" (q = e2m1(x / scale)).
        out: optional (codes, scales) to write into, shaped and typed as the ones returned, contiguous.

    Returns:
        (codes, scales): codes [M, K / 2] torch.float4_e2m1fn_x2, contiguous; scales float8_e4m3fn as the
        module docstring describes (dequantize with float(scale) * global_scale).

    Notes:
        Deterministic; bit-exact with deep_kernels.reference.quant.per_token_cast_to_nvfp4.
    """
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.per_token_cast_to_nvfp4(x, global_scale, scale_layout, amax_clamp, scale_mode, out)
    return _cast_to_fp4(x, global_scale, Fp4Format.nv, scale_layout, amax_clamp, scale_mode, out)


def nvfp4_global_scale(x: torch.Tensor, amax_clamp: float = DEFAULT_FP4_AMAX_CLAMP) -> torch.Tensor:
    """The usual NVFP4 global scale of x: max(amax(|x|), amax_clamp) / (448 * 6) (IEEE division) as a float32
    tensor of shape (1,) on x's device. Plain torch ops: no host sync, so it can be captured in a CUDA graph;
    a NaN in x makes it NaN."""
    check_dtype(x, "x", FLOAT_TYPES)
    _check_fp4_amax_clamp(amax_clamp)
    if x.numel() == 0:
        return torch.full((1,), amax_clamp, dtype=torch.float32, device=x.device) / (
            torch.full((1,), 448.0 * E2M1_MAX, dtype=torch.float32, device=x.device))
    amax = x.abs().amax().float().clamp(min=amax_clamp).reshape(1)
    return amax / torch.full_like(amax, 448.0 * E2M1_MAX)


FP4_CAST_BACK = KernelDef(
    "kernels/smxx_fp4_cast_back.cuh", "smxx_fp4_cast_back_impl",
    template=("OutT", "kNumWarps", "kPasses", "kFormat", "kLayout"),
    params=(Param("codes", PTR), Param("scales", PTR), Param("global_scale", PTR), Param("y", PTR),
            Param("shape_m", U32), Param("shape_k", U32), Param("scale_stride", U32)),
    threads=lambda t: t["kNumWarps"] * 32)


def _cast_back_spec(out_dtype: torch.dtype, fmt: Fp4Format, layout: Fp4ScaleLayout) -> KernelSpec:
    return FP4_CAST_BACK.spec(OutT=out_dtype, kNumWarps=NUM_WARPS, kPasses=_CAST_BACK_PASSES, kFormat=fmt,
                              kLayout=layout)


@functools.lru_cache(maxsize=None)
def _cast_back_kernel(out_dtype: torch.dtype, fmt: Fp4Format, layout: Fp4ScaleLayout):
    return get_kernel(_cast_back_spec(out_dtype, fmt, layout))


def _cast_back(codes, scales, global_scale, fmt: Fp4Format, layout: Fp4ScaleLayout, out_dtype, out):
    m, k = _check_codes(codes, fmt.group_size)
    # Mirrors TokenGroupTile<32 * vector, vector, NUM_WARPS, _CAST_BACK_PASSES>: one row per warp and pass.
    rows_per_block = NUM_WARPS * _CAST_BACK_PASSES
    _check_rows(m, rows_per_block, "codes")
    if out_dtype not in FLOAT_TYPES:
        raise TypeError(f"out_dtype must be torch.bfloat16 or torch.float32, got {out_dtype}")
    num_groups = k // fmt.group_size
    check_tensor(scales, "scales")
    _check_fp4_scales(scales, "scales", m, num_groups, fmt, layout)
    if fmt == Fp4Format.nv:
        _check_global_scale(global_scale)
    check_cuda_device(codes, "codes")
    check_cuda_device(scales, "scales", like=codes)
    if fmt == Fp4Format.nv:
        check_cuda_device(global_scale, "global_scale", like=codes)

    y = output_or_new(out, "out", (m, k), out_dtype, codes)
    check_aligned(y, "out")
    if m == 0 or k == 0:
        return y
    kernel = _cast_back_kernel(out_dtype, fmt, layout)
    scale_stride = tma_aligned_size(m, 4) if layout == Fp4ScaleLayout.packed_ue8m0 else 0
    global_ptr = global_scale.data_ptr() if fmt == Fp4Format.nv else 0
    grid = (ceil_div(k, 32 * (16 // y.element_size())), ceil_div(m, rows_per_block), 1)
    kernel.launch(grid, codes.get_device(), codes=codes.data_ptr(), scales=scales.data_ptr(), global_scale=global_ptr,
                  y=y.data_ptr(), shape_m=m, shape_k=k, scale_stride=scale_stride)
    return y


def _mx_layout_of(scales) -> Fp4ScaleLayout:
    check_dtype(scales, "scales", (torch.float8_e8m0fnu, torch.int32))
    return Fp4ScaleLayout.packed_ue8m0 if scales.dtype == torch.int32 else Fp4ScaleLayout.row_major


def mxfp4_cast_back(codes: torch.Tensor, scales: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16,
                    out: torch.Tensor = None) -> torch.Tensor:
    """Dequantize MXFP4: y = RNE(e2m1 * 2^(e - 127)) as out_dtype [M, K].

    Args:
        codes: [M, K / 2] float4_e2m1fn_x2 (or uint8), contiguous, K a multiple of 32.
        scales: float8_e8m0fnu [M, K / 32] row-major or packed int32 (the layout is recognised by dtype).
        out_dtype: torch.bfloat16 or torch.float32.
        out: optional contiguous [M, K] tensor of out_dtype to write into.

    Notes:
        Scale byte 0xFF (E8M0's NaN) dequantizes to NaN. Bit-exact with
        deep_kernels.reference.quant.mxfp4_cast_back.
    """
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.mxfp4_cast_back(codes, scales, out_dtype, out)
    check_tensor(scales, "scales")
    return _cast_back(codes, scales, None, Fp4Format.mx, _mx_layout_of(scales), out_dtype, out)


def nvfp4_cast_back(codes: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor,
                    scale_layout: str = "row_major", out_dtype: torch.dtype = torch.bfloat16,
                    out: torch.Tensor = None) -> torch.Tensor:
    """Dequantize NVFP4: y = RNE(e2m1 * (float(scale) * global_scale)) as out_dtype [M, K].

    Args:
        codes: [M, K / 2] float4_e2m1fn_x2 (or uint8), contiguous, K a multiple of 16.
        scales: float8_e4m3fn in `scale_layout` (named, since both layouts can have the same shape).
        global_scale: the float32 one-element CUDA tensor the cast used.
        scale_layout: "row_major" or "swizzled".
        out_dtype: torch.bfloat16 or torch.float32.
        out: optional contiguous [M, K] tensor of out_dtype to write into.

    Notes:
        Bit-exact with deep_kernels.reference.quant.nvfp4_cast_back.
    """
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.nvfp4_cast_back(codes, scales, global_scale, scale_layout, out_dtype, out)
    layout = _parse_fp4_layout(scale_layout, Fp4Format.nv)
    return _cast_back(codes, scales, global_scale, Fp4Format.nv, layout, out_dtype, out)


FP4_REQUANT_FP8 = KernelDef(
    "kernels/smxx_fp4_requant_fp8.cuh", "smxx_fp4_requant_fp8_impl",
    template=("kNumWarps", "kPasses", "kInLayout", "kOutLayout"),
    params=(Param("codes", PTR), Param("in_scales", PTR), Param("q", PTR), Param("out_scales", PTR),
            Param("shape_m", U32), Param("shape_k", U32), Param("in_scale_stride", U32), Param("out_scale_stride", U32),
            Param("amax_clamp", F32)),
    threads=lambda t: t["kNumWarps"] * 32)


def _requant_spec(in_layout: Fp4ScaleLayout, out_layout: ScaleLayout) -> KernelSpec:
    return FP4_REQUANT_FP8.spec(kNumWarps=NUM_WARPS, kPasses=PASSES, kInLayout=in_layout, kOutLayout=out_layout)


@functools.lru_cache(maxsize=None)
def _requant_kernel(in_layout: Fp4ScaleLayout, out_layout: ScaleLayout):
    return get_kernel(_requant_spec(in_layout, out_layout))


def mxfp4_requant_to_fp8(codes: torch.Tensor, scales: torch.Tensor, scale_layout: str = "mn_major",
                         amax_clamp: float = DEFAULT_AMAX_CLAMP, out=None):
    """Requantize MXFP4 (1x32, UE8M0) to FP8 e4m3 with power-of-two scales per 1x128 group.

    Args:
        codes: [M, K / 2] float4_e2m1fn_x2 (or uint8), contiguous, K a multiple of 128.
        scales: the MXFP4 scales, float8_e8m0fnu [M, K / 32] row-major or packed int32.
        scale_layout: the FP8 scales' layout: "mn_major" (default, what fp8_gemm_nt reads), "row_major" or
            "packed_ue8m0", as per_token_cast_to_fp8 writes them with ue8m0=True.
        amax_clamp: lower bound of each 128-group's amax, as in per_token_cast_to_fp8.
        out: optional (q, scales) to write into, shaped, typed and strided as the ones returned.

    Returns:
        (q, scales): q [M, K] float8_e4m3fn, contiguous; scales powers of two in `scale_layout`.

    Notes:
        Bit-exact with per_token_cast_to_fp8(mxfp4_cast_back(codes, scales, torch.float32), 128, ue8m0=True,
        scale_layout=scale_layout, amax_clamp=amax_clamp), and exact (no code changes value) when the 32-groups'
        scales of a 128-group are within 2^14 of each other; see the module docstring. Deterministic.
    """
    if is_traced():  # the custom op (deep_kernels.ops)
        from deep_kernels import ops
        return ops.mxfp4_requant_to_fp8(codes, scales, scale_layout, amax_clamp, out)
    m, k = _check_codes(codes, _REQUANT_GROUP_SIZE)
    rows_per_block = block_rows(_REQUANT_GROUP_SIZE, MXFP4_GROUP_SIZE)
    _check_rows(m, rows_per_block, "codes")
    check_tensor(scales, "scales")
    in_layout = _mx_layout_of(scales)
    _check_fp4_scales(scales, "scales", m, k // MXFP4_GROUP_SIZE, Fp4Format.mx, in_layout)
    out_layout = parse_layout(scale_layout, True)
    check_amax_clamp(amax_clamp)
    check_cuda_device(codes, "codes")
    check_cuda_device(scales, "scales", like=codes)

    num_groups = k // _REQUANT_GROUP_SIZE
    q, out_scales = cast_outputs(out, codes, m, k, num_groups, out_layout)
    if m == 0 or k == 0:
        return q, out_scales

    kernel = _requant_kernel(in_layout, out_layout)
    in_stride = tma_aligned_size(m, 4) if in_layout == Fp4ScaleLayout.packed_ue8m0 else 0
    out_stride = kernel_scale_stride(out_scales, out_layout)
    grid = (num_groups, ceil_div(m, rows_per_block), 1)
    kernel.launch(grid, codes.get_device(), codes=codes.data_ptr(), in_scales=scales.data_ptr(), q=q.data_ptr(),
                  out_scales=out_scales.data_ptr(), shape_m=m, shape_k=k, in_scale_stride=in_stride,
                  out_scale_stride=out_stride, amax_clamp=float(amax_clamp))
    return q, out_scales


@precompiled
def precompile_specs() -> list:
    """The specializations `python -m deep_kernels precompile` builds for this module."""
    specs = []
    for dtype in FLOAT_TYPES:
        for fmt in Fp4Format:
            for layout_name in FP4_SCALE_LAYOUTS[fmt]:
                layout = Fp4ScaleLayout[layout_name]
                specs.append(_cast_spec(dtype, fmt, layout, ScaleMode.mul))
                specs.append(_cast_back_spec(dtype, fmt, layout))
        specs.append(_cast_spec(dtype, Fp4Format.nv, Fp4ScaleLayout.row_major, ScaleMode.div))
    for in_layout in (Fp4ScaleLayout.row_major, Fp4ScaleLayout.packed_ue8m0):
        for out_layout in ScaleLayout:
            specs.append(_requant_spec(in_layout, out_layout))
    return specs
