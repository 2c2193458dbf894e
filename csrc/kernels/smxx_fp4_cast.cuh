// Per-token-group FP4 e2m1 cast: x [M, K] (bf16 or fp32, row stride >= K) -> codes [M, K / 2] (two per byte,
// element 2i in the low nibble) and one scale byte per row and group (fp4.cuh's Fp4Scaler):
//   MX: 1x32 groups, UE8M0 scales (row-major bytes, or the packed int32 MN-major words the FP8 GEMM reads)
//   NV: 1x16 groups, E4M3 scales times the FP32 global scale read from device memory (row-major, or the
//       128x4 swizzled tiles of block-scaled GEMMs; rows past M and groups past G of the last tiles get 0)
// Memory-bound: a lane loads one 16-byte vector per pass (all passes' loads in flight first), so each warp load
// is 512 contiguous bytes of one row; a group is the 2 to 8 lanes holding it (shuffle reduction) and each lane
// writes its 4 or 2 bytes of codes (a warp: one contiguous run). No shared memory. Not supported (the host
// checks): other group sizes or input types, K not a multiple of the group, more than 65535 row blocks.
// NOTE: two vectors per lane 32 bytes apart would halve the per-group work per code but make every warp load
// fetch half sectors; the per-element work is kept small instead (fp4.cuh's pack_e2m1).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

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
    constexpr int kVec = 16 / sizeof(InT);
    constexpr int GROUP_SIZE = kFp4GroupSize<kFormat>;
    using Tile = TokenGroupTile<32 * kVec, kVec, kNumWarps, kPasses>;
    using Group = TokenGroupTile<GROUP_SIZE, kVec, kNumWarps, kPasses>;
    DK_STATIC_ASSERT(kLayout != Fp4ScaleLayout::MNMajorPackedUE8M0 || kFormat == Fp4Format::MX,
                     "packed scales are UE8M0");
    DK_STATIC_ASSERT(kLayout != Fp4ScaleLayout::Swizzled128x4 || kFormat == Fp4Format::NV,
                     "the swizzled layout holds E4M3 scales");

    // Loads first: kPasses independent 16-byte loads per thread
    // NOTE: threads past M or K load row M - 1 or column 0 instead of predicating (the predicated, zero-filled
    // loads cost a byte permute per element); their values only reach their own skipped row's group.
    const Tile tile;
    const bool column_in_bounds = tile.column < shape_k;
    uint4 loaded[kPasses];
    #pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
        const uint32_t row = min(tile.row(pass), shape_m - 1), column = column_in_bounds ? tile.column : 0;
        loaded[pass] = __ldg(reinterpret_cast<const uint4*>(x + static_cast<uint64_t>(row) * x_row_stride + column));
    }
    const float global = kFormat == Fp4Format::NV ? __ldg(global_scale) : 1.0f;

    // NV scales: lane j of a group computes those of passes j, j + kShared, ... (from every pass's group amax),
    // the others read them by shuffle
    // NOTE: an NV scale is two IEEE divisions, an E4M3 round trip and a reciprocal, as much work as the codes of
    // 8 elements; MX's integer scale is cheaper than the shuffles, so each lane computes its own in its pass.
    using Scaler = Fp4Scaler<kFormat, kScaleMode>;
    constexpr bool kDivide = kFormat == Fp4Format::NV && kScaleMode == ScaleMode::Divide;
    constexpr int kShared = kFormat == Fp4Format::NV ? Group::kLanesPerGroup : 1;
    constexpr int kOwned = (kPasses + kShared - 1) / kShared;
    const uint32_t num_groups = shape_k / GROUP_SIZE, group = tile.column / GROUP_SIZE;
    const bool is_group_leader = threadIdx.x % Group::kLanesPerGroup == 0;
    const uint32_t group_lane = threadIdx.x % kShared;
    float owned_steps[kOwned];  // the multiplier, or the scale to divide by
    uint32_t owned_bytes[kOwned];
    if constexpr (kShared > 1) {
        float amaxes[kPasses];
        #pragma unroll
        for (int pass = 0; pass < kPasses; ++pass) {
            float values[kVec];
            amaxes[pass] = max_nan(Group::group_reduce(unpack_fp4_input<InT>(loaded[pass], values), max_nan),
                                   amax_clamp);
        }
        #pragma unroll
        for (int owned = 0; owned < kOwned; ++owned) {
            float amax = amaxes[owned * kShared];
            #pragma unroll
            for (int j = 1; j < kShared; ++j)
                if (owned * kShared + j < kPasses && group_lane == j)
                    amax = amaxes[owned * kShared + j];
            const Scaler scaler(amax, global);
            owned_steps[owned] = kDivide ? scaler.scale : scaler.multiplier;
            owned_bytes[owned] = scaler.byte;
        }
    }

    // Per pass: scale, cast, store
    #pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
        const uint32_t row = tile.row(pass);
        float values[kVec];
        const float lane_amax = unpack_fp4_input<InT>(loaded[pass], values);
        uint32_t word, byte;
        float scale = 0.0f;
        if constexpr (kShared > 1) {
            // NOTE: every lane takes part in the shuffles, so they come before the bounds check.
            const float step = __shfl_sync(0xffffffffu, owned_steps[pass / kShared], pass % kShared, kShared);
            byte = __shfl_sync(0xffffffffu, owned_bytes[pass / kShared], pass % kShared, kShared);
            float scaled[kVec];
            #pragma unroll
            for (int i = 0; i < kVec; ++i)
                scaled[i] = kDivide ? __fdiv_rn(values[i], step) : values[i] * step;
            word = pack_e2m1(scaled, 1.0f, loaded[pass]);
        } else {
            // NOTE: MX multipliers are powers of two, so the codes' FMAs take them (pack_e2m1's step) instead of
            // a multiply per element.
            DK_STATIC_ASSERT(kFormat == Fp4Format::MX, "NV scales are shared");
            const Scaler scaler(max_nan(Group::group_reduce(lane_amax, max_nan), amax_clamp), global);
            word = pack_e2m1(values, scaler.multiplier, loaded[pass]);
            byte = scaler.byte;
            scale = scaler.scale;
        }
        if (row >= shape_m || !column_in_bounds) {
            // NOTE: the swizzled tiles' padding is part of the output, so the threads past M or K write its zeros.
            if constexpr (kLayout == Fp4ScaleLayout::Swizzled128x4)
                if (is_group_leader && row < scale_rows && group < (num_groups + 3) / 4 * 4)
                    scales[fp4_scale_offset<kLayout>(row, group, num_groups, scale_stride)] = 0;
            continue;
        }

        uint8_t* dst = codes + (static_cast<uint64_t>(row) * shape_k + tile.column) / 2;
        if constexpr (kVec == 8)
            *reinterpret_cast<uint32_t*>(dst) = word;
        else
            *reinterpret_cast<uint16_t*>(dst) = static_cast<uint16_t>(word);

        if (is_group_leader) {
            if constexpr (kLayout == Fp4ScaleLayout::MNMajorPackedUE8M0)
                store_scale<ScaleLayout::MNMajorPackedUE8M0>(scales, row, group, num_groups, scale_stride, scale);
            else
                scales[fp4_scale_offset<kLayout>(row, group, num_groups, scale_stride)] = static_cast<uint8_t>(byte);
        }
    }
}

}  // namespace deep_kernels
