// FP4 e2m1 numerics shared by the FP4 kernels: code encoding (RNE, saturating at 6) and decoding, the scale
// of an MXFP4 (UE8M0) or NVFP4 (E4M3 times an FP32 global scale) group, and the scale layouts.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/macros.cuh"
#include "common/quant.cuh"
#include "common/types.cuh"

namespace deep_kernels {

constexpr float kE2M1Max = 6.0f;
// The smallest positive e4m3 value: NVFP4 block scales are clamped to it, so no block scale is zero.
constexpr float kE4M3MinSubnormal = 0.001953125f;  // 2^-9

// Enums shared with Python (deep_kernels/quant/fp4.py mirrors them by value).
enum class Fp4Format : int {
    MX = 0,  // 1x32 groups, UE8M0 scales
    NV = 1,  // 1x16 groups, E4M3 scales times one FP32 global scale
};

// Where the one-byte scale of (row m, group g) lives, with G groups per row.
enum class Fp4ScaleLayout : int {
    RowMajor = 0,            // bytes [M, G], offset m * G + g
    MNMajorPackedUE8M0 = 1,  // int32 [M, ceil(G / 4)], strides (1, M_ALIGNED), as ScaleLayout::MNMajorPackedUE8M0
    Swizzled128x4 = 2,       // the block-scaled GEMM tiles of 128 rows x 4 groups (fp4_scale_offset)
};

template <Fp4Format kFormat>
constexpr int kFp4GroupSize = kFormat == Fp4Format::MX ? 32 : 16;

// Byte offset of (row, group)'s scale. Swizzled128x4: rows padded to 128 and groups to 4 (padded_groups); tile
// (row / 128, group / 4) is 512 contiguous bytes, tiles row-block-major, and inside a tile
// (row % 32) * 16 + (row % 128 / 32) * 4 + group % 4.
template <Fp4ScaleLayout kLayout>
DK_DEVICE uint64_t fp4_scale_offset(uint32_t row, uint32_t group, uint32_t num_groups, uint32_t scale_stride) {
    if constexpr (kLayout == Fp4ScaleLayout::RowMajor) {
        return static_cast<uint64_t>(row) * num_groups + group;
    } else if constexpr (kLayout == Fp4ScaleLayout::MNMajorPackedUE8M0) {
        return scale_offset<ScaleLayout::MNMajorPackedUE8M0>(row, group, scale_stride);
    } else {
        const uint32_t padded_groups = (num_groups + 3) / 4 * 4;
        const uint64_t tile = static_cast<uint64_t>(row / 128) * (padded_groups / 4) + group / 4;
        return tile * 512 + (row % 32) * 16 + (row % 128 / 32) * 4 + group % 4;
    }
}

// 16 bytes of bf16 or fp32 input as FP32, with the largest magnitude (NaN propagates).
// NOTE: odd bf16 elements are their word masked (one LOP3), not byte-permuted and shifted (two ops).
template <typename InT>
DK_DEVICE float unpack_fp4_input(const uint4& vector, float (&values)[16 / sizeof(InT)]) {
    const uint32_t words[4] = {vector.x, vector.y, vector.z, vector.w};
    float amax = 0.0f;
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
        if constexpr (sizeof(InT) == 2) {
            values[2 * j] = __uint_as_float(words[j] << 16);
            values[2 * j + 1] = __uint_as_float(words[j] & 0xFFFF0000u);
            amax = max_nan(max_nan(amax, fabsf(values[2 * j])), fabsf(values[2 * j + 1]));
        } else {
            values[j] = __uint_as_float(words[j]);
            amax = max_nan(amax, fabsf(values[j]));
        }
    }
    return amax;
}

constexpr float kE2M1Magic = 8388608.0f;  // 2^23: floats in [2^23, 2^24) are integers

// 2^23 + the e2m1 magnitude code of |x| * step (RNE to {0, 0.5, 1, 1.5, 2, 3, 4, 6}, saturating; NaN -> 6); the
// float's low 3 bits are the code. step is 1 for values already scaled, or a power-of-two multiplier: then
// |x| * step is exact (or a subnormal, far below the first step either way), so folding it into the FMAs rounds
// as scaling first would.
// NOTE: RNE of a * 2 + 2^23 to an integer is e2m1's step of 0.5 below 2; a + 2 and a / 2 + 4 give the codes of
// the steps of 1 on [2, 4) and 2 on [4, 6]. Each is exact in its range and larger outside it, so the code is
// their minimum: FMAs and float min only (no e2m1 cvt before sm_100). The lines grow with a, so saturating the
// code at 7 (last, where fminf also turns NaN into 7) is saturating a at 6 first. Without kSaturate, for a below 7
// only (so not NaN): the last line then stays below 7.5 and rounds to at most 7 by itself.
template <bool kSaturate = true>
DK_DEVICE float e2m1_magnitude(float x, float step) {
    const float code = fminf(fminf(fmaf(fabsf(x), 2.0f * step, kE2M1Magic), fmaf(fabsf(x), step, kE2M1Magic + 2.0f)),
                             fmaf(fabsf(x), 0.5f * step, kE2M1Magic + 4.0f));
    return kSaturate ? fminf(code, kE2M1Magic + 7.0f) : code;
}

