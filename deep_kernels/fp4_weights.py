"""One-time preparation of MXFP4 weights for fp8_fp4_gemm_nt: the codes and scales reordered into the layout its
decode kernel (csrc/kernels/sm90_fp8_fp4_gemm_swap_ab.cuh) reads with the fewest instructions. Done once, at load
time, never per call; the prepared tensor replaces (codes, scales) as fp8_fp4_gemm_nt's b.

Layout: uint8 [ceil(N / 64), K / 128, 4352], one 4352-byte chunk per 64-row tile and 128-deep K block, loaded by one
bulk copy. Rows past N (N rounded up to 64) hold zero codes and scales. In a chunk, with row r = 16w + 8h + g (w in
0..3, h in 0..1, g in 0..7) and the columns of 32-wide sub-block s (0..3) that a wgmma register fragment gives to
lane quad position q (0..3): low elements 32s + 4q + i and high ones 32s + 16 + 4q + i (i in 0..3):
  - bytes [2048h + 16(32w + 4g + q) + 4s, + 4): the eight codes of (r, s, q) as one 32-bit word whose nibble j
    holds the magnitude (bits 0-2) of low element j (j < 4) or high element j - 4, and in bit 3 the sign of high
    element j / 2 (j even) or low element (j - 1) / 2 (j odd);
  - bytes [4096 + 4(2(8w + g) + h), + 4): row r's scale word: byte s is 8 * min(e_max - e_s, 31) (e_s the UE8M0
    exponent of sub-block s, e_max the largest of the four) plus, in its low two bits, bits 2s and 2s + 1 of e_max.
Numerics are the unprepared weights' (fp8_fp4_gemm_nt's Notes): the kernel expands a sub-block with the same table
(shift min(e_max - e_s, 31)) and promotes with the same 2^(e_max - 133).
"""

import torch

TILE_ROWS = 64
K_BLOCK = 128
SUB_BLOCK = 32
CODES_BYTES = TILE_ROWS * K_BLOCK // 2
CHUNK_BYTES = CODES_BYTES + TILE_ROWS * 4
MAX_SHIFT = 31


