// Top-k expert gating (DeepSeek-V3 semantics): logits [T, E] (fp32 or bf16, unit column stride) ->
// weights fp32 [T, k] and expert indices int32 [T, k], both contiguous.
//   score = softmax | sigmoid | sqrt(softplus) of the fp32 logits; key = score + bias[e] (bias optional)
//   with groups, a group's key is the sum of its two largest expert keys and only the topk_groups best
//   groups stay eligible; the k best eligible keys are chosen in descending order, ties to the lower
//   index; NaN keys rank as -inf. weight = the chosen score / (sum of the k chosen scores + 1e-20) when
//   renormalizing, times the scaling factor.
// One warp per token: lane l holds experts l, l + 32, ... in registers. Every sum has a fixed order (a
// lane's slots in ascending order, then an xor butterfly) that deep_kernels/reference/moe/gate.py mirrors.
// The per-token device functions (warp_gate_scores, warp_topk_gate) also serve the fused gate + layout
// kernel and the gate backward.
#pragma once

#include <cuda_bf16.h>
#include <math_constants.h>

#include <cstdint>

#include "common/macros.cuh"
#include "common/math.cuh"
#include "common/quant.cuh"

namespace deep_kernels {

// deep_kernels.moe.SCORINGS names them.
enum class GateScoring : int { Softmax = 0, Sigmoid = 1, SqrtSoftplus = 2 };

constexpr uint32_t kFullWarpMask = 0xffffffffu;
constexpr float kRenormalizeEpsilon = 1e-20f;
// softplus(x) = x above this (log1p(exp(x)) rounds to x in fp32 there).
constexpr float kSoftplusThreshold = 20.0f;
constexpr int kNoExpert = 0x7fffffff;

// The selection order: the larger key first, then the lower index. Keys are never NaN here.
DK_DEVICE bool ranks_before(float key, int index, float other_key, int other_index) {
    return key > other_key || (key == other_key && index < other_index);
}

DK_DEVICE float nan_to_lowest(float key) {
    return isnan(key) ? -CUDART_INF_F : key;
}

// Keys as unsigned integers in the same order (-0 as +0; never NaN), for the warp-wide integer max and
// min of redux.sync: one instruction each instead of a five-step shuffle butterfly.
DK_DEVICE uint32_t key_order_bits(float key) {
    const uint32_t bits = __float_as_uint(key == 0.0f ? 0.0f : key);
    return bits >> 31 ? ~bits : bits | 0x80000000u;
}

DK_DEVICE float key_from_order_bits(uint32_t bits) {
    return __uint_as_float(bits >> 31 ? bits & 0x7fffffffu : ~bits);
}

// The two largest keys of a multiset spread over the warp, from each lane's two largest as order bits (first >=
// second; 0, below every key, where a lane has fewer). -0 comes back as +0: the callers only compare their sum.
DK_DEVICE void warp_top2(uint32_t lane_first, uint32_t lane_second, float& first, float& second) {
    const uint32_t best = __reduce_max_sync(kFullWarpMask, lane_first);
    const bool holds_best = lane_first == best;
    // The runner-up is the best again when two lanes hold it, else the largest of everything else.
    const uint32_t runner_up = __reduce_max_sync(kFullWarpMask, holds_best ? lane_second : lane_first);
    const bool best_twice = __popc(__ballot_sync(kFullWarpMask, holds_best)) > 1;
    first = key_from_order_bits(best);
    second = key_from_order_bits(best_twice ? best : runner_up);
}

// condition ? a : b, as a PTX select the compiler cannot see through.
// NOTE: unrolled selects of array[i] where lane == i are otherwise turned into array[lane], a run-time index
// that puts the array in local memory.
DK_DEVICE float select_opaque(bool condition, float a, float b) {
    float result;
    asm("{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %1, 0;\n\tselp.f32 %0, %2, %3, p;\n\t}"
        : "=f"(result) : "r"(static_cast<uint32_t>(condition)), "f"(a), "f"(b));
    return result;
}

template <typename Op>
DK_DEVICE float warp_butterfly(float value, Op op) {
    #pragma unroll
    for (int offset = 16; offset > 0; offset /= 2)
        value = op(value, __shfl_xor_sync(kFullWarpMask, value, offset));
    return value;
}

template <GateScoring kScoring>
DK_DEVICE float elementwise_score(float logit) {
    if constexpr (kScoring == GateScoring::Sigmoid) {
        return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-logit)));
    } else {
        return sqrtf(logit > kSoftplusThreshold ? logit : log1pf(expf(logit)));
    }
}

