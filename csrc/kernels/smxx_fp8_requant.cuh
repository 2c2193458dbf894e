// FP8 requantization, 128 x 128 blocks -> 1 x 128 groups: q_in [M, K] float8_e4m3fn (contiguous) with FP32
// block scales [ceil(M / 128), K / 128] row-major (the per-block cast's output) -> q [M, K] float8_e4m3fn
// and one scale per row and group of 128 columns in kLayout. Defined as dequantize-then-cast: each value is
// x = float(q_in) * block_scale (FP32 product), then the per-token cast's numerics (smxx_per_token_cast.cuh)
// apply to x. The per-token cast's thread mapping with 16 codes per thread: a CTA covers exactly one
// 128-row block of one group column, so it reads a single block scale. Memory-bound, no shared memory.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "common/macros.cuh"
#include "common/quant.cuh"
#include "common/token_group_tile.cuh"
#include "common/types.cuh"

namespace deep_kernels {

template <bool kUE8M0, ScaleLayout kLayout, int kNumWarps, int kPasses, ScaleMode kScaleMode>
__global__ void __launch_bounds__(kNumWarps * 32)
smxx_fp8_requant_impl(const uint8_t* __restrict__ q_in, const float* __restrict__ block_scales,
                      uint8_t* __restrict__ q, void* __restrict__ scales, uint32_t shape_m, uint32_t shape_k,
                      uint32_t scale_stride, float amax_clamp) {
    // Static checks and types
    constexpr int BLOCK_SIZE = 128;
    constexpr int kVec = 16;
    using Tile = TokenGroupTile<BLOCK_SIZE, kVec, kNumWarps, kPasses>;
    DK_STATIC_ASSERT(Tile::BLOCK_ROWS == BLOCK_SIZE, "a CTA covers one block's rows");
    DK_STATIC_ASSERT(kLayout != ScaleLayout::MNMajorPackedUE8M0 || kUE8M0, "packed scales are UE8M0");

    // Loads first: kPasses independent 16-byte loads per thread, and the CTA's block scale
    const Tile tile;
    const float block_scale = __ldg(block_scales + blockIdx.y * gridDim.x + blockIdx.x);
    uint4 loaded[kPasses] = {};
    #pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
        const uint32_t row = tile.row(pass);
        if (row < shape_m)
            loaded[pass] = __ldg(reinterpret_cast<const uint4*>(q_in + static_cast<uint64_t>(row) * shape_k + tile.column));
    }

    // Per pass: dequantize, group amax, cast, store
    #pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
        const uint32_t row = tile.row(pass);
        const auto* codes = reinterpret_cast<const __nv_fp8_e4m3*>(&loaded[pass]);
        float values[kVec];
        float amax = 0.0f;
        #pragma unroll
        for (int i = 0; i < kVec; ++i) {
            values[i] = static_cast<float>(codes[i]) * block_scale;
            amax = max_nan(amax, fabsf(values[i]));
        }
        amax = max_nan(Tile::group_reduce(amax, max_nan), amax_clamp);
        if (row < shape_m)
            cast_group_to_e4m3<kUE8M0, kScaleMode, kLayout>(
                values, amax, q + static_cast<uint64_t>(row) * shape_k + tile.column, tile.is_group_leader, scales,
                row, blockIdx.x, gridDim.x, scale_stride);
    }
}

}  // namespace deep_kernels
