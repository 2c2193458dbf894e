// Per-token-group FP8 cast-back (dequantize): q [M, K] float8_e4m3fn with one scale per row and group of
// GROUP_SIZE columns (any ScaleLayout) -> y [M, K] bf16 or fp32, y = RNE(float(q) * scale).
// Memory-bound: each thread loads 8 codes (8 bytes) and stores 8 outputs per pass; no shared memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/macros.cuh"
#include "common/quant.cuh"
#include "common/token_group_tile.cuh"
#include "common/types.cuh"

namespace deep_kernels {

// NOTE: 32 registers, so the SM holds its 2048 threads (64 KB of codes in flight) rather than 1536.
template <typename OutT, int GROUP_SIZE, ScaleLayout kLayout, int kNumWarps, int kPasses>
__global__ void __launch_bounds__(kNumWarps * 32, 2048 / (kNumWarps * 32))
smxx_per_token_cast_back_impl(const uint8_t* __restrict__ q, const void* __restrict__ scales, OutT* __restrict__ y,
                              uint32_t shape_m, uint32_t shape_k, uint32_t scale_stride) {
    // Types
    constexpr int kVec = 8;
    using Tile = TokenGroupTile<GROUP_SIZE, kVec, kNumWarps, kPasses>;

    // Loads first: codes and scales of every pass.
    // NOTE: rows past M load row M - 1 (never stored), so the loads need no predicate.
    const Tile tile;
    uint2 codes[kPasses];
    float scale[kPasses];
    #pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
        const uint32_t row = min(tile.row(pass), shape_m - 1);
        codes[pass] = __ldg(reinterpret_cast<const uint2*>(q + static_cast<uint64_t>(row) * shape_k + tile.column));
        const uint64_t offset = scale_offset<kLayout>(row, blockIdx.x, scale_stride);
        if constexpr (kLayout == ScaleLayout::MNMajorPackedUE8M0)
            scale[pass] = ue8m0_to_float(__ldg(static_cast<const uint8_t*>(scales) + offset));
        else
            scale[pass] = __ldg(static_cast<const float*>(scales) + offset);
    }

    // Dequantize and store
    #pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
        const uint32_t row = tile.row(pass);
        if (row >= shape_m)
            continue;
        const auto* fp8 = reinterpret_cast<const __nv_fp8_e4m3*>(&codes[pass]);
        alignas(16) OutT out[kVec];
        #pragma unroll
        for (int i = 0; i < kVec; ++i)
            out[i] = static_cast<OutT>(static_cast<float>(fp8[i]) * scale[pass]);
        auto* y_row = reinterpret_cast<uint4*>(y + static_cast<uint64_t>(row) * shape_k + tile.column);
        #pragma unroll
        for (int i = 0; i < static_cast<int>(sizeof(out) / sizeof(uint4)); ++i)
            y_row[i] = reinterpret_cast<const uint4*>(out)[i];
    }
}

}  // namespace deep_kernels