// One token's logits row as fp32, slot i of lane l holding expert l + 32 i (-inf past the experts).
template <typename InT, int NUM_EXPERTS>
DK_DEVICE void warp_load_logits(const InT* row, int lane, float (&logit)[ceil_div(NUM_EXPERTS, 32)]) {
    constexpr int kSlots = ceil_div(NUM_EXPERTS, 32);
    DK_STATIC_ASSERT(NUM_EXPERTS >= 1 && kSlots <= 32, "one bit per slot in a 32-bit mask");
    #pragma unroll
    for (int i = 0; i < kSlots; ++i)
        logit[i] = NUM_EXPERTS % 32 == 0 || lane + 32 * i < NUM_EXPERTS ? static_cast<float>(row[lane + 32 * i])
                                                                         : -CUDART_INF_F;
}

// warp_load_logits' values become the fp32 scores in place (softmax's max and sum in the fixed order the reference
// mirrors).
template <int NUM_EXPERTS, GateScoring kScoring>
DK_DEVICE void warp_scores_from_logits(int lane, float (&score)[ceil_div(NUM_EXPERTS, 32)]) {
    constexpr int kSlots = ceil_div(NUM_EXPERTS, 32);
    const auto is_expert = [&](int slot) { return NUM_EXPERTS % 32 == 0 || lane + 32 * slot < NUM_EXPERTS; };
    if constexpr (kScoring == GateScoring::Softmax) {
        float row_max = -CUDART_INF_F;
        #pragma unroll
        for (int i = 0; i < kSlots; ++i)
            row_max = max_nan(row_max, score[i]);
        row_max = warp_butterfly(row_max, max_nan);
        float partial_sum = 0.0f;
        #pragma unroll
        for (int i = 0; i < kSlots; ++i) {
            if (is_expert(i)) {
                score[i] = expf(__fsub_rn(score[i], row_max));
                partial_sum = __fadd_rn(partial_sum, score[i]);
            }
        }
        const float sum = warp_butterfly(partial_sum, [](float a, float b) { return __fadd_rn(a, b); });
        #pragma unroll
        for (int i = 0; i < kSlots; ++i)
            score[i] = __fdiv_rn(score[i], sum);
    } else {
        #pragma unroll
        for (int i = 0; i < kSlots; ++i)
            score[i] = elementwise_score<kScoring>(score[i]);
    }
}

// The fp32 scores of one token's logits row, slot i of lane l holding expert l + 32 i (-inf past the
// experts).
template <typename InT, int NUM_EXPERTS, GateScoring kScoring>
DK_DEVICE void warp_gate_scores(const InT* row, int lane, float (&score)[ceil_div(NUM_EXPERTS, 32)]) {
    warp_load_logits<InT, NUM_EXPERTS>(row, lane, score);
    // NOTE: every load is issued before the first score is computed: the compiler would otherwise sink each
    // load below the previous score's division, whose slow path is a call, and wait for them one by one.
    asm volatile("" ::: "memory");
    warp_scores_from_logits<NUM_EXPERTS, kScoring>(lane, score);
}

// One lane's share of a token's choice: lane j < k holds the j-th chosen expert and its weight.
struct GateChoice {
    float weight;
    int expert;
};

