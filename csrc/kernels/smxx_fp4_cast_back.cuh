// Per-token-group FP4 cast-back (dequantize): codes [M, K / 2] (e2m1, element 2i in the low nibble) with one
// scale byte per row and group (MX: UE8M0 per 32, NV: E4M3 per 16 times the FP32 global scale; any
// Fp4ScaleLayout of the format) -> y [M, K] bf16 or fp32, y = RNE(e2m1 * scale) with scale as the cast uses it.
// Memory-bound: a lane writes one 16-byte vector per pass (8 bf16 or 4 fp32 from 4 or 2 bytes of codes), so each
// warp store is 512 contiguous bytes of one row; kPasses rows' codes and scales are loaded first. No shared memory.
// NOTE: a lane's 16 bytes of output are one vector, not two: two vectors 32 bytes apart per lane would make every
// warp store write half sectors, twice the L2 write requests for the same bytes.
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
    constexpr int kVec = 16 / sizeof(OutT);
    constexpr int GROUP_SIZE = kFp4GroupSize<kFormat>;
    using Tile = TokenGroupTile<32 * kVec, kVec, kNumWarps, kPasses>;
    DK_STATIC_ASSERT(GROUP_SIZE % kVec == 0, "a lane's elements share one scale");

    // Loads first: codes and scale bytes of every pass
    // NOTE: the addresses advance by one pass's rows outside the bounds checks, so the checks predicate the loads
    // and stores rather than branch around address arithmetic.
    const Tile tile;
    const uint32_t num_groups = shape_k / GROUP_SIZE, group = tile.column / GROUP_SIZE;
    const bool column_in_bounds = tile.column < shape_k;
    const uint8_t* src = codes + static_cast<uint64_t>(tile.row(0)) * (shape_k / 2) + tile.column / 2;
    auto* dst = reinterpret_cast<uint4*>(y + static_cast<uint64_t>(tile.row(0)) * shape_k + tile.column);
    const uint32_t src_pass_bytes = Tile::kRowsPerPass * (shape_k / 2);
    const uint32_t dst_pass_vectors = Tile::kRowsPerPass * (shape_k / kVec);
    uint32_t words[kPasses];
    uint8_t scale_bytes[kPasses];
    #pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
        const uint32_t row = tile.row(pass);
        const uint8_t* scale = scales + fp4_scale_offset<kLayout>(row, group, num_groups, scale_stride);
        if (row < shape_m && column_in_bounds) {
            if constexpr (kVec == 8)
                words[pass] = __ldg(reinterpret_cast<const uint32_t*>(src));
            else
                words[pass] = __ldg(reinterpret_cast<const unsigned short*>(src));
            scale_bytes[pass] = __ldg(scale);
        }
        src += src_pass_bytes;
    }
    const float global = kFormat == Fp4Format::NV ? __ldg(global_scale) : 1.0f;

    // Dequantize and store
    #pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
        const float scale = kFormat == Fp4Format::MX ? e8m0_to_float(scale_bytes[pass])
                                                     : e4m3_to_float(scale_bytes[pass]) * global;
        float values[8];
        e2m1x8_to_float(words[pass], values);
        alignas(16) OutT out[kVec];
        #pragma unroll
        for (int i = 0; i < kVec; ++i)
            out[i] = static_cast<OutT>(values[i] * scale);
        if (tile.row(pass) < shape_m && column_in_bounds)
            *dst = *reinterpret_cast<const uint4*>(out);
        dst += dst_pass_vectors;
    }
}

}  // namespace deep_kernels
