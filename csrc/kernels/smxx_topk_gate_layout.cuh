// Top-k gating and the contiguous (and optionally masked) MoE layout of its indices in one cooperative
// launch (the host bounds T * k): the outputs of smxx_topk_gate and of smxx_moe_layout, bit for bit.
//   every block: fills its share of the worst-case-sized m_indices, row_to_slot and masked_slots with -1;
//     the blocks holding tokens gate them (warp w: tokens w, w + kNumWarps, ... of the block's
//     tokens_per_block), keep their experts in shared memory, count them per warp and per expert and
//     publish the block's counts in block_counts [token blocks, 4 * ceil(E / 4)]
//   a grid barrier (co-residency is the cooperative launch's guarantee; fill-only blocks arrive and leave)
//   every token block: each expert's total and slots in earlier blocks, the segment offsets, then the rows
//     of its own slots over the fill (block 0 also the per-expert counts)
// Blocks hold consecutive tokens, so a slot's rank = (its expert's slots in earlier blocks) + (in earlier
// warps of its block) + (in earlier lanes of its tile): positions come from counts and scans only.
// Unsupported: more than one chunk (kNumWarps * 32 * kSlotsPerThread slots) per block (the host checks).
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

// Bytes of one block's row of per-expert slot counts in block_counts: E one-byte counts (a block's count of an
// expert is at most its tokens, which the host keeps below 256), rounded up to 16-byte vectors.
template <int NUM_EXPERTS>
constexpr uint32_t kBlockCountRowBytes = (NUM_EXPERTS + 15) / 16 * 16;

// After the grid barrier, per expert: totals [kMaxMoeExperts] (0 past E) and earlier [E], the slots of blocks
// before `block`, from the byte rows of block_counts [num_blocks] (written by other blocks during this launch: L2
// loads). Warp w sums the 16-expert vectors w, w + kNumWarps, ... over the rows, lane l taking rows l, l + 32, ...;
// each 32-bit word's even and odd bytes add up in 16-bit halves (a total is at most T < 65536), then a butterfly
// over the lanes.
template <int NUM_EXPERTS, int kNumWarps>
DK_DEVICE void sum_block_byte_counts(const uint8_t* block_counts, uint32_t num_blocks, uint32_t block, int* totals,
                                     int* earlier) {
    constexpr uint32_t kRowBytes = kBlockCountRowBytes<NUM_EXPERTS>;
    constexpr uint32_t kVectors = kRowBytes / 16, kBatch = 4;
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (uint32_t e = kRowBytes + threadIdx.x; e < kMaxMoeExperts; e += kNumWarps * 32)
        totals[e] = 0;
    for (uint32_t vector = warp; vector < kVectors; vector += kNumWarps) {
        // [word][even bytes, odd bytes]: experts 4 word + {0, 2} and 4 word + {1, 3} in the low and high halves
        uint32_t total[4][2] = {}, before[4][2] = {};
        const auto* rows = reinterpret_cast<const int4*>(block_counts) + vector;
        for (uint32_t first = lane; first < num_blocks; first += 32 * kBatch) {
            int4 count[kBatch];
            #pragma unroll
            for (uint32_t b = 0; b < kBatch; ++b) {
                const uint32_t row = first + 32 * b;
                count[b] = row < num_blocks ? __ldcg(rows + row * kVectors) : make_int4(0, 0, 0, 0);
            }
            #pragma unroll
            for (uint32_t b = 0; b < kBatch; ++b) {
                const bool is_earlier = first + 32 * b < block;
                const uint32_t words[4] = {static_cast<uint32_t>(count[b].x), static_cast<uint32_t>(count[b].y),
                                           static_cast<uint32_t>(count[b].z), static_cast<uint32_t>(count[b].w)};
                #pragma unroll
                for (int w = 0; w < 4; ++w) {
                    const uint32_t even = words[w] & 0x00ff00ffu, odd = (words[w] >> 8) & 0x00ff00ffu;
                    total[w][0] += even, total[w][1] += odd;
                    before[w][0] += is_earlier ? even : 0u, before[w][1] += is_earlier ? odd : 0u;
                }
            }
        }
        #pragma unroll
        for (int w = 0; w < 4; ++w) {
            #pragma unroll
            for (int half = 0; half < 2; ++half) {
                #pragma unroll
                for (int offset = 16; offset > 0; offset /= 2) {
                    total[w][half] += __shfl_xor_sync(kFullWarpMask, total[w][half], offset);
                    before[w][half] += __shfl_xor_sync(kFullWarpMask, before[w][half], offset);
                }
            }
        }
        if (lane == 0) {
            #pragma unroll
            for (int w = 0; w < 4; ++w) {
                #pragma unroll
                for (int byte = 0; byte < 4; ++byte) {
                    const uint32_t expert = vector * 16 + 4 * w + byte, shift = 16 * (byte / 2);
                    totals[expert] = static_cast<int>((total[w][byte % 2] >> shift) & 0xffffu);
                    earlier[expert] = static_cast<int>((before[w][byte % 2] >> shift) & 0xffffu);
                }
            }
        }
    }
}

