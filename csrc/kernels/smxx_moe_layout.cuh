// MoE layout in one cooperative launch: from topk_idx [T, k] (slot s = t * k + j; int32 or int64):
//   counts [E]; num_rows [1] = the sum of the counts each rounded up to kAlignment
//   contiguous layout of max_rows rows: expert e's segment starts at the sum of the rounded counts of
//     experts < e and lists its slots in ascending order; m_indices[row] = e and row_to_slot[row] = s (-1 on
//     every other row); slot_to_row [T, k] (-1 for dropped slots: any index outside [0, E))
//   masked layout (optional): masked_slots [E, max_tokens] = expert e's first max_tokens slots in
//     ascending order, then -1; masked_m [E] = min(counts, max_tokens)
// Block b < num_rank_blocks owns slots [b * slots_per_block, ...) in chunks of kNumWarps * 32 *
// kSlotsPerThread; every block (the grid may be larger, for the fill) fills its share of the -1 rows.
//   before the grid barrier: load the chunk, count it per warp and per expert, publish the block's counts
//     in block_counts [num_rank_blocks, 4 * ceil(E / 4)]
//   after it: each expert's total and slots in earlier blocks, the segment offsets, then each slot's row
// A block with one chunk keeps its slots and warp counts across the barrier; with several (more slots than
// the SMs' chunks) it loads and counts each chunk again. Positions come from counts and scans only.
// NOTE: the barrier counter serves one stream at a time (the host keeps one per stream).
#pragma once

#include <cstdint>

#include "common/grid_barrier.cuh"
#include "common/macros.cuh"
#include "kernels/smxx_moe_slots.cuh"

