// SwiGLU backward: x [N, 2H] bf16 (gate | up), dy [N, H] bf16 -> dx [N, 2H] bf16 (dgate | dup) and
// dweights [N] fp32, for y = silu(gc) * uc * w with gc = min(gate, c), uc = max(min(up, c), -c) (FP32,
// each step an IEEE operation, common/swiglu.cuh):
//   e = expf(-gc), d = 1 + e, s = 1 / d, silu = gc / d, dyw = dy * w (dy without weights)
//   dgate = (dyw * uc) * (s * (1 + gc * (1 - s))), 0 where gate > c
//   dup = dyw * silu, 0 where up > c or up < -c         (NaN propagates: only clamped values get 0)
//   dweights = sum over H of dy * (silu * uc): per lane 8 running sums (one per vector element) over
//   the row's 256-column chunks in order, then pairs of elements (01 23 45 67, then 0123 4567), then
//   lanes by xor-butterfly (16, 8, 4, 2, 1)
// One warp per row, kUnroll chunks (3 x 16-byte vectors each) per iteration, loaded one iteration ahead;
// a row whose position is outside [0, pos_limit) is neither read nor written. No shared memory.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/macros.cuh"
#include "common/swiglu.cuh"

namespace deep_kernels {

// The gradients of one chunk's 8 elements as packed bf16 (dgate, dup), and dy * (silu * uc) added to
// partial[i] for element i; dyw = dy * w (dy without kWeighted).
template <bool kFastDivision, bool kWeighted, bool kClamped>
DK_DEVICE void swiglu_gradients(const uint4& gate, const uint4& up, const uint4& grad, float clamp, float weight,
                                uint4& dgate, uint4& dup, float (&partial)[8]) {
    #pragma unroll
    for (int k = 0; k < 4; ++k) {
        const uint32_t gate_pair = reinterpret_cast<const uint32_t*>(&gate)[k];
        const uint32_t up_pair = reinterpret_cast<const uint32_t*>(&up)[k];
        const uint32_t grad_pair = reinterpret_cast<const uint32_t*>(&grad)[k];
        const float gates[2] = {bf16_low(gate_pair), bf16_high(gate_pair)};
        const float ups[2] = {bf16_low(up_pair), bf16_high(up_pair)};
        const float grads[2] = {bf16_low(grad_pair), bf16_high(grad_pair)};
        float dg[2], du[2];
        #pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float g = clamp_gate<kClamped>(gates[h], clamp);
            const float u = clamp_up<kClamped>(ups[h], clamp);
            const float dyw = kWeighted ? __fmul_rn(grads[h], weight) : grads[h];
            const float denominator = sigmoid_denominator(g);
            float sigmoid, silu;
            if constexpr (kFastDivision) {
                const float reciprocal = reciprocal_estimate(denominator);
                sigmoid = reciprocal_fast(denominator, reciprocal);
                silu = divide_fast(g, denominator, reciprocal);
            } else {
                sigmoid = __fdiv_rn(1.0f, denominator);
                silu = __fdiv_rn(g, denominator);
            }
            const float dsilu = __fmul_rn(sigmoid, __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, sigmoid))));
            dg[h] = gate_clamped<kClamped>(gates[h], clamp) ? 0.0f : __fmul_rn(__fmul_rn(dyw, u), dsilu);
            du[h] = up_clamped<kClamped>(ups[h], clamp) ? 0.0f : __fmul_rn(dyw, silu);
            partial[2 * k + h] = __fadd_rn(partial[2 * k + h], __fmul_rn(grads[h], __fmul_rn(silu, u)));
        }
        reinterpret_cast<__nv_bfloat162*>(&dgate)[k] = __floats2bfloat162_rn(dg[0], dg[1]);
        reinterpret_cast<__nv_bfloat162*>(&dup)[k] = __floats2bfloat162_rn(du[0], du[1]);
    }
}

