// Per-token E5M6 cast-back (dequantize): packed codes int32 [M, 3K/8] (common/e5m6.cuh's packing,
// contiguous) and FP32 scales [M] -> y [M, K] bf16 or fp32, contiguous, y = RNE(float(code) * scale).
// Memory-bound and flat over the M * K / 8 groups of 8 codes: each thread takes kUnits units of 4 groups,
// loads all their words first (three 16-byte loads a unit) and stores each group's 8 outputs as 16-byte
// vectors. A unit may span rows (K % 32 != 0): the row advances group by group. No shared memory.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/e5m6.cuh"
#include "common/macros.cuh"

namespace deep_kernels {

template <typename OutT, int kNumWarps, int kUnits>
__global__ void __launch_bounds__(kNumWarps * 32)
smxx_e5m6_cast_back_impl(const uint32_t* __restrict__ packed, const float* __restrict__ scales,
                         OutT* __restrict__ y, uint32_t num_groups, uint32_t groups_per_row) {
    // Static checks and types
    constexpr int kNumThreads = kNumWarps * 32;
    constexpr int kGroupsPerUnit = 4;  // 4 x 3 words: three 16-byte loads
    constexpr int kUnitWords = kGroupsPerUnit * kE5M6GroupWords;
    constexpr int kOutVectors = kE5M6PerGroup * sizeof(OutT) / sizeof(uint4);
    DK_STATIC_ASSERT(kE5M6PerGroup * sizeof(OutT) % sizeof(uint4) == 0, "a group's outputs fill whole vectors");

    // Loads first: every unit's words (unit i of this thread: consecutive threads, consecutive units)
    const uint32_t first_unit = blockIdx.x * kUnits * kNumThreads + threadIdx.x;
    alignas(16) uint32_t words[kUnits][kGroupsPerUnit][kE5M6GroupWords];
    #pragma unroll
    for (int i = 0; i < kUnits; ++i) {
        const uint32_t first_group = (first_unit + i * kNumThreads) * kGroupsPerUnit;
        const uint32_t* src = packed + static_cast<uint64_t>(first_group) * kE5M6GroupWords;
        if (first_group + kGroupsPerUnit <= num_groups) {
            #pragma unroll
            for (int v = 0; v < 3; ++v)
                reinterpret_cast<uint4*>(words[i])[v] = __ldg(reinterpret_cast<const uint4*>(src) + v);
        } else if (first_group < num_groups) {
            const uint32_t num_words = (num_groups - first_group) * kE5M6GroupWords;
            #pragma unroll
            for (int w = 0; w < kUnitWords; ++w)
                if (w < num_words)
                    words[i][w / kE5M6GroupWords][w % kE5M6GroupWords] = __ldg(src + w);
        }
    }

    // Decode, scale and store group by group
    #pragma unroll
    for (int i = 0; i < kUnits; ++i) {
        const uint32_t first_group = (first_unit + i * kNumThreads) * kGroupsPerUnit;
        if (first_group >= num_groups)
            continue;
        uint32_t row = first_group / groups_per_row;
        uint32_t group_in_row = first_group - row * groups_per_row;
        #pragma unroll
        for (int j = 0; j < kGroupsPerUnit; ++j) {
            const uint32_t group = first_group + j;
            if (group >= num_groups)
                break;
            const float scale = __ldg(scales + row);
            uint32_t codes[kE5M6PerGroup];
            unpack_e5m6(words[i][j], codes);
            alignas(16) OutT out[kE5M6PerGroup];
            #pragma unroll
            for (int k = 0; k < kE5M6PerGroup; ++k)
                out[k] = static_cast<OutT>(e5m6_to_float(codes[k]) * scale);
            auto* dst = reinterpret_cast<uint4*>(y + static_cast<uint64_t>(group) * kE5M6PerGroup);
            #pragma unroll
            for (int v = 0; v < kOutVectors; ++v)
                dst[v] = reinterpret_cast<const uint4*>(out)[v];
            if (++group_in_row == groups_per_row) {
                group_in_row = 0;
                ++row;
            }
        }
    }
}

}  // namespace deep_kernels
