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
Tile-scaled (tile_scaled, when in every 64-row tile and K block no scale is NaN, the largest exponent E is at least
7, and every sub-block with a nonzero code lies within 2^7 of it): the shifts are taken from the tile's E instead of
the row's e_max, d_s = min(E - e_s, 7), and row r's scale word is instead: bits 4-9 16 (8 d_0 + d_1), bits 20-25
16 (8 d_2 + d_3) (byte offsets of the kernel's pair tables, two sub-blocks' tables each), E - 6 in bits 0-3 (low
nibble) and 12-15 (high nibble), other bits zero. The expanded values are exact, 2^(e_max - E) times the row-scaled
ones, and the promotion scale 2^(E - 133) as much larger, so the products are the same (the tensor cores' sums
scale exactly by powers of two); the decode kernel promotes with one scale a tile and reads two tables a load.

Grouped (per-expert weights for m_grouped_fp8_fp4_gemm_nt_masked): codes [G, N, K / 2] and scales [G, N, K / 32]
give uint8 [G, ceil(N / 64), K / 128, 4352], each expert's chunks as above, back to back.

Prefill (more than 128 rows): the FP8 GEMM multiplies B expanded per call from the chunks
(kernels/sm90_fp4_prepared_expand.cuh). Preparation checks once whether every 128 x 128 block of B folds exactly
into e4m3 under one power-of-two scale (every sub-block holding a nonzero code within 2^14 of the block's largest
scale, no NaN scale); if so B is expanded with 128 x 128 block scales and the block-scaled FP8 GEMM runs, otherwise
with a scale per row and 128 columns and the per-channel-scaled one (recipe (1, 1, 128)).
"""

from dataclasses import dataclass

import torch


TILE_ROWS = 64
K_BLOCK = 128
SUB_BLOCK = 32
CODES_BYTES = TILE_ROWS * K_BLOCK // 2
CHUNK_BYTES = CODES_BYTES + TILE_ROWS * 4
MAX_SHIFT = 31
# The largest shift (sub-block exponent below its block's largest) whose e2m1 values are exact in e4m3.
MAX_EXACT_SHIFT = 14
# Tile-scaled words: the largest shift (the pair tables' 8 x 8) and the smallest tile exponent (2^(E - 133) normal).
MAX_TILE_SHIFT = 7
MIN_TILE_EXPONENT = 7
NAN_EXPONENT = 255

@dataclass(frozen=True)
class PreparedFp4Weights:
    """MXFP4 weights of N rows and K columns in the decode kernel's layout (data: uint8 [ceil(N / 64), K / 128,
    4352], or [G, ...] for G experts' weights, the module docstring), whether every 128 x 128 block folds
    exactly into e4m3 under one power-of-two scale (prefill then runs the block-scaled FP8 GEMM), and whether the
    data is tile-scaled (every 64-row tile's K block under one exponent, the module docstring)."""

    data: torch.Tensor
    n: int
    k: int
    folds_into_blocks: bool
    tile_scaled: bool

    @property
    def num_groups(self):
        """The experts of grouped weights, None for one matrix."""
        return self.data.shape[0] if self.data.dim() == 4 else None


def _check_unprepared(codes, scales) -> tuple:
    if not isinstance(codes, torch.Tensor) or codes.dtype not in (torch.float4_e2m1fn_x2, torch.uint8):
        raise TypeError(f"codes must be a float4_e2m1fn_x2 or uint8 tensor, got {getattr(codes, 'dtype', type(codes))}")
    if not isinstance(scales, torch.Tensor) or scales.dtype not in (torch.float8_e8m0fnu, torch.uint8):
        raise TypeError(f"scales must be a float8_e8m0fnu or uint8 tensor, got "
                        f"{getattr(scales, 'dtype', type(scales))}")
    if codes.dim() not in (2, 3) or 0 in codes.shape or codes.shape[-1] % (K_BLOCK // 2):
        raise ValueError(f"codes must be [N, K / 2] (or [G, N, K / 2]) with K a positive multiple of {K_BLOCK}, got "
                         f"shape {tuple(codes.shape)}")
    n, k = codes.shape[-2], 2 * codes.shape[-1]
    if tuple(scales.shape) != (*codes.shape[:-2], n, k // SUB_BLOCK):
        raise ValueError(f"scales must be [N, K / 32] (or [G, N, K / 32]) = {(*codes.shape[:-2], n, k // SUB_BLOCK)} "
                         f"(one UE8M0 scale per row and 32 columns), got shape {tuple(scales.shape)}")
    if scales.device != codes.device:
        raise ValueError(f"codes and scales must be on one device, got {codes.device} and {scales.device}")
    return n, k


def folds_into_blocks(codes: torch.Tensor, scales: torch.Tensor, rows: int = K_BLOCK,
                      max_shift: int = MAX_EXACT_SHIFT, min_exponent: int = 0) -> bool:
    """Whether every block of `rows` rows and 128 columns of the weights is exact in e4m3 under one power-of-two
    scale: no NaN scale, and every sub-block with a nonzero code within 2^14 of its block's largest scale (or
    2^max_shift; and every block's largest exponent at least min_exponent)."""
    n, k = codes.shape[0], 2 * codes.shape[1]
    exponents = scales.view(torch.uint8).int()
    if bool((exponents == NAN_EXPONENT).any()):
        return False
    nonzero = (codes.view(torch.uint8) & 0x77).view(n, -1, 16).amax(dim=-1) > 0  # [N, K / 32]
    pad = -n % rows
    exponents = torch.nn.functional.pad(exponents, (0, 0, 0, pad)).view(-1, rows, k // K_BLOCK, 4)
    nonzero = torch.nn.functional.pad(nonzero, (0, 0, 0, pad)).view(-1, rows, k // K_BLOCK, 4)
    block_max = exponents.amax(dim=(1, 3), keepdim=True)
    if bool((block_max < min_exponent).any()):
        return False
    return not bool(((block_max - exponents > max_shift) & nonzero).any())


def folds_into_tiles(codes: torch.Tensor, scales: torch.Tensor) -> bool:
    """Whether the weights can be tile-scaled (the module docstring)."""
    return folds_into_blocks(codes, scales, TILE_ROWS, MAX_TILE_SHIFT, MIN_TILE_EXPONENT)


def prepare_fp4_weights(codes: torch.Tensor, scales: torch.Tensor) -> PreparedFp4Weights:
    """MXFP4 weights (codes [N, K / 2] float4_e2m1fn_x2 or uint8, scales [N, K / 32] float8_e8m0fnu or uint8, as
    per_token_cast_to_mxfp4 returns them) in the layout the FP8 x MXFP4 GEMM's decode kernel reads fastest (the
    module docstring), on the inputs' device, with the prefill check (folds_into_blocks). Pass it as b to
    fp8_fp4_gemm_nt. G experts' weights (codes [G, N, K / 2], scales [G, N, K / 32]) give grouped prepared
    weights, b of m_grouped_fp8_fp4_gemm_nt_masked. Tile-scaled where every 64-row tile (of every expert) folds
    (the module docstring). Torch ops, meant for load time (a few passes over the weights)."""
    n, k = _check_unprepared(codes, scales)
    if codes.dim() == 3:
        tile_scaled = all(folds_into_tiles(c, s) for c, s in zip(codes, scales))
        data = torch.stack([_prepared_chunks(c, s, n, k, tile_scaled) for c, s in zip(codes, scales)])
        return PreparedFp4Weights(data, n, k, all(folds_into_blocks(c, s) for c, s in zip(codes, scales)),
                                  tile_scaled)
    tile_scaled = folds_into_tiles(codes, scales)
    return PreparedFp4Weights(_prepared_chunks(codes, scales, n, k, tile_scaled), n, k,
                              folds_into_blocks(codes, scales), tile_scaled)


def _prepared_chunks(codes: torch.Tensor, scales: torch.Tensor, n: int, k: int, tile_scaled: bool) -> torch.Tensor:
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
    if tile_scaled:
        tile_max = exponents.amax(dim=(2, 3, 4, 5), keepdim=True)
        shifts = (tile_max - exponents).clamp(max=MAX_TILE_SHIFT)
        pairs = 16 * ((MAX_TILE_SHIFT + 1) * shifts[..., 0::2] + shifts[..., 1::2])
        stored = tile_max[..., 0] - 6
        words = pairs[..., 0] | (pairs[..., 1] << 16) | (stored & 0xF) | ((stored >> 4) << 12)
        words = words.to(torch.int32).contiguous().view(torch.uint8).reshape(tiles, k_blocks, -1)
    else:
        e_max = exponents.amax(dim=-1, keepdim=True)
        offsets = (e_max - exponents).clamp(max=MAX_SHIFT) * 8
        e_max_bits = torch.cat([(e_max >> (2 * s)) & 3 for s in range(4)], dim=-1)
        words = (offsets | e_max_bits).to(torch.uint8).reshape(tiles, k_blocks, -1)
    return torch.cat([prepared_codes.to(torch.uint8), words], dim=-1).contiguous()


def check_prepared(data, n: int, k: int, num_groups: int = None) -> None:
    """data is a prepared weights' tensor for N = n rows and K = k columns (of num_groups experts, if given)."""
    if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8:
        raise TypeError(f"prepared weights' data must be a uint8 tensor (prepare_fp4_weights), got "
                        f"{getattr(data, 'dtype', type(data))}")
    shape = (() if num_groups is None else (num_groups,)) + (-(-n // TILE_ROWS), k // K_BLOCK, CHUNK_BYTES)
    if tuple(data.shape) != shape or not data.is_contiguous():
        raise ValueError(f"prepared weights' data for N = {n}, K = {k} must be contiguous of shape {shape} "
                         f"(prepare_fp4_weights), got shape {tuple(data.shape)} strides {tuple(data.stride())}")