// The same sums with each thread on one vector: thread t sums vector t % kVectors over rows t / kVectors, t / kVectors
// + kNumThreads / kVectors, ...; the lanes of a warp on one vector combine by shuffles, the warps in shared memory
// (partial [kNumWarps][kVectors][16] words).
template <int NUM_EXPERTS, int kNumWarps>
DK_DEVICE void sum_block_byte_counts_by_vector(const uint8_t* block_counts, uint32_t num_blocks, uint32_t block,
                                               uint32_t* partial, int* totals, int* earlier) {
    constexpr uint32_t kRowBytes = kBlockCountRowBytes<NUM_EXPERTS>;
    constexpr uint32_t kVectors = kRowBytes / 16, kBatch = 4, kNumThreads = kNumWarps * 32;
    DK_STATIC_ASSERT(32 % kVectors == 0, "a warp holds whole groups of vectors");
    constexpr uint32_t kGroups = kNumThreads / kVectors;
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint32_t vector = threadIdx.x % kVectors, group = threadIdx.x / kVectors;
    uint32_t sums[2][4][2] = {};  // [total, before][word][even, odd bytes]
    const auto* rows = reinterpret_cast<const int4*>(block_counts) + vector;
    for (uint32_t first = group; first < num_blocks; first += kGroups * kBatch) {
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
    for (uint32_t offset = kVectors; offset < 32; offset *= 2) {
        #pragma unroll
        for (int i = 0; i < 16; ++i)
            (&sums[0][0][0])[i] += __shfl_xor_sync(kFullWarpMask, (&sums[0][0][0])[i], offset);
    }
    if (lane < kVectors) {
        #pragma unroll
        for (int i = 0; i < 16; ++i)
            partial[(warp * kVectors + vector) * 16 + i] = (&sums[0][0][0])[i];
    }
    __syncthreads();
    for (uint32_t e = threadIdx.x; e < kMaxMoeExperts; e += kNumThreads) {
        if (e >= kRowBytes) {
            totals[e] = 0;
            continue;
        }
        const uint32_t v = e / 16, w = e % 16 / 4, half = e % 2, shift = 16 * (e % 4 / 2);
        uint32_t total = 0, before = 0;
        #pragma unroll
        for (int u = 0; u < kNumWarps; ++u) {
            total += partial[(u * kVectors + v) * 16 + w * 2 + half];
            before += partial[(u * kVectors + v) * 16 + 8 + w * 2 + half];
        }
        totals[e] = static_cast<int>((total >> shift) & 0xffffu);
        earlier[e] = static_cast<int>((before >> shift) & 0xffffu);
    }
}

// grid_barrier_arrive with one gpu-scope fence, by thread 0 after the CTA barrier (the CTA barrier orders the other
// threads' writes before it).
DK_DEVICE uint32_t grid_barrier_arrive_one_fence(uint32_t* counter) {
    constexpr uint32_t kFlipBit = 0x80000000u;
    __syncthreads();
    uint32_t before = 0;
    if (threadIdx.x == 0) {
        ptx::fence_acq_rel_gpu();
        before = ptx::atomic_add_acq_rel_gpu(counter, blockIdx.x == 0 ? kFlipBit - (gridDim.x - 1) : 1u);
    }
    return before;
}

DK_DEVICE uint64_t probe_globaltimer() {
    uint64_t t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

template <typename InT, int NUM_EXPERTS, int NUM_GROUPS, GateScoring kScoring, int kNumWarps, int kSlotsPerThread,
          int kAlignment, int kTokensPerWarp, int kProbe = 0>
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
    __shared__ __align__(16) int smem_total[kMaxMoeExperts];
    __shared__ __align__(16) int smem_offset[kMaxMoeExperts + 1];
    __shared__ int smem_earlier[kMaxMoeExperts];
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    long long stamp[8] = {};
    uint64_t start_ns = 0;
    const auto stamp_at = [&](int i) {
        if constexpr ((kProbe & 1024) != 0) {
            if (i == 0)
                start_ns = probe_globaltimer();
            stamp[i] = clock64();
        }
    };
    stamp_at(0);

    // NOTE: the counter's line is in L2 by the time the grid barrier's atomic takes it (after an L2 flush
    // the atomic would otherwise wait for a DRAM read on the critical path).
    if (threadIdx.x == 0)
        ptx::prefetch_l2(barrier);
    // The warp's first token row (lanes 0-15) and the bias (lanes 16-31) head for L2 before the fill's stores
    // are issued, so the gate's first loads find them on the way: 10.1 -> 8.5 us at T = 128 after an L2 flush
    // (the gate's scores had waited 3 us for their loads).
    const uint32_t first_token = blockIdx.x * tokens_per_block;
    const uint32_t token_blocks = (num_tokens + tokens_per_block - 1) / tokens_per_block;
    if constexpr (!(kProbe & 64)) {
        constexpr uint32_t kLineBytes = 128, kPrefetchLanes = 16;
        const auto* row = reinterpret_cast<const uint8_t*>(
            logits + static_cast<uint64_t>(min(first_token + warp, num_tokens - 1)) * logits_row_stride);
        // One more line than the row holds covers a row that does not start on a line.
        if (lane <= NUM_EXPERTS * sizeof(InT) / kLineBytes && lane < kPrefetchLanes)
            ptx::prefetch_l2(row + lane * kLineBytes);
        const uint32_t bias_line = lane - kPrefetchLanes;
        if (bias != nullptr && lane >= kPrefetchLanes && bias_line <= NUM_EXPERTS * sizeof(float) / kLineBytes)
            ptx::prefetch_l2(reinterpret_cast<const uint8_t*>(bias) + bias_line * kLineBytes);
        // Then the rows of the warp's later tokens, so that each token after the first finds its row in L2
        constexpr uint32_t kRowLines = NUM_EXPERTS * sizeof(InT) / kLineBytes + 1;
        const uint32_t later_tokens = tokens_per_block > warp ? (tokens_per_block - warp - 1) / kNumWarps : 0;
        for (uint32_t line = lane; line < later_tokens * kRowLines; line += 32) {
            const uint32_t token = first_token + (1 + line / kRowLines) * kNumWarps + warp;
            const InT* token_row = logits + static_cast<uint64_t>(token) * logits_row_stride;
            if (token < num_tokens)
                ptx::prefetch_l2(reinterpret_cast<const uint8_t*>(token_row) + (line % kRowLines) * kLineBytes);
        }
    }

    // The block's share of the -1 fill: stores issued first complete while the gate computes, so the
    // fence before the grid barrier finds them done. Blocks past the tokens only fill.
    if constexpr (!(kProbe & 16))
    fill_layout_padding<kNumThreads>(m_indices, row_to_slot, masked_slots, max_rows, NUM_EXPERTS * max_tokens,
                                     blockIdx.x, gridDim.x);
    if (blockIdx.x >= token_blocks) {
        if constexpr (kProbe & 512)
        grid_barrier_arrive_one_fence(barrier);
        else if constexpr (!(kProbe & 4))
        grid_barrier_arrive(barrier);
        return;
    }
    for (uint32_t e = lane; e < NUM_EXPERTS; e += 32)
        smem_warp_base[warp][e] = 0;
    stamp_at(1);

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
        if constexpr (kProbe & 1) {
            #pragma unroll
            for (int t = 0; t < kTokensPerWarp; ++t)
                choices[t] = {1.0f, static_cast<int>((first_token + first_in_block + t * kNumWarps) * 7 + lane * 37) % NUM_EXPERTS};
        } else {
        warp_topk_gates<InT, NUM_EXPERTS, NUM_GROUPS, kScoring, kTokensPerWarp>(
            rows, bias, top_k, topk_groups, renormalize, scaling_factor, choices);
        }
        #pragma unroll
        for (int t = 0; t < kTokensPerWarp; ++t) {
            const uint32_t token_in_block = first_in_block + t * kNumWarps;
            const uint32_t token = first_token + token_in_block;
            if (token_in_block < tokens_per_block && token < num_tokens && lane < top_k) {
                const uint64_t offset = static_cast<uint64_t>(token) * top_k + lane;
                if constexpr (!(kProbe & 128)) {
                weights[offset] = choices[t].weight;
                indices[offset] = choices[t].expert;
                }
                smem_experts[token_in_block * top_k + lane] = choices[t].expert;
            }
        }
    }
    __syncthreads();
    stamp_at(2);

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
    if constexpr (kProbe & 32) {
    constexpr uint32_t kRowStride = (NUM_EXPERTS + 3) / 4 * 4;
    for (uint32_t e = threadIdx.x; e < kRowStride; e += kNumThreads)
        block_counts[blockIdx.x * kRowStride + e] =
            e < NUM_EXPERTS ? scan_warp_counts<kNumWarps>(smem_warp_base, e, true) : 0;
    } else {
    constexpr uint32_t kRowBytes = kBlockCountRowBytes<NUM_EXPERTS>;
    auto* count_bytes = reinterpret_cast<uint8_t*>(block_counts);
    for (uint32_t e = threadIdx.x; e < kRowBytes; e += kNumThreads)
        count_bytes[blockIdx.x * kRowBytes + e] =
            e < NUM_EXPERTS ? static_cast<uint8_t>(scan_warp_counts<kNumWarps>(smem_warp_base, e, true)) : 0;
    }

    stamp_at(3);
    if constexpr (kProbe & 512)
    grid_barrier_wait(barrier, grid_barrier_arrive_one_fence(barrier));
    else if constexpr (!(kProbe & 4))
    grid_barrier_sync(barrier);
    else __syncthreads();

    stamp_at(4);
    // Per expert: the total and the slots of earlier blocks; the segment offsets
    if constexpr (kProbe & 2) {
        for (uint32_t e = threadIdx.x; e < kMaxMoeExperts; e += kNumThreads)
            smem_total[e] = 0, smem_earlier[e] = 0;
    } else if constexpr (kProbe & 32) {
    __shared__ __align__(16) int smem_partial[2 * 4 * kNumThreads];
    sum_block_counts<kNumThreads>(block_counts, token_blocks, blockIdx.x, NUM_EXPERTS, smem_partial, smem_total,
                                  smem_earlier);
    } else if constexpr (kProbe & 256) {
    __shared__ uint32_t smem_vector_partial[kNumWarps * kBlockCountRowBytes<NUM_EXPERTS> / 16 * 16];
    sum_block_byte_counts_by_vector<NUM_EXPERTS, kNumWarps>(reinterpret_cast<const uint8_t*>(block_counts),
                                                            token_blocks, blockIdx.x, smem_vector_partial, smem_total,
                                                            smem_earlier);
    } else {
    sum_block_byte_counts<NUM_EXPERTS, kNumWarps>(reinterpret_cast<const uint8_t*>(block_counts), token_blocks,
                                                  blockIdx.x, smem_total, smem_earlier);
    }
    __syncthreads();
    stamp_at(5);
    if (warp == 0)
        warp_segment_offsets<kAlignment>(smem_total, smem_offset);
    __syncthreads();
    stamp_at(6);
    if (blockIdx.x == 0)
        write_expert_counts<kNumThreads>(smem_total, smem_offset, counts, num_rows, masked_m, NUM_EXPERTS, max_tokens);

    // The rows of the block's slots (the gate routes every slot: none is dropped)
    const uint32_t first_slot = first_token * top_k;
    const auto slot_of = [first_slot](uint32_t position) { return first_slot + position; };
    if constexpr (!(kProbe & 8))
    warp_scatter_tiles(experts, 0, block_slots, slot_of, smem_warp_base[warp], smem_earlier, smem_offset, m_indices,
                       row_to_slot, slot_to_row, masked_slots, max_tokens);
    if constexpr (kProbe & 1024) {
        __syncthreads();
        stamp[7] = clock64();
        const uint64_t end_ns = probe_globaltimer();
        if (threadIdx.x == 0) {
            auto* out = reinterpret_cast<uint32_t*>(weights) + blockIdx.x * 16;
            for (int i = 1; i < 8; ++i)
                out[i - 1] = static_cast<uint32_t>(stamp[i] - stamp[0]);
            out[7] = static_cast<uint32_t>(start_ns), out[8] = static_cast<uint32_t>(end_ns);
            out[9] = static_cast<uint32_t>(start_ns >> 32);
        }
    }
}

}  // namespace deep_kernels