// The e2m1 codes of kNum (4 or 8) values times step (e2m1_magnitude), packed little-endian (element 2j in the
// low nibble of byte j), with the sign bit of each element's input: `inputs` is the 16-byte vector of bf16
// (kNum = 8) or fp32 (kNum = 4) the values came from, so -0 keeps its sign and a NaN scale gives +-6 by the
// input's sign.
// NOTE: a byte is low + (high << 4) of the two magnitude floats' bits (one LEA; the exponent bits land above
// the byte), and the 8 sign bits are gathered with byte permutes from the inputs' top bytes rather than per
// element.
template <int kNum, bool kSaturate = true>
DK_DEVICE uint32_t pack_e2m1(const float (&values)[kNum], float step, const uint4& inputs) {
    DK_STATIC_ASSERT(kNum == 4 || kNum == 8, "a 16-byte vector of bf16 or fp32");
    uint32_t bytes[kNum / 2];
    #pragma unroll
    for (int j = 0; j < kNum / 2; ++j)
        bytes[j] = __float_as_uint(e2m1_magnitude<kSaturate>(values[2 * j], step)) +
                   (__float_as_uint(e2m1_magnitude<kSaturate>(values[2 * j + 1], step)) << 4);
    uint32_t magnitudes, even_signs, odd_signs;  // sign bytes: bit 7 of byte j is element 2j's or 2j + 1's sign
    if constexpr (kNum == 8) {
        magnitudes = __byte_perm(__byte_perm(bytes[0], bytes[1], 0x0040), __byte_perm(bytes[2], bytes[3], 0x0040),
                                 0x5410);
        // (2j's top byte, 2j + 1's top byte) of words 0 and 1, then of words 2 and 3.
        const uint32_t top01 = __byte_perm(inputs.x, inputs.y, 0x7531), top23 = __byte_perm(inputs.z, inputs.w, 0x7531);
        even_signs = __byte_perm(top01, top23, 0x6420);
        odd_signs = __byte_perm(top01, top23, 0x7531);
    } else {
        magnitudes = __byte_perm(bytes[0], bytes[1], 0x0040);
        even_signs = __byte_perm(inputs.x, inputs.z, 0x0073);
        odd_signs = __byte_perm(inputs.y, inputs.w, 0x0073);
    }
    constexpr uint32_t kUsed = kNum == 8 ? 0xFFFFFFFFu : 0xFFFFu;
    return (magnitudes | ((even_signs >> 4) & 0x08080808u) | (odd_signs & 0x80808080u)) & kUsed;
}

// The value of an e2m1 code (its low 4 bits).
// NOTE: the 3 magnitude bits placed at FP32 bits 22-24 read as e2m1 * 2^-126 (code 1, 0.5, is the subnormal
// 2^-127), so one exact multiply decodes; needs subnormals kept (no -ftz).
DK_DEVICE float e2m1_value(uint32_t code) {
    const uint32_t bits = ((code & 0x7u) << 22) | ((code & 0x8u) << 28);
    return __uint_as_float(bits) * 0x1p126f;
}

// Eight e2m1 codes (element i in bits [4i, 4i + 4) of `word`) as FP32, exactly.
// NOTE: a code's magnitude bits moved to bits 2-4 of a byte, and its sign to bit 7, make the e4m3 byte of
// e2m1 * 2^-6 (e2m1's subnormal 0.5 lands on e4m3's subnormal 2^-7). So 6 integer ops build the e4m3 bytes of 8
// codes (even elements from word << 2, odd ones from word >> 2, both masked by one LOP3 each), and the exact
// conversions e4m3x2 -> f16x2 (one cvt for two, sm_89+), f16x2 * 64 (one HMUL2 for two) and f16 -> f32 do the rest.
DK_DEVICE void e2m1x8_to_float(uint32_t word, float (&values)[8]) {
    constexpr uint32_t kMagnitudeBits = 0x1C1C1C1Cu;
    const uint32_t signs = word & 0x88888888u;
    // Byte j of `even` is element 2j's e4m3 byte, of `odd` element 2j + 1's.
    const uint32_t even = ((word << 2) & kMagnitudeBits) | ((signs << 4) & ~kMagnitudeBits);
    const uint32_t odd = ((word >> 2) & kMagnitudeBits) | (signs & ~kMagnitudeBits);
    const __half2 sixty_four = __float2half2_rn(64.0f);
    #pragma unroll
    for (int half = 0; half < 2; ++half) {
        const auto e4m3_pair = [&](uint32_t bytes) {
            return __hmul2(__half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(bytes >> (16 * half)),
                                                              __NV_E4M3)), sixty_four);
        };
        const __half2 even_pair = e4m3_pair(even), odd_pair = e4m3_pair(odd);
        values[4 * half + 0] = __low2float(even_pair);
        values[4 * half + 1] = __low2float(odd_pair);
        values[4 * half + 2] = __high2float(even_pair);
        values[4 * half + 3] = __high2float(odd_pair);
    }
}

