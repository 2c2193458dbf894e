// What the MoE layout kernels share: the expert limit, how a top-k slot names its expert, the -1 fill of
// the worst-case-sized outputs, and the steps of ranking slots without atomics, a block at a time over
// chunks of its slots, the blocks exchanging per-expert counts across one grid barrier:
//   1. each warp counts the experts of its contiguous run of the chunk (__match_any_sync per 32-slot tile)
//   2. per expert, an exclusive scan of the warps' counts gives each warp its first rank in the chunk; after
//      the grid barrier, the blocks' counts give each expert's total and its slots in earlier blocks, and
//      warp 0 scans the aligned totals into segment offsets
//   3. each warp ranks its run again: rank = slots of the expert before the chunk + the warp's running
//      base + earlier lanes of the tile with the expert
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

// A block ranks its slots in chunks of kNumWarps * 32 * kSlotsPerThread: warp w takes the chunk's run
// [w * 32 * kSlotsPerThread, (w + 1) * 32 * kSlotsPerThread), tile t of it in element t of the lane's experts.
template <int kSlotsPerThread>
DK_DEVICE uint32_t chunk_slot(uint32_t chunk_first, int tile) {
    return chunk_first + (threadIdx.x / 32) * (32 * kSlotsPerThread) + tile * 32 + threadIdx.x % 32;
}

// The experts of the calling thread's slots of the chunk from chunk_first (-1 from slot_end on).
template <typename IndexT, int kSlotsPerThread>
DK_DEVICE void load_chunk_experts(const IndexT* topk_idx, uint32_t chunk_first, uint32_t slot_end,
                                  uint32_t num_experts, int (&experts)[kSlotsPerThread]) {
    #pragma unroll
    for (int t = 0; t < kSlotsPerThread; ++t)
        experts[t] = load_slot_expert(topk_idx, chunk_slot<kSlotsPerThread>(chunk_first, t), slot_end, num_experts);
}

// Step 1: the calling warp adds the experts of its run into warp_counts [E] (zeroed before).
template <int kSlotsPerThread>
DK_DEVICE void warp_count_tiles(const int (&experts)[kSlotsPerThread], uint16_t* warp_counts) {
    const uint32_t lane = threadIdx.x % 32;
    #pragma unroll
    for (int t = 0; t < kSlotsPerThread; ++t) {
        const uint32_t peers = __match_any_sync(0xffffffffu, experts[t]);
        if (experts[t] >= 0 && lane == static_cast<uint32_t>(__ffs(peers) - 1))
            warp_counts[experts[t]] += static_cast<uint16_t>(__popc(peers));
        __syncwarp();
    }
}

// Step 2, per expert: the warps' counts [kNumWarps][kMaxMoeExperts] of a chunk become each warp's first rank
// within the chunk (or zero, for the next chunk's count, without keep_bases); returns the chunk's count.
template <int kNumWarps>
DK_DEVICE int scan_warp_counts(uint16_t (*warp_counts)[kMaxMoeExperts], uint32_t expert, bool keep_bases) {
    int base = 0;
    #pragma unroll
    for (int w = 0; w < kNumWarps; ++w) {
        const int count = warp_counts[w][expert];
        warp_counts[w][expert] = keep_bases ? static_cast<uint16_t>(base) : 0;
        base += count;
    }
    return base;
}

