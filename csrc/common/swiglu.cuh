// SwiGLU's elementwise steps, shared by its forward and backward kernels. Each is an explicit IEEE FP32
// operation (no FMA contraction), so a plain-torch reference evaluated on the GPU (where torch.exp is
// expf) reproduces every value bit for bit.
#pragma once

#include "common/macros.cuh"
#include "common/quant.cuh"

namespace deep_kernels {

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
    return kClamped && fabsf(up) > clamp;
}

// The denominator 1 + expf(-g) of the sigmoid and silu(g) = g / (1 + expf(-g)).
DK_DEVICE float sigmoid_denominator(float gate) {
    return __fadd_rn(1.0f, expf(-gate));
}

// The sigmoid's denominator d with a reciprocal estimate r (rcp.approx refined by one Newton step), and
// a / d by the fast path of nvcc's div.rn.f32 on sm_90 (the same operations: q0 = a r, then
// q0 + r (a - d q0)), without its per-element check (FCHK) and slow-path branch.
// NOTE: the check and its branch (FCHK, BSSY, BRA, BSYNC) cost 4 of __fdiv_rn's 10 instructions per
// element and cut the code into per-element regions the compiler does not schedule across; here a
// vector's check is one range test (GateRange). The quotient is the IEEE one for a = gate and a = 1 and every gate of
// GateRange's fast range that is a bf16 value: tests/test_quant_swiglu.py evaluates the steps exactly for
// each such gate, each d from an expf within 2 ulp (CUDA's bound) and each rcp.approx within 2 ulp, and
// compares the kernels with IEEE division on the GPU for all 2^16 bf16 gates. The clamp, the one gate
// that need not be a bf16 value, is checked at run time (clamp_divides_fast).
struct SigmoidDenominator {
    float d;  // 1 + expf(-gate)
    float r;  // about 1 / d

    DK_DEVICE explicit SigmoidDenominator(float gate) : d(sigmoid_denominator(gate)) {
        float estimate;
        asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(estimate) : "f"(d));
        r = __fmaf_rn(estimate, __fmaf_rn(-d, estimate, 1.0f), estimate);
    }

    // a / d, the IEEE quotient for the gates of GateRange's fast range and a = 1 or a = gate.
    DK_DEVICE float divide(float a) const {
        const float q = __fmul_rn(a, r);
        return __fmaf_rn(r, __fmaf_rn(-d, q, a), q);
    }
};

// The magnitude range of a vector's gates (after the clamp); fast() when every one lies in [2^-20, 64]
// (no zero, subnormal, inf or NaN): there d is below 2^93, every step of SigmoidDenominator is a normal
// number far from overflow, and d's significand is never all ones, the divisor whose Newton step can
// round the wrong way (d = 2 - 2^-23 comes from gates below 2^-21).
struct GateRange {
    float smallest = __int_as_float(0x7f800000), largest = 0.0f;

    DK_DEVICE void add(float gate) {
        smallest = min_nan(smallest, fabsf(gate));
        largest = max_nan(largest, fabsf(gate));
    }

    DK_DEVICE bool fast() const { return smallest >= 0x1p-20f && largest <= 64.0f; }
};

// Whether SigmoidDenominator's quotients of the clamp (the one gate that need not be a bf16 value) are the
// IEEE ones; always true without kClamped.
template <bool kClamped>
DK_DEVICE bool clamp_divides_fast(float clamp) {
    if constexpr (!kClamped)
        return true;
    const SigmoidDenominator denominator(clamp);
    return denominator.divide(clamp) == __fdiv_rn(clamp, denominator.d) &&
           denominator.divide(1.0f) == __fdiv_rn(1.0f, denominator.d);
}

}  // namespace deep_kernels
