// MoE layout, pass 2 of 2: from topk_idx [T, k] (slot s = t * k + j) and pass 1's chunk_counts [B, E]:
//   counts [E]; num_rows [1] = the sum of the counts each rounded up to kAlignment
//   contiguous layout of max_rows rows: expert e's segment starts at the sum of the rounded counts of
//     experts < e and lists its slots in ascending order; m_indices[row] = e and row_to_slot[row] = s,
//     -1 in padding rows and rows from num_rows on; slot_to_row [T, k] (-1 for dropped slots)
//   masked layout (optional): masked_slots [E, max_tokens] = expert e's first max_tokens slots in
//     ascending order, -1 after them; masked_m [E] = min(counts, max_tokens)
// Block b ranks chunk b's slots: rank = (slots of e in earlier chunks, from chunk_counts) + (in earlier
// warps of the chunk, from per-warp counts) + (in earlier lanes, from __match_any_sync). No atomics.
// Then every block fills its share of the padding rows and unused masked positions.
#pragma once

#include <cstdint>

#include "common/macros.cuh"
#include "common/math.cuh"
#include "kernels/smxx_moe_slots.cuh"

namespace deep_kernels {

template <typename IndexT, int CHUNK_SLOTS, int kAlignment, int kNumWarps>
__global__ void __launch_bounds__(kNumWarps * 32)
smxx_moe_layout_impl(const IndexT* __restrict__ topk_idx, const int* __restrict__ chunk_counts, int* __restrict__ counts,
                     int* __restrict__ num_rows, int* __restrict__ m_indices, int* __restrict__ row_to_slot,
                     int* __restrict__ slot_to_row, int* __restrict__ masked_slots, int* __restrict__ masked_m,
                     uint32_t num_slots, uint32_t num_experts, uint32_t num_chunks, uint32_t max_rows,
                     uint32_t max_tokens) {
    // Static checks and shared memory
    constexpr int kNumThreads = kNumWarps * 32;
    constexpr int kSlotsPerWarp = CHUNK_SLOTS / kNumWarps;
    constexpr int kTiles = kSlotsPerWarp / 32;
    constexpr int kExpertsPerLane = kMaxMoeExperts / 32;
    DK_STATIC_ASSERT(CHUNK_SLOTS % (kNumWarps * 32) == 0, "every warp ranks whole tiles of 32 slots");
    __shared__ int smem_total[kMaxMoeExperts];
    __shared__ int smem_earlier_chunks[kMaxMoeExperts];
    __shared__ int smem_offset[kMaxMoeExperts + 1];
    __shared__ int smem_warp_base[kNumWarps][kMaxMoeExperts];
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const bool is_masked = masked_slots != nullptr;

    // Per expert: the total count and the count in chunks before this block's
    for (uint32_t e = threadIdx.x; e < kMaxMoeExperts; e += kNumThreads) {
        int total = 0, earlier = 0;
        for (uint32_t chunk = 0; e < num_experts && chunk < num_chunks; ++chunk) {
            const int count = chunk_counts[static_cast<uint64_t>(chunk) * num_experts + e];
            total += count;
            earlier += chunk < blockIdx.x ? count : 0;
        }
        smem_total[e] = total;
        smem_earlier_chunks[e] = earlier;
    }
    __syncthreads();

    // Segment offsets: an exclusive scan of the rounded counts by warp 0, kExpertsPerLane per lane
    if (warp == 0) {
        int lane_rows = 0;
        #pragma unroll
        for (int i = 0; i < kExpertsPerLane; ++i)
            lane_rows += align_up(smem_total[lane * kExpertsPerLane + i], kAlignment);
        int inclusive = lane_rows;
        #pragma unroll
        for (int offset = 1; offset < 32; offset *= 2) {
            const int other = __shfl_up_sync(0xffffffffu, inclusive, offset);
            inclusive += lane >= static_cast<uint32_t>(offset) ? other : 0;
        }
        int offset = inclusive - lane_rows;
        #pragma unroll
        for (int i = 0; i < kExpertsPerLane; ++i) {
            smem_offset[lane * kExpertsPerLane + i] = offset;
            offset += align_up(smem_total[lane * kExpertsPerLane + i], kAlignment);
        }
        if (lane == 31)
            smem_offset[kMaxMoeExperts] = offset;
    }
    __syncthreads();
    if (blockIdx.x == 0) {
        for (uint32_t e = threadIdx.x; e < num_experts; e += kNumThreads) {
            counts[e] = smem_total[e];
            if (is_masked)
                masked_m[e] = min(static_cast<uint32_t>(smem_total[e]), max_tokens);
        }
        if (threadIdx.x == 0)
            *num_rows = smem_offset[kMaxMoeExperts];
    }

    // Each warp counts its experts over its kTiles tiles of the chunk
    for (uint32_t e = lane; e < num_experts; e += 32)
        smem_warp_base[warp][e] = 0;
    __syncwarp();
    const uint32_t first_slot = blockIdx.x * CHUNK_SLOTS + warp * kSlotsPerWarp + lane;
    int expert[kTiles];
    uint32_t peers[kTiles];
    #pragma unroll
    for (int tile = 0; tile < kTiles; ++tile) {
        const uint32_t slot = first_slot + tile * 32;
        expert[tile] = slot < num_slots ? expert_of_slot(topk_idx[slot], num_experts) : -1;
        peers[tile] = __match_any_sync(0xffffffffu, expert[tile]);
        if (expert[tile] >= 0 && lane == static_cast<uint32_t>(__ffs(peers[tile]) - 1))
            smem_warp_base[warp][expert[tile]] += __popc(peers[tile]);
        __syncwarp();
    }
    __syncthreads();

    // Per expert: turn the per-warp counts into each warp's first rank (exclusive scan over warps)
    for (uint32_t e = threadIdx.x; e < num_experts; e += kNumThreads) {
        int base = smem_earlier_chunks[e];
        #pragma unroll
        for (int w = 0; w < kNumWarps; ++w) {
            const int count = smem_warp_base[w][e];
            smem_warp_base[w][e] = base;
            base += count;
        }
    }
    __syncthreads();

    // Scatter: rank = the warp's running base + earlier lanes with the same expert
    const uint32_t earlier_lanes = (1u << lane) - 1u;
    #pragma unroll
    for (int tile = 0; tile < kTiles; ++tile) {
        const uint32_t slot = first_slot + tile * 32;
        const int e = expert[tile];
        const int rank = e >= 0 ? smem_warp_base[warp][e] + __popc(peers[tile] & earlier_lanes) : 0;
        __syncwarp();
        if (e >= 0 && lane == static_cast<uint32_t>(__ffs(peers[tile]) - 1))
            smem_warp_base[warp][e] += __popc(peers[tile]);
        __syncwarp();
        if (slot >= num_slots)
            continue;
        if (e < 0) {
            slot_to_row[slot] = -1;
            continue;
        }
        const int row = smem_offset[e] + rank;
        slot_to_row[slot] = row;
        row_to_slot[row] = static_cast<int>(slot);
        m_indices[row] = e;
        if (is_masked && static_cast<uint32_t>(rank) < max_tokens)
            masked_slots[static_cast<uint64_t>(e) * max_tokens + rank] = static_cast<int>(slot);
    }

    // Padding: this block's share of the rows and masked positions no slot writes
    const uint32_t rows_per_block = ceil_div(max_rows, gridDim.x);
    const uint32_t rows_end = min(max_rows, (blockIdx.x + 1) * rows_per_block);
    const int total_rows = smem_offset[kMaxMoeExperts];
    for (uint32_t row = blockIdx.x * rows_per_block + threadIdx.x; row < rows_end; row += kNumThreads) {
        bool is_padding = static_cast<int>(row) >= total_rows;
        if (!is_padding) {
            // The segment holding the row: the last expert whose offset is <= row (empty ones share it).
            uint32_t low = 0, high = num_experts;
            while (high - low > 1) {
                const uint32_t middle = (low + high) / 2;
                if (smem_offset[middle] <= static_cast<int>(row))
                    low = middle;
                else
                    high = middle;
            }
            is_padding = static_cast<int>(row) - smem_offset[low] >= smem_total[low];
        }
        if (is_padding) {
            m_indices[row] = -1;
            row_to_slot[row] = -1;
        }
    }
    if (is_masked) {
        // NOTE: 32-bit positions (the host keeps E * max_tokens < 2^31): 64-bit division needs a stack frame.
        const uint32_t positions = num_experts * max_tokens;
        const uint32_t per_block = ceil_div(positions, gridDim.x);
        const uint32_t end = min(positions, (blockIdx.x + 1) * per_block);
        for (uint32_t position = blockIdx.x * per_block + threadIdx.x; position < end; position += kNumThreads)
            if (position % max_tokens >= static_cast<uint32_t>(smem_total[position / max_tokens]))
                masked_slots[position] = -1;
    }
}

}  // namespace deep_kernels
