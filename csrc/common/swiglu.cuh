// SwiGLU's elementwise steps, shared by its forward and backward kernels. Each is an explicit IEEE FP32
// operation (no FMA contraction), so a plain-torch reference evaluated on the GPU (where torch.exp is
// expf) reproduces every value bit for bit.
#pragma once

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

// The denominator 1 + expf(-g) of the sigmoid and silu(g) = g / (1 + expf(-g)).
DK_DEVICE float sigmoid_denominator(float gate) {
    return __fadd_rn(1.0f, expf(-gate));
}

}  // namespace deep_kernels
