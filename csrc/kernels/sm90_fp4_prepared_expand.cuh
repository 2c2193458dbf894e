// Expands MXFP4 weights in prepare_fp4_weights's layout (gemm/fp4_prepared.cuh) to e4m3 q [N, K] (row-major) with
// power-of-two scales, for the FP8 GEMM at prefill sizes:
//   kBlockScaled: one scale per 128 x 128 block, 2^(E - 133) with E the largest sub-block exponent of the block's
//     (up to) 128 rows; a code of a sub-block with exponent e becomes e2m1 * 2^(6 - (E - e)) in e4m3, the shift
//     E - e taken as the row's table offset plus E - e_max (clamped to 31, as the tables end). Exact where every
//     shift is at most 14 (prepare_fp4_weights checks that); scales FP32 [ceil(N / 128), K / 128] row-major.
//   otherwise: one scale per row and 128 columns, 2^(e_max - 133), the shifts as the decode kernel takes them (the
//     Fp8Mxfp4 numerics); scales FP32 MN-major, element (row, K block) at K block * scale_stride + row.
// One CTA of 256 threads per 128-row block and K block: thread t reads tile 2 * blockIdx.y + t / 128's chunk as the
// decode kernel's math thread t % 128 does (two 16-byte loads of codes, one 8-byte load of its rows' scale words)
// and stores its rows' bytes as 4-byte words. Rows past N are not stored.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "common/fp4.cuh"
#include "common/macros.cuh"
#include "gemm/fp4_prepared.cuh"

namespace deep_kernels {

template <bool kBlockScaled>
__global__ void __launch_bounds__(256)
sm90_fp4_prepared_expand_impl(const uint8_t* __restrict__ prepared, uint8_t* __restrict__ q,
                              float* __restrict__ scales, uint32_t shape_n, uint32_t shape_k, uint32_t scale_stride) {
    using namespace fp4_prepared;
    constexpr uint32_t kNumTables = 32;
    __shared__ uint2 tables[kNumTables];
    __shared__ uint32_t warp_max[8];

    const uint32_t num_k_blocks = shape_k / 128;
    const uint32_t num_tiles = (shape_n + kPreparedTileRows - 1) / kPreparedTileRows;
    const uint32_t k_block = blockIdx.x;
    const uint32_t tile = 2 * blockIdx.y + threadIdx.x / 128;
    const uint32_t thread = threadIdx.x % 128, warp = thread / 32, lane = thread % 32, g = lane / 4, quad = lane % 4;
    const bool has_tile = tile < num_tiles;

    uint4 codes[2] = {};
    uint2 words = {};
    if (has_tile) {
        const uint8_t* chunk = prepared + (static_cast<uint64_t>(tile) * num_k_blocks + k_block) * kPreparedChunkBytes;
        codes[0] = __ldg(reinterpret_cast<const uint4*>(chunk + thread * 16));
        codes[1] = __ldg(reinterpret_cast<const uint4*>(chunk + kPreparedCodesBytes / 2 + thread * 16));
        words = __ldg(reinterpret_cast<const uint2*>(chunk + kPreparedCodesBytes + (warp * 8 + g) * 8));
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
    const uint32_t scale_words[2] = {words.x, words.y};
    const uint32_t e_max[2] = {prepared_max_exponent(words.x), prepared_max_exponent(words.y)};

    // The block exponent (block-scaled): rows past N (zero words) give 0, below every real one.
    uint32_t block_exponent = 0;
    if constexpr (kBlockScaled) {
        const uint32_t warp_value = __reduce_max_sync(0xffffffffu, max(e_max[0], e_max[1]));
        if (lane == 0)
            warp_max[threadIdx.x / 32] = warp_value;
    }
    __syncthreads();
    if constexpr (kBlockScaled) {
#pragma unroll
        for (uint32_t i = 0; i < 8; ++i)
            block_exponent = max(block_exponent, warp_max[i]);
        if (threadIdx.x == 0)
            scales[blockIdx.y * num_k_blocks + k_block] = e8m0_to_float(static_cast<uint8_t>(block_exponent)) * 0x1p-6f;
    }
    if (!has_tile)
        return;

#pragma unroll
    for (uint32_t h = 0; h < 2; ++h) {
        const uint32_t row = tile * kPreparedTileRows + warp * 16 + h * 8 + g;
        if (row >= shape_n)
            continue;
        const uint32_t extra_shift = kBlockScaled ? block_exponent - e_max[h] : 0;
        uint8_t* q_row = q + static_cast<uint64_t>(row) * shape_k + k_block * 128 + quad * 4;
        const uint32_t codes_of_h[4] = {h ? codes[1].x : codes[0].x, h ? codes[1].y : codes[0].y,
                                        h ? codes[1].z : codes[0].z, h ? codes[1].w : codes[0].w};
#pragma unroll
        for (uint32_t s = 0; s < 4; ++s) {
            const uint32_t shift = min(((scale_words[h] >> (8 * s + 3)) & 0x1Fu) + extra_shift, kNumTables - 1);
            const uint2 expanded = expand_prepared_e2m1x8(codes_of_h[s], tables[shift]);
            *reinterpret_cast<uint32_t*>(q_row + 32 * s) = expanded.x;
            *reinterpret_cast<uint32_t*>(q_row + 32 * s + 16) = expanded.y;
        }
        if (!kBlockScaled && quad == 0)
            scales[k_block * scale_stride + row] = prepared_promotion_scale(scale_words[h]);
    }
}

}  // namespace deep_kernels
