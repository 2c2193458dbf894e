// Expands MXFP4 weights in prepare_fp4_weights's layout (gemm/fp4_prepared.cuh) to e4m3 q [N, K] (row-major) with
// power-of-two scales, for the FP8 GEMM at prefill sizes:
//   kBlockScaled: one scale per 128 x 128 block, 2^(E - 133) with E the largest sub-block exponent of the block's
//     (up to) 128 rows; a code of a sub-block with exponent e becomes e2m1 * 2^(6 - (E - e)) in e4m3, the shift
//     E - e taken as the row's table offset plus E - e_max (clamped to 31, as the tables end). Exact where every
//     shift is at most 14 (prepare_fp4_weights checks that); scales FP32 [ceil(N / 128), K / 128] row-major.
//   otherwise: one scale per row and 128 columns, 2^(e_max - 133), the shifts as the decode kernel takes them (the
//     Fp8Mxfp4 numerics); scales FP32 MN-major, element (row, K block) at K block * scale_stride + row.
// kTileScaled: the chunks' words are the tile-scaled ones (gemm/fp4_prepared.cuh): E and the shifts read from them.
// One CTA of 256 threads per 128-row block and kKBlocksPerCta K blocks: thread t reads tile 2 * blockIdx.y + t / 128's
// chunks as the decode kernel's math thread t % 128 does (two 16-byte loads of codes, one 8-byte load of its rows'
// scale words; every K block's loads issued first), expands them into a shared-memory copy of the 128 x 128 block
// (16-byte chunks swizzled by row % 8), and the CTA stores the block's rows as 16-byte words, four rows a warp
// instruction. Rows past N are not stored.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "common/fp4.cuh"
#include "common/macros.cuh"
#include "gemm/fp4_prepared.cuh"

