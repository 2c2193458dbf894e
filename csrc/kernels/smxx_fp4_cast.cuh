// Per-token-group FP4 e2m1 cast: x [M, K] (bf16 or fp32, row stride >= K) -> codes [M, K / 2] (two per byte,
// element 2i in the low nibble) and one scale byte per row and group (fp4.cuh's Fp4Scaler):
//   MX: 1x32 groups, UE8M0 scales (row-major bytes, or the packed int32 MN-major words the FP8 GEMM reads)
//   NV: 1x16 groups, E4M3 scales times the FP32 global scale read from device memory (row-major, or the
//       128x4 swizzled tiles of block-scaled GEMMs; rows past M and groups past G of the last tiles get 0)
// Memory-bound: a thread casts 16 consecutive elements per pass (2 or 4 16-byte loads, all passes' loads in
// flight first), a warp one row's 512, and writes its codes as one contiguous 256-byte run; NV tabulates the
// multipliers of the 256 scale bytes in shared memory.
// NOTE: 16 elements a thread (not one 16-byte vector) halve the per-group work (amax shuffles, scale) per code,
// which otherwise makes the kernel issue-bound rather than memory-bound; a warp's two (bf16) loads together
// still read whole sectors, which L1 serves to the second. Not supported (the host checks): other group sizes or
// input types, K not a multiple of the group, more than 65535 row blocks.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "common/fp4.cuh"
#include "common/macros.cuh"
#include "common/quant.cuh"
#include "common/token_group_tile.cuh"
#include "common/types.cuh"

namespace deep_kernels {

template <typename InT, int kNumWarps, int kPasses, Fp4Format kFormat, Fp4ScaleLayout kLayout, ScaleMode kScaleMode>
__global__ void __launch_bounds__(kNumWarps * 32)
smxx_fp4_cast_impl(const InT* __restrict__ x, uint8_t* __restrict__ codes, uint8_t* __restrict__ scales,
                   const float* __restrict__ global_scale, uint32_t shape_m, uint32_t shape_k, uint32_t x_row_stride,
                   uint32_t scale_rows, uint32_t scale_stride, float amax_clamp) {
    // Static checks and types
    constexpr int kElems = 16;
    constexpr int kVec = 16 / sizeof(InT);
    constexpr int kLoads = kElems / kVec;
    constexpr int GROUP_SIZE = kFp4GroupSize<kFormat>;
    using Tile = TokenGroupTile<32 * kElems, kElems, kNumWarps, kPasses>;
    using Group = TokenGroupTile<GROUP_SIZE, kElems, kNumWarps, kPasses>;
    DK_STATIC_ASSERT(kLayout != Fp4ScaleLayout::MNMajorPackedUE8M0 || kFormat == Fp4Format::MX,
                     "packed scales are UE8M0");
    DK_STATIC_ASSERT(kLayout != Fp4ScaleLayout::Swizzled128x4 || kFormat == Fp4Format::NV,
                     "the swizzled layout holds E4M3 scales");

    // Loads first: kPasses x kLoads independent 16-byte loads per thread
    // NOTE: threads past M or K load row M - 1 or column 0 instead of predicating (the predicated, zero-filled
    // loads cost a byte permute per element); their values only reach their own skipped row's group.
    const Tile tile;
    const bool column_in_bounds = tile.column < shape_k;
    uint4 loaded[kPasses][kLoads];
    #pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
        const uint32_t row = min(tile.row(pass), shape_m - 1), column = column_in_bounds ? tile.column : 0;
        const auto* src = reinterpret_cast<const uint4*>(x + static_cast<uint64_t>(row) * x_row_stride + column);
        #pragma unroll
        for (int i = 0; i < kLoads; ++i)
            loaded[pass][i] = __ldg(src + i);
    }
    const float global = kFormat == Fp4Format::NV ? __ldg(global_scale) : 1.0f;
    const ScaleDivisor global_divisor(global);
    __shared__ float nv_multipliers[kFormat == Fp4Format::NV ? 256 : 1];
    if constexpr (kFormat == Fp4Format::NV) {
        for (uint32_t byte = threadIdx.x; byte < 256; byte += kNumWarps * 32)
            nv_multipliers[byte] = Fp4Scaler<kFormat, kScaleMode>::nv_multiplier(static_cast<uint8_t>(byte), global);
        __syncthreads();
    }

