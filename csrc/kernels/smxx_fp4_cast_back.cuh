// Per-token-group FP4 cast-back (dequantize): codes [M, K / 2] (e2m1, element 2i in the low nibble) with one
// scale byte per row and group (MX: UE8M0 per 32, NV: E4M3 per 16 times the FP32 global scale; any
// Fp4ScaleLayout of the format) -> y [M, K] bf16 or fp32, y = RNE(e2m1 * scale) with scale as the cast uses it.
// Memory-bound: a warp streams one row's 32 x 8 bytes of codes (16 elements a thread, kPasses in flight) and
// writes 16-byte vectors; no shared memory.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/fp4.cuh"
#include "common/macros.cuh"
#include "common/token_group_tile.cuh"

namespace deep_kernels {

template <typename OutT, int kNumWarps, int kPasses, Fp4Format kFormat, Fp4ScaleLayout kLayout>
__global__ void __launch_bounds__(kNumWarps * 32)
smxx_fp4_cast_back_impl(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales,
                        const float* __restrict__ global_scale, OutT* __restrict__ y, uint32_t shape_m,
                        uint32_t shape_k, uint32_t scale_stride) {
    // Types
    constexpr int kVec = 16;
    constexpr int GROUP_SIZE = kFp4GroupSize<kFormat>;
    using Tile = TokenGroupTile<32 * kVec, kVec, kNumWarps, kPasses>;
    DK_STATIC_ASSERT(GROUP_SIZE % kVec == 0, "a thread's elements share one scale");

    // Loads first: codes and scale bytes of every pass
    const Tile tile;
    const uint32_t num_groups = shape_k / GROUP_SIZE, group = tile.column / GROUP_SIZE;
    const bool column_in_bounds = tile.column < shape_k;
    uint2 words[kPasses];
    uint8_t scale_bytes[kPasses];
    #pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
        const uint32_t row = tile.row(pass);
        if (row < shape_m && column_in_bounds) {
            words[pass] = __ldg(reinterpret_cast<const uint2*>(codes + (static_cast<uint64_t>(row) * shape_k + tile.column) / 2));
            scale_bytes[pass] = __ldg(scales + fp4_scale_offset<kLayout>(row, group, num_groups, scale_stride));
        }
    }
    const float global = kFormat == Fp4Format::NV ? __ldg(global_scale) : 1.0f;

    // Dequantize and store
    #pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
        const uint32_t row = tile.row(pass);
        if (row >= shape_m || !column_in_bounds)
            continue;
        const float scale = kFormat == Fp4Format::MX ? e8m0_to_float(scale_bytes[pass])
                                                     : e4m3_to_float(scale_bytes[pass]) * global;
        const uint32_t packed[2] = {words[pass].x, words[pass].y};
        alignas(16) OutT out[kVec];
        #pragma unroll
        for (int i = 0; i < kVec; ++i)
            out[i] = static_cast<OutT>(e2m1_value(packed[i / 8] >> (4 * (i % 8))) * scale);
        auto* y_row = reinterpret_cast<uint4*>(y + static_cast<uint64_t>(row) * shape_k + tile.column);
        #pragma unroll
        for (int i = 0; i < static_cast<int>(sizeof(out) / sizeof(uint4)); ++i)
            y_row[i] = reinterpret_cast<const uint4*>(out)[i];
    }
}

}  // namespace deep_kernels