// Where a warp holds a token's experts: slot i of lane l is expert l + 32 i; with groups of whole warps' worth of
// experts a slot's group is the same on every lane, a compile-time constant that prunes the group loops.
template <int NUM_EXPERTS, int NUM_GROUPS>
struct GateSlots {
    static constexpr int kSlots = ceil_div(NUM_EXPERTS, 32);
    static constexpr int kGroupSize = NUM_GROUPS > 0 ? NUM_EXPERTS / NUM_GROUPS : NUM_EXPERTS;
    DK_STATIC_ASSERT(NUM_GROUPS >= 0 && NUM_GROUPS <= 32, "one bit per group in a 32-bit mask");
    DK_STATIC_ASSERT(NUM_GROUPS == 0 || (NUM_EXPERTS % NUM_GROUPS == 0 && kGroupSize >= 2),
                     "groups are equal and hold at least two experts");

    DK_DEVICE static int expert_of(int lane, int slot) { return lane + 32 * slot; }
    DK_DEVICE static bool is_expert(int lane, int slot) {
        return NUM_EXPERTS % 32 == 0 || expert_of(lane, slot) < NUM_EXPERTS;
    }
    DK_DEVICE static int group_of(int lane, int slot) {
        return kGroupSize % 32 == 0 ? 32 * slot / kGroupSize : expert_of(lane, slot) / kGroupSize;
    }
};

// The tokens' scores and their selection keys as order bits (key_order_bits); 0 marks a slot out of the race (no
// expert; later also a group left out, or chosen already): every key, -inf included, has larger ones, so integer
// maxima rank the rest.
template <typename InT, int NUM_EXPERTS, int NUM_GROUPS, GateScoring kScoring, int kTokens>
DK_DEVICE void warp_selection_keys(const InT* const (&rows)[kTokens], const float* bias, int lane,
                                   float (&score)[kTokens][GateSlots<NUM_EXPERTS, NUM_GROUPS>::kSlots],
                                   uint32_t (&order)[kTokens][GateSlots<NUM_EXPERTS, NUM_GROUPS>::kSlots]) {
    using Slots = GateSlots<NUM_EXPERTS, NUM_GROUPS>;
    // The bias loads first, so that they and the logits' are in flight together
    const bool has_bias = bias != nullptr;
    float bias_value[Slots::kSlots];
    #pragma unroll
    for (int i = 0; i < Slots::kSlots; ++i)
        bias_value[i] = has_bias && Slots::is_expert(lane, i) ? bias[Slots::expert_of(lane, i)] : 0.0f;
    #pragma unroll
    for (int t = 0; t < kTokens; ++t)
        warp_load_logits<InT, NUM_EXPERTS>(rows[t], lane, score[t]);
    // NOTE: every load is issued before the first score is computed: the compiler would otherwise sink each
    // load below the previous score's division, whose slow path is a call, and wait for them one by one.
    asm volatile("" ::: "memory");
    #pragma unroll
    for (int t = 0; t < kTokens; ++t)
        warp_scores_from_logits<NUM_EXPERTS, kScoring>(lane, score[t]);
    #pragma unroll
    for (int t = 0; t < kTokens; ++t) {
        #pragma unroll
        for (int i = 0; i < Slots::kSlots; ++i) {
            const bool biased = has_bias && Slots::is_expert(lane, i);
            const float key = nan_to_lowest(biased ? __fadd_rn(score[t][i], bias_value[i]) : score[t][i]);
            order[t][i] = Slots::is_expert(lane, i) ? key_order_bits(key) : 0u;
        }
    }
}

