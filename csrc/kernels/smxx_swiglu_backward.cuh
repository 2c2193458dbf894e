// SwiGLU backward: x [N, 2H] bf16 (gate | up), dy [N, H] bf16 -> dx [N, 2H] bf16 (dgate | dup) and
// dweights [N] fp32, for y = silu(gc) * uc * w with gc = min(gate, c), uc = max(min(up, c), -c) (FP32,
// each step an IEEE operation, common/swiglu.cuh):
//   e = expf(-gc), d = 1 + e, s = 1 / d, silu = gc / d, dyw = dy * w (dy without weights)
//   dgate = (dyw * uc) * (s * (1 + gc * (1 - s))), 0 where gate > c
//   dup = dyw * silu, 0 where up > c or up < -c         (NaN propagates: only clamped values get 0)
//   dweights = sum over H of dy * (silu * uc): per lane 8 running sums (one per vector element) over
//   the row's 256-column chunks in order, then pairs of elements (01 23 45 67, then 0123 4567), then
//   lanes by xor-butterfly (16, 8, 4, 2, 1)
// One warp per row; each lane loads the chunk kChunksAhead further (3 x 16-byte vectors) before it computes the
// current one, so kChunksAhead chunks' loads are always in flight; kMinBlocks is the blocks per SM the launch
// bounds ask for (the register budget). sigmoid and silu take SigmoidDenominator's steps, or
// ScaledSigmoidDenominator's for a chunk whose gates leave their fast range (common/swiglu.cuh: the IEEE
// quotients with no call); a clamped gate takes silu(c), computed once per thread by IEEE division (its dgate is
// zero). A row whose position is outside [0, pos_limit) is neither read nor written. No shared memory.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/macros.cuh"
#include "common/swiglu.cuh"

namespace deep_kernels {

// One lane's 8 columns of a chunk: gate, up and dy.
struct SwigluChunk {
    uint4 gate, up, grad;
};

template <int kNumWarps, int kChunksAhead, int kMinBlocks, bool kClamped>
__global__ void __launch_bounds__(kNumWarps * 32, kMinBlocks)
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
    const float clamped_silu = silu_of_clamp<kClamped>(clamp);

    const auto load = [&](uint32_t column) {
        return SwigluChunk{__ldg(reinterpret_cast<const uint4*>(gate_row + column)),
                           __ldg(reinterpret_cast<const uint4*>(gate_row + hidden + column)),
                           __ldg(reinterpret_cast<const uint4*>(dy_row + column))};
    };
    // The gradients of one chunk, its terms added to the lane's running sums
    float partial[kVec] = {};
    const auto process = [&](const SwigluChunk& chunk, uint32_t column) {
        float gate_in[kVec], up_in[kVec], grad[kVec];
        unpack_bf16<1>(&chunk.gate, gate_in);
        GateRange range;
        #pragma unroll
        for (int i = 0; i < kVec; ++i)
            range.add(clamp_gate<kClamped>(gate_in[i], clamp));
        const bool fast = range.fast();
        unpack_bf16<1>(&chunk.up, up_in);
        unpack_bf16<1>(&chunk.grad, grad);
        uint4 dgate_packed, dup_packed;
        __nv_bfloat162* dgate = reinterpret_cast<__nv_bfloat162*>(&dgate_packed);
        __nv_bfloat162* dup = reinterpret_cast<__nv_bfloat162*>(&dup_packed);
        // NOTE: a pair of elements at a time keeps one chunk ahead within 64 registers (4 blocks per SM).
        #pragma unroll
        for (int pair = 0; pair < kVec / 2; ++pair) {
            float sigmoid[2], silu[2], dg[2], du[2];
            #pragma unroll
            for (int i = 0; i < 2; ++i) {
                const float g = gate_in[2 * pair + i];
                if (fast) {
                    const SigmoidDenominator denominator(g);
                    sigmoid[i] = denominator.divide(1.0f);
                    silu[i] = denominator.divide(g);
                } else {
                    const ScaledSigmoidDenominator denominator(g);
                    sigmoid[i] = denominator.sigmoid();
                    silu[i] = denominator.silu(g);
                }
            }
            #pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int k = 2 * pair + i;
                const float g = gate_in[k];
                const float u = clamp_up<kClamped>(up_in[k], clamp);
                const bool clamped = gate_clamped<kClamped>(g, clamp);
                if (clamped)
                    silu[i] = clamped_silu;
                const float dyw = weights != nullptr ? __fmul_rn(grad[k], weight) : grad[k];
                const float dsilu =
                    __fmul_rn(sigmoid[i], __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, sigmoid[i]))));
                dg[i] = clamped ? 0.0f : __fmul_rn(__fmul_rn(dyw, u), dsilu);
                du[i] = up_clamped<kClamped>(up_in[k], clamp) ? 0.0f : __fmul_rn(dyw, silu[i]);
                partial[k] = __fadd_rn(partial[k], __fmul_rn(grad[k], __fmul_rn(silu[i], u)));
            }
            dgate[pair] = __floats2bfloat162_rn(dg[0], dg[1]);
            dup[pair] = __floats2bfloat162_rn(du[0], du[1]);
        }
        *reinterpret_cast<uint4*>(dx_row + column) = dgate_packed;
        *reinterpret_cast<uint4*>(dx_row + hidden + column) = dup_packed;
    };

    // The row's chunks in order, kChunksAhead + 1 per iteration, each in its own registers (no copies): chunk i
    // of an iteration is processed after the load of the chunk kChunksAhead further is issued
    constexpr int kBuffers = kChunksAhead + 1;
    SwigluChunk chunks[kBuffers] = {};
    #pragma unroll
    for (int i = 0; i < kChunksAhead; ++i)
        if (lane * kVec + i * kChunk < hidden)
            chunks[i] = load(lane * kVec + i * kChunk);
    for (uint32_t first = lane * kVec; first < hidden; first += kBuffers * kChunk) {
        #pragma unroll
        for (int i = 0; i < kBuffers; ++i) {
            const uint32_t column = first + i * kChunk;
            if (column >= hidden)
                break;
            if (column + kChunksAhead * kChunk < hidden)
                chunks[(i + kChunksAhead) % kBuffers] = load(column + kChunksAhead * kChunk);
            process(chunks[i], column);
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
