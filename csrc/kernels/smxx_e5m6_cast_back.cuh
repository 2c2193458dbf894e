// Per-token E5M6 cast-back (dequantize): packed codes int32 [M, 3K/8] (common/e5m6.cuh's packing,
// contiguous) and FP32 scales [M] -> y [M, K] bf16 or fp32, contiguous, y = RNE(float(code) * scale).
// Memory-bound and flat over the M * K / 8 groups of 8 codes, in warp tiles of 128 groups (1536 packed bytes):
// each warp copies its kTiles tiles into shared memory (cp.async, 16 bytes a lane, every warp-wide copy 512
// contiguous bytes), then lane i decodes and stores 16-byte output vectors i, i + 32, ... of each tile, so
// every warp-wide store writes 512 contiguous bytes. The row of a group is group / (K / 8), by a multiply and
// shift (row_magic, row_shift: deep_kernels/quant/e5m6.py's row_divisor).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/e5m6.cuh"
#include "common/macros.cuh"
#include "ptx/cp_async.cuh"

namespace deep_kernels {

template <typename OutT, int kNumWarps, int kTiles>
__global__ void __launch_bounds__(kNumWarps * 32)
smxx_e5m6_cast_back_impl(const uint32_t* __restrict__ packed, const float* __restrict__ scales,
                         OutT* __restrict__ y, uint32_t num_groups, uint32_t row_magic, uint32_t row_shift) {
    // Static checks and types
    constexpr int kTileGroups = 128;
    constexpr int kTileWords = kTileGroups * kE5M6GroupWords;
    constexpr int kCopiesPerLane = kTileWords / 4 / 32;
    constexpr int kVectorCodes = 16 / sizeof(OutT);  // codes per output vector: 8 (a group) or 4 (half a group)
    constexpr int kGroupVectors = kE5M6PerGroup / kVectorCodes;
    constexpr int kVectorsPerLane = kTileGroups * kGroupVectors / 32;
    DK_STATIC_ASSERT(kVectorCodes == 8 || kVectorCodes == 4, "bf16 or fp32 outputs");

    // Shared memory: each warp's tiles of packed words
    __shared__ __align__(16) uint32_t smem_words[kNumWarps][kTiles][kTileWords];
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint32_t first_tile = (blockIdx.x * kNumWarps + warp) * kTiles;
    // The packed words as 16-byte vectors (fewer than 2^32): full_vectors whole ones, then tail_words words
    const uint64_t num_words = static_cast<uint64_t>(num_groups) * kE5M6GroupWords;
    const uint32_t full_vectors = static_cast<uint32_t>(num_words / 4), tail_words = num_words % 4;

    // Copies of every tile's words: words past the end are zero-filled, never read
    #pragma unroll
    for (int t = 0; t < kTiles; ++t) {
        #pragma unroll
        for (int c = 0; c < kCopiesPerLane; ++c) {
            const uint32_t tile_vector = c * 32 + lane;
            const uint32_t vector = (first_tile + t) * (kTileWords / 4) + tile_vector;
            const uint32_t valid_words = vector < full_vectors ? 4 : (vector == full_vectors ? tail_words : 0);
            const uint32_t* src = packed + static_cast<uint64_t>(min(vector, full_vectors)) * 4;
            ptx::cp_async_16(&smem_words[warp][t][tile_vector * 4], src, valid_words * 4);
        }
    }

    // The scale of each output vector, loaded while the copies are in flight (past the end: the last group's)
    float vector_scales[kTiles][kVectorsPerLane];
    #pragma unroll
    for (int t = 0; t < kTiles; ++t) {
        #pragma unroll
        for (int j = 0; j < kVectorsPerLane; ++j) {
            const uint32_t vector = j * 32 + lane;
            const uint32_t group = min((first_tile + t) * kTileGroups + vector * kVectorCodes / kE5M6PerGroup,
                                       num_groups - 1);
            const uint32_t row = static_cast<uint32_t>((static_cast<uint64_t>(group) * row_magic) >> row_shift);
            vector_scales[t][j] = __ldg(scales + row);
        }
    }
    ptx::cp_async_wait_all();
    __syncwarp();

    // Decode, scale and store, vector by vector (vectors past the end decode zero-filled words, not stored)
    // NOTE: no early exit at the end: ptxas would sink the scale loads into the branches, after the copies.
    #pragma unroll
    for (int t = 0; t < kTiles; ++t) {
        #pragma unroll
        for (int j = 0; j < kVectorsPerLane; ++j) {
            const uint32_t vector = j * 32 + lane;
            const uint32_t first_code = vector * kVectorCodes;
            const uint32_t first_group = (first_tile + t) * kTileGroups;
            uint32_t codes[kVectorCodes];
            if constexpr (kVectorCodes == 8) {
                const uint32_t* words = &smem_words[warp][t][vector * kE5M6GroupWords];
                unpack_e5m6({words[0], words[1], words[2]}, codes);
            } else {
                // Half h of a group is its 48 bits from bit 48h: 2 words from word 3h / 2, shifted by 16 for odd h.
                const uint32_t* words = &smem_words[warp][t][vector * 3 / 2];
                const uint32_t shift = vector % 2 * 16;
                const uint32_t low = __funnelshift_r(words[0], words[1], shift), high = words[1] >> shift;
                codes[0] = low & 0xfffu;
                codes[1] = (low >> 12) & 0xfffu;
                codes[2] = ((low >> 24) | (high << 8)) & 0xfffu;
                codes[3] = (high >> 4) & 0xfffu;
            }
            uint32_t out[4];
            #pragma unroll
            for (int w = 0; w < 4; ++w) {
                if constexpr (kVectorCodes == 8) {
                    const float scale = vector_scales[t][j];
                    const __nv_bfloat162 pair = __floats2bfloat162_rn(e5m6_to_float(codes[2 * w]) * scale,
                                                                      e5m6_to_float(codes[2 * w + 1]) * scale);
                    out[w] = *reinterpret_cast<const uint32_t*>(&pair);
                } else {
                    out[w] = __float_as_uint(e5m6_to_float(codes[w]) * vector_scales[t][j]);
                }
            }
            if (first_group + first_code / kE5M6PerGroup < num_groups)
                reinterpret_cast<uint4*>(y)[static_cast<uint64_t>(first_group) * kGroupVectors + vector] =
                    make_uint4(out[0], out[1], out[2], out[3]);
        }
    }
}

}  // namespace deep_kernels