// NOTE: 3 blocks per SM fit the unclamped kernel in 80 registers; the clamped one needs more (at 80 its
// IEEE division's slow path saves registers to a stack frame), so 2.
template <int kNumWarps, int kUnroll, bool kClamped>
__global__ void __launch_bounds__(kNumWarps * 32, kClamped ? 2 : 3)
smxx_swiglu_backward_impl(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ dy,
                          __nv_bfloat16* __restrict__ dx, float* __restrict__ dweights,
                          const float* __restrict__ weights, const int32_t* __restrict__ pos, uint32_t num_rows,
                          uint32_t hidden, uint32_t x_row_stride, uint32_t dy_row_stride, uint32_t pos_limit,
                          float clamp) {
    // Types
    constexpr int kVec = 8;
    constexpr int kChunk = 32 * kVec;
    constexpr int kChunkVectors = 32;

    // The warp's row, its position and weight
    const uint32_t lane = threadIdx.x % 32;
    const uint32_t row = blockIdx.x * kNumWarps + threadIdx.x / 32;
    if (row >= num_rows)
        return;
    uint32_t weight_index = row;
    if (pos != nullptr) {
        weight_index = static_cast<uint32_t>(__ldg(pos + row));
        if (weight_index >= pos_limit)
            return;
    }
    const float weight = weights != nullptr ? __ldg(weights + weight_index) : 1.0f;
    // The lane's first vector of each half; chunk j of an iteration is kChunkVectors * j vectors further.
    const __nv_bfloat16* gate_row = x + static_cast<uint64_t>(row) * x_row_stride;
    const uint4* gate_vectors = reinterpret_cast<const uint4*>(gate_row) + lane;
    const uint4* up_vectors = reinterpret_cast<const uint4*>(gate_row + hidden) + lane;
    const uint4* grad_vectors = reinterpret_cast<const uint4*>(dy + static_cast<uint64_t>(row) * dy_row_stride) + lane;
    uint4* dgate_vectors = reinterpret_cast<uint4*>(dx + static_cast<uint64_t>(row) * hidden * 2) + lane;
    uint4* dup_vectors = dgate_vectors + hidden / kVec;

    // Chunks of the row, kUnroll per iteration: the next iteration's loads are issued before this one's
    // gradients, which go in chunk order. The fast steps (the fast division, no clamping) where the
    // iteration has all its chunks, every gate allows the fast division and every |gate| and |up| lies
    // within the clamp (which then changes nothing); the weight's product only with weights.
    // NOTE: with clamping active the backward takes the IEEE steps (no third variant, fast division with
    // clamping, adding code and registers): it has issue slack to spare, the forward has not.
    // NOTE: with the loads one iteration ahead every warp keeps ~3 KB in flight while it computes; loads
    // issued only at the top of each iteration left the warps computing with nothing in flight.
    const auto load_chunks = [&](uint32_t base, uint32_t vector, uint4 (&gate)[kUnroll], uint4 (&up)[kUnroll],
                                 uint4 (&grad)[kUnroll]) {
        #pragma unroll
        for (int j = 0; j < kUnroll; ++j) {
            if (base + j * kChunk < hidden) {
                gate[j] = __ldg(gate_vectors + vector + j * kChunkVectors);
                up[j] = __ldg(up_vectors + vector + j * kChunkVectors);
                grad[j] = __ldg(grad_vectors + vector + j * kChunkVectors);
            }
        }
    };
    const uint32_t clamp_bits = kClamped ? bf16_floor_bits(clamp) : 0u;
    float partial[kVec] = {};
    uint4 gate[kUnroll], up[kUnroll], grad[kUnroll];
    load_chunks(lane * kVec, 0, gate, up, grad);
    constexpr int kStep = kChunk * kUnroll, kVectorStep = kChunkVectors * kUnroll;
    for (uint32_t base = lane * kVec, vector = 0; base < hidden; base += kStep, vector += kVectorStep) {
        uint4 next_gate[kUnroll], next_up[kUnroll], next_grad[kUnroll];
        load_chunks(base + kStep, vector + kVectorStep, next_gate, next_up, next_grad);
        bool fast = false;
        if (base + (kUnroll - 1) * kChunk < hidden) {
            const uint2 gate_range = magnitude_range(gate);
            fast = fast_silu_gates(gate_range) &&
                   (!kClamped || (gate_range.y <= clamp_bits && largest_magnitude(up) <= clamp_bits));
        }
        #pragma unroll
        for (int j = 0; j < kUnroll; ++j) {
            if (base + j * kChunk >= hidden)
                break;
            uint4 dgate, dup;
            const uint4 &gj = gate[j], &uj = up[j], &dj = grad[j];
            if (weights != nullptr) {
                if (fast)
                    swiglu_gradients<true, true, false>(gj, uj, dj, clamp, weight, dgate, dup, partial);
                else
                    swiglu_gradients<false, true, kClamped>(gj, uj, dj, clamp, weight, dgate, dup, partial);
            } else {
                if (fast)
                    swiglu_gradients<true, false, false>(gj, uj, dj, clamp, 1.0f, dgate, dup, partial);
                else
                    swiglu_gradients<false, false, kClamped>(gj, uj, dj, clamp, 1.0f, dgate, dup, partial);
            }
            dgate_vectors[vector + j * kChunkVectors] = dgate;
            dup_vectors[vector + j * kChunkVectors] = dup;
        }
        #pragma unroll
        for (int j = 0; j < kUnroll; ++j) {
            gate[j] = next_gate[j];
            up[j] = next_up[j];
            grad[j] = next_grad[j];
        }
    }

    // dweights: the lane's elements pairwise, then the lanes
    #pragma unroll
    for (int width = 1; width < kVec; width *= 2)
        #pragma unroll
        for (int i = 0; i < kVec; i += 2 * width)
            partial[i] = __fadd_rn(partial[i], partial[i + width]);
    float sum = partial[0];
    #pragma unroll
    for (int offset = 16; offset > 0; offset /= 2)
        sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, offset));
    if (lane == 0)
        dweights[row] = sum;
}

}  // namespace deep_kernels