// A UE8M0 byte as FP32: 2^(byte - 127), byte 0 the subnormal 2^-127, and 0xFF (E8M0's NaN) NaN.
DK_DEVICE float e8m0_to_float(uint8_t byte) {
    return byte == 0xFFu ? __uint_as_float(0x7FFFFFFFu) : ue8m0_to_float(byte);
}

// An E4M3 byte as FP32.
DK_DEVICE float e4m3_to_float(uint8_t byte) {
    __nv_fp8_e4m3 value;
    value.__x = byte;
    return static_cast<float>(value);
}

// The scale of one FP4 group from its clamped amax (at least 1e-37 when finite: MIN_FP4_AMAX_CLAMP), its byte,
// and the step into e2m1 range.
//   MX: scale = the power of two >= amax / 6 (IEEE division), multiplier = 1 / scale (exact; both scale modes
//       coincide)
//   NV: byte = E4M3(max(amax / 6 / global_scale, 2^-9)) (IEEE divisions, RNE, saturating at 448, NaN kept),
//       scale = float(byte) * global_scale, multiplier = 1 / scale (IEEE), or Divide: x / scale
// NOTE: MX in integer ops (quant.cuh's power_of_two_scale_bits: amax / 6's quotient is normal from the clamp's
// 1e-37 up); checked against the IEEE division rounded up to a power of two for every FP32 amax from 1e-37 to
// FLT_MAX. An infinite amax gives scale inf (byte 0xFF) and multiplier 0, a NaN scale and multiplier NaN, as the
// division and reciprocal would.
// NOTE: NV divides with divide_by_scale's steps, not __fdiv_rn (a check and a slow-path call each, whose registers
// held the kernel to 4 blocks per SM). amax / 6 is the IEEE quotient for every FP32 amax from 2^-125 up
// (scripts/brute_force_e4m3_division.c checks them all; inf is taken as it is). The quotient by the global scale
// comes from global_divisor (one per thread) where it is below 1024 in magnitude (or NaN), so nothing overflows,
// and has the e4m3 code of the IEEE quotient, max with 2^-9 included (2^-9 is one of divide_by_scale's 5-bit
// values); from 1024 up (and for a zero global scale) the code saturates either way, so the IEEE quotient's
// infinity of the global scale's sign stands in; an infinite global scale divides (0 for finite units, NaN for
// inf, as IEEE).
template <Fp4Format kFormat, ScaleMode kScaleMode>
struct Fp4Scaler {
    float scale;
    float multiplier;
    uint8_t byte;

    // NV: nv_multipliers[b] = nv_multiplier(b, global_scale) for every byte b (MX: unused, may be null).
    DK_DEVICE Fp4Scaler(float amax, float global_scale, const ScaleDivisor& global_divisor,
                        const float* nv_multipliers) {
        if constexpr (kFormat == Fp4Format::MX) {
            const uint32_t bits = __float_as_uint(amax);
            const bool finite = bits < 0x7F800000u;
            const uint32_t scale_bits = power_of_two_scale_bits(bits, kE2M1Max);
            scale = __uint_as_float(finite ? scale_bits : bits);
            multiplier = finite ? __uint_as_float(power_of_two_reciprocal_bits(scale_bits))
                                : (bits == 0x7F800000u ? 0.0f : amax);
            byte = ue8m0_byte(scale);
        } else {
            constexpr float kOneSixth = 1.0f / kE2M1Max;
            const float unit = isinf(amax) ? amax : divide_by_scale(amax, kE2M1Max, kOneSixth);
            const bool below_1024 = !(unit >= 1024.0f * fabsf(global_scale));
            const float infinity = copysignf(__uint_as_float(0x7F800000u), global_scale);
            const float quotient = below_1024 || isinf(global_scale) ? global_divisor.divide(unit) : infinity;
            const float block = max_nan(quotient, kE4M3MinSubnormal);
            byte = static_cast<uint8_t>(__nv_cvt_float_to_fp8(block, __NV_SATFINITE, __NV_E4M3));
            scale = e4m3_to_float(byte) * global_scale;
            multiplier = nv_multipliers[byte];
        }
    }

    // NV: the multiplier of scale byte `byte`, 1 / (E4M3 value * global scale) (IEEE). A kernel tabulates the
    // 256 bytes' multipliers once per block: a shared-memory load per group instead of a reciprocal with its
    // range check and slow-path call.
    DK_DEVICE static float nv_multiplier(uint8_t byte, float global_scale) {
        return __frcp_rn(e4m3_to_float(byte) * global_scale);
    }

    DK_DEVICE float apply(float x) const {
        if constexpr (kFormat == Fp4Format::NV && kScaleMode == ScaleMode::Divide)
            return __fdiv_rn(x, scale);
        else
            return x * multiplier;
    }
};

}  // namespace deep_kernels
