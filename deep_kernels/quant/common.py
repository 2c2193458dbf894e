"""What every cast of the quantization family shares: the scale layouts and modes, the token-group tile
geometry of the per-token kernels, and the argument checks.

Scale layouts (ScaleLayout, mirrored from csrc/common/types.cuh), with M_ALIGNED = M rounded up to 4:
    "mn_major"      FP32 [M, G], strides (1, M_ALIGNED): transposed and TMA-aligned, what the FP8 GEMM reads
    "row_major"     FP32 [M, G], strides (G, 1)
    "packed_ue8m0"  int32 [M, ceil(G / 4)], strides (1, M_ALIGNED): byte g % 4 of word g // 4 is group g's
                    UE8M0 exponent (little-endian); unused bytes of the last word are zero
"""

from enum import IntEnum

import torch

from deep_kernels.validation import (
    check_aligned, check_bool, check_cuda_device, check_dtype, check_fp32_number, check_rank, ceil_div,
    tma_aligned_size,
)

E4M3_MAX = 448.0
DEFAULT_AMAX_CLAMP = 1e-4


class ScaleLayout(IntEnum):
    row_major = 0
    mn_major = 1
    packed_ue8m0 = 2

    @property
    def cpp(self) -> str:
        return "deep_kernels::ScaleLayout::" + ("RowMajor", "MNMajor", "MNMajorPackedUE8M0")[self.value]


class ScaleMode(IntEnum):
    """How x is brought into e4m3 range: multiplied by 448 / amax, or divided by the scale."""

    mul = 0
    div = 1

    @property
    def cpp(self) -> str:
        return "deep_kernels::ScaleMode::" + ("Multiply", "Divide")[self.value]


FLOAT_TYPES = (torch.bfloat16, torch.float32)
# The smallest amax clamp of the FP8 and E5M6 casts. Below 448 / FLT_MAX (about 1.3e-36; 1.9e-34 for E5M6's
# 65024) the multiplier format_max / amax of a group at the clamp overflows to inf, and the kernels' codes stopped
# matching the reference's (980 of 4M codes differed at 1e-37); 1e-30 keeps a margin and is what the GPU tests
# compare at.
MIN_AMAX_CLAMP = 1e-30
NUM_WARPS = 8
PASSES = 4


