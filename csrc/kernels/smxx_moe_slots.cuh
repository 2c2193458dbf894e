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

// Step 2, for every expert: the warps' counts [kNumWarps][kMaxMoeExperts] of a chunk become each warp's first
// rank within the chunk (or zero, for the next chunk's count, without keep_bases); on_count(e, count) gets the
// chunk's count of each expert e < num_experts once. `parts` consecutive lanes (a power of two) share an
// expert, each scanning kNumWarps / parts warps, and combine their sums by shuffles.
template <int kNumWarps, int kNumThreads, typename OnCount>
DK_DEVICE void scan_warp_counts(uint16_t (*warp_counts)[kMaxMoeExperts], uint32_t num_experts, bool keep_bases,
                                OnCount on_count) {
    uint32_t parts = 1;
    while (parts * 2 <= kNumWarps && parts * 2 <= 32 && parts * 2 * num_experts <= kNumThreads)
        parts *= 2;
    const uint32_t part = threadIdx.x % parts, warps_per_part = kNumWarps / parts;
    for (uint32_t first = 0; first < num_experts; first += kNumThreads / parts) {
        const uint32_t expert = first + threadIdx.x / parts;
        const bool valid = expert < num_experts;
        int local = 0;
        for (uint32_t w = part * warps_per_part; valid && w < (part + 1) * warps_per_part; ++w)
            local += warp_counts[w][expert];
        int inclusive = local;
        for (uint32_t offset = 1; offset < parts; offset *= 2) {
            const int other = __shfl_up_sync(0xffffffffu, inclusive, offset, parts);
            inclusive += part >= offset ? other : 0;
        }
        const int count = __shfl_sync(0xffffffffu, inclusive, parts - 1, parts);
        int base = inclusive - local;
        for (uint32_t w = part * warps_per_part; valid && w < (part + 1) * warps_per_part; ++w) {
            const int warp_count = warp_counts[w][expert];
            warp_counts[w][expert] = keep_bases ? static_cast<uint16_t>(base) : 0;
            base += warp_count;
        }
        if (valid && part == 0)
            on_count(expert, count);
    }
}

// After the grid barrier, per expert: totals [kMaxMoeExperts] (0 past E) and earlier [E], the slots of
// blocks before `block`, from block_counts [num_blocks, 4 * ceil(E / 4)] (16-byte rows, zero past E, written
// by other blocks during this launch: L2 loads). Each 16-byte column of the rows takes a run of `lanes`
// consecutive lanes (a power of two up to 32), which split the rows, kBatch loads each in flight, and sum
// their shares by shuffles.
template <int kNumThreads, int kBatch>
DK_DEVICE void sum_block_counts(const int* block_counts, uint32_t num_blocks, uint32_t block, uint32_t num_experts,
                                int* totals, int* earlier) {
    DK_STATIC_ASSERT(kNumThreads >= kMaxMoeExperts, "every 16-byte column gets a lane");
    const uint32_t num_vectors = (num_experts + 3) / 4;
    uint32_t lanes = 32;
    while (lanes * num_vectors > kNumThreads)
        lanes /= 2;
    const uint32_t vector = threadIdx.x / lanes, part = threadIdx.x % lanes;
    int4 total = make_int4(0, 0, 0, 0), before = make_int4(0, 0, 0, 0);
    if (vector < num_vectors) {
        const auto* rows = reinterpret_cast<const int4*>(block_counts) + vector;
        for (uint32_t first = part; first < num_blocks; first += lanes * kBatch) {
            int4 count[kBatch];
            #pragma unroll
            for (int b = 0; b < kBatch; ++b) {
                const uint32_t row = first + b * lanes;
                count[b] = row < num_blocks ? __ldcg(rows + row * num_vectors) : make_int4(0, 0, 0, 0);
            }
            #pragma unroll
            for (int b = 0; b < kBatch; ++b) {
                const bool is_earlier = first + b * lanes < block;
                total.x += count[b].x, total.y += count[b].y, total.z += count[b].z, total.w += count[b].w;
                before.x += is_earlier ? count[b].x : 0, before.y += is_earlier ? count[b].y : 0;
                before.z += is_earlier ? count[b].z : 0, before.w += is_earlier ? count[b].w : 0;
            }
        }
    }
    for (uint32_t offset = 1; offset < lanes; offset *= 2) {
        total.x += __shfl_xor_sync(0xffffffffu, total.x, offset);
        total.y += __shfl_xor_sync(0xffffffffu, total.y, offset);
        total.z += __shfl_xor_sync(0xffffffffu, total.z, offset);
        total.w += __shfl_xor_sync(0xffffffffu, total.w, offset);
        before.x += __shfl_xor_sync(0xffffffffu, before.x, offset);
        before.y += __shfl_xor_sync(0xffffffffu, before.y, offset);
        before.z += __shfl_xor_sync(0xffffffffu, before.z, offset);
        before.w += __shfl_xor_sync(0xffffffffu, before.w, offset);
    }
    if (vector < num_vectors && part == 0) {
        const int total_of[4] = {total.x, total.y, total.z, total.w};
        const int before_of[4] = {before.x, before.y, before.z, before.w};
        #pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint32_t e = 4 * vector + i;
            totals[e] = total_of[i];
            if (e < num_experts)
                earlier[e] = before_of[i];
        }
    }
    for (uint32_t e = 4 * num_vectors + threadIdx.x; e < kMaxMoeExperts; e += kNumThreads)
        totals[e] = 0;
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
