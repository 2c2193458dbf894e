// Per-row FP8 cast (the per-token cast with one group per row, group size K): x [M, K] (bf16 or fp32, row
// stride >= K) -> q [M, K] float8_e4m3fn and one scale per row, scales [M, 1] in kLayout. The numerics are
// the per-token cast's (common/quant.cuh's E4M3Scaler) with amax over the whole row. A CTA of 256 threads
// casts one row: each thread loads up to kVectorsPerThread 16-byte vectors (all in flight), the row amax is
// reduced by warp shuffles then across warps in shared memory. K must be a multiple of the vector width and
// at most 256 * kVectorsPerThread vectors (the host checks).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/macros.cuh"
#include "common/quant.cuh"
#include "common/types.cuh"

namespace deep_kernels {

template <typename InT, int kVectorsPerThread, bool kUE8M0, ScaleLayout kLayout, ScaleMode kScaleMode>
__global__ void __launch_bounds__(256)
smxx_per_row_cast_impl(const InT* __restrict__ x, uint8_t* __restrict__ q, void* __restrict__ scales,
                       uint32_t shape_k, uint32_t x_row_stride, uint32_t scale_stride, float amax_clamp) {
    // Static checks and thread mapping: vector v of the row is thread v % kNumThreads's (v / kNumThreads)-th
    constexpr int kVec = 16 / sizeof(InT);
    constexpr int kNumThreads = 256;
    constexpr int kNumWarps = kNumThreads / 32;
    DK_STATIC_ASSERT(kLayout != ScaleLayout::MNMajorPackedUE8M0 || kUE8M0, "packed scales are UE8M0");

    // Shared memory: each warp's amax of the row
    __shared__ float smem_amax[kNumWarps];

    // Loads first: kVectorsPerThread independent 16-byte loads per thread
    const uint32_t row = blockIdx.x, num_vectors = shape_k / kVec;
    const InT* x_row = x + static_cast<uint64_t>(row) * x_row_stride;
    uint4 loaded[kVectorsPerThread] = {};
    #pragma unroll
    for (int i = 0; i < kVectorsPerThread; ++i) {
        const uint32_t vector = threadIdx.x + i * kNumThreads;
        if (vector < num_vectors)
            loaded[i] = __ldg(reinterpret_cast<const uint4*>(x_row + vector * kVec));
    }

    // Row amax: this thread's vectors (zeros past K), the warp's lanes, then the warps
    float amax = vectors_amax<InT>(loaded);
    #pragma unroll
    for (int offset = 16; offset > 0; offset /= 2)
        amax = max_nan(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
    if (threadIdx.x % 32 == 0)
        smem_amax[threadIdx.x / 32] = amax;
    __syncthreads();
    amax = amax_clamp;
    #pragma unroll
    for (int i = 0; i < kNumWarps; ++i)
        amax = max_nan(amax, smem_amax[i]);

    // Quantize and store; thread 0 writes the row's scale
    const E4M3Scaler<kUE8M0, kScaleMode> scaler(amax);
    #pragma unroll
    for (int i = 0; i < kVectorsPerThread; ++i) {
        const uint32_t vector = threadIdx.x + i * kNumThreads;
        if (vector < num_vectors)
            cast_vector<InT>(scaler, loaded[i], q + static_cast<uint64_t>(row) * shape_k + vector * kVec);
    }
    if (threadIdx.x == 0)
        store_scale<kLayout>(scales, row, 0, 1, scale_stride, scaler.scale);
}

}  // namespace deep_kernels
