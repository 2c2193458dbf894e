// Per-token-group FP8 cast: x [M, K] (bf16 or fp32, row stride >= K) -> q [M, K] float8_e4m3fn and one
// scale per row and group of GROUP_SIZE columns.
//   amax = max |x| over the group (NaN propagates), clamped below by amax_clamp
//   scale = amax / 448; q = RNE(x * (448 / amax)) with both divisions IEEE-exact, or with
//   ScaleMode::Divide q = RNE(x / scale)
//   kUE8M0: scale = the smallest power of two >= amax / 448, q = RNE(x * (1 / scale)), so nothing saturates
// Scales go to the layout the FP8 GEMM reads (common/types.cuh). Memory-bound: each thread casts 16 consecutive
// elements of a group per tile pass (the whole group when smaller), with kPasses 16-byte loads in flight; shared
// memory only stages packed UE8M0 scale words. Groups wider than 32 x 16 bytes are not supported (the host
// checks; one group per row of any width is smxx_per_row_cast.cuh's).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/macros.cuh"
#include "common/quant.cuh"
#include "common/token_group_tile.cuh"
#include "common/types.cuh"

namespace deep_kernels {

// NOTE: 5 blocks per SM (at most 48 registers) keep 5 x 256 x kPasses x 16 bytes = 80 KB of loads in flight per
// SM. With 16 elements a thread it measured 0.5-2% faster than 6 blocks (40 registers, where the Multiply casts
// spilled across the IEEE divisions' slow-path calls) at [16384, 7168] and [4096, 7168] bf16 (2026-12-01). Groups
// narrower than 128 bytes keep ptxas's choice.
template <typename InT, int GROUP_SIZE>
constexpr int per_token_cast_min_blocks() {
    return GROUP_SIZE * sizeof(InT) >= 128 ? 5 : 1;
}

// NOTE: kScaleMode comes last with the original behaviour as its default, so specializations named before it
// existed still instantiate.
template <typename InT, int GROUP_SIZE, bool kUE8M0, ScaleLayout kLayout, int kNumWarps, int kPasses,
          ScaleMode kScaleMode = ScaleMode::Multiply>
__global__ void __launch_bounds__(kNumWarps * 32, (per_token_cast_min_blocks<InT, GROUP_SIZE>()))
smxx_per_token_cast_impl(const InT* __restrict__ x, uint8_t* __restrict__ q, void* __restrict__ scales,
                         uint32_t shape_m, uint32_t shape_k, uint32_t x_row_stride, uint32_t scale_stride,
                         float amax_clamp) {
    // Static checks and types. NOTE: packed UE8M0 scales of 4 groups share a word; the block's warps take 4
    // neighbouring groups (common/token_group_tile.cuh), so the block stages its scale bytes in shared memory
    // and writes whole words rather than scattering single bytes into words that other blocks complete.
    // NOTE: 16 elements a thread (two bf16 vectors, four fp32 ones) rather than one vector halve or quarter the
    // per-group work per element (the amax shuffles, the scale's division and Divide's reciprocal), as much of a
    // thread's instructions as the elements' own; kPasses counts loads, so the bytes in flight stay the same.
    constexpr int kVec = 16 / sizeof(InT);
    constexpr int kThreadElements = GROUP_SIZE < 16 ? GROUP_SIZE : 16;
    constexpr int kLoads = kThreadElements / kVec;
    constexpr int kTilePasses = kPasses * kVec / kThreadElements;
    constexpr bool kPacked = kLayout == ScaleLayout::MNMajorPackedUE8M0;
    constexpr int kGroupsPerBlock = kPacked ? 4 : 1;
    using Tile = TokenGroupTile<GROUP_SIZE, kThreadElements, kNumWarps, kTilePasses, kGroupsPerBlock>;
    using Vector = uint4;
    DK_STATIC_ASSERT(kThreadElements % kVec == 0 && kPasses * kVec % kThreadElements == 0,
                     "a thread's elements are whole loads, and the loads whole tile passes");
    DK_STATIC_ASSERT(!kPacked || kUE8M0, "packed scales are UE8M0");
    DK_STATIC_ASSERT(!kPacked || Tile::kBlockRowsPerGroup <= Tile::kNumThreads, "a thread per scale word of the block");

    // Loads first: kPasses independent 16-byte loads per thread. With packed scales the last block column
    // may reach past K by whole groups; their warps store no codes and stage zero bytes (the word's padding).
    // NOTE: loads clamp the row to M - 1 and a padding group to the last group, so they need no predicate
    // and no zero fill (which cost two byte permutes per bf16 element); what they read there is never stored.
    const Tile tile;
    const uint32_t num_groups = shape_k / GROUP_SIZE;
    const bool group_valid = tile.group < num_groups;
    const uint32_t load_column = group_valid ? tile.column : tile.column - (tile.group - (num_groups - 1)) * GROUP_SIZE;
    Vector loaded[kTilePasses][kLoads];
    #pragma unroll
    for (int pass = 0; pass < kTilePasses; ++pass) {
        const uint32_t row = min(tile.row(pass), shape_m - 1);
        const auto* vectors = reinterpret_cast<const Vector*>(x + static_cast<uint64_t>(row) * x_row_stride + load_column);
        #pragma unroll
        for (int i = 0; i < kLoads; ++i)
            loaded[pass][i] = __ldg(vectors + i);
    }

    // Per pass: group amax, scale, cast, store
    __shared__ uint32_t staged_words[kPacked ? Tile::kBlockRowsPerGroup : 1];
    #pragma unroll
    for (int pass = 0; pass < kTilePasses; ++pass) {
        const uint32_t row = tile.row(pass);
        // NOTE: amax from the loaded vectors (bf16 on the packed pairs) and the values unpacked after: the scale's
        // IEEE division and Divide's reciprocal have slow-path calls, across which 16 unpacked values spilled under
        // a 40-register cap.
        const float amax = max_nan(Tile::group_reduce(vectors_amax<InT>(loaded[pass]), max_nan), amax_clamp);
        float values[kThreadElements];
        unpack_vectors<InT>(loaded[pass], values);
        uint8_t* dst = q + static_cast<uint64_t>(row) * shape_k + tile.column;
        if constexpr (kPacked) {
            const E4M3Scaler<kUE8M0, kScaleMode> scaler(amax);
            if (row < shape_m && group_valid) {
                uint32_t codes[kThreadElements / 4];
                scaler.quantize(values, codes);
                store_codes(dst, codes);
            }
            if (tile.is_group_leader)
                reinterpret_cast<uint8_t*>(staged_words)[(row - tile.first_block_row) * 4 + tile.group % 4] =
                    group_valid ? ue8m0_byte(scaler.scale) : 0;
        } else if (row < shape_m) {
            cast_group_to_e4m3<kUE8M0, kScaleMode, kLayout>(values, amax, dst, tile.is_group_leader, scales, row,
                                                            tile.group, gridDim.x, scale_stride);
        }
    }

    // Packed scales: one word per row of the block, byte g % 4 for group g
    if constexpr (kPacked) {
        __syncthreads();
        const uint32_t row = tile.first_block_row + threadIdx.x;
        if (threadIdx.x < Tile::kBlockRowsPerGroup && row < shape_m)
            static_cast<uint32_t*>(scales)[static_cast<uint64_t>(blockIdx.x / kGroupsPerBlock) * scale_stride + row] =
                staged_words[threadIdx.x];
    }
}

}  // namespace deep_kernels
