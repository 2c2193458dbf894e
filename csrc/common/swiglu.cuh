// SwiGLU's elementwise steps, shared by its forward and backward kernels. Each is an explicit IEEE FP32
// operation (no FMA contraction), so a plain-torch reference evaluated on the GPU (where torch.exp is
// expf) reproduces every value bit for bit.
#pragma once

#include <cuda_bf16.h>

#include "common/macros.cuh"
#include "common/quant.cuh"

namespace deep_kernels {

// min(gate, c) and max(min(up, c), -c), NaN propagating; without kClamped the values as they are. (A clamped
// gate takes silu(c) from one IEEE division per thread; min(gate, c) is what the fast range is checked on.)
template <bool kClamped>
DK_DEVICE float clamp_gate(float gate, float clamp) {
    return kClamped ? min_nan(gate, clamp) : gate;
}

template <bool kClamped>
DK_DEVICE float clamp_up(float up, float clamp) {
    return kClamped ? max_nan(min_nan(up, clamp), -clamp) : up;
}

// clamp_gate and clamp_up on the bf16 pairs of kNum 16-byte vectors of gates and ups, in place, for a clamp
// that bf16 holds exactly: the clamped values are bf16 values then, the same as FP32's min and max give (NaN
// propagating), at one instruction per pair instead of one per element and bound.
template <int kNum>
DK_DEVICE void clamp_bf16_pairs(uint4 (&gates)[kNum], uint4 (&ups)[kNum], float clamp) {
    const __nv_bfloat162 upper = __float2bfloat162_rn(clamp), lower = __float2bfloat162_rn(-clamp);
    #pragma unroll
    for (int v = 0; v < kNum; ++v) {
        auto* gate_pairs = reinterpret_cast<__nv_bfloat162*>(&gates[v]);
        auto* up_pairs = reinterpret_cast<__nv_bfloat162*>(&ups[v]);
        #pragma unroll
        for (int i = 0; i < 4; ++i) {
            gate_pairs[i] = __hmin2_nan(gate_pairs[i], upper);
            up_pairs[i] = __hmax2_nan(__hmin2_nan(up_pairs[i], upper), lower);
        }
    }
}

// Whether the clamp changed the value (where the clamp's gradient is zero); NaN is not clamped.
template <bool kClamped>
DK_DEVICE bool gate_clamped(float gate, float clamp) {
    return kClamped && gate > clamp;
}

template <bool kClamped>
DK_DEVICE bool up_clamped(float up, float clamp) {
    return kClamped && fabsf(up) > clamp;
}

// The denominator 1 + expf(-g) of the sigmoid and silu(g) = g / (1 + expf(-g)).
DK_DEVICE float sigmoid_denominator(float gate) {
    return __fadd_rn(1.0f, expf(-gate));
}

// silu(c) by IEEE division, for the gates the clamp replaces (c need not be a bf16 value, so it takes neither
// of the division steps below); computed once per thread. Without kClamped, unused.
template <bool kClamped>
DK_DEVICE float silu_of_clamp(float clamp) {
    return kClamped ? __fdiv_rn(clamp, sigmoid_denominator(clamp)) : 0.0f;
}

// rcp.approx.ftz: 1 / d within 1 ulp (subnormal results flushed to zero).
DK_DEVICE float approximate_reciprocal(float d) {
    float estimate;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(estimate) : "f"(d));
    return estimate;
}

// About 1 / d: rcp.approx refined by one Newton step; RN(1 / d) for d normal, well inside the exponent range,
// unless d's significand is all ones (where the Newton step can round the wrong way).
DK_DEVICE float refined_reciprocal(float d) {
    const float estimate = approximate_reciprocal(d);
    return __fmaf_rn(estimate, __fmaf_rn(-d, estimate, 1.0f), estimate);
}

