// What the MoE layout kernels share: the expert limit, how a top-k slot names its expert, the -1 fill of
// the worst-case-sized outputs, and the block-level steps of ranking slots without atomics:
//   1. each warp counts the experts of its contiguous run of slots (__match_any_sync per 32-slot tile)
//   2. per expert, an exclusive scan of the warps' counts (plus the slots of earlier chunks) gives each
//      warp its first rank; warp 0 scans the aligned counts into segment offsets
//   3. each warp re-reads its slots: rank = its running base + earlier lanes of the tile with the expert
#pragma once

#include <cstdint>

#include "common/macros.cuh"
#include "common/math.cuh"

namespace deep_kernels {

// Per-expert tables live in shared memory; deep_kernels.moe.MAX_EXPERTS mirrors it.
constexpr int kMaxMoeExperts = 512;

// The expert of a slot, or -1 when it is dropped: -1 and every other index outside [0, E).
template <typename IndexT>
DK_DEVICE int expert_of_slot(IndexT index, uint32_t num_experts) {
    return index >= 0 && static_cast<uint64_t>(index) < num_experts ? static_cast<int>(index) : -1;
}

// The expert of slot `slot` (-1 past num_slots). NOTE: an L2 load (ld.global.cg): in the fused kernel other
// blocks wrote topk_idx during this launch, and L1 is not coherent with their writes.
template <typename IndexT>
DK_DEVICE int load_slot_expert(const IndexT* topk_idx, uint32_t slot, uint32_t num_slots, uint32_t num_experts) {
    if (slot >= num_slots)
        return -1;
    if constexpr (sizeof(IndexT) == 8)
        return expert_of_slot(__ldcg(reinterpret_cast<const long long*>(topk_idx) + slot), num_experts);
    else
        return expert_of_slot(__ldcg(reinterpret_cast<const int*>(topk_idx) + slot), num_experts);
}

// Part `part` of `num_parts` (one per block) of filling data [count] with -1: 16-byte stores, data 16-byte
// aligned (a fresh torch allocation), the last count % 4 elements by single stores.
template <int kNumThreads>
DK_DEVICE void fill_minus_one(int* data, uint32_t count, uint32_t part, uint32_t num_parts) {
    const uint32_t num_vectors = count / 4;
    const uint32_t first = part * kNumThreads + threadIdx.x;
    for (uint32_t v = first; v < num_vectors; v += num_parts * kNumThreads)
        reinterpret_cast<int4*>(data)[v] = make_int4(-1, -1, -1, -1);
    if (first < count % 4)
        data[num_vectors * 4 + first] = -1;
}

// The rows no slot writes in the contiguous and masked layouts, filled with -1 before any slot's row is
// written (the kernels order the two: a later launch, or the fused kernel's ticket).
template <int kNumThreads>
DK_DEVICE void fill_layout_padding(int* m_indices, int* row_to_slot, int* masked_slots, uint32_t max_rows,
                                   uint32_t num_masked, uint32_t part, uint32_t num_parts) {
    fill_minus_one<kNumThreads>(m_indices, max_rows, part, num_parts);
    fill_minus_one<kNumThreads>(row_to_slot, max_rows, part, num_parts);
    if (masked_slots != nullptr)
        fill_minus_one<kNumThreads>(masked_slots, num_masked, part, num_parts);
}

// Tiles of 32 slots whose loads a warp issues together before ranking them (L2 latency, not bandwidth,
// bounds the ranking of a few thousand slots).
constexpr int kTileBatch = 8;

// The experts of a warp's tiles [batch, batch + kTileBatch) of its run; -1 past the run or num_slots.
// Steps 1 and 3 take batch 0 from the caller, who loads it once for both.
template <typename IndexT>
DK_DEVICE void load_tile_batch(const IndexT* topk_idx, uint32_t first_slot, uint32_t batch, uint32_t num_tiles,
                               uint32_t num_slots, uint32_t num_experts, int (&experts)[kTileBatch]) {
    const uint32_t lane = threadIdx.x % 32;
    #pragma unroll
    for (int b = 0; b < kTileBatch; ++b) {
        const uint32_t slot = first_slot + (batch + b) * 32 + lane;
        experts[b] = batch + b < num_tiles ? load_slot_expert(topk_idx, slot, num_slots, num_experts) : -1;
    }
}

template <typename IndexT>
DK_DEVICE void next_tile_batch(const IndexT* topk_idx, uint32_t first_slot, uint32_t batch, uint32_t num_tiles,
                               uint32_t num_slots, uint32_t num_experts, const int (&first_batch)[kTileBatch],
                               int (&experts)[kTileBatch]) {
    if (batch == 0) {
        #pragma unroll
        for (int b = 0; b < kTileBatch; ++b)
            experts[b] = first_batch[b];
    } else {
        load_tile_batch(topk_idx, first_slot, batch, num_tiles, num_slots, num_experts, experts);
    }
}

// Step 1: the calling warp adds the experts of its slots [first_slot, first_slot + 32 * num_tiles) into
// warp_counts [E] (zeroed by the caller).
template <typename IndexT>
DK_DEVICE void warp_count_slots(const IndexT* topk_idx, uint32_t first_slot, uint32_t num_tiles, uint32_t num_slots,
                                uint32_t num_experts, const int (&first_batch)[kTileBatch], int* warp_counts) {
    const uint32_t lane = threadIdx.x % 32;
    for (uint32_t batch = 0; batch < num_tiles; batch += kTileBatch) {
        int experts[kTileBatch];
        next_tile_batch(topk_idx, first_slot, batch, num_tiles, num_slots, num_experts, first_batch, experts);
        #pragma unroll
        for (int b = 0; b < kTileBatch; ++b) {
            const uint32_t peers = __match_any_sync(0xffffffffu, experts[b]);
            if (experts[b] >= 0 && lane == static_cast<uint32_t>(__ffs(peers) - 1))
                warp_counts[experts[b]] += __popc(peers);
            __syncwarp();
        }
    }
}

// Step 2, per expert: warp_counts [kNumWarps][kMaxMoeExperts] become each warp's first rank (starting at
// `earlier`); returns the expert's count over the block's warps plus `earlier`.
template <int kNumWarps>
DK_DEVICE int scan_warp_counts(int (*warp_counts)[kMaxMoeExperts], uint32_t expert, int earlier) {
    int base = earlier;
    #pragma unroll
    for (int w = 0; w < kNumWarps; ++w) {
        const int count = warp_counts[w][expert];
        warp_counts[w][expert] = base;
        base += count;
    }
    return base;
}

// Step 2, by warp 0: segment offsets [kMaxMoeExperts + 1] = the exclusive scan of the totals [kMaxMoeExperts]
// (0 past E) each rounded up to kAlignment; offsets[kMaxMoeExperts] is the number of rows used. Both arrays
// 16-byte aligned.
// NOTE: lane l owns experts [16 l, 16 l + 16) and moves them as four 16-byte vectors: sixteen scalar
// accesses at a 64-byte lane stride would each be a 16-way bank conflict (the vectors are 4-way).
template <int kAlignment>
DK_DEVICE void warp_segment_offsets(const int* totals, int* offsets) {
    constexpr int kVectorsPerLane = kMaxMoeExperts / 32 / 4;
    const int lane = static_cast<int>(threadIdx.x % 32);
    int4 rows[kVectorsPerLane];
    int lane_rows = 0;
    #pragma unroll
    for (int v = 0; v < kVectorsPerLane; ++v) {
        const int4 total = reinterpret_cast<const int4*>(totals)[lane * kVectorsPerLane + v];
        rows[v] = make_int4(align_up(total.x, kAlignment), align_up(total.y, kAlignment),
                            align_up(total.z, kAlignment), align_up(total.w, kAlignment));
        lane_rows += rows[v].x + rows[v].y + rows[v].z + rows[v].w;
    }
    int inclusive = lane_rows;
    #pragma unroll
    for (int offset = 1; offset < 32; offset *= 2) {
        const int other = __shfl_up_sync(0xffffffffu, inclusive, offset);
        inclusive += lane >= offset ? other : 0;
    }
    int offset = inclusive - lane_rows;
    #pragma unroll
    for (int v = 0; v < kVectorsPerLane; ++v) {
        int4 segment;
        segment.x = offset;
        segment.y = segment.x + rows[v].x;
        segment.z = segment.y + rows[v].y;
        segment.w = segment.z + rows[v].z;
        offset = segment.w + rows[v].w;
        reinterpret_cast<int4*>(offsets)[lane * kVectorsPerLane + v] = segment;
    }
    if (lane == 31)
        offsets[kMaxMoeExperts] = offset;
}

// Step 3: the calling warp ranks and writes its slots (the same run as step 1); warp_base [E] holds its
// first rank per expert and advances.
template <typename IndexT>
DK_DEVICE void warp_scatter_slots(const IndexT* topk_idx, uint32_t first_slot, uint32_t num_tiles, uint32_t num_slots,
                                  uint32_t num_experts, const int (&first_batch)[kTileBatch], int* warp_base,
                                  const int* offsets, int* m_indices, int* row_to_slot, int* slot_to_row,
                                  int* masked_slots, uint32_t max_tokens) {
    const uint32_t lane = threadIdx.x % 32;
    const uint32_t earlier_lanes = (1u << lane) - 1u;
    for (uint32_t batch = 0; batch < num_tiles; batch += kTileBatch) {
        int experts[kTileBatch];
        next_tile_batch(topk_idx, first_slot, batch, num_tiles, num_slots, num_experts, first_batch, experts);
        #pragma unroll
        for (int b = 0; b < kTileBatch; ++b) {
            const int expert = experts[b];
            const uint32_t peers = __match_any_sync(0xffffffffu, expert);
            const int rank = expert >= 0 ? warp_base[expert] + __popc(peers & earlier_lanes) : 0;
            __syncwarp();
            if (expert >= 0 && lane == static_cast<uint32_t>(__ffs(peers) - 1))
                warp_base[expert] += __popc(peers);
            __syncwarp();
            const uint32_t slot = first_slot + (batch + b) * 32 + lane;
            if (batch + b >= num_tiles || slot >= num_slots)
                continue;
            if (expert < 0) {
                slot_to_row[slot] = -1;
                continue;
            }
            const int row = offsets[expert] + rank;
            slot_to_row[slot] = row;
            row_to_slot[row] = static_cast<int>(slot);
            m_indices[row] = expert;
            if (masked_slots != nullptr && static_cast<uint32_t>(rank) < max_tokens)
                masked_slots[static_cast<uint64_t>(expert) * max_tokens + rank] = static_cast<int>(slot);
        }
    }
}

// counts [E], masked_m [E] (when masked) and num_rows [1] from the totals and offsets of step 2.
template <int kNumThreads>
DK_DEVICE void write_expert_counts(const int* totals, const int* offsets, int* counts, int* num_rows, int* masked_m,
                                   uint32_t num_experts, uint32_t max_tokens) {
    for (uint32_t e = threadIdx.x; e < num_experts; e += kNumThreads) {
        counts[e] = totals[e];
        if (masked_m != nullptr)
            masked_m[e] = min(static_cast<uint32_t>(totals[e]), max_tokens);
    }
    if (threadIdx.x == 0)
        *num_rows = offsets[kMaxMoeExperts];
}

}  // namespace deep_kernels
