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