// silu(gate) = gate / (1 + expf(-gate)) for the forward, where only this quotient is needed: divide_by_scale's
// steps on gate / 4 and d / 4 (the same quotient) from the bare rcp.approx estimate of 4 / d, no Newton step.
// d / 4 is RN(1 + e) / 4 in one FMA, below 2^126 for every finite d, so the estimate and every step are normal
// numbers; an infinite d (gates from about -88.7 down) is clamped to FLT_MAX, whose estimate flushes to zero, so
// the steps give -0, the quotient gate / inf. The quotient is the IEEE one for every finite bf16 gate of at least
// 2^-20 in magnitude (GatePairRange): tests/test_quant_swiglu.py evaluates the steps exactly for each such
// gate, each d from an expf within 2 ulp and each estimate within 2 ulp of 4 / d. (A dividend of 8 significant
// bits leaves the correction step enough margin; 1 / d, the backward's sigmoid, needs the Newton step.)
DK_DEVICE float fast_silu(float gate) {
    const float quarter_d = fminf(__fmaf_rn(expf(-gate), 0.25f, 0.25f), 0x1.fffffep127f);
    return divide_by_scale(__fmul_rn(gate, 0.25f), quarter_d, approximate_reciprocal(quarter_d));
}

// The sigmoid's denominator d with refined_reciprocal(d), and a / d by the steps of nvcc's div.rn.f32 fast path
// on sm_90 (q0 = a r, then q0 - r (d q0 - a): common/quant.cuh's divide_by_scale) without its per-element check
// (FCHK) and slow-path branch. With r = RN(1 / d) and every step a normal number, the quotient is the IEEE one
// (Markstein's theorem); the residual's sign order keeps the sign of a zero a.
// NOTE: the check and its branch (FCHK, BSSY, BRA, BSYNC) cost 4 of __fdiv_rn's 10 instructions per
// element and cut the code into per-element regions the compiler does not schedule across; here a
// vector's check is one range test (GateRange). The quotient is the IEEE one for a = gate and a = 1 and every gate of
// GateRange's fast range that is a bf16 value: tests/test_quant_swiglu.py evaluates the steps exactly for
// each such gate, each d from an expf within 2 ulp (CUDA's bound) and each rcp.approx within 2 ulp, and
// compares the kernels with IEEE division on the GPU for all 2^16 bf16 gates.
struct SigmoidDenominator {
    float d;  // 1 + expf(-gate)
    float r;  // about 1 / d

    DK_DEVICE explicit SigmoidDenominator(float gate) : d(sigmoid_denominator(gate)), r(refined_reciprocal(d)) {}

    // a / d, the IEEE quotient for the gates of GateRange's fast range and a = 1 or a = gate.
    DK_DEVICE float divide(float a) const { return divide_by_scale(a, d, r); }
};

// The sigmoid's denominator d = 1 + expf(-gate) and the quotients silu(gate) = gate / d and sigmoid(gate) = 1 / d,
// the IEEE ones for every bf16 gate (zeros, subnormals, infinities and NaN included) by SigmoidDenominator's
// steps, with no call or branch: a d from 2^64 up (gates below about -44) is scaled by 2^-64, so that the
// steps stay far from the exponent range's ends, and r is set to RN(1 / divisor) where the divisor's
// significand is all ones (Markstein's exception). tests/test_quant_swiglu.py replays the steps for every
// bf16 gate (d from an expf within 2 ulp, rcp.approx within 2 ulp) and compares the kernels with IEEE
// division on the GPU for all 2^16 of them.
struct ScaledSigmoidDenominator {
    float d;        // 1 + expf(-gate)
    bool huge;      // d >= 2^64 (inf included)
    float divisor;  // d, or d * 2^-64 when huge
    float r;        // RN(1 / divisor) for a finite divisor

    DK_DEVICE explicit ScaledSigmoidDenominator(float gate)
        : d(sigmoid_denominator(gate)), huge(d >= 0x1p64f), divisor(huge ? __fmul_rn(d, 0x1p-64f) : d) {
        const uint32_t bits = __float_as_uint(divisor);
        // RN(1 / (2^e (2 - 2^-23))) = 2^-(e+1) (1 + 2^-23): biased exponent 253 - (e + 127), significand 1
        r = (bits & 0x7fffffu) == 0x7fffffu ? __uint_as_float(((253u - (bits >> 23)) << 23) | 1u)
                                            : refined_reciprocal(divisor);
    }

