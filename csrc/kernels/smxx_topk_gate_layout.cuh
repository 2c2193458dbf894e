// Top-k gating and the contiguous (and optionally masked) MoE layout of its indices in one cooperative
// launch (the host bounds T * k): the outputs of smxx_topk_gate and of smxx_moe_layout, bit for bit.
//   every block: fills its share of the worst-case-sized m_indices, row_to_slot and masked_slots with -1;
//     the blocks holding tokens gate them (warp w: tokens w, w + kNumWarps, ... of the block's
//     tokens_per_block), keep their experts in shared memory, count them per warp and per expert and
//     publish the block's counts as bytes in block_counts [token blocks, 16 * ceil(E / 16) bytes] (a block's
//     count of an expert is at most its tokens, which the host keeps below 256)
//   a grid barrier (co-residency is the cooperative launch's guarantee; fill-only blocks arrive and leave)
//   every token block: each expert's total and slots in earlier blocks, the segment offsets, then the rows
//     of its own slots over the fill (block 0 also the per-expert counts)
// Blocks hold consecutive tokens, so a slot's rank = (its expert's slots in earlier blocks) + (in earlier
// warps of its block) + (in earlier lanes of its tile): positions come from counts and scans only.
// Unsupported: more than one chunk (kNumWarps * 32 * kSlotsPerThread slots) or 255 tokens per block, 65536 tokens
// (the host checks).
// NOTE: the barrier counter serves one stream at a time (the host keeps one per stream); each launch
// flips its bit 31 and leaves the lower bits at zero.
#pragma once

#include <cstdint>

#include "common/grid_barrier.cuh"
#include "common/macros.cuh"
#include "kernels/smxx_moe_slots.cuh"
#include "kernels/smxx_topk_gate.cuh"
#include "ptx/global_memory.cuh"