// After the grid barrier, per expert: totals [kMaxMoeExperts] (0 past E) and earlier [E], the slots of
// blocks before `block`, from block_counts [num_blocks, 4 * ceil(E / 4)] (16-byte rows, zero past E, written
// by other blocks during this launch: L2 loads). Threads split the rows' 16-byte vectors and the blocks;
// partial [2 * 4 * kNumThreads] in shared memory combines them.
template <int kNumThreads>
DK_DEVICE void sum_block_counts(const int* block_counts, uint32_t num_blocks, uint32_t block, uint32_t num_experts,
                                int* partial, int* totals, int* earlier) {
    constexpr int kBatch = 16;
    const uint32_t num_vectors = (num_experts + 3) / 4;
    const uint32_t num_groups = min(kNumThreads / num_vectors, num_blocks);
    const uint32_t vector = threadIdx.x % num_vectors, group = threadIdx.x / num_vectors;
    int* partial_total = partial;
    int* partial_earlier = partial + 4 * kNumThreads;
    if (group < num_groups) {
        int4 total = make_int4(0, 0, 0, 0), before = make_int4(0, 0, 0, 0);
        const auto* rows = reinterpret_cast<const int4*>(block_counts) + vector;
        for (uint32_t first = group; first < num_blocks; first += num_groups * kBatch) {
            int4 count[kBatch];
            #pragma unroll
            for (int b = 0; b < kBatch; ++b) {
                const uint32_t row = first + b * num_groups;
                count[b] = row < num_blocks ? __ldcg(rows + row * num_vectors) : make_int4(0, 0, 0, 0);
            }
            #pragma unroll
            for (int b = 0; b < kBatch; ++b) {
                const bool is_earlier = first + b * num_groups < block;
                total.x += count[b].x, total.y += count[b].y, total.z += count[b].z, total.w += count[b].w;
                before.x += is_earlier ? count[b].x : 0, before.y += is_earlier ? count[b].y : 0;
                before.z += is_earlier ? count[b].z : 0, before.w += is_earlier ? count[b].w : 0;
            }
        }
        reinterpret_cast<int4*>(partial_total)[group * num_vectors + vector] = total;
        reinterpret_cast<int4*>(partial_earlier)[group * num_vectors + vector] = before;
    }
    __syncthreads();
    for (uint32_t e = threadIdx.x; e < kMaxMoeExperts; e += kNumThreads) {
        int total = 0, before = 0;
        for (uint32_t g = 0; e < num_experts && g < num_groups; ++g) {
            total += partial_total[g * 4 * num_vectors + e];
            before += partial_earlier[g * 4 * num_vectors + e];
        }
        totals[e] = total;
        if (e < num_experts)
            earlier[e] = before;
    }
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

// Step 3: the calling warp ranks and writes its run of the chunk (slots from slot_end on are skipped):
// rank = earlier[e] (slots of e before the chunk) + warp_base[e] (the warp's first rank in the chunk, which
// advances) + earlier lanes of the tile with e. slot_of maps the chunk position to the slot's index.
template <int kSlotsPerThread, typename SlotOf>
DK_DEVICE void warp_scatter_tiles(const int (&experts)[kSlotsPerThread], uint32_t chunk_first, uint32_t slot_end,
                                  SlotOf slot_of, uint16_t* warp_base, const int* earlier, const int* offsets,
                                  int* m_indices, int* row_to_slot, int* slot_to_row, int* masked_slots,
                                  uint32_t max_tokens) {
    const uint32_t lane = threadIdx.x % 32;
    const uint32_t earlier_lanes = (1u << lane) - 1u;
    #pragma unroll
    for (int t = 0; t < kSlotsPerThread; ++t) {
        const int expert = experts[t];
        const uint32_t peers = __match_any_sync(0xffffffffu, expert);
        const int rank = expert >= 0 ? earlier[expert] + warp_base[expert] + __popc(peers & earlier_lanes) : 0;
        __syncwarp();
        if (expert >= 0 && lane == static_cast<uint32_t>(__ffs(peers) - 1))
            warp_base[expert] += static_cast<uint16_t>(__popc(peers));
        __syncwarp();
        const uint32_t position = chunk_slot<kSlotsPerThread>(chunk_first, t);
        if (position >= slot_end)
            continue;
        const int slot = static_cast<int>(slot_of(position));
        if (expert < 0) {
            slot_to_row[slot] = -1;
            continue;
        }
        const int row = offsets[expert] + rank;
        slot_to_row[slot] = row;
        row_to_slot[row] = slot;
        m_indices[row] = expert;
        if (masked_slots != nullptr && static_cast<uint32_t>(rank) < max_tokens)
            masked_slots[static_cast<uint64_t>(expert) * max_tokens + rank] = slot;
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