# A group spans 1 to 32 lanes of 16-byte vectors (8 elements for cast-back, whatever its output).
GROUP_SIZES = {dtype: tuple(16 // dtype.itemsize * lanes for lanes in (1, 2, 4, 8, 16, 32))
                for dtype in (torch.bfloat16, torch.float32)}
# CUDA's limit on gridDim.y, where the row blocks go.
MAX_ROW_BLOCKS = 65535


def supported_group_sizes(dtype: torch.dtype) -> tuple:
    """Group sizes of the per-token kernels for a bf16 or fp32 input."""
    return GROUP_SIZES[dtype]


def block_rows(group_size: int, vector: int) -> int:
    # Mirrors TokenGroupTile::BLOCK_ROWS (csrc/common/token_group_tile.cuh) for PASSES loads of `vector` elements
    # a thread, whether a tile pass takes one load or several (the per-token cast's 16 elements a thread).
    return (32 // (group_size // vector)) * NUM_WARPS * PASSES


def scale_geometry(m: int, num_groups: int, layout: ScaleLayout) -> tuple:
    """(dtype, shape, strides) of the scales of [m, num_groups] groups in `layout`."""
    if layout == ScaleLayout.row_major:
        return torch.float32, (m, num_groups), (num_groups, 1)
    if layout == ScaleLayout.mn_major:
        return torch.float32, (m, num_groups), (1, tma_aligned_size(m, 4))
    return torch.int32, (m, ceil_div(num_groups, 4)), (1, tma_aligned_size(m, 4))


def kernel_scale_stride(scales: torch.Tensor, layout: ScaleLayout) -> int:
    """The scale kernels' stride argument, in elements (int32 words when packed): between rows in the
    row-major layout, between group columns in the MN-major ones (batch dimensions lead)."""
    return scales.stride(-2) if layout == ScaleLayout.row_major else scales.stride(-1)


def empty_scales(m: int, num_groups: int, layout: ScaleLayout, like: torch.Tensor) -> torch.Tensor:
    """An uninitialised scale tensor of [m, num_groups] groups in `layout`, on like's device."""
    dtype, shape, strides = scale_geometry(m, num_groups, layout)
    return like.new_empty_strided(shape, strides, dtype=dtype)


def unpack_ue8m0(words: torch.Tensor, rows: int, groups: int) -> torch.Tensor:
    """Packed UE8M0 int32 [rows, ceil(groups / 4)] (any strides) to FP32 [rows, groups]: 2^(e - 127) per
    byte, e = 0 being the subnormal 2^-127."""
    exponents = words.new_empty(words.shape).copy_(words).view(torch.uint8).view(rows, -1)[:, :groups].int()
    return torch.where(exponents == 0, 0x00400000, exponents << 23).view(torch.float32)


def check_scales(scales: torch.Tensor, name: str, m: int, num_groups: int, layout: ScaleLayout) -> None:
    """scales has the dtype, shape and strides (of dimensions longer than 1) of `layout`."""
    check_scale_geometry(scales, name, scale_geometry(m, num_groups, layout), layout)


def check_scale_geometry(scales: torch.Tensor, name: str, geometry: tuple, layout: ScaleLayout) -> None:
    """scales has the (dtype, shape, strides) geometry, strides compared on dimensions longer than 1."""
    dtype, shape, strides = geometry
    check_dtype(scales, name, (dtype,))
    if tuple(scales.shape) != shape or any(
        size > 1 and stride != want for size, stride, want in zip(shape, scales.stride(), strides)
    ):
        raise ValueError(
            f"{name} must have shape {shape} with strides {strides} ({layout.name} scales), "
            f"got shape {tuple(scales.shape)} strides {tuple(scales.stride())}"
        )


def scale_layout_of(scales: torch.Tensor, m: int, num_groups: int) -> ScaleLayout:
    """The layout of an existing scale tensor (as this module writes them), or a clear error."""
    check_dtype(scales, "scales", (torch.float32, torch.int32))
    check_rank(scales, "scales", 2)
    if scales.dtype == torch.int32:
        layout = ScaleLayout.packed_ue8m0
    else:
        # Only strides of dimensions longer than 1 matter; with one group both FP32 layouts coincide.
        transposed = scales.stride(0) == 1 if m > 1 else scales.stride(-1) != 1
        layout = ScaleLayout.mn_major if transposed and num_groups > 1 else ScaleLayout.row_major
    check_scales(scales, "scales", m, num_groups, layout)
    return layout


def parse_layout(scale_layout, ue8m0: bool) -> ScaleLayout:
    try:
        layout = ScaleLayout[scale_layout]
    except KeyError:
        raise ValueError(
            f"scale_layout must be one of {[layout.name for layout in ScaleLayout]}, got {scale_layout!r}"
        ) from None
    if layout == ScaleLayout.packed_ue8m0 and not ue8m0:
        raise ValueError("scale_layout='packed_ue8m0' needs ue8m0=True (packed scales are powers of two)")
    return layout


def parse_scale_mode(scale_mode, ue8m0: bool) -> ScaleMode:
    """The kernel's mode; with ue8m0 both modes give the same bits, so one kernel serves them."""
    check_bool(ue8m0, "ue8m0")
    try:
        mode = ScaleMode[scale_mode]
    except (KeyError, TypeError):
        raise ValueError(
            f"scale_mode must be one of {[mode.name for mode in ScaleMode]}, got {scale_mode!r}"
        ) from None
    return ScaleMode.mul if ue8m0 else mode


def check_amax_clamp(amax_clamp, minimum: float = MIN_AMAX_CLAMP) -> None:
    """amax_clamp is a finite FP32 number from `minimum` up (MIN_AMAX_CLAMP: the FP8 and E5M6 casts)."""
    check_fp32_number(amax_clamp, "amax_clamp", positive=True)
    if amax_clamp < minimum:
        raise ValueError(f"amax_clamp must be at least {minimum:g}, got {amax_clamp!r}")


def check_group_size(group_size, m: int, k: int, dtype: torch.dtype, argument: str) -> None:
    if group_size not in GROUP_SIZES[dtype] or not isinstance(group_size, int):
        raise ValueError(f"group_size must be one of {GROUP_SIZES[dtype]} for {dtype}, got {group_size!r}")
    if k % group_size != 0:
        raise ValueError(f"{argument}.shape[1] (K = {k}) must be a multiple of group_size = {group_size}")
    if ceil_div(m, block_rows(group_size, 16 // dtype.itemsize)) > MAX_ROW_BLOCKS:
        raise ValueError(f"{argument} has too many rows ({m}) for one launch: split it")


def check_output(t, name: str, shape: tuple, dtype: torch.dtype, like: torch.Tensor) -> None:
    check_dtype(t, name, (dtype,))
    if tuple(t.shape) != shape or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous tensor of shape {shape}, got shape {tuple(t.shape)} "
                         f"strides {tuple(t.stride())}")
    check_cuda_device(t, name, like=like)


def check_vector_output(t, name: str, shape: tuple, dtype: torch.dtype, like: torch.Tensor) -> None:
    """check_output, and a 16-byte aligned start: the kernels store 16-byte vectors."""
    check_output(t, name, shape, dtype, like)
    check_aligned(t, name)


def output_or_new(out, name: str, shape: tuple, dtype: torch.dtype, like: torch.Tensor) -> torch.Tensor:
    """`out` checked as a contiguous `shape` tensor of `dtype` on like's device, or a new one."""
    if out is None:
        return like.new_empty(shape, dtype=dtype)
    check_output(out, name, shape, dtype, like)
    return out


def cast_outputs(out, x: torch.Tensor, rows: int, cols: int, num_groups: int, layout: ScaleLayout) -> tuple:
    """(q [rows, cols] float8_e4m3fn, scales of [rows, num_groups] groups in layout) of a cast: out's, checked
    (q contiguous and 16-byte aligned for the kernels' vector stores), or new ones on x's device."""
    if out is None:
        return x.new_empty((rows, cols), dtype=torch.float8_e4m3fn), empty_scales(rows, num_groups, layout, x)
    q, scales = out
    check_vector_output(q, "out[0]", (rows, cols), torch.float8_e4m3fn, x)
    check_scales(scales, "out[1]", rows, num_groups, layout)
    check_cuda_device(scales, "out[1]", like=x)
    return q, scales