// Group limit: rank the groups by the sum of their top-2 keys, keep the best topk_groups (the others' keys become 0).
template <int NUM_EXPERTS, int NUM_GROUPS, int kTokens>
DK_DEVICE void warp_limit_groups(int lane, uint32_t topk_groups,
                                 uint32_t (&order)[kTokens][GateSlots<NUM_EXPERTS, NUM_GROUPS>::kSlots]) {
    using Slots = GateSlots<NUM_EXPERTS, NUM_GROUPS>;
    float group_key[kTokens][NUM_GROUPS], lane_group_key[kTokens];
    #pragma unroll
    for (int t = 0; t < kTokens; ++t)
        lane_group_key[t] = 0.0f;
    #pragma unroll
    for (int g = 0; g < NUM_GROUPS; ++g) {
        #pragma unroll
        for (int t = 0; t < kTokens; ++t) {
            uint32_t lane_first = 0, lane_second = 0;
            #pragma unroll
            for (int i = 0; i < Slots::kSlots; ++i) {
                if (Slots::is_expert(lane, i) && Slots::group_of(lane, i) == g) {
                    lane_second = max(lane_second, min(lane_first, order[t][i]));
                    lane_first = max(lane_first, order[t][i]);
                }
            }
            float first, second;
            warp_top2(lane_first, lane_second, first, second);
            group_key[t][g] = nan_to_lowest(__fadd_rn(first, second));
            lane_group_key[t] = select_opaque(lane == g, group_key[t][g], lane_group_key[t]);
        }
    }
    // Lane g ranks group g
    #pragma unroll
    for (int t = 0; t < kTokens; ++t) {
        uint32_t rank = 0;
        #pragma unroll
        for (int h = 0; h < NUM_GROUPS; ++h)
            rank += ranks_before(group_key[t][h], h, lane_group_key[t], lane);
        const uint32_t selected_groups = __ballot_sync(kFullWarpMask, lane < NUM_GROUPS && rank < topk_groups);
        #pragma unroll
        for (int i = 0; i < Slots::kSlots; ++i)
            order[t][i] = ((selected_groups >> Slots::group_of(lane, i)) & 1u) != 0 ? order[t][i] : 0u;
    }
}

// Iterative argmax: top_k rounds of (lane-local best, warp argmax); lane j keeps round j's expert.
// NOTE: the host guarantees k <= the number of eligible experts, so every round finds one.
template <int kSlots, int kTokens>
DK_DEVICE void warp_argmax_rounds(int lane, uint32_t top_k, uint32_t (&order)[kTokens][kSlots],
                                  int (&chosen_expert)[kTokens]) {
    #pragma unroll
    for (int t = 0; t < kTokens; ++t)
        chosen_expert[t] = 0;
    for (uint32_t round = 0; round < top_k; ++round) {
        #pragma unroll
        for (int t = 0; t < kTokens; ++t) {
            // A lane's slots ascend in expert index: only strictly larger keys replace the best
            uint32_t best_order = 0;
            int best_slot = 0;
            #pragma unroll
            for (int i = 0; i < kSlots; ++i) {
                const bool better = order[t][i] > best_order;
                best_order = better ? order[t][i] : best_order;
                best_slot = better ? i : best_slot;
            }
            const uint32_t warp_best = __reduce_max_sync(kFullWarpMask, best_order);
            const int best_expert =
                __reduce_min_sync(kFullWarpMask, best_order == warp_best ? lane + 32 * best_slot : kNoExpert);
            const int cleared_slot =
                lane == static_cast<int>(static_cast<uint32_t>(best_expert) % 32) ? best_slot : -1;
            #pragma unroll
            for (int i = 0; i < kSlots; ++i)
                order[t][i] = i == cleared_slot ? 0u : order[t][i];
            chosen_expert[t] = static_cast<uint32_t>(lane) == round ? best_expert : chosen_expert[t];
        }
    }
}

// Each token's weight of lane j's expert: its score (fetched from the lane holding it), renormalized by the chosen
// scores' sum in round order when asked, times the scaling factor.
template <int kSlots, int kTokens>
DK_DEVICE void warp_chosen_weights(uint32_t top_k, uint32_t renormalize, float scaling_factor,
                                   const float (&score)[kTokens][kSlots], const int (&chosen_expert)[kTokens],
                                   GateChoice (&choices)[kTokens]) {
    #pragma unroll
    for (int t = 0; t < kTokens; ++t) {
        const uint32_t owner_lane = static_cast<uint32_t>(chosen_expert[t]) % 32;
        const int owner_slot = static_cast<int>(static_cast<uint32_t>(chosen_expert[t]) / 32);
        float chosen_score = 0.0f;
        #pragma unroll
        for (int i = 0; i < kSlots; ++i) {
            const float slot_score = __shfl_sync(kFullWarpMask, score[t][i], owner_lane);
            chosen_score = owner_slot == i ? slot_score : chosen_score;
        }
        float score_sum = 0.0f;
        for (uint32_t j = 0; j < top_k; ++j)
            score_sum = __fadd_rn(score_sum, __shfl_sync(kFullWarpMask, chosen_score, j));
        // NOTE: dividing on every lane, outside any branch, keeps predicates from living across the division's
        // slow-path call (which would spill them to a stack frame).
        const float renormalized = __fdiv_rn(chosen_score, __fadd_rn(score_sum, kRenormalizeEpsilon));
        choices[t] = {__fmul_rn(renormalize ? renormalized : chosen_score, scaling_factor), chosen_expert[t]};
    }
}

