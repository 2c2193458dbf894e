// SwiGLU backward: x [N, 2H] bf16 (gate | up), dy [N, H] bf16 -> dx [N, 2H] bf16 (dgate | dup) and
// dweights [N] fp32, for y = silu(gc) * uc * w with gc = min(gate, c), uc = max(min(up, c), -c) (FP32,
// each step an IEEE operation, common/swiglu.cuh):
//   e = expf(-gc), d = 1 + e, s = 1 / d, silu = gc / d, dyw = dy * w (dy without weights)
//   dgate = (dyw * uc) * (s * (1 + gc * (1 - s))), 0 where gate > c
//   dup = dyw * silu, 0 where up > c or up < -c         (NaN propagates: only clamped values get 0)
//   dweights = sum over H of dy * (silu * uc): per lane 8 running sums (one per vector element) over
//   the row's 256-column chunks in order, then pairs of elements (01 23 45 67, then 0123 4567), then
//   lanes by xor-butterfly (16, 8, 4, 2, 1)
// One warp per row, kUnroll chunks (3 x 16-byte vectors each) in flight per lane; a row whose position
// is outside [0, pos_limit) is neither read nor written. No shared memory.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/macros.cuh"
#include "common/swiglu.cuh"

namespace deep_kernels {

template <int kNumWarps, int kUnroll, bool kClamped>
__global__ void __launch_bounds__(kNumWarps * 32)
smxx_swiglu_backward_impl(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ dy,
                          __nv_bfloat16* __restrict__ dx, float* __restrict__ dweights,
                          const float* __restrict__ weights, const int32_t* __restrict__ pos, uint32_t num_rows,
                          uint32_t hidden, uint32_t x_row_stride, uint32_t dy_row_stride, uint32_t pos_limit,
                          float clamp) {
    // Types
    constexpr int kVec = 8;
    constexpr int kChunk = 32 * kVec;

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
    const __nv_bfloat16* gate_row = x + static_cast<uint64_t>(row) * x_row_stride;
    const __nv_bfloat16* dy_row = dy + static_cast<uint64_t>(row) * dy_row_stride;
    __nv_bfloat16* dx_row = dx + static_cast<uint64_t>(row) * hidden * 2;

    // Chunks of the row: loads of kUnroll chunks first, then the gradients in chunk order
    float partial[kVec] = {};
    for (uint32_t base = lane * kVec; base < hidden; base += kChunk * kUnroll) {
        uint4 gate[kUnroll], up[kUnroll], grad[kUnroll];
        #pragma unroll
        for (int j = 0; j < kUnroll; ++j) {
            const uint32_t column = base + j * kChunk;
            if (column < hidden) {
                gate[j] = __ldg(reinterpret_cast<const uint4*>(gate_row + column));
                up[j] = __ldg(reinterpret_cast<const uint4*>(gate_row + hidden + column));
                grad[j] = __ldg(reinterpret_cast<const uint4*>(dy_row + column));
            }
        }
        #pragma unroll
        for (int j = 0; j < kUnroll; ++j) {
            const uint32_t column = base + j * kChunk;
            if (column >= hidden)
                break;
            const __nv_bfloat16* gate_values = reinterpret_cast<const __nv_bfloat16*>(&gate[j]);
            const __nv_bfloat16* up_values = reinterpret_cast<const __nv_bfloat16*>(&up[j]);
            const __nv_bfloat16* grad_values = reinterpret_cast<const __nv_bfloat16*>(&grad[j]);
            uint4 dgate_packed, dup_packed;
            __nv_bfloat16* dgate = reinterpret_cast<__nv_bfloat16*>(&dgate_packed);
            __nv_bfloat16* dup = reinterpret_cast<__nv_bfloat16*>(&dup_packed);
            #pragma unroll
            for (int i = 0; i < kVec; ++i) {
                const float gate_in = __bfloat162float(gate_values[i]), up_in = __bfloat162float(up_values[i]);
                const float g = clamp_gate<kClamped>(gate_in, clamp);
                const float u = clamp_up<kClamped>(up_in, clamp);
                const float dy_value = __bfloat162float(grad_values[i]);
                const float dyw = weights != nullptr ? __fmul_rn(dy_value, weight) : dy_value;
                const float denominator = sigmoid_denominator(g);
                const float sigmoid = __fdiv_rn(1.0f, denominator);
                const float silu = __fdiv_rn(g, denominator);
                const float dsilu = __fmul_rn(sigmoid, __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, sigmoid))));
                const float dg = __fmul_rn(__fmul_rn(dyw, u), dsilu);
                const float du = __fmul_rn(dyw, silu);
                dgate[i] = __float2bfloat16_rn(gate_clamped<kClamped>(gate_in, clamp) ? 0.0f : dg);
                dup[i] = __float2bfloat16_rn(up_clamped<kClamped>(up_in, clamp) ? 0.0f : du);
                partial[i] = __fadd_rn(partial[i], __fmul_rn(dy_value, __fmul_rn(silu, u)));
            }
            *reinterpret_cast<uint4*>(dx_row + column) = dgate_packed;
            *reinterpret_cast<uint4*>(dx_row + hidden + column) = dup_packed;
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
