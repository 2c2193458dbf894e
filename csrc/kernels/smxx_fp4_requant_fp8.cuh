// MXFP4 -> FP8 requantization: codes [M, K / 2] (e2m1) with UE8M0 scales per 1x32 group (row-major bytes or
// packed int32 MN-major) -> q [M, K] float8_e4m3fn with power-of-two scales per 1x128 group (any ScaleLayout).
// Exactly the FP8 UE8M0 cast (smxx_per_token_cast with kUE8M0) of the dequantized values e2m1 * 2^(e - 127),
// which are exact in FP32, so every code is exact in e4m3 when its 32-group's scale is within 2^14 of the
// 128-group's largest (see deep_kernels/quant/fp4.py). A thread decodes one 32-group: 16 bytes of codes.
#pragma once

#include <cstdint>

#include "common/fp4.cuh"
#include "common/macros.cuh"
#include "common/quant.cuh"
#include "common/token_group_tile.cuh"
#include "common/types.cuh"

namespace deep_kernels {

template <int kNumWarps, int kPasses, Fp4ScaleLayout kInLayout, ScaleLayout kOutLayout>
__global__ void __launch_bounds__(kNumWarps * 32)
smxx_fp4_requant_fp8_impl(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ in_scales,
                          uint8_t* __restrict__ q, void* __restrict__ out_scales, uint32_t shape_m,
                          uint32_t shape_k, uint32_t in_scale_stride, uint32_t out_scale_stride, float amax_clamp) {
    // Static checks and types
    constexpr int kVec = kFp4GroupSize<Fp4Format::MX>;
    constexpr int GROUP_SIZE = 128;
    using Tile = TokenGroupTile<GROUP_SIZE, kVec, kNumWarps, kPasses>;
    DK_STATIC_ASSERT(kInLayout != Fp4ScaleLayout::Swizzled128x4, "MXFP4 scales are row-major or packed");

    // Loads first: one 32-group's codes and scale byte per thread and pass
    const Tile tile;
    const uint32_t num_in_groups = shape_k / kVec, in_group = tile.column / kVec;
    uint4 words[kPasses];
    uint8_t scale_bytes[kPasses];
    #pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
        const uint32_t row = tile.row(pass);
        words[pass] = make_uint4(0, 0, 0, 0);
        scale_bytes[pass] = 0;
        if (row < shape_m) {
            words[pass] = __ldg(reinterpret_cast<const uint4*>(codes + (static_cast<uint64_t>(row) * shape_k + tile.column) / 2));
            scale_bytes[pass] = __ldg(in_scales + fp4_scale_offset<kInLayout>(row, in_group, num_in_groups, in_scale_stride));
        }
    }

    // Per pass: dequantize, 128-group amax, FP8 scale, cast, store
    #pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
        const uint32_t row = tile.row(pass);
        const uint32_t packed[4] = {words[pass].x, words[pass].y, words[pass].z, words[pass].w};
        const float scale = e8m0_to_float(scale_bytes[pass]);
        float values[kVec];
        float amax = 0.0f;
        #pragma unroll
        for (int i = 0; i < kVec; ++i) {
            values[i] = e2m1_value(packed[i / 8] >> (4 * (i % 8))) * scale;
            amax = max_nan(amax, fabsf(values[i]));
        }
        amax = max_nan(Tile::group_reduce(amax, max_nan), amax_clamp);
        if (row >= shape_m)
            continue;

        cast_group_to_e4m3<true, ScaleMode::Multiply, kOutLayout>(
            values, amax, q + static_cast<uint64_t>(row) * shape_k + tile.column, tile.is_group_leader, out_scales, row,
            blockIdx.x, gridDim.x, out_scale_stride);
    }
}

}  // namespace deep_kernels
