// Per-token-group FP8 cast: x [M, K] (bf16 or fp32, row stride >= K) -> q [M, K] float8_e4m3fn and one
// scale per row and group of GROUP_SIZE columns.
//   amax = max |x| over the group (NaN propagates), clamped below by amax_clamp
//   scale = amax / 448; q = RNE(x * (448 / amax)) with both divisions IEEE-exact, or with
//   ScaleMode::Divide q = RNE(x / scale)
//   kUE8M0: scale = the smallest power of two >= amax / 448, q = RNE(x * (1 / scale)), so nothing saturates
// Scales go to the layout the FP8 GEMM reads (common/types.cuh). Memory-bound: no shared memory, each
// thread streams 16-byte vectors with kPasses loads in flight. Groups wider than 32 x 16 bytes are
// not supported (the host checks; one group per row of any width is smxx_per_row_cast.cuh's).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/macros.cuh"
#include "common/quant.cuh"
#include "common/token_group_tile.cuh"
#include "common/types.cuh"

namespace deep_kernels {

// NOTE: kScaleMode comes last with the original behaviour as its default, so specializations named before it
// existed still instantiate.
template <typename InT, int GROUP_SIZE, bool kUE8M0, ScaleLayout kLayout, int kNumWarps, int kPasses,
          ScaleMode kScaleMode = ScaleMode::Multiply>
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
        float values[kVec];
        const float amax = max_nan(Tile::group_reduce(unpack_vector<InT>(loaded[pass], values), max_nan), amax_clamp);
        if (row < shape_m)
            cast_group_to_e4m3<kUE8M0, kScaleMode, kLayout>(
                values, amax, q + static_cast<uint64_t>(row) * shape_k + tile.column, tile.is_group_leader, scales,
                row, blockIdx.x, gridDim.x, scale_stride);
    }
}

}  // namespace deep_kernels