    // Per pass: group amax, scale, cast, store
    const uint32_t num_groups = shape_k / GROUP_SIZE, group = tile.column / GROUP_SIZE;
    const bool is_group_leader = threadIdx.x % Group::kLanesPerGroup == 0;
    #pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
        const uint32_t row = tile.row(pass);
        float values[kLoads][kVec];
        float amax = 0.0f;
        #pragma unroll
        for (int i = 0; i < kLoads; ++i)
            amax = max_nan(amax, unpack_fp4_input<InT>(loaded[pass][i], values[i]));
        amax = max_nan(Group::group_reduce(amax, max_nan), amax_clamp);
        if (row >= shape_m || !column_in_bounds) {
            // NOTE: the swizzled tiles' padding is part of the output, so the threads past M or K write its zeros.
            if constexpr (kLayout == Fp4ScaleLayout::Swizzled128x4)
                if (is_group_leader && row < scale_rows && group < (num_groups + 3) / 4 * 4)
                    scales[fp4_scale_offset<kLayout>(row, group, num_groups, scale_stride)] = 0;
            continue;
        }

        // Codes of each 16-byte vector: 4 bytes (bf16) or 2 (fp32)
        // NOTE: MX multipliers are powers of two, so the codes' FMAs take them (pack_e2m1's step) instead of a
        // multiply per element.
        // NOTE: where the group's |x| * multiplier stay below 7 (RN(amax * multiplier) < 7, so no NaN either), as
        // they do but for NaN, infinities, saturated NV scales and subnormal E4M3 ones, the codes need no
        // saturating min: one instruction fewer per element.
        const Fp4Scaler<kFormat, kScaleMode> scaler(amax, global, global_divisor, nv_multipliers);
        uint32_t vector_codes[kLoads];
        const auto encode = [&](auto saturate) {
            constexpr bool kSaturate = decltype(saturate)::value;
            #pragma unroll
            for (int i = 0; i < kLoads; ++i) {
                if constexpr (kFormat == Fp4Format::MX) {
                    vector_codes[i] = pack_e2m1<kVec, kSaturate>(values[i], scaler.multiplier, loaded[pass][i]);
                } else {
                    float scaled[kVec];
                    #pragma unroll
                    for (int j = 0; j < kVec; ++j)
                        scaled[j] = scaler.apply(values[i][j]);
                    vector_codes[i] = pack_e2m1<kVec, kSaturate>(scaled, 1.0f, loaded[pass][i]);
                }
            }
        };
        const bool below_seven =
            (kFormat == Fp4Format::MX || kScaleMode == ScaleMode::Multiply) && amax * scaler.multiplier < 7.0f;
        if (below_seven)
            encode(std::false_type{});
        else
            encode(std::true_type{});
        uint2 words;
        if constexpr (kLoads == 2)
            words = make_uint2(vector_codes[0], vector_codes[1]);
        else
            words = make_uint2(vector_codes[0] | (vector_codes[1] << 16), vector_codes[2] | (vector_codes[3] << 16));
        *reinterpret_cast<uint2*>(codes + (static_cast<uint64_t>(row) * shape_k + tile.column) / 2) = words;

        if (is_group_leader) {
            if constexpr (kLayout == Fp4ScaleLayout::MNMajorPackedUE8M0)
                store_scale<ScaleLayout::MNMajorPackedUE8M0>(scales, row, group, num_groups, scale_stride, scaler.scale);
            else
                scales[fp4_scale_offset<kLayout>(row, group, num_groups, scale_stride)] = scaler.byte;
        }
    }
}

}  // namespace deep_kernels
