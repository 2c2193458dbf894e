// Numerics shared by the quantization kernels: NaN-propagating max, power-of-two scales, the scaling step
// of both scale modes (for any format's largest value; e4m3 with Divide's fast exact division), e4m3
// codes, 16-byte vector unpacking and code stores, scale addressing and stores.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/macros.cuh"
#include "common/types.cuh"

namespace deep_kernels {

constexpr float kE4M3Max = 448.0f;

// NOTE: fmaxf drops NaN; torch's amax keeps it, and so must we to match the reference bit for bit.
DK_DEVICE float max_nan(float a, float b) {
    float result;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(result) : "f"(a), "f"(b));
    return result;
}

DK_DEVICE float min_nan(float a, float b) {
    float result;
    asm("min.NaN.f32 %0, %1, %2;" : "=f"(result) : "f"(a), "f"(b));
    return result;
}

// The smallest power of two >= s, for finite positive s; inf and NaN pass through.
DK_DEVICE float ceil_to_power_of_two(float s) {
    const uint32_t bits = __float_as_uint(s);
    if ((bits >> 23) >= 0xffu)
        return s;
    const uint32_t exponent = (bits >> 23) + ((bits & 0x7fffffu) != 0u);
    return __uint_as_float(exponent << 23);
}

// The UE8M0 byte of a power-of-two scale: its biased exponent.
DK_DEVICE uint8_t ue8m0_byte(float power_of_two) {
    return static_cast<uint8_t>(__float_as_uint(power_of_two) >> 23);
}

// A UE8M0 byte back to FP32: 2^(byte - 127); byte 0 is the subnormal 2^-127.
DK_DEVICE float ue8m0_to_float(uint8_t byte) {
    return byte == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(static_cast<uint32_t>(byte) << 23);
}

// |x| / divisor on the fast path of ScaleMode::Divide, with the sign of x. reciprocal = RN(1 / divisor).
// y1 = y0 + r (a - b y0) refines y0 = a * r to within one ulp of a / b; Markstein's theorem (Muller et al.,
// Handbook of Floating-Point Arithmetic, Thm. 4.10: y faithful, r = RN(1 / b), a - b y exact by FMA, no
// underflow) then makes RN(y1 + r (a - b y1)) = RN(a / b). For divisor in [2^-64, 2^64] and |x| <= 449 *
// divisor (a group member), every intermediate is normal and a - b y1 exact whenever |x / divisor| >= 2^-12,
// so the result is the IEEE quotient there; below, both are smaller than 2^-10 and round to a zero of x's
// sign in e4m3 (copysign keeps the sign of -0). tests/test_quant.py checks this against true division.
DK_DEVICE float divide_by_scale_fast(float x, float divisor, float reciprocal) {
    const float a = fabsf(x);
    const float y0 = __fmul_rn(a, reciprocal);
    const float y1 = __fmaf_rn(__fmaf_rn(-divisor, y0, a), reciprocal, y0);
    return copysignf(__fmaf_rn(__fmaf_rn(-divisor, y1, a), reciprocal, y1), x);
}

// The scales for which divide_by_scale_fast gives the codes of IEEE division (NaN and inf excluded).
DK_DEVICE bool has_fast_division(float scale) {
    return scale >= 0x1p-64f && scale <= 0x1p64f;
}

// The scale of a group from its clamped amax, and the step that maps x into [-format_max, format_max].
template <bool kUE8M0, ScaleMode kScaleMode>
struct GroupScaler {
    float scale;       // what dequantization multiplies by
    float multiplier;  // format_max / amax (or 1 / scale with kUE8M0); E4M3Scaler's Divide: RN(1 / scale)

    GroupScaler() = default;

    DK_DEVICE GroupScaler(float amax, float format_max) {
        if constexpr (kUE8M0) {
            scale = ceil_to_power_of_two(__fdiv_rn(amax, format_max));
            multiplier = __frcp_rn(scale);
        } else {
            scale = __fdiv_rn(amax, format_max);
            multiplier = __fdiv_rn(format_max, amax);
        }
    }

