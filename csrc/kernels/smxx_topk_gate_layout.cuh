// Top-k gating and the contiguous (and optionally masked) MoE layout of its indices in one cooperative
// launch, for few tokens (the host bounds T * k): the outputs of smxx_topk_gate and of smxx_moe_count +
// smxx_moe_layout, bit for bit.
//   every block: fills its share of the worst-case-sized m_indices, row_to_slot and masked_slots with -1,
//     gates its tokens (warp w: tokens w, w + kNumWarps, ... of the block's tokens_per_warp * kNumWarps),
//     keeps their experts in shared memory and counts them per expert (warp w: the block's slots
//     [32 w, 32 w + 32), one tile) into block_counts [token blocks, E] (the blocks past the tokens only fill)
//   a grid barrier (co-residency is the cooperative launch's guarantee)
//   every block: sums block_counts into each expert's total and its count in earlier blocks, scans the
//     totals into segment offsets, and writes the rows of its own slots over the fill (block 0 also the
//     per-expert counts)
// Blocks hold consecutive tokens, so a slot's rank = (its expert's slots in earlier blocks) + (in earlier
// warps of its block) + (in earlier lanes of its tile): positions come from counts and scans only.
// Unsupported: more than kNumWarps * 32 slots per block (the host checks tokens_per_warp * k <= 32).
// NOTE: the barrier counter serves one stream at a time (the host keeps one per stream); each launch
// flips its bit 31 and leaves the lower bits at zero.
#pragma once

#include <cstdint>

#include "common/macros.cuh"
#include "kernels/smxx_moe_slots.cuh"
#include "kernels/smxx_topk_gate.cuh"
#include "ptx/global_memory.cuh"

