// Numerics shared by the quantization kernels: NaN-propagating max, power-of-two scales, the scaling step
// of both scale modes (for any format's largest value; e4m3 with Divide's three-operation division), e4m3
// codes, 16-byte vector unpacking and code stores, scale addressing and stores.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

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

// The bits of the power-of-two scale of amax for format_max: the smallest power of two >= RN(amax / format_max),
// for a finite amax whose quotient is a normal number (amax >= format_max * 2^-126; format_max above 2, so the
// scale is at most 2^126). With amax = 2^E m and format_max = 2^F f (m, f in [1, 2)), the quotient rounds to at
// most 2^(E-F) exactly when m <= f (m / f > 1 by more than half an ulp otherwise), so the scale's biased exponent
// is E - F + (m's significand > f's): one subtraction with borrow, no division.
DK_DEVICE uint32_t power_of_two_scale_bits(uint32_t amax_bits, float format_max) {
    return (amax_bits - (__float_as_uint(format_max) - (128u << 23) + 1u)) & 0x7F800000u;
}

// The bits of 1 / s, exactly, for the bits of a power of two s from 2^-126 to 2^126.
DK_DEVICE uint32_t power_of_two_reciprocal_bits(uint32_t power_of_two_bits) {
    return 0x7F000000u - power_of_two_bits;
}

// The UE8M0 byte of a power-of-two scale: its biased exponent.
DK_DEVICE uint8_t ue8m0_byte(float power_of_two) {
    return static_cast<uint8_t>(__float_as_uint(power_of_two) >> 23);
}

// A UE8M0 byte back to FP32: 2^(byte - 127); byte 0 is the subnormal 2^-127.
DK_DEVICE float ue8m0_to_float(uint8_t byte) {
    return byte == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(static_cast<uint32_t>(byte) << 23);
}

// x / divisor rounded as e4m3 needs it, from reciprocal = RN(1 / divisor): q0 = RN(x r), the residual e =
// q0 d - x (one FMA) and one correction RN(q0 - e r) (Markstein). Equal to IEEE division wherever an e4m3 code
// depends on it, for divisor in [2^-92, 2^126) and any x: with the divisor and the quotient scaled to [1, 2) by
// powers of two (which every step follows exactly while e is a multiple of 2^-149: quotients from 2^-11 up and
// divisors from 2^-92 up), a brute force over every divisor significand and every x within 4 ulps of b *
// divisor, b each 5-bit value in [1, 2) (the e4m3 rounding midpoints of every binade, 2^-10 included), finds
// no quotient that differs from IEEE division even in FP32, and only a one-ulp difference at such a b could
// change a code; quotients below 2^-11 round to a zero of x's sign either way (the residual's sign order
// keeps -0: -0 / d gives q0 = -0, e = +0, -e r + q0 = -0). scripts/brute_force_e4m3_division.c is the brute
// force; tests/test_quant.py replays the steps on CPU.
DK_DEVICE float divide_by_scale(float x, float divisor, float reciprocal) {
    const float quotient = __fmul_rn(x, reciprocal);
    const float residual = __fmaf_rn(quotient, divisor, -x);
    return __fmaf_rn(-residual, reciprocal, quotient);
}

// x / scale through divide_by_scale for any FP32 scale: x / scale = (x * prescale) / divisor, divisor = scale *
// prescale (exact) inside divide_by_scale's range (prescale 2^100 for magnitudes below 2^-92, 2^-100 from 2^100
// up), reciprocal = RN(1 / divisor). Callers keep |x / scale| below 2^100 (a group member over its own scale is at
// most ~700 times it; fp4.cuh checks its quotients), so nothing overflows and x * prescale is exact where it
// matters (scaled down, a result below 2^-126 means a quotient below 2^-226, a zero of x's sign in e4m3). Special
// scales take the same steps with chosen constants: +-inf, divisor 0 and reciprocal +-0 (x / inf: zeros for
// finite x, NaN for inf); +-0, divisor -+1 and reciprocal +-inf (x * inf, as x / 0); NaN, NaN throughout. (A
// negative scale divides right, but for it -0 quotients may come out +0.)
struct ScaleDivisor {
    float prescale, divisor, reciprocal;

    DK_DEVICE explicit ScaleDivisor(float scale) {
        const float magnitude = fabsf(scale);
        prescale = magnitude > 0.0f && magnitude < 0x1p-92f ? 0x1p100f : (magnitude >= 0x1p100f ? 0x1p-100f : 1.0f);
        const float scaled = scale * prescale;
        divisor = isinf(scaled) ? 0.0f : (scaled == 0.0f ? copysignf(1.0f, -scaled) : scaled);
        reciprocal = __frcp_rn(scaled);
    }

    DK_DEVICE float divide(float x) const {
        return divide_by_scale(x * prescale, divisor, reciprocal);
    }

