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

DK_DEVICE uint32_t hmul2(uint32_t a, uint32_t b) {
    const __half2 product = __hmul2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b));
    return *reinterpret_cast<const uint32_t*>(&product);
}

// One weight row's 128-deep block for this thread: `row_codes` the row's 64 code bytes (four 16-byte chunks, chunk c
// at c ^ ((row / 2) % 4): TMA's 64-byte swizzle), `row_scales` its eight E4M3 group scales; writes registers h
// (columns 2q, 2q + 1) and 2 + h (columns 8 + 2q, 9 + 2q) of every step.
// NOTE: a code's magnitude bits moved to bits 2-4 of a byte and its sign to bit 7 make the e4m3 byte of
// e2m1 * 2^-6 (e2m1's subnormal 0.5 lands on e4m3's subnormal 2^-7); the cvt to f16x2 is exact, and the product with
// the f16 pair (scale * 64, scale * 64) is the exact f16 of e2m1 * scale.
DK_DEVICE void expand_row(F16Fragments& frag, uint32_t h, const uint8_t* row_codes, uint32_t swizzle, uint2 row_scales,
                          uint32_t q) {
    constexpr uint32_t kMagnitudeBits = 0x1C1C1C1Cu, kSignBits = 0x80808080u;
    const uint32_t sixty_four = 0x54005400u;  // f16x2 (64, 64)
    const uint32_t scale_words[2] = {row_scales.x, row_scales.y};
    // Byte q of each word of a chunk (byte_perm selectors: x's byte q, then y's).
    const uint32_t pick = q | ((4 + q) << 4);
#pragma unroll
    for (uint32_t c = 0; c < 4; ++c) {
        const uint4 chunk = *reinterpret_cast<const uint4*>(row_codes + ((c ^ swizzle) * 16));
        // Bytes: group 2c columns 2q..2q+1, group 2c columns 8+2q..9+2q, the same of group 2c + 1.
        const uint32_t word = __byte_perm(__byte_perm(chunk.x, chunk.y, pick), __byte_perm(chunk.z, chunk.w, pick), 0x5410);
        const uint32_t even = ((word << 2) & kMagnitudeBits) | ((word << 4) & kSignBits);
        const uint32_t odd = ((word >> 2) & kMagnitudeBits) | (word & kSignBits);
        const uint32_t low = __byte_perm(even, odd, 0x5140), high = __byte_perm(even, odd, 0x7362);
        // The two groups' scales times 64 as f16 pairs (group 2c, group 2c + 1).
        const uint32_t scales = hmul2(e4m3x2_to_f16x2(__byte_perm(scale_words[c / 2], 0, (c % 2) ? 0x32 : 0x10)), sixty_four);
        const uint32_t scale_lo = __byte_perm(scales, 0, 0x1010), scale_hi = __byte_perm(scales, 0, 0x3232);
        frag.regs[2 * c][h] = hmul2(e4m3x2_to_f16x2(low), scale_lo);
        frag.regs[2 * c][2 + h] = hmul2(e4m3x2_to_f16x2(low >> 16), scale_lo);
        frag.regs[2 * c + 1][h] = hmul2(e4m3x2_to_f16x2(high), scale_hi);
        frag.regs[2 * c + 1][2 + h] = hmul2(e4m3x2_to_f16x2(high >> 16), scale_hi);
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
