// What the MoE layout kernels share: the expert limit and how a top-k slot names its expert.
#pragma once

#include <cstdint>

#include "common/macros.cuh"

namespace deep_kernels {

// Per-expert tables live in shared memory; deep_kernels.moe.MAX_EXPERTS mirrors it.
constexpr int kMaxMoeExperts = 512;

// The expert of a slot, or -1 when it is dropped: -1 and every other index outside [0, E).
template <typename IndexT>
DK_DEVICE int expert_of_slot(IndexT index, uint32_t num_experts) {
    return index >= 0 && static_cast<uint64_t>(index) < num_experts ? static_cast<int>(index) : -1;
}

}  // namespace deep_kernels
