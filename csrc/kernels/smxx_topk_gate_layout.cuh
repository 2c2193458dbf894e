// Top-k gating and the contiguous (and optionally masked) MoE layout of its indices in one launch, for
// few tokens (the host bounds T * k): the outputs of smxx_topk_gate and of smxx_moe_count +
// smxx_moe_layout, bit for bit.
//   every block: fills its share of the worst-case-sized m_indices, row_to_slot and masked_slots with -1,
//     then warp w gates token blockIdx.x * kNumWarps + w (if any)
//   the last block to arrive (an atomic ticket, reset by that block so that graph replays start at 0)
//     ranks all T * k slots as one chunk (smxx_moe_slots.cuh) and writes the routed rows over the fill
// Positions come from counts and scans only: the ticket picks which block works, never where a slot goes.
// NOTE: one ticket serves one stream at a time (the host keeps one per stream).
#pragma once

#include <cstdint>

#include "common/macros.cuh"
#include "kernels/smxx_moe_slots.cuh"
#include "kernels/smxx_topk_gate.cuh"

namespace deep_kernels {

template <typename InT, int NUM_EXPERTS, int NUM_GROUPS, GateScoring kScoring, int kNumWarps, int kAlignment>
__global__ void __launch_bounds__(kNumWarps * 32)
smxx_topk_gate_layout_impl(const InT* __restrict__ logits, const float* __restrict__ bias, float* __restrict__ weights,
                           int* indices, int* __restrict__ counts, int* __restrict__ num_rows,
                           int* __restrict__ m_indices, int* __restrict__ row_to_slot, int* __restrict__ slot_to_row,
                           int* __restrict__ masked_slots, int* __restrict__ masked_m, uint32_t* __restrict__ ticket,
                           uint32_t num_tokens, uint32_t logits_row_stride, uint32_t top_k, uint32_t topk_groups,
                           uint32_t renormalize, float scaling_factor, uint32_t max_rows, uint32_t max_tokens) {
    // Shared memory
    constexpr int kNumThreads = kNumWarps * 32;
    __shared__ int smem_total[kMaxMoeExperts];
    __shared__ int smem_offset[kMaxMoeExperts + 1];
    __shared__ int smem_warp_base[kNumWarps][kMaxMoeExperts];
    __shared__ bool smem_is_last;
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    // The block's share of the -1 fill: stores issued first complete while the gate computes, so the
    // fence before the ticket finds them done
    fill_layout_padding<kNumThreads>(m_indices, row_to_slot, masked_slots, max_rows, NUM_EXPERTS * max_tokens,
                                     blockIdx.x, gridDim.x);

    // Gate: one token per warp
    // NOTE: warps past the last token gate it again and store nothing: a branch around the gate would make
    // the compiler give its warp-wide reductions a divergent fallback that spills to a stack frame.
    const uint32_t token = blockIdx.x * kNumWarps + warp;
    const uint32_t gated_token = min(token, num_tokens - 1);
    const GateChoice choice = warp_topk_gate<InT, NUM_EXPERTS, NUM_GROUPS, kScoring>(
        logits + static_cast<uint64_t>(gated_token) * logits_row_stride, bias, top_k, topk_groups, renormalize,
        scaling_factor);
    if (token < num_tokens && lane < top_k) {
        const uint64_t offset = static_cast<uint64_t>(token) * top_k + lane;
        weights[offset] = choice.weight;
        indices[offset] = choice.expert;
    }

    // Ticket: the last block sees every block's indices and fill
    // NOTE: every thread fences its own writes before the barrier; thread 0's atomic then publishes them all.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        smem_is_last = atomicAdd(ticket, 1u) == gridDim.x - 1;
        if (smem_is_last)
            *ticket = 0;
        __threadfence();
    }
    __syncthreads();
    if (!smem_is_last)
        return;

    // Layout of all slots as one chunk: warp w ranks a contiguous run of whole tiles
    const uint32_t num_slots = num_tokens * top_k;
    const uint32_t tiles_per_warp = ceil_div(ceil_div(num_slots, 32u), static_cast<uint32_t>(kNumWarps));
    const uint32_t first_slot = warp * tiles_per_warp * 32;
    int first_batch[kTileBatch];
    load_tile_batch(indices, first_slot, 0, tiles_per_warp, num_slots, NUM_EXPERTS, first_batch);
    for (uint32_t e = lane; e < NUM_EXPERTS; e += 32)
        smem_warp_base[warp][e] = 0;
    __syncwarp();
    warp_count_slots(indices, first_slot, tiles_per_warp, num_slots, NUM_EXPERTS, first_batch, smem_warp_base[warp]);
    __syncthreads();
    for (uint32_t e = threadIdx.x; e < kMaxMoeExperts; e += kNumThreads)
        smem_total[e] = e < NUM_EXPERTS ? scan_warp_counts<kNumWarps>(smem_warp_base, e, 0) : 0;
    __syncthreads();
    if (warp == 0)
        warp_segment_offsets<kAlignment>(smem_total, smem_offset);
    __syncthreads();
    write_expert_counts<kNumThreads>(smem_total, smem_offset, counts, num_rows, masked_m, NUM_EXPERTS, max_tokens);
    warp_scatter_slots(indices, first_slot, tiles_per_warp, num_slots, NUM_EXPERTS, first_batch, smem_warp_base[warp],
                       smem_offset, m_indices, row_to_slot, slot_to_row, masked_slots, max_tokens);
}

}  // namespace deep_kernels
