// SwiGLU's elementwise steps, shared by its forward and backward kernels. Each gives the value of the
// reference's IEEE FP32 operation (no FMA contraction of the formula's steps; the fused and fast steps
// below are exact rewrites), so a plain-torch reference evaluated on the GPU (where torch.exp is expf)
// reproduces every value bit for bit.
#pragma once

#include <cstdint>

#include "common/macros.cuh"
#include "common/quant.cuh"

namespace deep_kernels {

// min(gate, c) and max(min(up, c), -c), NaN propagating; without kClamped the values as they are.
template <bool kClamped>
DK_DEVICE float clamp_gate(float gate, float clamp) {
    return kClamped ? min_nan(gate, clamp) : gate;
}

template <bool kClamped>
DK_DEVICE float clamp_up(float up, float clamp) {
    return kClamped ? max_nan(min_nan(up, clamp), -clamp) : up;
}

// Whether the clamp changed the value (where the clamp's gradient is zero); NaN is not clamped.
template <bool kClamped>
DK_DEVICE bool gate_clamped(float gate, float clamp) {
    return kClamped && gate > clamp;
}

template <bool kClamped>
DK_DEVICE bool up_clamped(float up, float clamp) {
    return kClamped && (up > clamp || up < -clamp);
}

// The denominator 1 + expf(-g) of the sigmoid and silu(g) = g / (1 + expf(-g)): CUDA's expf step for step
// (libdevice's __nv_expf as nvcc 13 emits it: e = 2^t * 2^j), with its last product and the sum 1 + e
// fused into one FMA.
// NOTE: 2^t * 2^j is exact unless it leaves the normal range; below it 1 + e and 1 + 2^t * 2^j both round
// to 1, from 2^128 on both overflow, so the FMA's single rounding gives RN(1 + expf(-g)) and saves an
// instruction per element.
DK_DEVICE float sigmoid_denominator(float gate) {
    const float x = -gate;
    const float j = __fmaf_rd(__saturatef(__fmaf_rn(x, 0x1.77313Ap-8f, 0.5f)), 252.0f, 12582913.0f);
    const float t = __fmaf_rn(x, 0x1.4AE0C0p-26f, __fmaf_rn(x, 0x1.715476p+0f, -__fadd_rn(j, -12583039.0f)));
    float power;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(power) : "f"(t));
    return __fmaf_rn(power, __uint_as_float(__float_as_uint(j) << 23), 1.0f);
}

// The two bf16 halves of a word as FP32 (exact: bf16 is FP32's upper half).
DK_DEVICE float bf16_low(uint32_t pair) {
    return __uint_as_float(pair << 16);
}

DK_DEVICE float bf16_high(uint32_t pair) {
    return __uint_as_float(pair & 0xffff0000u);
}

// Exact division by a sigmoid denominator d = 1 + expf(-g) without __fdiv_rn's per-element range check
// and slow-path branch. reciprocal_estimate(d) is a Newton step on the hardware reciprocal and
// divide_fast(a, d, r) the Markstein correction RN(q + r (a - d q)), q = RN(a r): the steps of the fast
// path of IEEE division (div.rn.f32), which gives RN(a / d) wherever its range check passes.
// NOTE: the steps are exact only with the hardware reciprocal (a merely faithful estimate breaks them,
// e.g. at d = 2 - 2^-23), so the claim rests on div.rn.f32's: where its check passes (moderate exponents
// of a, d and a / d) the same steps give RN(a / d). With d fixed they scale exactly with a's exponent
// while every result stays normal (each FMA rounds once; a - d q, a multiple of 2^-149 for |a| >=
// 2^-100, is exact), which carries them to every |a| in [2^-100, 87] over d in (1, 2] (min(gate, c) = c
// for any c in range, d = 1 + expf(-c)); d beyond 2 comes from bf16 gates only (g < 0 down to -87: d <
// 1 + e^87 < 2^126, r and g / d normal), and tests/test_quant_swiglu.py checks every bf16 gate on the
// GPU (test_every_bf16_gate). fast_silu_gates selects the gates with |g| in [2^-100, 87].
DK_DEVICE float reciprocal_estimate(float denominator) {
    float estimate;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(estimate) : "f"(denominator));
    return __fmaf_rn(estimate, __fmaf_rn(-denominator, estimate, 1.0f), estimate);
}

DK_DEVICE float divide_fast(float numerator, float denominator, float reciprocal) {
    const float quotient = __fmul_rn(numerator, reciprocal);
    return __fmaf_rn(reciprocal, __fmaf_rn(-denominator, quotient, numerator), quotient);
}

// divide_fast(1, d, r), whose first product is r itself.
DK_DEVICE float reciprocal_fast(float denominator, float reciprocal) {
    return __fmaf_rn(reciprocal, __fmaf_rn(-denominator, reciprocal, 1.0f), reciprocal);
}

// silu(g) = g / (1 + expf(-g)), with the fast division (for gates fast_silu_gates accepts) or __fdiv_rn.
template <bool kFastDivision>
DK_DEVICE float silu(float gate) {
    const float denominator = sigmoid_denominator(gate);
    return kFastDivision ? divide_fast(gate, denominator, reciprocal_estimate(denominator))
                         : __fdiv_rn(gate, denominator);
}

// The smallest and the largest magnitude of the vectors' bf16 elements as bit patterns (x and y), which
// compare as unsigned integers (two to a word; NaN above infinity above every finite value).
template <int kNum>
DK_DEVICE uint2 magnitude_range(const uint4 (&vectors)[kNum]) {
    uint32_t lowest = 0xffffffffu, highest = 0u;
    #pragma unroll
    for (int v = 0; v < kNum; ++v) {
        const uint32_t* words = reinterpret_cast<const uint32_t*>(&vectors[v]);
        #pragma unroll
        for (int i = 0; i < 4; i += 2) {
            const uint32_t first = words[i] & 0x7fff7fffu, second = words[i + 1] & 0x7fff7fffu;
            lowest = __vimin3_u16x2(lowest, first, second);
            highest = __vimax3_u16x2(highest, first, second);
        }
    }
    return make_uint2(min(lowest & 0xffffu, lowest >> 16), max(highest & 0xffffu, highest >> 16));
}

template <int kNum>
DK_DEVICE uint32_t largest_magnitude(const uint4 (&vectors)[kNum]) {
    uint32_t highest = 0u;
    #pragma unroll
    for (int v = 0; v < kNum; ++v) {
        const uint32_t* words = reinterpret_cast<const uint32_t*>(&vectors[v]);
        #pragma unroll
        for (int i = 0; i < 4; i += 2)
            highest = __vimax3_u16x2(highest, words[i] & 0x7fff7fffu, words[i + 1] & 0x7fff7fffu);
    }
    return max(highest & 0xffffu, highest >> 16);
}

// Whether gates (before the clamp) of this magnitude_range have their silu's and sigmoid's IEEE divisions
// from reciprocal_estimate and divide_fast: magnitudes in [2^-100, 87] (no zero, subnormal, infinity or
// NaN; a clamp c >= 2^-100 keeps min(gate, c) in range).
constexpr float kFastClampMin = 0x1p-100f;

DK_DEVICE bool fast_silu_gates(uint2 gate_range) {
    return gate_range.x >= 0x0D80u && gate_range.y <= 0x42AEu;  // bf16 2^-100 and 87
}

// The bit pattern of the largest bf16 <= c (c > 0 finite): a bf16 magnitude m has m <= c iff its bit
// pattern is at most this one.
DK_DEVICE uint32_t bf16_floor_bits(float c) {
    return __float_as_uint(c) >> 16;
}

}  // namespace deep_kernels
