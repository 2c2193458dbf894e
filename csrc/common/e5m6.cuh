// E5M6: the top 12 bits of an IEEE half (sign, 5 exponent bits with bias 15, 6 mantissa bits), so every
// code is the half with bits code << 4. Rounding from FP32 is round-to-nearest-even on that grid (one
// rounding, not through a half); magnitudes >= 65280 give inf (0x7C0 | sign) as IEEE half overflow does,
// every NaN gives 0x7FF, zeros and values rounding to zero keep their sign. Eight codes pack into three
// 32-bit words: code i occupies bits [12i, 12i + 12) of the little-endian 96-bit group.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "common/macros.cuh"

namespace deep_kernels {

constexpr float kE5M6Max = 65024.0f;  // (2 - 2^-6) * 2^15
constexpr int kE5M6PerGroup = 8;      // codes per packed group
constexpr int kE5M6GroupWords = 3;    // 32-bit words per packed group

// The e5m6 code of an FP32 value. With kSpecials false the caller guarantees |value| < 65280 (no NaN,
// nothing that rounds to inf), which saves the checks.
template <bool kSpecials>
DK_DEVICE uint32_t e5m6_code(float value) {
    // NOTE: adding 2^(e + 17), e the exponent of |value| (at least -14, e5m6's subnormal step being 2^-20),
    // leaves the FP32 sum's last mantissa bit where e5m6's last bit is, so the FP32 addition rounds to the
    // e5m6 grid, ties to even; subtracting it back is exact. Magnitudes are capped at 2^16 first: all from
    // 65280 up round to 2^16, whose code is inf.
    const float magnitude = kSpecials ? fminf(fabsf(value), 65536.0f) : fabsf(value);
    // NOTE: masked from the bits of magnitude's source (the mask drops the sign), so that fabsf stays an
    // operand modifier of the addition below rather than an instruction.
    const float exponent_only = __uint_as_float(__float_as_uint(kSpecials ? magnitude : value) & 0x7f800000u);
    const float step = fmaxf(__fmul_rn(exponent_only, 131072.0f), 8.0f);
    const float rounded = __fsub_rn(__fadd_rn(magnitude, step), step);
    // Scaling by 2^-112 rebiases the exponent (127 -> 15) in the FP32 bit pattern, subnormals included
    // (they become FP32 subnormals exactly), so its top bits are the code.
    const uint32_t code = (__float_as_uint(__fmul_rn(rounded, 0x1p-112f)) >> 17) + (__float_as_uint(value) >> 31) * 0x800u;
    if constexpr (kSpecials)
        return isnan(value) ? 0x7ffu : code;
    else
        return code;
}

// The FP32 value of a code (exact).
DK_DEVICE float e5m6_to_float(uint32_t code) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(code << 4)));
}

DK_DEVICE void pack_e5m6(const uint32_t (&codes)[kE5M6PerGroup], uint32_t (&words)[kE5M6GroupWords]) {
    words[0] = codes[0] | (codes[1] << 12) | (codes[2] << 24);
    words[1] = (codes[2] >> 8) | (codes[3] << 4) | (codes[4] << 16) | (codes[5] << 28);
    words[2] = (codes[5] >> 4) | (codes[6] << 8) | (codes[7] << 20);
}

DK_DEVICE void unpack_e5m6(const uint32_t (&words)[kE5M6GroupWords], uint32_t (&codes)[kE5M6PerGroup]) {
    codes[0] = words[0] & 0xfffu;
    codes[1] = (words[0] >> 12) & 0xfffu;
    codes[2] = (words[0] >> 24) | ((words[1] & 0xfu) << 8);
    codes[3] = (words[1] >> 4) & 0xfffu;
    codes[4] = (words[1] >> 16) & 0xfffu;
    codes[5] = (words[1] >> 28) | ((words[2] & 0xffu) << 4);
    codes[6] = (words[2] >> 8) & 0xfffu;
    codes[7] = words[2] >> 20;
}

}  // namespace deep_kernels