namespace deep_kernels {

namespace sm90_fp4_prepared_expand_detail {

constexpr uint32_t kNumThreads = 256;
constexpr uint32_t kKBlocksPerCta = 4;
constexpr uint32_t kNumTables = 32;

// Byte offset of row `row`'s 16-byte chunk `chunk` in the shared copy of a 128 x 128 block.
DK_DEVICE uint32_t staged_offset(uint32_t row, uint32_t chunk) {
    return row * 128 + ((chunk ^ (row % 8)) * 16);
}

// A word's block exponent: the row's, or (kTileScaled) the tile's.
template <bool kTileScaled>
DK_DEVICE uint32_t max_exponent_of(uint32_t word) {
    return kTileScaled ? fp4_prepared::tile_max_exponent(word) : fp4_prepared::prepared_max_exponent(word);
}

}  // namespace sm90_fp4_prepared_expand_detail

template <bool kBlockScaled, bool kTileScaled>
__global__ void __launch_bounds__(256)
sm90_fp4_prepared_expand_impl(const uint8_t* __restrict__ prepared, uint8_t* __restrict__ q,
                              float* __restrict__ scales, uint32_t shape_n, uint32_t shape_k, uint32_t scale_stride) {
    using namespace fp4_prepared;
    using namespace sm90_fp4_prepared_expand_detail;
    __shared__ uint2 tables[kNumTables];
    __shared__ uint32_t warp_max[kKBlocksPerCta][kNumThreads / 32];
    __shared__ __align__(16) uint8_t staged[128 * 128];

    const uint32_t num_k_blocks = shape_k / 128;
    const uint32_t num_tiles = (shape_n + kPreparedTileRows - 1) / kPreparedTileRows;
    const uint32_t first_k_block = blockIdx.x * kKBlocksPerCta;
    const uint32_t tile = 2 * blockIdx.y + threadIdx.x / 128;
    const uint32_t thread = threadIdx.x % 128, warp = thread / 32, lane = thread % 32, g = lane / 4, quad = lane % 4;
    const bool has_tile = tile < num_tiles;

    // Every K block's loads first (zeros for tiles past N and K blocks past K).
    uint4 codes[kKBlocksPerCta][2];
    uint2 words[kKBlocksPerCta];
#pragma unroll
    for (uint32_t i = 0; i < kKBlocksPerCta; ++i) {
        codes[i][0] = codes[i][1] = make_uint4(0, 0, 0, 0);
        words[i] = make_uint2(0, 0);
        if (has_tile && first_k_block + i < num_k_blocks) {
            const uint8_t* chunk =
                prepared + (static_cast<uint64_t>(tile) * num_k_blocks + first_k_block + i) * kPreparedChunkBytes;
            codes[i][0] = __ldg(reinterpret_cast<const uint4*>(chunk + thread * 16));
            codes[i][1] = __ldg(reinterpret_cast<const uint4*>(chunk + kPreparedCodesBytes / 2 + thread * 16));
            words[i] = __ldg(reinterpret_cast<const uint2*>(chunk + kPreparedCodesBytes + (warp * 8 + g) * 8));
        }
    }
    if (threadIdx.x < kNumTables) {
        uint32_t bytes[2] = {0, 0};
#pragma unroll
        for (uint32_t i = 0; i < 8; ++i) {
            const float value = ldexpf(e2m1_value(i), 6 - static_cast<int>(threadIdx.x));
            bytes[i / 4] |= static_cast<uint32_t>(__nv_cvt_float_to_fp8(value, __NV_SATFINITE, __NV_E4M3)) << (8 * (i % 4));
        }
        tables[threadIdx.x] = make_uint2(bytes[0], bytes[1]);
    }
    // The block exponents (block-scaled): rows past N (zero words) give 0 (tile-scaled: 6), below every real one.
    if constexpr (kBlockScaled) {
#pragma unroll
        for (uint32_t i = 0; i < kKBlocksPerCta; ++i) {
            const uint32_t e = max(max_exponent_of<kTileScaled>(words[i].x), max_exponent_of<kTileScaled>(words[i].y));
            const uint32_t warp_value = __reduce_max_sync(0xffffffffu, e);
            if (lane == 0)
                warp_max[i][threadIdx.x / 32] = warp_value;
        }
    }
    __syncthreads();

    const uint32_t block_first_row = blockIdx.y * 128;
    const uint32_t num_rows = min(128u, shape_n - block_first_row);
#pragma unroll
    for (uint32_t i = 0; i < kKBlocksPerCta; ++i) {
        const uint32_t k_block = first_k_block + i;
        if (k_block >= num_k_blocks)
            break;
        uint32_t block_exponent = 0;
        if constexpr (kBlockScaled) {
#pragma unroll
            for (uint32_t w = 0; w < kNumThreads / 32; ++w)
                block_exponent = max(block_exponent, warp_max[i][w]);
            if (threadIdx.x == 0)
                scales[blockIdx.y * num_k_blocks + k_block] =
                    e8m0_to_float(static_cast<uint8_t>(block_exponent)) * 0x1p-6f;
        }
        if (has_tile) {
            const uint32_t scale_words[2] = {words[i].x, words[i].y};
            const uint32_t codes_of[2][4] = {{codes[i][0].x, codes[i][0].y, codes[i][0].z, codes[i][0].w},
                                             {codes[i][1].x, codes[i][1].y, codes[i][1].z, codes[i][1].w}};
#pragma unroll
            for (uint32_t h = 0; h < 2; ++h) {
                const uint32_t row = (threadIdx.x / 128) * kPreparedTileRows + warp * 16 + h * 8 + g;  // in the block
                const uint32_t extra_shift =
                    kBlockScaled ? block_exponent - max_exponent_of<kTileScaled>(scale_words[h]) : 0;
#pragma unroll
                for (uint32_t s = 0; s < 4; ++s) {
                    const uint32_t word_shift =
                        kTileScaled ? tile_shift(scale_words[h], s) : (scale_words[h] >> (8 * s + 3)) & 0x1Fu;
                    const uint32_t shift = min(word_shift + extra_shift, kNumTables - 1);
                    const uint2 expanded = expand_prepared_e2m1x8(codes_of[h][s], tables[shift]);
                    *reinterpret_cast<uint32_t*>(staged + staged_offset(row, 2 * s) + quad * 4) = expanded.x;
                    *reinterpret_cast<uint32_t*>(staged + staged_offset(row, 2 * s + 1) + quad * 4) = expanded.y;
                }
                if (!kBlockScaled && quad == 0 && block_first_row + row < shape_n)
                    scales[k_block * scale_stride + block_first_row + row] =
                        kTileScaled ? tile_promotion_scale(scale_words[h]) : prepared_promotion_scale(scale_words[h]);
            }
        }
        __syncthreads();
        // 128 rows x 8 chunks: thread t stores chunk t % 8 of rows t / 8, t / 8 + 32, ...
#pragma unroll
        for (uint32_t r = threadIdx.x / 8; r < 128; r += kNumThreads / 8) {
            if (r < num_rows) {
                const uint4 value = *reinterpret_cast<const uint4*>(staged + staged_offset(r, threadIdx.x % 8));
                *reinterpret_cast<uint4*>(q + static_cast<uint64_t>(block_first_row + r) * shape_k + k_block * 128 +
                                          (threadIdx.x % 8) * 16) = value;
            }
        }
        __syncthreads();
    }
}

}  // namespace deep_kernels