    DK_DEVICE float apply(float x) const {
        if constexpr (kScaleMode == ScaleMode::Divide)
            return __fdiv_rn(x, scale);
        else
            return x * multiplier;
    }
};

// The group scaler of e4m3 codes.
template <bool kUE8M0, ScaleMode kScaleMode>
struct E4M3Scaler : GroupScaler<kUE8M0, kScaleMode> {
    using GroupScaler<kUE8M0, kScaleMode>::apply;

    bool fast_divide = false;  // ScaleMode::Divide: divide_by_scale_fast gives IEEE division's codes

    DK_DEVICE explicit E4M3Scaler(float amax) : GroupScaler<kUE8M0, kScaleMode>(amax, kE4M3Max) {
        if constexpr (kScaleMode == ScaleMode::Divide && !kUE8M0) {
            this->multiplier = __frcp_rn(this->scale);
            fast_divide = has_fast_division(this->scale);
        }
    }

    // kVec values to e4m3 codes (RNE, saturating to +-448; NaN stays NaN), packed little-endian: code i is
    // byte i % 4 of words[i / 4].
    // NOTE: the IEEE division per element (__fdiv_rn: a range check and a slow-path call) held Divide at
    // ~77% of copy bandwidth; the inlined fast path serves every practical scale (amax from about 2^-55 to
    // 2^72), chosen once per group rather than per element.
    template <int kVec>
    DK_DEVICE void quantize(const float (&values)[kVec], uint32_t (&words)[kVec / 4]) const {
        DK_STATIC_ASSERT(kVec % 4 == 0, "codes are packed four to a word");
        float scaled[kVec];
        if constexpr (kScaleMode == ScaleMode::Divide && !kUE8M0) {
            if (fast_divide) {
                #pragma unroll
                for (int i = 0; i < kVec; ++i)
                    scaled[i] = divide_by_scale_fast(values[i], this->scale, this->multiplier);
            } else {
                #pragma unroll
                for (int i = 0; i < kVec; ++i)
                    scaled[i] = __fdiv_rn(values[i], this->scale);
            }
        } else {
            #pragma unroll
            for (int i = 0; i < kVec; ++i)
                scaled[i] = values[i] * this->multiplier;
        }
        #pragma unroll
        for (int i = 0; i < kVec / 4; ++i) {
            const uint32_t low = __nv_cvt_float2_to_fp8x2(make_float2(scaled[4 * i], scaled[4 * i + 1]),
                                                          __NV_SATFINITE, __NV_E4M3);
            const uint32_t high = __nv_cvt_float2_to_fp8x2(make_float2(scaled[4 * i + 2], scaled[4 * i + 3]),
                                                           __NV_SATFINITE, __NV_E4M3);
            words[i] = low | (high << 16);
        }
    }
};

// The elements of one 16-byte input vector as FP32; returns their largest magnitude (NaN propagates).
template <typename InT, int kVec>
DK_DEVICE float unpack_vector(const uint4& vector, float (&values)[kVec]) {
    DK_STATIC_ASSERT(kVec * sizeof(InT) == sizeof(uint4), "one vector holds kVec elements");
    const InT* elements = reinterpret_cast<const InT*>(&vector);
    float amax = 0.0f;
    #pragma unroll
    for (int i = 0; i < kVec; ++i) {
        values[i] = static_cast<float>(elements[i]);
        amax = max_nan(amax, fabsf(values[i]));
    }
    return amax;
}

// The largest magnitude over kNum 16-byte vectors of InT (NaN propagates).
template <typename InT, int kNum>
DK_DEVICE float vectors_amax(const uint4 (&vectors)[kNum]) {
    float amax = 0.0f;
    #pragma unroll
    for (int i = 0; i < kNum; ++i) {
        float values[16 / sizeof(InT)];
        amax = max_nan(amax, unpack_vector<InT>(vectors[i], values));
    }
    return amax;
}

