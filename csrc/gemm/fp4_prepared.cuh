// MXFP4 weights in prepare_fp4_weights's layout (deep_kernels/fp4_weights.py): one chunk per 64-row tile and 128-deep
// K block, each math thread's codes as one 32-bit word per 32-wide sub-block (k-step), each row's scale word holding
// its sub-blocks' expansion-table offsets and the block exponent e_max. Read by the swapped decode kernel
// (kernels/sm90_fp8_fp4_gemm_swap_ab.cuh) and the prefill expansion (kernels/sm90_fp4_prepared_expand.cuh).
#pragma once

#include <cstdint>

#include "common/macros.cuh"

namespace deep_kernels::fp4_prepared {

constexpr uint32_t kPreparedTileRows = 64;
// Bytes of one 64-row tile's K block in the prepared layout (prepare_fp4_weights): the codes, 32 bytes a math
// thread as two 16-byte halves (thread t's at t * 16 and 2048 + t * 16), then the 64 rows' scale words (row 16w +
// 8h + g at word 2 * (8w + g) + h).
constexpr uint32_t kPreparedChunkBytes = kPreparedTileRows * 128 / 2 + kPreparedTileRows * sizeof(uint32_t);
constexpr uint32_t kPreparedCodesBytes = kPreparedTileRows * 128 / 2;

DK_DEVICE uint32_t byte_perm(uint32_t lo, uint32_t hi, uint32_t selector) {
    uint32_t result;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(result) : "r"(lo), "r"(hi), "r"(selector));
    return result;
}

// Eight codes of the prepared layout as eight e4m3 bytes (low word: register columns 4q .. 4q + 3, high word: 16 +
// 4q .. 16 + 4q + 3), magnitudes through `table`. Nibble j of `word` holds the magnitude of low element j (j < 4)
// or of high element j - 4 in its bits 0-2, and in bit 3 a sign: of high element j / 2 for even j, of low element
// (j - 1) / 2 for odd j, so that each sign sits at its e4m3 byte's bit 7 in `word` or in `word << 4`.
// NOTE: 7 integer ops for 8 codes (the unprepared order takes 9).
DK_DEVICE uint2 expand_prepared_e2m1x8(uint32_t word, uint2 table) {
    constexpr uint32_t kSignBits = 0x80808080u;
    const uint32_t magnitudes = word & 0x77777777u;
    const uint32_t lo = byte_perm(table.x, table.y, magnitudes);
    const uint32_t hi = byte_perm(table.x, table.y, magnitudes >> 16);
    return make_uint2(lo | (word & kSignBits), hi | ((word << 4) & kSignBits));
}

// Tile-scaled words (PreparedFp4Weights.tile_scaled): one block exponent E (7 .. 254) for the 64-row tile, every
// shift d_s = min(E - e_s, 7), and the pair tables: entry 8 d + d' (16 bytes) the expansion tables of shifts d and d'
// (expand_prepared_e2m1x8's, 8 bytes each). Bits 4-9 hold 16 (8 d_0 + d_1) and bits 20-25 16 (8 d_2 + d_3), the byte
// offsets of sub-blocks 0, 1 and 2, 3's pair tables; E - 6 sits in bits 0-3 (low nibble) and 12-15 (high nibble).
constexpr uint32_t kTileMaxShift = 7;
constexpr uint32_t kTilePairTables = (kTileMaxShift + 1) * (kTileMaxShift + 1);
constexpr uint32_t kTilePairTableBytes = kTilePairTables * 16;

// The byte offset of sub-blocks 2 * pair and 2 * pair + 1's pair table.
// NOTE: masked to the tables' span, so that a word the kernel reads but never uses (a chunk past the prepared ones,
// not loaded) stays inside them.
DK_DEVICE uint32_t tile_pair_offset(uint32_t word, uint32_t pair) {
    return (pair == 0 ? word : word >> 16) & 0x3F0u;
}

// Sub-block s's shift d_s.
DK_DEVICE uint32_t tile_shift(uint32_t word, uint32_t s) {
    const uint32_t pair_table = tile_pair_offset(word, s / 2) / 16;
    return s % 2 == 0 ? pair_table / (kTileMaxShift + 1) : pair_table % (kTileMaxShift + 1);
}

DK_DEVICE uint32_t tile_max_exponent(uint32_t word) {
    return ((word & 0xFu) | ((word >> 8) & 0xF0u)) + 6;
}

// The tile's promotion scale 2^(E - 133) = 2^((E - 6) - 127), a normal float (E >= 7).
// NOTE: one multiply moves both nibbles of E - 6 to FP32's exponent field: bits 0-3 land at 23-26 (and 15-18),
// bits 12-15 at 27-30 (and past bit 31); the ranges do not overlap, so nothing carries.
DK_DEVICE float tile_promotion_scale(uint32_t word) {
    return __uint_as_float(((word & 0xF00Fu) * 0x00808000u) & 0x7F800000u);
}

// A prepared scale word's block exponent e_max: bits 2i, 2i + 1 in the low two bits of byte i.
DK_DEVICE uint32_t prepared_max_exponent(uint32_t word) {
    return ((word & 0x03030303u) * 0x00820820u) >> 23 & 0xFFu;
}

// A prepared scale word's promotion scale 2^(e_max - 133), as e8m0_to_float(e_max) * 2^-6 gives it (NaN for e_max =
// 255, 2^-133 for 0). Bits 2i, 2i + 1 of e_max sit in the low two bits of byte i (each byte's bits 3-7 are its
// sub-block's table offset, 8 * min(e_max - e_sub, 31)).
// NOTE: one multiply gathers them into e_max << 23 (FP32's exponent field): byte i's bits land at 23 + 2i, and
// every other product term lands below bit 23 without overlapping another (no carries) or at bit 31 (masked off).
DK_DEVICE float prepared_promotion_scale(uint32_t word) {
    const uint32_t exponent_bits = ((word & 0x03030303u) * 0x00820820u) & 0x7F800000u;
    const float scale = __uint_as_float(exponent_bits) * 0x1p-6f;
    return exponent_bits == 0x7F800000u ? __uint_as_float(0x7FFFFFFFu) : exponent_bits == 0 ? 0x1p-133f : scale;
}

}  // namespace deep_kernels::fp4_prepared
