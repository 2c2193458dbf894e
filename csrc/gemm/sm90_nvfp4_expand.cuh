// The FP8 x NVFP4 kind's on-chip expansion to FP16 (exact): NVFP4 weight codes with their E4M3 1x16 scales into
// wgmma's f16 register A fragment, and e4m3 activations into an f16 K-major tile for wgmma's B.
// Numerics: an e2m1 value (<= 2 significant bits) times an E4M3 scale (<= 4) has at most 6 significant bits and
// lies in [2^-10, 2688], so it is exact in f16 (11 bits, normal from 2^-14, up to 65504); e4m3 values are exact in
// f16 too. The tensor cores' FP32 sums of the exact products are then promoted per 128-deep block with
// sfa * global_scale, as the FP8 recipe promotes.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/macros.cuh"

namespace deep_kernels::sm90_nvfp4_detail {

// A K block's f16 A fragments of one thread for the m64nNk16 wgmma (ptx/wgmma_register_a.cuh's F16WgmmaRegisterA):
// the eight 16-deep steps, which are the block's eight NVFP4 groups.
struct F16Fragments {
    uint32_t regs[8][4];
};

// Two e4m3 bytes (the low 16 bits) as f16x2, exactly.
DK_DEVICE uint32_t e4m3x2_to_f16x2(uint32_t bytes) {
    const __half2_raw pair = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(bytes & 0xFFFFu), __NV_E4M3);
    return static_cast<uint32_t>(pair.x) | (static_cast<uint32_t>(pair.y) << 16);
}

DK_DEVICE __half2 as_half2(uint32_t bits) {
    return *reinterpret_cast<const __half2*>(&bits);
}

DK_DEVICE uint32_t as_bits(__half2 value) {
    return *reinterpret_cast<const uint32_t*>(&value);
}

// One weight row's 128-deep block for this thread: `row_codes` the row's 64 code bytes (four 16-byte chunks, chunk c
// at c ^ ((row / 2) % 4): TMA's 64-byte swizzle), `row_scales` its eight E4M3 group scales; writes registers h
// (columns 2q, 2q + 1) and 2 + h (columns 8 + 2q, 9 + 2q) of every step.
// NOTE: an e2m1 value's f16 has a zero low byte, and its high byte is a table of the code's 3 magnitude bits (one
// byte permute looks up four codes) with the sign bit ORed in; the product with the f16 pair (scale, scale) is then
// the exact f16 of e2m1 * scale. No conversion instruction per code (those issue at a fraction of the integer rate).
DK_DEVICE void expand_row(F16Fragments& frag, uint32_t h, const uint8_t* row_codes, uint32_t swizzle, uint2 row_scales,
                          uint32_t q) {
    // f16 high bytes of the e2m1 magnitudes 0, 0.5, 1, 1.5 and 2, 3, 4, 6.
    constexpr uint32_t kTableLow = 0x3E3C3800u, kTableHigh = 0x46444240u;
    // The groups' scales as f16 pairs: groups (0, 1), (2, 3), (4, 5), (6, 7).
    const __half2 scales[4] = {as_half2(e4m3x2_to_f16x2(row_scales.x)), as_half2(e4m3x2_to_f16x2(row_scales.x >> 16)),
                               as_half2(e4m3x2_to_f16x2(row_scales.y)), as_half2(e4m3x2_to_f16x2(row_scales.y >> 16))};
    // Byte q of each word of a chunk (byte_perm selectors: x's byte q, then y's).
    const uint32_t pick = q | ((4 + q) << 4);
#pragma unroll
    for (uint32_t c = 0; c < 4; ++c) {
        const uint4 chunk = *reinterpret_cast<const uint4*>(row_codes + ((c ^ swizzle) * 16));
        // Bytes: group 2c columns 2q..2q+1, group 2c columns 8+2q..9+2q, the same of group 2c + 1; nibble i is code
        // n_i (n_0 column 2q of group 2c, n_1 column 2q + 1, ...).
        const uint32_t word = __byte_perm(__byte_perm(chunk.x, chunk.y, pick), __byte_perm(chunk.z, chunk.w, pick), 0x5410);
        const uint32_t magnitudes = word & 0x77777777u;
        // Byte i of `even_signs` / `word` has code n_2i / n_2i+1's sign as its top bit.
        const uint32_t even_signs = word << 4;
        // f16 high bytes of n_0..n_3 and n_4..n_7, signs included.
        const uint32_t first = __byte_perm(kTableLow, kTableHigh, magnitudes) |
                               (__byte_perm(even_signs, word, 0x5140) & 0x80808080u);
        const uint32_t second = __byte_perm(kTableLow, kTableHigh, magnitudes >> 16) |
                                (__byte_perm(even_signs, word, 0x7362) & 0x80808080u);
        const __half2 scale_lo = __low2half2(scales[c]), scale_hi = __high2half2(scales[c]);
        // f16 pairs (zero low bytes): (n_0, n_1), (n_2, n_3) of group 2c, (n_4, n_5), (n_6, n_7) of group 2c + 1.
        frag.regs[2 * c][h] = as_bits(__hmul2(as_half2(__byte_perm(first, 0, 0x1404)), scale_lo));
        frag.regs[2 * c][2 + h] = as_bits(__hmul2(as_half2(__byte_perm(first, 0, 0x3424)), scale_lo));
        frag.regs[2 * c + 1][h] = as_bits(__hmul2(as_half2(__byte_perm(second, 0, 0x1404)), scale_hi));
        frag.regs[2 * c + 1][2 + h] = as_bits(__hmul2(as_half2(__byte_perm(second, 0, 0x3424)), scale_hi));
    }
}