namespace deep_kernels {

template <typename IndexT, int kSlotsPerThread, int kAlignment, int kNumWarps>
__global__ void __launch_bounds__(kNumWarps * 32, 1)
smxx_moe_layout_impl(const IndexT* __restrict__ topk_idx, int* __restrict__ counts, int* __restrict__ num_rows,
                     int* __restrict__ m_indices, int* __restrict__ row_to_slot, int* __restrict__ slot_to_row,
                     int* __restrict__ masked_slots, int* __restrict__ masked_m, int* block_counts,
                     uint32_t* __restrict__ barrier, uint32_t num_slots, uint32_t num_experts, uint32_t slots_per_block,
                     uint32_t num_rank_blocks, uint32_t max_rows, uint32_t max_tokens) {
    // Static checks and shared memory
    constexpr int kNumThreads = kNumWarps * 32;
    constexpr int CHUNK_SLOTS = kNumThreads * kSlotsPerThread;
    DK_STATIC_ASSERT(CHUNK_SLOTS <= 65535, "a warp's rank within a chunk fits in 16 bits");
    DK_STATIC_ASSERT(kNumThreads * 4 >= kMaxMoeExperts, "sum_block_counts: a group of threads spans a row");
    __shared__ uint16_t smem_warp_base[kNumWarps][kMaxMoeExperts];
    __shared__ __align__(16) int smem_partial[2 * 4 * kNumThreads];
    __shared__ __align__(16) int smem_total[kMaxMoeExperts];
    __shared__ __align__(16) int smem_offset[kMaxMoeExperts + 1];
    __shared__ int smem_earlier[kMaxMoeExperts];
    __shared__ int smem_chunk_count[kMaxMoeExperts];
    const uint32_t warp = threadIdx.x / 32;

    // NOTE: the counter's line is in L2 by the time the grid barrier's atomic takes it.
    if (threadIdx.x == 0)
        ptx::prefetch_l2(barrier);

    // The first chunk's loads are in flight while the block fills its share of the -1 rows
    const bool ranks = blockIdx.x < num_rank_blocks;
    const uint32_t first_slot = blockIdx.x * slots_per_block;
    const uint32_t slot_end = ranks ? min(first_slot + slots_per_block, num_slots) : first_slot;
    const uint32_t num_chunks = ranks ? (slot_end - first_slot + CHUNK_SLOTS - 1) / CHUNK_SLOTS : 0;
    int experts[kSlotsPerThread];
    load_chunk_experts<IndexT, kSlotsPerThread>(topk_idx, first_slot, slot_end, num_experts, experts);
    fill_layout_padding<kNumThreads>(m_indices, row_to_slot, masked_slots, max_rows, num_experts * max_tokens,
                                     blockIdx.x, gridDim.x);
    if (!ranks) {
        grid_barrier_arrive(barrier);
        return;
    }
    for (uint32_t e = threadIdx.x % 32; e < num_experts; e += 32)
        smem_warp_base[warp][e] = 0;
    for (uint32_t e = threadIdx.x; e < num_experts; e += kNumThreads)
        smem_chunk_count[e] = 0;
    __syncthreads();

    // The block's count per expert, chunk by chunk
    const bool one_chunk = num_chunks == 1;
    for (uint32_t chunk = 0; chunk < num_chunks; ++chunk) {
        if (chunk > 0)
            load_chunk_experts<IndexT, kSlotsPerThread>(topk_idx, first_slot + chunk * CHUNK_SLOTS, slot_end,
                                                        num_experts, experts);
        warp_count_tiles(experts, smem_warp_base[warp]);
        __syncthreads();
        for (uint32_t e = threadIdx.x; e < num_experts; e += kNumThreads)
            smem_chunk_count[e] += scan_warp_counts<kNumWarps>(smem_warp_base, e, one_chunk);
        __syncthreads();
    }
    const uint32_t row_stride = (num_experts + 3) / 4 * 4;
    for (uint32_t e = threadIdx.x; e < row_stride; e += kNumThreads)
        block_counts[blockIdx.x * row_stride + e] = e < num_experts ? smem_chunk_count[e] : 0;

    grid_barrier_sync(barrier);

    // Per expert: the total and the slots of earlier blocks; the segment offsets
    sum_block_counts<kNumThreads>(block_counts, num_rank_blocks, blockIdx.x, num_experts, smem_partial, smem_total,
                                  smem_earlier);
    __syncthreads();
    if (warp == 0)
        warp_segment_offsets<kAlignment>(smem_total, smem_offset);
    __syncthreads();
    if (blockIdx.x == 0)
        write_expert_counts<kNumThreads>(smem_total, smem_offset, counts, num_rows, masked_m, num_experts, max_tokens);

    // The rows of the block's slots, chunk by chunk (smem_earlier advances past each chunk)
    const auto slot_of = [](uint32_t position) { return position; };
    for (uint32_t chunk = 0; chunk < num_chunks; ++chunk) {
        const uint32_t chunk_first = first_slot + chunk * CHUNK_SLOTS;
        if (!one_chunk) {
            load_chunk_experts<IndexT, kSlotsPerThread>(topk_idx, chunk_first, slot_end, num_experts, experts);
            warp_count_tiles(experts, smem_warp_base[warp]);
            __syncthreads();
            for (uint32_t e = threadIdx.x; e < num_experts; e += kNumThreads)
                smem_chunk_count[e] = scan_warp_counts<kNumWarps>(smem_warp_base, e, true);
            __syncthreads();
        }
        warp_scatter_tiles(experts, chunk_first, slot_end, slot_of, smem_warp_base[warp], smem_earlier, smem_offset,
                           m_indices, row_to_slot, slot_to_row, masked_slots, max_tokens);
        if (!one_chunk) {
            __syncthreads();
            for (uint32_t e = threadIdx.x; e < num_experts; e += kNumThreads) {
                smem_earlier[e] += smem_chunk_count[e];
                for (int w = 0; w < kNumWarps; ++w)
                    smem_warp_base[w][e] = 0;
            }
            __syncthreads();
        }
    }
}

}  // namespace deep_kernels