// The whole gate of kTokens tokens by one warp (every lane takes part; the caller stores lanes < k of each). The
// tokens' computations are independent and interleaved, so that one token's warp-wide reductions wait while the
// other's run: a warp gating several tokens keeps the same latency as a warp gating one.
template <typename InT, int NUM_EXPERTS, int NUM_GROUPS, GateScoring kScoring, int kTokens>
DK_DEVICE void warp_topk_gates(const InT* const (&rows)[kTokens], const float* bias, uint32_t top_k,
                               uint32_t topk_groups, uint32_t renormalize, float scaling_factor,
                               GateChoice (&choices)[kTokens]) {
    constexpr int kSlots = GateSlots<NUM_EXPERTS, NUM_GROUPS>::kSlots;
    const int lane = static_cast<int>(threadIdx.x % 32);
    float score[kTokens][kSlots];
    uint32_t order[kTokens][kSlots];
    warp_selection_keys<InT, NUM_EXPERTS, NUM_GROUPS, kScoring, kTokens>(rows, bias, lane, score, order);
    if constexpr (NUM_GROUPS > 0)
        warp_limit_groups<NUM_EXPERTS, NUM_GROUPS, kTokens>(lane, topk_groups, order);
    int chosen_expert[kTokens];
    warp_argmax_rounds<kSlots, kTokens>(lane, top_k, order, chosen_expert);
    warp_chosen_weights<kSlots, kTokens>(top_k, renormalize, scaling_factor, score, chosen_expert, choices);
}

// The whole gate of one token by one warp (every lane takes part; the caller stores lanes < k).
template <typename InT, int NUM_EXPERTS, int NUM_GROUPS, GateScoring kScoring>
DK_DEVICE GateChoice warp_topk_gate(const InT* row, const float* bias, uint32_t top_k, uint32_t topk_groups,
                                    uint32_t renormalize, float scaling_factor) {
    const InT* const rows[1] = {row};
    GateChoice choices[1];
    warp_topk_gates<InT, NUM_EXPERTS, NUM_GROUPS, kScoring, 1>(rows, bias, top_k, topk_groups, renormalize,
                                                                 scaling_factor, choices);
    return choices[0];
}

template <typename InT, int NUM_EXPERTS, int NUM_GROUPS, GateScoring kScoring, int kNumWarps>
__global__ void __launch_bounds__(kNumWarps * 32)
smxx_topk_gate_impl(const InT* __restrict__ logits, const float* __restrict__ bias, float* __restrict__ weights,
                    int* __restrict__ indices, uint32_t num_tokens, uint32_t logits_row_stride, uint32_t top_k,
                    uint32_t topk_groups, uint32_t renormalize, float scaling_factor) {
    const uint32_t token = blockIdx.x * kNumWarps + threadIdx.x / 32;
    if (token >= num_tokens)
        return;
    const GateChoice choice = warp_topk_gate<InT, NUM_EXPERTS, NUM_GROUPS, kScoring>(
        logits + static_cast<uint64_t>(token) * logits_row_stride, bias, top_k, topk_groups, renormalize,
        scaling_factor);
    const uint32_t lane = threadIdx.x % 32;
    if (lane < top_k) {
        const uint64_t offset = static_cast<uint64_t>(token) * top_k + lane;
        weights[offset] = choice.weight;
        indices[offset] = choice.expert;
    }
}

}  // namespace deep_kernels
