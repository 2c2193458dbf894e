// Per-token-group FP8 cast: x [M, K] (bf16 or fp32, row stride >= K) -> q [M, K] float8_e4m3fn and one
// scale per row and group of GROUP_SIZE columns.
//   amax = max |x| over the group (NaN propagates), clamped below by amax_clamp
//   scale = amax / 448; q = RNE(x * (448 / amax)) with both divisions IEEE-exact
//   kUE8M0: scale = the smallest power of two >= amax / 448, q = RNE(x * (1 / scale)), so nothing saturates
// Scales go to the layout the FP8 GEMM reads (common/types.cuh). Memory-bound: no shared memory, each
// thread streams 16-byte vectors with kPasses loads in flight. Groups wider than 32 x 16 bytes are
// not supported (the host checks).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/macros.cuh"
#include "common/quant.cuh"
#include "common/token_group_tile.cuh"
#include "common/types.cuh"

namespace deep_kernels {

template <typename InT, int GROUP_SIZE, bool kUE8M0, ScaleLayout kLayout, int kNumWarps, int kPasses>
__global__ void __launch_bounds__(kNumWarps * 32)
smxx_per_token_cast_impl(const InT* __restrict__ x, uint8_t* __restrict__ q, void* __restrict__ scales,
                         uint32_t shape_m, uint32_t shape_k, uint32_t x_row_stride, uint32_t scale_stride,
                         float amax_clamp) {
    // Static checks and types
    constexpr int kVec = 16 / sizeof(InT);
    using Tile = TokenGroupTile<GROUP_SIZE, kVec, kNumWarps, kPasses>;
    using Vector = uint4;
    DK_STATIC_ASSERT(kLayout != ScaleLayout::MNMajorPackedUE8M0 || kUE8M0, "packed scales are UE8M0");

    // Loads first: kPasses independent 16-byte loads per thread
    const Tile tile;
    Vector loaded[kPasses] = {};
    #pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
        const uint32_t row = tile.row(pass);
        if (row < shape_m)
            loaded[pass] = __ldg(reinterpret_cast<const Vector*>(x + static_cast<uint64_t>(row) * x_row_stride + tile.column));
    }

    // Per pass: group amax, scale, cast, store
    #pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
        const uint32_t row = tile.row(pass);
        const InT* elements = reinterpret_cast<const InT*>(&loaded[pass]);
        float values[kVec];
        float amax = 0.0f;
        #pragma unroll
        for (int i = 0; i < kVec; ++i) {
            values[i] = static_cast<float>(elements[i]);
            amax = max_nan(amax, fabsf(values[i]));
        }
        amax = max_nan(Tile::group_reduce(amax, max_nan), amax_clamp);
        if (row >= shape_m)
            continue;

        float scale, multiplier;
        if constexpr (kUE8M0) {
            scale = ceil_to_power_of_two(__fdiv_rn(amax, kE4M3Max));
            multiplier = __frcp_rn(scale);
        } else {
            scale = __fdiv_rn(amax, kE4M3Max);
            multiplier = __fdiv_rn(kE4M3Max, amax);
        }

        uint8_t codes[kVec];
        #pragma unroll
        for (int i = 0; i < kVec; i += 2) {
            const auto pair = __nv_cvt_float2_to_fp8x2(make_float2(values[i] * multiplier, values[i + 1] * multiplier),
                                                       __NV_SATFINITE, __NV_E4M3);
            codes[i] = static_cast<uint8_t>(pair & 0xffu);
            codes[i + 1] = static_cast<uint8_t>(pair >> 8);
        }
        uint8_t* q_row = q + static_cast<uint64_t>(row) * shape_k + tile.column;
        if constexpr (kVec == 8)
            *reinterpret_cast<uint2*>(q_row) = *reinterpret_cast<const uint2*>(codes);
        else
            *reinterpret_cast<uint32_t*>(q_row) = *reinterpret_cast<const uint32_t*>(codes);

        if (tile.is_group_leader) {
            const uint32_t group = blockIdx.x;
            const uint64_t offset = scale_offset<kLayout>(row, group, scale_stride);
            if constexpr (kLayout == ScaleLayout::MNMajorPackedUE8M0) {
                uint8_t* bytes = static_cast<uint8_t*>(scales);
                bytes[offset] = ue8m0_byte(scale);
                // NOTE: the last group also zeroes the unused bytes of its int32, so the packed word is
                // fully defined without a memset launch.
                if (group + 1 == gridDim.x)
                    for (uint32_t pad = group % 4 + 1; pad < 4; ++pad)
                        bytes[offset - group % 4 + pad] = 0;
            } else {
                static_cast<float*>(scales)[offset] = scale;
            }
        }
    }
}

}  // namespace deep_kernels
