// Backward of top-k gating: grad_weights fp32 [T, k], the forward's logits [T, E] (fp32 or bf16, unit
// column stride) and indices int32 [T, k] -> grad_logits fp32 [T, E], contiguous. Per token, with the
// scores s recomputed as the forward does, c_j = s[indices_j] (0 for an index outside [0, E)) and f the
// scaling factor:
//   renormalizing: D = (c_0 + ... + c_{k-1}) + 1e-20, q = (sum_j g_j c_j) / D, gc_j = ((g_j - q) / D) f
//   otherwise:     gc_j = g_j f
//   softmax:       grad[x] = s[x] (gc[x] - sum_j gc_j c_j), gc[x] = the gc_j of the slots choosing x (else 0)
//   sigmoid:       grad[x] = gc[x] (s[x] (1 - s[x])) for chosen x, else 0
//   sqrtsoftplus:  grad[x] = (gc[x] d[x]) / (2 s[x]) for chosen x with s[x] != 0 (d = 1 above the softplus
//                  threshold, else sigmoid(x)), else 0
// Sums in j order; the bias and the selection are not differentiated. One warp per token, the forward's
// slot mapping (lane l holds experts l, l + 32, ...); deep_kernels/reference/moe/gate.py mirrors it.
#pragma once

#include <cstdint>

#include "common/macros.cuh"
#include "common/math.cuh"
#include "kernels/smxx_topk_gate.cuh"

namespace deep_kernels {

// values[slot] with a warp-uniform slot, without indexing the register array dynamically.
template <int kSlots>
DK_DEVICE float select_slot(const float (&values)[kSlots], int slot) {
    float result = 0.0f;
    #pragma unroll
    for (int i = 0; i < kSlots; ++i)
        result = i == slot ? values[i] : result;
    return result;
}

template <typename InT, int NUM_EXPERTS, GateScoring kScoring, int kNumWarps>
__global__ void __launch_bounds__(kNumWarps * 32)
smxx_topk_gate_backward_impl(const float* __restrict__ grad_weights, const InT* __restrict__ logits,
                             const int* __restrict__ indices, float* __restrict__ grad_logits, uint32_t num_tokens,
                             uint32_t logits_row_stride, uint32_t top_k, uint32_t renormalize, float scaling_factor) {
    constexpr int kSlots = ceil_div(NUM_EXPERTS, 32);
    const int lane = static_cast<int>(threadIdx.x % 32);
    const uint32_t token = blockIdx.x * kNumWarps + threadIdx.x / 32;
    if (token >= num_tokens)
        return;
    const auto is_expert = [&](int slot) { return NUM_EXPERTS % 32 == 0 || lane + 32 * slot < NUM_EXPERTS; };

    // Scores, and lane j's slot: its gradient and expert
    const InT* row = logits + static_cast<uint64_t>(token) * logits_row_stride;
    float score[kSlots];
    warp_gate_scores<InT, NUM_EXPERTS, kScoring>(row, lane, score);
    const uint64_t first = static_cast<uint64_t>(token) * top_k;
    const float lane_grad = static_cast<uint32_t>(lane) < top_k ? grad_weights[first + lane] : 0.0f;
    const int lane_expert = static_cast<uint32_t>(lane) < top_k ? indices[first + lane] : -1;
    const auto chosen_score = [&](int expert) {
        const bool valid = expert >= 0 && expert < NUM_EXPERTS;
        const float value = __shfl_sync(kFullWarpMask, select_slot(score, valid ? expert / 32 : 0), expert & 31);
        return valid ? value : 0.0f;
    };

    // The renormalization's sums, in j order
    float denominator = 0.0f, dot = 0.0f;
    for (uint32_t j = 0; j < top_k; ++j) {
        const int expert = __shfl_sync(kFullWarpMask, lane_expert, j);
        const float grad = __shfl_sync(kFullWarpMask, lane_grad, j);
        const float chosen = chosen_score(expert);
        denominator = __fadd_rn(denominator, chosen);
        dot = __fadd_rn(dot, __fmul_rn(grad, chosen));
    }
    denominator = __fadd_rn(denominator, kRenormalizeEpsilon);
    const float quotient = __fdiv_rn(dot, denominator);

    // The score gradients: slot i of this lane gathers the gc_j of the slots choosing its expert
    float score_grad[kSlots];
    uint32_t chosen_slots = 0;
    #pragma unroll
    for (int i = 0; i < kSlots; ++i)
        score_grad[i] = 0.0f;
    float chosen_dot = 0.0f;
    for (uint32_t j = 0; j < top_k; ++j) {
        const int expert = __shfl_sync(kFullWarpMask, lane_expert, j);
        const float grad = __shfl_sync(kFullWarpMask, lane_grad, j);
        // NOTE: both branches computed on every lane: no predicate lives across the division's slow path.
        const float renormalized = __fdiv_rn(__fsub_rn(grad, quotient), denominator);
        const float gc = __fmul_rn(renormalize ? renormalized : grad, scaling_factor);
        chosen_dot = __fadd_rn(chosen_dot, __fmul_rn(gc, chosen_score(expert)));
        #pragma unroll
        for (int i = 0; i < kSlots; ++i) {
            if (lane + 32 * i == expert) {
                score_grad[i] = __fadd_rn(score_grad[i], gc);
                chosen_slots |= 1u << i;
            }
        }
    }

    // Through the scoring function
    float* grad_row = grad_logits + static_cast<uint64_t>(token) * NUM_EXPERTS;
    #pragma unroll
    for (int i = 0; i < kSlots; ++i) {
        const bool chosen = (chosen_slots >> i) & 1u;
        float grad;
        if constexpr (kScoring == GateScoring::Softmax) {
            grad = __fmul_rn(score[i], __fsub_rn(score_grad[i], chosen_dot));
        } else if constexpr (kScoring == GateScoring::Sigmoid) {
            grad = __fmul_rn(score_grad[i], __fmul_rn(score[i], __fsub_rn(1.0f, score[i])));
        } else {
            const float logit = is_expert(i) ? static_cast<float>(row[lane + 32 * i]) : 0.0f;
            const float slope = logit > kSoftplusThreshold ? 1.0f : elementwise_score<GateScoring::Sigmoid>(logit);
            grad = __fdiv_rn(__fmul_rn(score_grad[i], slope), __fmul_rn(2.0f, score[i]));
            grad = score[i] == 0.0f ? 0.0f : grad;
        }
        if constexpr (kScoring != GateScoring::Softmax)
            grad = chosen ? grad : 0.0f;
        if (is_expert(i))
            grad_row[lane + 32 * i] = grad;
    }
}

}  // namespace deep_kernels
