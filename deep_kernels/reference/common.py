"""What the references share, written from the formats' definitions (README, quantization section) and not
taken from the kernel modules: a reference that shares a helper with a kernel shares its bugs.

Scale layouts of per-token scales [M, G] (M rows, G groups), with M_4 = M rounded up to 4 (16-byte columns):
    "row_major"     FP32 [M, G], strides (G, 1)
    "mn_major"      FP32 [M, G], strides (1, M_4): what the FP8 GEMM reads
    "packed_ue8m0"  int32 [M, ceil(G / 4)], strides (1, M_4): byte g % 4 (little-endian) of word g // 4 is group
                    g's UE8M0 exponent; the unused bytes of a row's last word are zero
A batch [B, M, G] of such blocks (the masked MoE layouts) puts block b at b * (M * G) elements (row-major) or
b * (columns * M_4) (the MN-major layouts).
UE8M0 byte e: the FP32 number 2^(e - 127) (its exponent field is e), except e = 0: 2^-127.
"""

import torch

E4M3_MAX = 448.0
DEFAULT_AMAX_CLAMP = 1e-4


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def name_of(option) -> str:
    """A scale layout or scale mode given by name, or by any enum member of that name."""
    return getattr(option, "name", option)


def divides(scale_mode) -> bool:
    """Whether `scale_mode` brings values into range by dividing by the scale ("div") or multiplying ("mul")."""
    mode = name_of(scale_mode)
    if mode not in ("mul", "div"):
        raise ValueError(f"unknown scale mode {scale_mode!r}")
    return mode == "div"


def scale_geometry(m: int, num_groups: int, layout) -> tuple:
    """(dtype, shape, strides) of the scales of [m, num_groups] groups in `layout`."""
    layout = name_of(layout)
    columns_stride = ceil_div(m, 4) * 4
    if layout == "row_major":
        return torch.float32, (m, num_groups), (num_groups, 1)
    if layout == "mn_major":
        return torch.float32, (m, num_groups), (1, columns_stride)
    if layout == "packed_ue8m0":
        return torch.int32, (m, ceil_div(num_groups, 4)), (1, columns_stride)
    raise ValueError(f"unknown scale layout {layout!r}")


def batched_scale_geometry(batches, m: int, num_groups: int, layout) -> tuple:
    """scale_geometry of [m, num_groups] groups, or with batches (not None) [batches, m, ...] such blocks."""
    dtype, shape, strides = scale_geometry(m, num_groups, layout)
    if batches is None:
        return dtype, shape, strides
    block = shape[0] * shape[1] if name_of(layout) == "row_major" else shape[1] * strides[1]
    return dtype, (batches, *shape), (block, *strides)


def empty_scales(m: int, num_groups: int, layout, device, batches=None) -> torch.Tensor:
    dtype, shape, strides = batched_scale_geometry(batches, m, num_groups, layout)
    return torch.empty_strided(shape, strides, dtype=dtype, device=device)


def ue8m0_bytes(scales: torch.Tensor) -> torch.Tensor:
    """uint8 exponent fields of FP32 scales (powers of two: their UE8M0 codes)."""
    return ((scales.float().contiguous().view(torch.int32) >> 23) & 0xFF).to(torch.uint8)


def ue8m0_to_float(exponents: torch.Tensor) -> torch.Tensor:
    """UE8M0 bytes (any integer dtype) to FP32: exponent field e, zero mantissa; e = 0 is 2^-127."""
    e = exponents.to(torch.int32)
    return torch.where(e == 0, 0x00400000, e << 23).view(torch.float32)


def pack_ue8m0(scales: torch.Tensor) -> torch.Tensor:
    """FP32 [M, G] (powers of two) to int32 words [M, ceil(G / 4)], row-major: byte g % 4 of word g // 4."""
    m, num_groups = scales.shape
    padded = torch.zeros((m, ceil_div(num_groups, 4) * 4), dtype=torch.uint8, device=scales.device)
    padded[:, :num_groups] = ue8m0_bytes(scales)
    return padded.view(torch.int32)


def unpack_ue8m0_bytes(words: torch.Tensor, rows: int, num_groups: int) -> torch.Tensor:
    """Packed int32 words [..., W] of any strides to the UE8M0 bytes [rows (all batches), num_groups]."""
    # NOTE: a fresh tensor, not contiguous(): that keeps odd strides of size-1 dimensions, which view() rejects.
    dense = words.new_empty(words.shape).copy_(words).reshape(-1, words.shape[-1])
    return dense.view(torch.uint8).view(rows, -1)[:, :num_groups]


def unpack_ue8m0(words: torch.Tensor, rows: int, num_groups: int) -> torch.Tensor:
    """Packed int32 words [..., W] of any strides to FP32 [rows (all batches), num_groups]."""
    return ue8m0_to_float(unpack_ue8m0_bytes(words, rows, num_groups))


def pack_scales(scales: torch.Tensor, layout) -> torch.Tensor:
    """FP32 scales [M, G] written into `layout` (a name, or an enum member of that name)."""
    m, num_groups = scales.shape
    out = empty_scales(m, num_groups, layout, scales.device)
    out.copy_(pack_ue8m0(scales) if name_of(layout) == "packed_ue8m0" else scales)
    return out


def unpack_scales(scales: torch.Tensor, m: int, num_groups: int) -> torch.Tensor:
    """Scales of [m, num_groups] groups in any layout (FP32 of any strides, or packed int32) as FP32 [M, G]."""
    if scales.dtype == torch.int32:
        return unpack_ue8m0(scales, m, num_groups)
    return scales.float().contiguous()
