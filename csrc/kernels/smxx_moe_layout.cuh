// MoE layout, pass 2 of 2: from topk_idx [T, k] (slot s = t * k + j) and pass 1's chunk_counts [B, E]:
//   counts [E]; num_rows [1] = the sum of the counts each rounded up to kAlignment
//   contiguous layout of max_rows rows: expert e's segment starts at the sum of the rounded counts of
//     experts < e and lists its slots in ascending order; m_indices[row] = e and row_to_slot[row] = s;
//     slot_to_row [T, k] (-1 for dropped slots)
//   masked layout (optional): masked_slots [E, max_tokens] = expert e's first max_tokens slots in
//     ascending order; masked_m [E] = min(counts, max_tokens)
// Pass 1 already wrote -1 everywhere in m_indices, row_to_slot and masked_slots; this pass writes the
// routed slots only. Block b ranks chunk b's slots: rank = (slots of e in earlier chunks, from
// chunk_counts) + (in earlier warps of the chunk) + (in earlier lanes, from __match_any_sync). No atomics.
#pragma once

#include <cstdint>

#include "common/macros.cuh"
#include "kernels/smxx_moe_slots.cuh"

namespace deep_kernels {

template <typename IndexT, int CHUNK_SLOTS, int kAlignment, int kNumWarps>
__global__ void __launch_bounds__(kNumWarps * 32)
smxx_moe_layout_impl(const IndexT* __restrict__ topk_idx, const int* __restrict__ chunk_counts, int* __restrict__ counts,
                     int* __restrict__ num_rows, int* __restrict__ m_indices, int* __restrict__ row_to_slot,
                     int* __restrict__ slot_to_row, int* __restrict__ masked_slots, int* __restrict__ masked_m,
                     uint32_t num_slots, uint32_t num_experts, uint32_t num_chunks, uint32_t max_tokens) {
    // Static checks and shared memory
    constexpr int kNumThreads = kNumWarps * 32;
    constexpr int kSlotsPerWarp = CHUNK_SLOTS / kNumWarps;
    constexpr int kChunkBatch = 16;
    DK_STATIC_ASSERT(CHUNK_SLOTS % (kNumWarps * 32) == 0, "every warp ranks whole tiles of 32 slots");
    __shared__ __align__(16) int smem_total[kMaxMoeExperts];
    __shared__ int smem_earlier_chunks[kMaxMoeExperts];
    __shared__ __align__(16) int smem_offset[kMaxMoeExperts + 1];
    __shared__ int smem_warp_base[kNumWarps][kMaxMoeExperts];
    const uint32_t warp = threadIdx.x / 32;

    // The warp's first tiles of the chunk, loaded while the chunk counts are summed
    const uint32_t first_slot = blockIdx.x * CHUNK_SLOTS + warp * kSlotsPerWarp;
    int first_batch[kTileBatch];
    load_tile_batch(topk_idx, first_slot, 0, kSlotsPerWarp / 32, num_slots, num_experts, first_batch);

    // Per expert: the total count and the count in chunks before this block's (kChunkBatch loads in flight)
    for (uint32_t e = threadIdx.x; e < kMaxMoeExperts; e += kNumThreads) {
        int total = 0, earlier = 0;
        for (uint32_t chunk = 0; e < num_experts && chunk < num_chunks; chunk += kChunkBatch) {
            int count[kChunkBatch];
            #pragma unroll
            for (int b = 0; b < kChunkBatch; ++b)
                count[b] = chunk + b < num_chunks ? chunk_counts[(chunk + b) * static_cast<uint64_t>(num_experts) + e] : 0;
            #pragma unroll
            for (int b = 0; b < kChunkBatch; ++b) {
                total += count[b];
                earlier += chunk + b < blockIdx.x ? count[b] : 0;
            }
        }
        smem_total[e] = total;
        smem_earlier_chunks[e] = earlier;
    }
    for (uint32_t e = threadIdx.x % 32; e < num_experts; e += 32)
        smem_warp_base[warp][e] = 0;
    __syncthreads();

    // Segment offsets (warp 0); each warp counts its experts over its run of the chunk
    if (warp == 0)
        warp_segment_offsets<kAlignment>(smem_total, smem_offset);
    warp_count_slots(topk_idx, first_slot, kSlotsPerWarp / 32, num_slots, num_experts, first_batch,
                     smem_warp_base[warp]);
    __syncthreads();
    if (blockIdx.x == 0)
        write_expert_counts<kNumThreads>(smem_total, smem_offset, counts, num_rows, masked_m, num_experts, max_tokens);

    // Per expert: each warp's first rank (exclusive scan over warps, after the earlier chunks)
    for (uint32_t e = threadIdx.x; e < num_experts; e += kNumThreads)
        scan_warp_counts<kNumWarps>(smem_warp_base, e, smem_earlier_chunks[e]);
    __syncthreads();

    // Scatter
    warp_scatter_slots(topk_idx, first_slot, kSlotsPerWarp / 32, num_slots, num_experts, first_batch,
                       smem_warp_base[warp], smem_offset, m_indices, row_to_slot, slot_to_row, masked_slots,
                       max_tokens);
}

}  // namespace deep_kernels