// The K block's fragments of rows r0 and r0 + 8 (q = lane % 4): smem_codes the stage's codes (64 bytes a row),
// smem_scales its E4M3 scales (8 bytes a row).
DK_DEVICE void expand_fragments(F16Fragments& frag, const uint8_t* smem_codes, const uint8_t* smem_scales, uint32_t r0,
                                uint32_t q) {
#pragma unroll
    for (uint32_t h = 0; h < 2; ++h) {
        const uint32_t row = r0 + 8 * h;
        expand_row(frag, h, smem_codes + row * 64, (row / 2) % 4, *reinterpret_cast<const uint2*>(smem_scales + row * 8),
                   q);
    }
}

// A warpgroup's copy of a stage's activation tile as f16: `src` BLOCK_T rows of 128 e4m3 bytes (TMA's 128-byte
// swizzle), `dst` two 64-deep K-major f16 tiles of BLOCK_T rows (each row 128 bytes, the same swizzle), the second
// BLOCK_T * 128 bytes after the first. Each thread converts 16-byte chunks (thread_idx of 128).
template <uint32_t BLOCK_T>
DK_DEVICE void convert_activations(const uint8_t* src, uint8_t* dst, uint32_t thread_idx) {
#pragma unroll
    for (uint32_t p = thread_idx; p < BLOCK_T * 8; p += 128) {
        const uint32_t row = p / 8, swizzle = row % 8;
        const uint32_t chunk = (p % 8) ^ swizzle;  // the 16 e4m3 values of columns 16 * chunk ..
        const uint4 values = *reinterpret_cast<const uint4*>(src + p * 16);
        const uint32_t words[4] = {values.x, values.y, values.z, values.w};
        uint32_t halves[8];
#pragma unroll
        for (uint32_t j = 0; j < 4; ++j) {
            halves[2 * j] = e4m3x2_to_f16x2(words[j]);
            halves[2 * j + 1] = e4m3x2_to_f16x2(words[j] >> 16);
        }
        uint8_t* dst_row = dst + (chunk / 4) * BLOCK_T * 128 + row * 128;
        const uint32_t first = 2 * (chunk % 4);
        *reinterpret_cast<uint4*>(dst_row + ((first ^ swizzle) * 16)) = make_uint4(halves[0], halves[1], halves[2], halves[3]);
        *reinterpret_cast<uint4*>(dst_row + (((first + 1) ^ swizzle) * 16)) =
            make_uint4(halves[4], halves[5], halves[6], halves[7]);
    }
}

}  // namespace deep_kernels::sm90_nvfp4_detail