namespace deep_kernels {

// Bytes of one block's row of per-expert slot counts in block_counts: one byte per expert, whole 16-byte vectors.
template <int NUM_EXPERTS>
constexpr uint32_t kBlockCountRowBytes = (NUM_EXPERTS + 15) / 16 * 16;

// After the grid barrier, per expert: totals [kMaxMoeExperts] (0 past E) and earlier [E], the slots of blocks
// before `block`, from the byte rows of block_counts [num_blocks] (written by other blocks during this launch: L2
// loads). Thread t sums the 16-byte vector t % kVectorLanes over the rows t / kVectorLanes, + kGroups, ...: each
// 32-bit word's even and odd bytes add up in 16-bit halves (a total is at most T < 65536); the lanes of a warp on
// one vector combine by shuffles, then the warps through partial [kNumWarps * kVectors * 8] in shared memory, the
// totals first, then the earlier slots.
template <int NUM_EXPERTS, int kNumWarps>
DK_DEVICE void sum_block_byte_counts(const uint8_t* block_counts, uint32_t num_blocks, uint32_t block,
                                     uint32_t* partial, int* totals, int* earlier) {
    constexpr uint32_t kRowBytes = kBlockCountRowBytes<NUM_EXPERTS>, kVectors = kRowBytes / 16;
    constexpr uint32_t kVectorLanes = kVectors <= 1 ? 1 : kVectors <= 2 ? 2 : kVectors <= 4 ? 4
                                    : kVectors <= 8 ? 8 : kVectors <= 16 ? 16 : 32;
    constexpr uint32_t kNumThreads = kNumWarps * 32, kGroups = kNumThreads / kVectorLanes, kBatch = 4;
    DK_STATIC_ASSERT(kVectors <= 32, "a warp spans a row");
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint32_t vector = lane % kVectorLanes, group = threadIdx.x / kVectorLanes;
    // [totals, earlier][word][even bytes, odd bytes]: experts 4 word + {0, 2} and 4 word + {1, 3} of the vector in
    // the low and high halves
    uint32_t sums[2][4][2] = {};
    const auto* rows = reinterpret_cast<const int4*>(block_counts) + vector;
    for (uint32_t first = group; vector < kVectors && first < num_blocks; first += kGroups * kBatch) {
        int4 count[kBatch];
        #pragma unroll
        for (uint32_t b = 0; b < kBatch; ++b) {
            const uint32_t row = first + kGroups * b;
            count[b] = row < num_blocks ? __ldcg(rows + row * kVectors) : make_int4(0, 0, 0, 0);
        }
        #pragma unroll
        for (uint32_t b = 0; b < kBatch; ++b) {
            const bool is_earlier = first + kGroups * b < block;
            const uint32_t words[4] = {static_cast<uint32_t>(count[b].x), static_cast<uint32_t>(count[b].y),
                                       static_cast<uint32_t>(count[b].z), static_cast<uint32_t>(count[b].w)};
            #pragma unroll
            for (int w = 0; w < 4; ++w) {
                const uint32_t even = words[w] & 0x00ff00ffu, odd = (words[w] >> 8) & 0x00ff00ffu;
                sums[0][w][0] += even, sums[0][w][1] += odd;
                sums[1][w][0] += is_earlier ? even : 0u, sums[1][w][1] += is_earlier ? odd : 0u;
            }
        }
    }
    #pragma unroll
    for (uint32_t offset = kVectorLanes; offset < 32; offset *= 2) {
        #pragma unroll
        for (int w = 0; w < 4; ++w) {
            #pragma unroll
            for (int half = 0; half < 2; ++half) {
                sums[0][w][half] += __shfl_xor_sync(kFullWarpMask, sums[0][w][half], offset);
                sums[1][w][half] += __shfl_xor_sync(kFullWarpMask, sums[1][w][half], offset);
            }
        }
    }
    for (uint32_t e = kRowBytes + threadIdx.x; e < kMaxMoeExperts; e += kNumThreads)
        totals[e] = 0;
    #pragma unroll
    for (int pass = 0; pass < 2; ++pass) {
        if (lane < kVectors) {
            #pragma unroll
            for (int w = 0; w < 4; ++w) {
                partial[(warp * kVectors + lane) * 8 + 2 * w] = sums[pass][w][0];
                partial[(warp * kVectors + lane) * 8 + 2 * w + 1] = sums[pass][w][1];
            }
        }
        __syncthreads();
        for (uint32_t e = threadIdx.x; e < kRowBytes; e += kNumThreads) {
            // Expert e: vector e / 16, word e % 16 / 4, byte e % 4 (odd bytes in the odd words, bytes 2-3 high)
            const uint32_t word = e / 16 * 8 + e % 16 / 4 * 2 + e % 2;
            uint32_t sum = 0;
            #pragma unroll
            for (int u = 0; u < kNumWarps; ++u)
                sum += partial[u * kVectors * 8 + word];
            (pass == 0 ? totals : earlier)[e] = static_cast<int>((sum >> (16 * (e % 4 / 2))) & 0xffffu);
        }
        __syncthreads();
    }
}

template <typename InT, int NUM_EXPERTS, int NUM_GROUPS, GateScoring kScoring, int kNumWarps, int kSlotsPerThread,
          int kAlignment, int kTokensPerWarp>
__global__ void __launch_bounds__(kNumWarps * 32, 1)
smxx_topk_gate_layout_impl(const InT* __restrict__ logits, const float* __restrict__ bias, float* __restrict__ weights,
                           int* __restrict__ indices, int* __restrict__ counts, int* __restrict__ num_rows,
                           int* __restrict__ m_indices, int* __restrict__ row_to_slot, int* __restrict__ slot_to_row,
                           int* __restrict__ masked_slots, int* __restrict__ masked_m, int* block_counts,
                           uint32_t* __restrict__ barrier, uint32_t num_tokens, uint32_t tokens_per_block,
                           uint32_t logits_row_stride, uint32_t top_k, uint32_t topk_groups, uint32_t renormalize,
                           float scaling_factor, uint32_t max_rows, uint32_t max_tokens) {
    // Static checks and shared memory
    constexpr int kNumThreads = kNumWarps * 32;
    constexpr int CHUNK_SLOTS = kNumThreads * kSlotsPerThread;
    DK_STATIC_ASSERT(NUM_EXPERTS <= kMaxMoeExperts, "per-expert tables hold kMaxMoeExperts");
    DK_STATIC_ASSERT(CHUNK_SLOTS <= 65535, "a warp's rank within a chunk fits in 16 bits");
    __shared__ int smem_experts[CHUNK_SLOTS];
    __shared__ uint16_t smem_warp_base[kNumWarps][kMaxMoeExperts];
    __shared__ uint32_t smem_partial[kNumWarps * kBlockCountRowBytes<NUM_EXPERTS> / 2];
    __shared__ __align__(16) int smem_total[kMaxMoeExperts];
    __shared__ __align__(16) int smem_offset[kMaxMoeExperts + 1];
    __shared__ int smem_earlier[kMaxMoeExperts];
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    // NOTE: the counter's line is in L2 by the time the grid barrier's atomic takes it (after an L2 flush
    // the atomic would otherwise wait for a DRAM read on the critical path).
    if (threadIdx.x == 0)
        ptx::prefetch_l2(barrier);
    // NOTE: no L2 prefetch of the logits rows and the bias ahead of the gate's loads: it slowed the gate (H200, L2
    // flushed: 20.8 us with it against 15.3 without at T = 4096, 9.2 against 8.3 at T = 512, the same at T = 128).
    const uint32_t first_token = blockIdx.x * tokens_per_block;
    const uint32_t token_blocks = (num_tokens + tokens_per_block - 1) / tokens_per_block;

    // The block's share of the -1 fill: stores issued first complete while the gate computes, so the
    // fence before the grid barrier finds them done. Blocks past the tokens only fill.
    fill_layout_padding<kNumThreads>(m_indices, row_to_slot, masked_slots, max_rows, NUM_EXPERTS * max_tokens,
                                     blockIdx.x, gridDim.x);
    if (blockIdx.x >= token_blocks) {
        grid_barrier_arrive(barrier);
        return;
    }
    for (uint32_t e = lane; e < NUM_EXPERTS; e += 32)
        smem_warp_base[warp][e] = 0;

    // Gate: kTokensPerWarp tokens per warp at a time (warp w: tokens w, w + kNumWarps, ... of the block's)
    // NOTE: warps past the last token gate it again and store nothing: a branch around the gate would make
    // the compiler give its warp-wide reductions a divergent fallback that spills to a stack frame.
    for (uint32_t first_in_block = warp; first_in_block < tokens_per_block;
         first_in_block += kNumWarps * kTokensPerWarp) {
        const InT* rows[kTokensPerWarp];
        #pragma unroll
        for (int t = 0; t < kTokensPerWarp; ++t) {
            const uint32_t token = first_token + first_in_block + t * kNumWarps;
            rows[t] = logits + static_cast<uint64_t>(min(token, num_tokens - 1)) * logits_row_stride;
        }
        GateChoice choices[kTokensPerWarp];
        warp_topk_gates<InT, NUM_EXPERTS, NUM_GROUPS, kScoring, kTokensPerWarp>(
            rows, bias, top_k, topk_groups, renormalize, scaling_factor, choices);
        #pragma unroll
        for (int t = 0; t < kTokensPerWarp; ++t) {
            const uint32_t token_in_block = first_in_block + t * kNumWarps;
            const uint32_t token = first_token + token_in_block;
            if (token_in_block < tokens_per_block && token < num_tokens && lane < top_k) {
                const uint64_t offset = static_cast<uint64_t>(token) * top_k + lane;
                weights[offset] = choices[t].weight;
                indices[offset] = choices[t].expert;
                smem_experts[token_in_block * top_k + lane] = choices[t].expert;
            }
        }
    }
    __syncthreads();

    // Count the block's slots per warp, then per expert an exclusive scan over the warps
    const uint32_t block_slots = min(tokens_per_block, num_tokens - first_token) * top_k;
    int experts[kSlotsPerThread];
    #pragma unroll
    for (int t = 0; t < kSlotsPerThread; ++t) {
        const uint32_t position = chunk_slot<kSlotsPerThread>(0, t);
        experts[t] = position < block_slots ? smem_experts[position] : -1;
    }
    warp_count_tiles(experts, smem_warp_base[warp]);
    __syncthreads();
    constexpr uint32_t kRowBytes = kBlockCountRowBytes<NUM_EXPERTS>;
    auto* count_bytes = reinterpret_cast<uint8_t*>(block_counts);
    for (uint32_t e = threadIdx.x; e < kRowBytes; e += kNumThreads)
        count_bytes[blockIdx.x * kRowBytes + e] =
            e < NUM_EXPERTS ? static_cast<uint8_t>(scan_warp_counts<kNumWarps>(smem_warp_base, e, true)) : 0;

    grid_barrier_sync(barrier);

    // Per expert: the total and the slots of earlier blocks; the segment offsets
    sum_block_byte_counts<NUM_EXPERTS, kNumWarps>(count_bytes, token_blocks, blockIdx.x, smem_partial, smem_total,
                                                  smem_earlier);
    if (warp == 0)
        warp_segment_offsets<kAlignment>(smem_total, smem_offset);
    __syncthreads();
    if (blockIdx.x == 0)
        write_expert_counts<kNumThreads>(smem_total, smem_offset, counts, num_rows, masked_m, NUM_EXPERTS, max_tokens);

    // The rows of the block's slots (the gate routes every slot: none is dropped)
    const uint32_t first_slot = first_token * top_k;
    const auto slot_of = [first_slot](uint32_t position) { return first_slot + position; };
    warp_scatter_tiles(experts, 0, block_slots, slot_of, smem_warp_base[warp], smem_earlier, smem_offset, m_indices,
                       row_to_slot, slot_to_row, masked_slots, max_tokens);
}

}  // namespace deep_kernels