// Codes packed as E4M3Scaler::quantize packs them (4, 8 or 16 bytes) to an address aligned to their size.
template <int kWords>
DK_DEVICE void store_codes(uint8_t* dst, const uint32_t (&words)[kWords]) {
    DK_STATIC_ASSERT(kWords == 1 || kWords == 2 || kWords == 4, "one 4-, 8- or 16-byte store");
    if constexpr (kWords == 4)
        *reinterpret_cast<uint4*>(dst) = make_uint4(words[0], words[1], words[2], words[3]);
    else if constexpr (kWords == 2)
        *reinterpret_cast<uint2*>(dst) = make_uint2(words[0], words[1]);
    else
        *reinterpret_cast<uint32_t*>(dst) = words[0];
}

// One 16-byte input vector of InT cast by `scaler` (an E4M3Scaler) to its codes at dst, aligned to their size.
template <typename InT, typename Scaler>
DK_DEVICE void cast_vector(const Scaler& scaler, const uint4& vector, uint8_t* dst) {
    constexpr int kVec = 16 / sizeof(InT);
    float values[kVec];
    uint32_t codes[kVec / 4];
    unpack_vector<InT>(vector, values);
    scaler.quantize(values, codes);
    store_codes(dst, codes);
}

// Element offset of (row, group)'s scale: FP32 elements, or bytes for the packed layout.
template <ScaleLayout kLayout>
DK_DEVICE uint64_t scale_offset(uint32_t row, uint32_t group, uint32_t scale_stride) {
    if constexpr (kLayout == ScaleLayout::RowMajor)
        return static_cast<uint64_t>(row) * scale_stride + group;
    else if constexpr (kLayout == ScaleLayout::MNMajor)
        return static_cast<uint64_t>(group) * scale_stride + row;
    else
        return (static_cast<uint64_t>(group / 4) * scale_stride + row) * 4 + group % 4;
}

// Writes the scale of (row, group) of num_groups in kLayout.
template <ScaleLayout kLayout>
DK_DEVICE void store_scale(void* scales, uint32_t row, uint32_t group, uint32_t num_groups, uint32_t scale_stride,
                           float scale) {
    const uint64_t offset = scale_offset<kLayout>(row, group, scale_stride);
    if constexpr (kLayout == ScaleLayout::MNMajorPackedUE8M0) {
        uint8_t* bytes = static_cast<uint8_t*>(scales);
        bytes[offset] = ue8m0_byte(scale);
        // NOTE: the last group also zeroes the unused bytes of its int32, so the packed word is fully
        // defined without a memset launch.
        if (group + 1 == num_groups)
            for (uint32_t pad = group % 4 + 1; pad < 4; ++pad)
                bytes[offset - group % 4 + pad] = 0;
    } else {
        static_cast<float*>(scales)[offset] = scale;
    }
}

// The last step of a token-group cast: one thread's kVec values of a group (whose amax is reduced) to e4m3
// codes at dst; the group's leader thread also stores the scale of (row, group).
template <bool kUE8M0, ScaleMode kScaleMode, ScaleLayout kLayout, int kVec>
DK_DEVICE void cast_group_to_e4m3(const float (&values)[kVec], float amax, uint8_t* dst, bool is_group_leader,
                                  void* scales, uint32_t row, uint32_t group, uint32_t num_groups,
                                  uint32_t scale_stride) {
    const E4M3Scaler<kUE8M0, kScaleMode> scaler(amax);
    uint32_t codes[kVec / 4];
    scaler.quantize(values, codes);
    store_codes(dst, codes);
    if (is_group_leader)
        store_scale<kLayout>(scales, row, group, num_groups, scale_stride, scaler.scale);
}

}  // namespace deep_kernels