    // gate / d for the gate d was made from. A gate below 2^-64 in magnitude (zeros included) is scaled by
    // 2^64, so the steps give the quotient times 2^64 (as a huge d does), which scales back exactly (a normal
    // number: at least 2^-122 in magnitude for a huge d, and for a tiny gate d is 2, so the scaled quotient is
    // exact). An infinite d gives gate * 0 (-0, or NaN for -inf), an infinite gate itself.
    DK_DEVICE float silu(float gate) const {
        const bool tiny = fabsf(gate) < 0x1p-64f;
        const float q = divide_by_scale(tiny ? __fmul_rn(gate, 0x1p64f) : gate, divisor, r);
        const float quotient = huge || tiny ? __fmul_rn(q, 0x1p-64f) : q;
        return isinf(d) || isinf(gate) ? __fmul_rn(gate, isinf(d) ? 0.0f : 1.0f) : quotient;
    }

    // 1 / d. With a huge d the steps give q = 2^64 / d, and 1 / d is c + (1 - 2^64 c / divisor) r 2^-64 in one
    // rounding, c = q 2^-64 rounded toward zero (exact where 1 / d is normal; for d above 2^126 the correction
    // decides the rounding of the subnormal quotient, which scaling q back would round twice). An infinite d
    // gives 0.
    DK_DEVICE float sigmoid() const {
        const float q = divide_by_scale(1.0f, divisor, r);
        const float truncated = __fmul_rz(q, 0x1p-64f);
        const float residual = __fmaf_rn(-__fmul_rn(truncated, 0x1p64f), divisor, 1.0f);
        const float scaled_back = __fmaf_rn(__fmul_rn(residual, 0x1p-64f), r, truncated);
        return isinf(d) ? 0.0f : (huge ? scaled_back : q);
    }
};

// The magnitude range of a vector's gates (after the clamp: a clamped gate's quotients are not used); fast()
// when every one lies in [2^-20, 64] (no zero, subnormal, inf or NaN): there d is below 2^93, every step of
// SigmoidDenominator is a normal number far from overflow, and d's significand is never all ones, the
// divisor whose Newton step can round the wrong way (d = 2 - 2^-23 comes from gates below 2^-21).
struct GateRange {
    float smallest = __int_as_float(0x7f800000), largest = 0.0f;

    DK_DEVICE void add(float gate) {
        smallest = min_nan(smallest, fabsf(gate));
        largest = max_nan(largest, fabsf(gate));
    }

    DK_DEVICE bool fast() const { return smallest >= 0x1p-20f && largest <= 64.0f; }
};

// The forward's check of a thread's bf16 gates for fast_silu, on the packed pairs (two gates an instruction, where
// GateRange takes two FP32 instructions a gate): fast_silu gives IEEE division's quotient for every gate but those
// below 2^-20 in magnitude (zeros and subnormals: below 2^-21 d approaches 2 - 2^-23, where the correction step can
// round the wrong way) and +inf (inf - inf in the residual); -inf and NaN give NaN, as the division does. So a
// vector is fast when its smallest magnitude is at least 2^-20 and, unless kBounded (gates below +inf, as a finite
// clamp leaves them), its largest gate is finite. NaN lanes drop out of the bf16 min and max (they take the fast
// steps).
template <bool kBounded>
struct GatePairRange {
    __nv_bfloat162 smallest = __float2bfloat162_rn(__int_as_float(0x7f800000));
    __nv_bfloat162 largest = __float2bfloat162_rn(0.0f);

    DK_DEVICE void add(const uint4& vector) {
        const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&vector);
        smallest = __hmin2(__hmin2(smallest, __hmin2(__habs2(pairs[0]), __habs2(pairs[1]))),
                           __hmin2(__habs2(pairs[2]), __habs2(pairs[3])));
        if constexpr (!kBounded)
            largest = __hmax2(__hmax2(largest, __hmax2(pairs[0], pairs[1])), __hmax2(pairs[2], pairs[3]));
    }

    DK_DEVICE bool silu_fast() const {
        return __hbge2(smallest, __float2bfloat162_rn(0x1p-20f)) &&
               (kBounded || __hblt2(largest, __float2bfloat162_rn(__int_as_float(0x7f800000))));
    }
};

}  // namespace deep_kernels