    // divide without the prescale step, for callers that checked prescale == 1
    DK_DEVICE float divide_direct(float x) const {
        return divide_by_scale(x, divisor, reciprocal);
    }
};

// The scale of a group from its clamped amax, and the step that maps x into [-format_max, format_max].
template <bool kUE8M0, ScaleMode kScaleMode>
struct GroupScaler {
    float scale;       // what dequantization multiplies by
    float multiplier;  // format_max / amax (or 1 / scale with kUE8M0)

    GroupScaler() = default;

    // format_max from 256 to 2^24 with kUE8M0 (448 and 65024 here), so that format_max * 2^-150 is an FP32 value.
    DK_DEVICE GroupScaler(float amax, float format_max) {
        if constexpr (kUE8M0) {
            // NOTE: no division: power_of_two_scale_bits where the quotient q = RN(amax / format_max) is a normal
            // number; below, q is subnormal (scale 2^-126) or, from amax <= format_max * 2^-150 down, zero (scale
            // 0, multiplier inf); inf and NaN amax give what the division and reciprocal give (inf and 0, NaN and
            // NaN). tests/test_quant.py checks this against the division for every significand at each end of the
            // range. The division's and the reciprocal's checks and slow-path calls were most of a thread's
            // per-group work where it casts 16 elements.
            const uint32_t bits = __float_as_uint(amax);
            const uint32_t scale_bits = power_of_two_scale_bits(bits, format_max);
            const bool normal_quotient = amax >= format_max * 0x1p-126f;
            // NOTE: 2^-150 is no FP32 value; format_max * 2^-150 is (a subnormal, exact in two steps).
            const bool nonzero_quotient = amax > format_max * 0x1p-126f * 0x1p-24f;
            const bool finite = bits < 0x7F800000u;
            const float canonical_nan = __uint_as_float(0x7FFFFFFFu);  // what GPU arithmetic makes of any NaN
            const bool infinite = bits == 0x7F800000u;
            scale = !finite ? (infinite ? amax : canonical_nan)
                    : normal_quotient ? __uint_as_float(scale_bits)
                    : nonzero_quotient ? 0x1p-126f : 0.0f;
            multiplier = !finite ? (infinite ? 0.0f : canonical_nan)
                         : normal_quotient ? __uint_as_float(power_of_two_reciprocal_bits(scale_bits))
                         : nonzero_quotient ? 0x1p126f : __uint_as_float(0x7F800000u);
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

// The group scaler of e4m3 codes; ScaleMode::Divide with FP32 scales divides by ScaleDivisor's steps.
template <bool kUE8M0, ScaleMode kScaleMode>
struct E4M3Scaler : GroupScaler<kUE8M0, kScaleMode> {
    static constexpr bool kDivides = kScaleMode == ScaleMode::Divide && !kUE8M0;
    ScaleDivisor divisor;

    DK_DEVICE explicit E4M3Scaler(float amax)
        : GroupScaler<kUE8M0, kScaleMode>(amax, kE4M3Max), divisor(kDivides ? this->scale : 1.0f) {}

    // kVec values to e4m3 codes (RNE, saturating to +-448; NaN stays NaN), packed little-endian: code i is
    // byte i % 4 of words[i / 4].
    // NOTE: IEEE division per element (__fdiv_rn: a range check and a slow-path call) held Divide at ~77% of copy
    // bandwidth, and a per-group choice between a fast path and __fdiv_rn still cost registers (the call's);
    // divide_by_scale is three FP32 operations with no branch, whatever the scale.
    template <int kVec>
    DK_DEVICE void quantize(const float (&values)[kVec], uint32_t (&words)[kVec / 4]) const {
        DK_STATIC_ASSERT(kVec % 4 == 0, "codes are packed four to a word");
        float scaled[kVec];
        if constexpr (kDivides) {
            if (divisor.prescale == 1.0f) {
                #pragma unroll
                for (int i = 0; i < kVec; ++i)
                    scaled[i] = divisor.divide_direct(values[i]);
            } else {
                #pragma unroll
                for (int i = 0; i < kVec; ++i)
                    scaled[i] = divisor.divide(values[i]);
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

// The bf16 elements of kNum 16-byte vectors as FP32, exactly: a bf16 is the upper half of its FP32.
// NOTE: one shift or mask per element; __bfloat162float of each element of the vector costs an extra PRMT
// for the odd ones.
template <int kNum>
DK_DEVICE void unpack_bf16(const uint4* vectors, float (&values)[8 * kNum]) {
    const uint32_t* words = reinterpret_cast<const uint32_t*>(vectors);
    #pragma unroll
    for (int i = 0; i < 4 * kNum; ++i) {
        values[2 * i] = __uint_as_float(words[i] << 16);
        values[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
}

// The elements of one 16-byte input vector as FP32; returns their largest magnitude (NaN propagates).
template <typename InT, int kVec>
DK_DEVICE float unpack_vector(const uint4& vector, float (&values)[kVec]) {
    DK_STATIC_ASSERT(kVec * sizeof(InT) == sizeof(uint4), "one vector holds kVec elements");
    if constexpr (std::is_same_v<InT, __nv_bfloat16>) {
        unpack_bf16<1>(&vector, values);
    } else {
        const InT* elements = reinterpret_cast<const InT*>(&vector);
        #pragma unroll
        for (int i = 0; i < kVec; ++i)
            values[i] = static_cast<float>(elements[i]);
    }
    float amax = 0.0f;
    #pragma unroll
    for (int i = 0; i < kVec; ++i)
        amax = max_nan(amax, fabsf(values[i]));
    return amax;
}

// The elements of kNum 16-byte vectors of InT as FP32, in order; returns their largest magnitude (NaN propagates).
template <typename InT, int kNum>
DK_DEVICE float unpack_vectors(const uint4 (&vectors)[kNum], float (&values)[kNum * 16 / sizeof(InT)]) {
    constexpr int kVec = 16 / sizeof(InT);
    float amax = 0.0f;
    #pragma unroll
    for (int i = 0; i < kNum; ++i) {
        float elements[kVec];
        amax = max_nan(amax, unpack_vector<InT>(vectors[i], elements));
        #pragma unroll
        for (int e = 0; e < kVec; ++e)
            values[i * kVec + e] = elements[e];
    }
    return amax;
}

// The largest magnitude over kNum 16-byte vectors of InT (NaN propagates).
// NOTE: bf16 on the packed pairs (a mask and a NaN-propagating bf16x2 max per pair, exact): half the instructions
// of unpacking, and no FP32 copies of the values for the compiler to keep live until the cast unpacks them again.
template <typename InT, int kNum>
DK_DEVICE float vectors_amax(const uint4 (&vectors)[kNum]) {
    if constexpr (std::is_same_v<InT, __nv_bfloat16>) {
        __nv_bfloat162 largest = __float2bfloat162_rn(0.0f);
        #pragma unroll
        for (int i = 0; i < kNum; ++i) {
            const uint32_t words[4] = {vectors[i].x, vectors[i].y, vectors[i].z, vectors[i].w};
            #pragma unroll
            for (int j = 0; j < 4; ++j) {
                const uint32_t magnitudes = words[j] & 0x7FFF7FFFu;
                largest = __hmax2_nan(largest, *reinterpret_cast<const __nv_bfloat162*>(&magnitudes));
            }
        }
        return max_nan(__low2float(largest), __high2float(largest));
    } else {
        float values[kNum * 16 / sizeof(InT)];
        return unpack_vectors<InT>(vectors, values);
    }
}

// Codes packed as E4M3Scaler::quantize packs them (4, 8 or a multiple of 16 bytes) to an address aligned to their
// size (to 16 bytes for more than 16).
template <int kWords>
DK_DEVICE void store_codes(uint8_t* dst, const uint32_t (&words)[kWords]) {
    DK_STATIC_ASSERT(kWords == 1 || kWords == 2 || kWords % 4 == 0, "4- or 8-byte stores, or 16-byte stores");
    if constexpr (kWords % 4 == 0) {
        #pragma unroll
        for (int i = 0; i < kWords / 4; ++i)
            reinterpret_cast<uint4*>(dst)[i] =
                make_uint4(words[4 * i], words[4 * i + 1], words[4 * i + 2], words[4 * i + 3]);
    } else if constexpr (kWords == 2) {
        *reinterpret_cast<uint2*>(dst) = make_uint2(words[0], words[1]);
    } else {
        *reinterpret_cast<uint32_t*>(dst) = words[0];
    }
}

// kVec values cast by `scaler` (an E4M3Scaler) to their codes at dst, aligned to their size (to 16 bytes past 16).
template <typename Scaler, int kVec>
DK_DEVICE void cast_values(const Scaler& scaler, const float (&values)[kVec], uint8_t* dst) {
    uint32_t codes[kVec / 4];
    scaler.quantize(values, codes);
    store_codes(dst, codes);
}

// One 16-byte input vector of InT cast by `scaler` (an E4M3Scaler) to its codes at dst, aligned to their size.
template <typename InT, typename Scaler>
DK_DEVICE void cast_vector(const Scaler& scaler, const uint4& vector, uint8_t* dst) {
    float values[16 / sizeof(InT)];
    unpack_vector<InT>(vector, values);
    cast_values(scaler, values, dst);
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
    cast_values(scaler, values, dst);
    if (is_group_leader)
        store_scale<kLayout>(scales, row, group, num_groups, scale_stride, scaler.scale);
}

}  // namespace deep_kernels