namespace deep_kernels {

// Every block of the grid arrives, then waits until all have: block 0 adds 2^31 - (gridDim.x - 1) and the
// others 1, so bit 31 flips exactly when the last one arrives. The CTA's writes before the call are
// visible to every CTA's reads after it.
DK_DEVICE void grid_barrier_sync(uint32_t* counter) {
    constexpr uint32_t kFlipBit = 0x80000000u;
    // NOTE: every thread fences its own writes at gpu scope before the barrier; thread 0's release add then
    // publishes them all, and its acquire load plus the second barrier order every thread's later loads.
    ptx::fence_acq_rel_gpu();
    __syncthreads();
    if (threadIdx.x == 0) {
        const uint32_t arrival = blockIdx.x == 0 ? kFlipBit - (gridDim.x - 1) : 1u;
        const uint32_t before = ptx::atomic_add_acq_rel_gpu(counter, arrival);
        while (((ptx::load_acquire_gpu(counter) ^ before) & kFlipBit) == 0)
            ;
    }
    __syncthreads();
}

template <typename InT, int NUM_EXPERTS, int NUM_GROUPS, GateScoring kScoring, int kNumWarps, int kAlignment>
__global__ void __launch_bounds__(kNumWarps * 32, 1)
smxx_topk_gate_layout_impl(const InT* __restrict__ logits, const float* __restrict__ bias, float* __restrict__ weights,
                           int* __restrict__ indices, int* __restrict__ counts, int* __restrict__ num_rows,
                           int* __restrict__ m_indices, int* __restrict__ row_to_slot, int* __restrict__ slot_to_row,
                           int* __restrict__ masked_slots, int* __restrict__ masked_m, int* block_counts,
                           uint32_t* __restrict__ barrier, uint32_t num_tokens, uint32_t tokens_per_warp,
                           uint32_t logits_row_stride, uint32_t top_k, uint32_t topk_groups, uint32_t renormalize,
                           float scaling_factor, uint32_t max_rows, uint32_t max_tokens) {
    // Shared memory
    constexpr int kNumThreads = kNumWarps * 32;
    constexpr int kCountBatch = 32;
    DK_STATIC_ASSERT(NUM_EXPERTS <= kMaxMoeExperts, "per-expert tables hold kMaxMoeExperts");
    __shared__ int smem_experts[kNumThreads];
    __shared__ int smem_warp_base[kNumWarps][kMaxMoeExperts];
    __shared__ int smem_earlier_blocks[NUM_EXPERTS];
    __shared__ __align__(16) int smem_total[kMaxMoeExperts];
    __shared__ __align__(16) int smem_offset[kMaxMoeExperts + 1];
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    // NOTE: the counter's line is in L2 by the time the grid barrier's atomic takes it (after an L2 flush
    // the atomic would otherwise wait for a DRAM read on the critical path).
    if (threadIdx.x == 0)
        ptx::prefetch_l2(barrier);
    // The warp's first token row (lanes 0-15) and the bias (lanes 16-31) head for L2 before the fill's stores
    // are issued, so the gate's first loads find them on the way: 10.1 -> 8.5 us at T = 128 after an L2 flush
    // (the gate's scores had waited 3 us for their loads).
    const uint32_t tokens_per_block = tokens_per_warp * kNumWarps;
    const uint32_t first_token = blockIdx.x * tokens_per_block;
    {
        constexpr uint32_t kLineBytes = 128, kPrefetchLanes = 16;
        const auto* row = reinterpret_cast<const uint8_t*>(
            logits + static_cast<uint64_t>(min(first_token + warp, num_tokens - 1)) * logits_row_stride);
        // One more line than the row holds covers a row that does not start on a line.
        if (lane <= NUM_EXPERTS * sizeof(InT) / kLineBytes && lane < kPrefetchLanes)
            ptx::prefetch_l2(row + lane * kLineBytes);
        const uint32_t bias_line = lane - kPrefetchLanes;
        if (bias != nullptr && lane >= kPrefetchLanes && bias_line <= NUM_EXPERTS * sizeof(float) / kLineBytes)
            ptx::prefetch_l2(reinterpret_cast<const uint8_t*>(bias) + bias_line * kLineBytes);
    }

    // The block's share of the -1 fill: stores issued first complete while the gate computes, so the
    // fence before the grid barrier finds them done
    fill_layout_padding<kNumThreads>(m_indices, row_to_slot, masked_slots, max_rows, NUM_EXPERTS * max_tokens,
                                     blockIdx.x, gridDim.x);
    for (uint32_t e = lane; e < NUM_EXPERTS; e += 32)
        smem_warp_base[warp][e] = 0;

    // Gate: one token per warp at a time
    // NOTE: warps past the last token gate it again and store nothing: a branch around the gate would make
    // the compiler give its warp-wide reductions a divergent fallback that spills to a stack frame.
    for (uint32_t i = 0; i < tokens_per_warp; ++i) {
        const uint32_t token_in_block = i * kNumWarps + warp;
        const uint32_t token = first_token + token_in_block;
        const GateChoice choice = warp_topk_gate<InT, NUM_EXPERTS, NUM_GROUPS, kScoring>(
            logits + static_cast<uint64_t>(min(token, num_tokens - 1)) * logits_row_stride, bias, top_k,
            topk_groups, renormalize, scaling_factor);
        if (token < num_tokens && lane < top_k) {
            const uint64_t offset = static_cast<uint64_t>(token) * top_k + lane;
            weights[offset] = choice.weight;
            indices[offset] = choice.expert;
            smem_experts[token_in_block * top_k + lane] = choice.expert;
        }
    }
    __syncthreads();

    // Count the block's slots: warp w's tile, then per expert an exclusive scan over the warps
    const uint32_t block_tokens = first_token < num_tokens ? min(tokens_per_block, num_tokens - first_token) : 0;
    const uint32_t block_slot = warp * 32 + lane;
    const int expert = block_slot < block_tokens * top_k ? smem_experts[block_slot] : -1;
    const uint32_t peers = __match_any_sync(kFullWarpMask, expert);
    const int rank_in_tile = __popc(peers & ((1u << lane) - 1u));
    if (expert >= 0 && rank_in_tile == 0)
        smem_warp_base[warp][expert] = __popc(peers);
    __syncthreads();
    // Only the blocks holding tokens count (the others, launched for the fill, have no slots).
    const uint32_t token_blocks = (num_tokens + tokens_per_block - 1) / tokens_per_block;
    if (blockIdx.x < token_blocks) {
        for (uint32_t e = threadIdx.x; e < NUM_EXPERTS; e += kNumThreads)
            block_counts[blockIdx.x * NUM_EXPERTS + e] = scan_warp_counts<kNumWarps>(smem_warp_base, e, 0);
    }

    grid_barrier_sync(barrier);

    // Per expert: the total and the slots of earlier blocks (kCountBatch L2 loads in flight: one round trip
    // up to 32 token blocks, T <= 256 at 8 warps; .cg, since other blocks wrote them during this launch)
    for (uint32_t e = threadIdx.x; e < kMaxMoeExperts; e += kNumThreads) {
        int total = 0, earlier = 0;
        for (uint32_t first = 0; e < NUM_EXPERTS && first < token_blocks; first += kCountBatch) {
            int count[kCountBatch];
            #pragma unroll
            for (int b = 0; b < kCountBatch; ++b)
                count[b] = first + b < token_blocks ? __ldcg(block_counts + (first + b) * NUM_EXPERTS + e) : 0;
            #pragma unroll
            for (int b = 0; b < kCountBatch; ++b) {
                total += count[b];
                earlier += first + b < blockIdx.x ? count[b] : 0;
            }
        }
        smem_total[e] = total;
        if (e < NUM_EXPERTS)
            smem_earlier_blocks[e] = earlier;
    }
    __syncthreads();
    if (warp == 0)
        warp_segment_offsets<kAlignment>(smem_total, smem_offset);
    __syncthreads();
    if (blockIdx.x == 0)
        write_expert_counts<kNumThreads>(smem_total, smem_offset, counts, num_rows, masked_m, NUM_EXPERTS, max_tokens);

    // The rows of the block's slots (the gate routes every slot: none is dropped)
    if (expert >= 0) {
        const int slot = static_cast<int>(first_token * top_k + block_slot);
        const int rank = smem_earlier_blocks[expert] + smem_warp_base[warp][expert] + rank_in_tile;
        const int row = smem_offset[expert] + rank;
        slot_to_row[slot] = row;
        row_to_slot[row] = slot;
        m_indices[row] = expert;
        if (masked_slots != nullptr && static_cast<uint32_t>(rank) < max_tokens)
            masked_slots[static_cast<uint64_t>(expert) * max_tokens + rank] = slot;
    }
}

}  // namespace deep_kernels
