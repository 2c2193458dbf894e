// MoE layout, pass 1 of 2: per-chunk expert counts, and the -1 fill of the worst-case-sized outputs.
// topk_idx [T, k] (int32 or int64, contiguous) is cut into chunks of CHUNK_SLOTS slots; block b < num_chunks
// writes chunk_counts[b, e] = the number of slots of chunk b routed to expert e (dropped slots, any index
// outside [0, E), count nowhere). Shared-memory integer atomics make the counts exact whatever their
// order; no position depends on them. Every block (the grid may exceed num_chunks) fills its share of
// m_indices and row_to_slot [max_rows] and masked_slots [num_masked] with -1; pass 2 then writes only the
// rows and positions of routed slots.
#pragma once

#include <cstdint>

#include "common/macros.cuh"
#include "kernels/smxx_moe_slots.cuh"

namespace deep_kernels {

template <typename IndexT, int CHUNK_SLOTS, int kNumThreads>
__global__ void __launch_bounds__(kNumThreads)
smxx_moe_count_impl(const IndexT* __restrict__ topk_idx, int* __restrict__ chunk_counts, int* __restrict__ m_indices,
                    int* __restrict__ row_to_slot, int* __restrict__ masked_slots, uint32_t num_slots,
                    uint32_t num_experts, uint32_t num_chunks, uint32_t max_rows, uint32_t num_masked) {
    fill_layout_padding<kNumThreads>(m_indices, row_to_slot, masked_slots, max_rows, num_masked, blockIdx.x,
                                     gridDim.x);
    if (blockIdx.x >= num_chunks)
        return;

    __shared__ int smem_counts[kMaxMoeExperts];
    for (uint32_t e = threadIdx.x; e < num_experts; e += kNumThreads)
        smem_counts[e] = 0;
    __syncthreads();

    // Every load of the thread first, then the counting
    constexpr int kSlotsPerThread = CHUNK_SLOTS / kNumThreads;
    DK_STATIC_ASSERT(CHUNK_SLOTS % kNumThreads == 0, "every thread counts the same number of slots");
    int experts[kSlotsPerThread];
    #pragma unroll
    for (int i = 0; i < kSlotsPerThread; ++i) {
        const uint32_t slot = blockIdx.x * CHUNK_SLOTS + i * kNumThreads + threadIdx.x;
        experts[i] = slot < num_slots ? expert_of_slot(topk_idx[slot], num_experts) : -1;
    }
    #pragma unroll
    for (int i = 0; i < kSlotsPerThread; ++i)
        if (experts[i] >= 0)
            atomicAdd(&smem_counts[experts[i]], 1);
    __syncthreads();

    for (uint32_t e = threadIdx.x; e < num_experts; e += kNumThreads)
        chunk_counts[static_cast<uint64_t>(blockIdx.x) * num_experts + e] = smem_counts[e];
}

}  // namespace deep_kernels
