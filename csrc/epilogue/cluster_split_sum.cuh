// Split-K partial sums exchanged through distributed shared memory, for the kernels whose splits of a tile form one
// cluster: each non-leading split stores a math warpgroup's FP32 partial sums into its own shared memory, and the
// leader adds them from there. A warpgroup's slot holds float4 j of thread t at float (j * 128 + t) * 4, so that a
// warp's stores and loads are contiguous.
#pragma once

#include <cstdint>

#include "common/macros.cuh"
#include "ptx/dsmem.cuh"
#include "ptx/wgmma.cuh"

namespace deep_kernels::cluster_split_sum {

using ptx::kNumThreadsPerWarpgroup;

// This thread's place in its warpgroup's slot (slot: the warpgroup's first float).
DK_DEVICE float* thread_slot(float* slot) {
    return slot + threadIdx.x % kNumThreadsPerWarpgroup * 4;
}

template <uint32_t kNumFloats>
DK_DEVICE void store_partials(const float (&partial)[kNumFloats], float* own) {
    DK_STATIC_ASSERT(kNumFloats % 4 == 0, "whole float4s");
#pragma unroll
    for (uint32_t j = 0; j < kNumFloats / 4; ++j)
        *reinterpret_cast<float4*>(own + j * kNumThreadsPerWarpgroup * 4) =
            make_float4(partial[j * 4 + 0], partial[j * 4 + 1], partial[j * 4 + 2], partial[j * 4 + 3]);
}

// Adds the partial sums that cluster CTA `cta_rank` stored at `own`'s offset of its shared memory.
template <uint32_t kNumFloats>
DK_DEVICE void add_remote_partials(float (&total)[kNumFloats], const float* own, uint32_t cta_rank) {
    const uint32_t remote = ptx::cluster_shared_address(own, cta_rank);
#pragma unroll
    for (uint32_t j = 0; j < kNumFloats / 4; ++j) {
        float x, y, z, w;
        ptx::ld_shared_cluster(remote + j * kNumThreadsPerWarpgroup * 4 * sizeof(float), x, y, z, w);
        total[j * 4 + 0] += x;
        total[j * 4 + 1] += y;
        total[j * 4 + 2] += z;
        total[j * 4 + 3] += w;
    }
}

}  // namespace deep_kernels::cluster_split_sum