def _check_unprepared(codes, scales) -> tuple:
    if not isinstance(codes, torch.Tensor) or codes.dtype not in (torch.float4_e2m1fn_x2, torch.uint8):
        raise TypeError(f"codes must be a float4_e2m1fn_x2 or uint8 tensor, got {getattr(codes, 'dtype', type(codes))}")
    if not isinstance(scales, torch.Tensor) or scales.dtype not in (torch.float8_e8m0fnu, torch.uint8):
        raise TypeError(f"scales must be a float8_e8m0fnu or uint8 tensor, got "
                        f"{getattr(scales, 'dtype', type(scales))}")
    if codes.dim() != 2 or codes.shape[0] == 0 or codes.shape[1] == 0 or codes.shape[1] % (K_BLOCK // 2):
        raise ValueError(f"codes must be [N, K / 2] with K a positive multiple of {K_BLOCK}, got shape "
                         f"{tuple(codes.shape)}")
    n, k = codes.shape[0], 2 * codes.shape[1]
    if tuple(scales.shape) != (n, k // SUB_BLOCK):
        raise ValueError(f"scales must be [N, K / 32] = {(n, k // SUB_BLOCK)} (one UE8M0 scale per row and 32 "
                         f"columns), got shape {tuple(scales.shape)}")
    if scales.device != codes.device:
        raise ValueError(f"codes and scales must be on one device, got {codes.device} and {scales.device}")
    return n, k


def prepare_fp4_weights(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """MXFP4 weights (codes [N, K / 2] float4_e2m1fn_x2 or uint8, scales [N, K / 32] float8_e8m0fnu or uint8, as
    per_token_cast_to_mxfp4 returns them) in the layout the FP8 x MXFP4 GEMM's decode kernel reads fastest (the
    module docstring): uint8 [ceil(N / 64), K / 128, 4352] on the inputs' device. Pass it as b to fp8_fp4_gemm_nt.
    Torch ops, meant for load time (a few passes over the weights)."""
    n, k = _check_unprepared(codes, scales)
    tiles, k_blocks = -(-n // TILE_ROWS), k // K_BLOCK
    pad = tiles * TILE_ROWS - n
    code_bytes = torch.nn.functional.pad(codes.view(torch.uint8), (0, 0, 0, pad))
    exponents = torch.nn.functional.pad(scales.view(torch.uint8), (0, 0, 0, pad)).int()

    nibbles = torch.stack([code_bytes & 0xF, code_bytes >> 4], dim=-1)
    # [tile, w, h, g, K block, s, half, q, i] -> [tile, K block, h, w, g, q, s, half, i]
    nibbles = nibbles.view(tiles, 4, 2, 8, k_blocks, 4, 2, 4, 4).permute(0, 4, 2, 1, 3, 7, 5, 6, 8)
    magnitudes = (nibbles & 7).flatten(-2)
    signs = nibbles >> 3
    signs = torch.stack([signs[..., 1, :], signs[..., 0, :]], dim=-1).flatten(-2)
    prepared_nibbles = magnitudes | (signs << 3)
    prepared_codes = (prepared_nibbles[..., 0::2] | (prepared_nibbles[..., 1::2] << 4)).reshape(tiles, k_blocks, -1)

    # [tile, w, h, g, K block, s] -> [tile, K block, w, g, h, s]
    exponents = exponents.view(tiles, 4, 2, 8, k_blocks, 4).permute(0, 4, 1, 3, 2, 5)
    e_max = exponents.amax(dim=-1, keepdim=True)
    offsets = (e_max - exponents).clamp(max=MAX_SHIFT) * 8
    e_max_bits = torch.cat([(e_max >> (2 * s)) & 3 for s in range(4)], dim=-1)
    words = (offsets | e_max_bits).to(torch.uint8).reshape(tiles, k_blocks, -1)
    return torch.cat([prepared_codes.to(torch.uint8), words], dim=-1).contiguous()


def check_prepared(prepared, n: int, k: int) -> None:
    """prepared is prepare_fp4_weights's tensor for N = n rows and K = k columns."""
    if not isinstance(prepared, torch.Tensor) or prepared.dtype != torch.uint8:
        raise TypeError(f"prepared weights must be the uint8 tensor of prepare_fp4_weights, got "
                        f"{getattr(prepared, 'dtype', type(prepared))}")
    shape = (-(-n // TILE_ROWS), k // K_BLOCK, CHUNK_BYTES)
    if tuple(prepared.shape) != shape or not prepared.is_contiguous():
        raise ValueError(f"prepared weights for N = {n}, K = {k} must be contiguous of shape {shape} "
                         f"(prepare_fp4_weights), got shape {tuple(prepared.shape)} strides {tuple(prepared.stride())}")


def restore_fp4_weights(prepared: torch.Tensor, n: int) -> tuple:
    """(codes [N, K / 2] uint8, scales [N, K / 32] uint8) back from prepare_fp4_weights's tensor of N rows: the
    codes exactly; a scale whose sub-block lay more than 2^31 below its 128-block's largest comes back as exactly
    2^31 below it (the same e4m3 expansion: zero)."""
    tiles, k_blocks = prepared.shape[0], prepared.shape[1]
    # [tile, K block, h, w, g, q, s, byte] -> nibbles [..., s, j]
    code_bytes = prepared[..., :CODES_BYTES].view(tiles, k_blocks, 2, 4, 8, 4, 4, 4)
    nibbles = torch.stack([code_bytes & 0xF, code_bytes >> 4], dim=-1).flatten(-2)
    magnitudes = (nibbles & 7).unflatten(-1, (2, 4))  # [..., half, i]
    signs = (nibbles >> 3).unflatten(-1, (4, 2)).flip(-1).transpose(-1, -2)  # [..., half, i]
    original = magnitudes | (signs << 3)
    # [tile, K block, h, w, g, q, s, half, i] -> [tile, w, h, g, K block, s, half, q, i]
    original = original.permute(0, 3, 2, 4, 1, 6, 7, 5, 8).reshape(tiles * TILE_ROWS, -1)
    codes = original[:, 0::2] | (original[:, 1::2] << 4)

    words = prepared[..., CODES_BYTES:].view(tiles, k_blocks, 4, 8, 2, 4).int()  # [tile, K block, w, g, h, s]
    e_max = sum((words[..., s:s + 1] & 3) << (2 * s) for s in range(4))
    exponents = e_max - (words >> 3)
    scales = exponents.permute(0, 2, 4, 3, 1, 5).reshape(tiles * TILE_ROWS, -1)
    return codes[:n].to(torch.uint8).contiguous(), scales[:n].to(torch.uint8).contiguous()
