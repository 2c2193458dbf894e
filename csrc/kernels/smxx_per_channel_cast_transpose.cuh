// Per-channel FP8 cast with transpose, for the backward GEMMs: x [M, K] (bf16 or fp32, row stride >= K) ->
// q [K, M] float8_e4m3fn, q = cast(x).T stored contiguously (K-major), with one scale per column k and
// block of 128 rows of x: scales [K, ceil(M / 128)] in kLayout, the per-token 1 x 128 scales of x.T. The
// numerics are the per-token cast's (common/quant.cuh's E4M3Scaler); rows past M count as zeros.
// A CTA of 64 threads moves one 128 x TILE_K tile of 128-byte rows through swizzled shared memory: 16
// independent 16-byte loads per thread, then each thread reads 16 rows of one 16-byte column chunk and
// writes 16 codes of each of its columns as one 16-byte store. M must be a multiple of 16 (whole 16-byte
// code runs) and K of the 16-byte vector's width (the host checks).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/macros.cuh"
#include "common/quant.cuh"
#include "common/types.cuh"

namespace deep_kernels {

template <typename InT, bool kUE8M0, ScaleLayout kLayout, ScaleMode kScaleMode>
__global__ void __launch_bounds__(64)
smxx_per_channel_cast_transpose_impl(const InT* __restrict__ x, uint8_t* __restrict__ q, void* __restrict__ scales,
                                     uint32_t shape_m, uint32_t shape_k, uint32_t x_row_stride,
                                     uint32_t scale_stride, float amax_clamp) {
    // Static checks and thread mapping: a tile row is kChunks 16-byte chunks of kVec columns; a column's
    // BLOCK_M rows split into kNumRuns runs of kRunM, one thread per (run, chunk)
    constexpr int kVec = 16 / sizeof(InT);
    constexpr int kChunks = 8;
    constexpr int BLOCK_M = 128;
    constexpr int TILE_K = kVec * kChunks;
    constexpr int kRunM = 16;
    constexpr int kNumRuns = BLOCK_M / kRunM;
    constexpr int kNumThreads = kChunks * kNumRuns;
    constexpr int kLoads = BLOCK_M * kChunks / kNumThreads;
    DK_STATIC_ASSERT(kNumThreads == 64 && kNumRuns == 8, "the launch bounds and the 3-step run reduction");
    DK_STATIC_ASSERT(kLayout != ScaleLayout::MNMajorPackedUE8M0 || kUE8M0, "packed scales are UE8M0");

    // Shared memory: the tile, chunk c of row m at position c ^ (m / kRunM) % kChunks, so that the 8 lanes
    // of a quarter-warp hit 8 different bank groups both when they store one row and when they read one
    // chunk column of 8 runs
    __shared__ uint4 smem_tile[BLOCK_M][kChunks];
    const auto swizzled = [](uint32_t row, uint32_t chunk) { return chunk ^ (row / kRunM) % kChunks; };

    // Loads first: kLoads independent 16-byte loads per thread, a row's chunks from neighbouring lanes;
    // rows past M and columns past K stay zero
    const uint32_t m_base = blockIdx.y * BLOCK_M, k_base = blockIdx.x * TILE_K;
    uint4 loaded[kLoads] = {};
    #pragma unroll
    for (int i = 0; i < kLoads; ++i) {
        const uint32_t row = threadIdx.x / kChunks + i * (kNumThreads / kChunks), chunk = threadIdx.x % kChunks;
        const uint32_t m = m_base + row, k = k_base + chunk * kVec;
        if (m < shape_m && k < shape_k)
            loaded[i] = __ldg(reinterpret_cast<const uint4*>(x + static_cast<uint64_t>(m) * x_row_stride + k));
    }
    #pragma unroll
    for (int i = 0; i < kLoads; ++i) {
        const uint32_t row = threadIdx.x / kChunks + i * (kNumThreads / kChunks), chunk = threadIdx.x % kChunks;
        smem_tile[row][swizzled(row, chunk)] = loaded[i];
    }
    __syncthreads();

    // This thread's run of kRunM rows of one chunk: kVec columns of x, kVec rows of q
    const uint32_t run = threadIdx.x % kNumRuns, chunk = threadIdx.x / kNumRuns;
    uint4 column_run[kRunM];
    #pragma unroll
    for (int i = 0; i < kRunM; ++i)
        column_run[i] = smem_tile[run * kRunM + i][swizzled(run * kRunM + i, chunk)];

    // Column amaxes: over the run, then over the kNumRuns lanes of the chunk (neighbouring lanes)
    float amax[kVec];
    #pragma unroll
    for (int e = 0; e < kVec; ++e)
        amax[e] = 0.0f;
    #pragma unroll
    for (int i = 0; i < kRunM; ++i) {
        float values[kVec];
        unpack_vector<InT>(column_run[i], values);
        #pragma unroll
        for (int e = 0; e < kVec; ++e)
            amax[e] = max_nan(amax[e], fabsf(values[e]));
    }
    #pragma unroll
    for (int e = 0; e < kVec; ++e) {
        #pragma unroll
        for (int offset = 1; offset < kNumRuns; offset *= 2)
            amax[e] = max_nan(amax[e], __shfl_xor_sync(0xffffffffu, amax[e], offset));
        amax[e] = max_nan(amax[e], amax_clamp);
    }
    const uint32_t k_first = k_base + chunk * kVec, m_first = m_base + run * kRunM;
    if (k_first >= shape_k)
        return;

    // Per column: scale, cast the run and store its 16 codes; the chunk's lane `run` writes column run's scale
    float run_column_scale = 0.0f;
    #pragma unroll
    for (int e = 0; e < kVec; ++e) {
        const E4M3Scaler<kUE8M0, kScaleMode> scaler(amax[e]);
        if (m_first < shape_m) {
            float values[kRunM];
            #pragma unroll
            for (int i = 0; i < kRunM; ++i)
                values[i] = static_cast<float>(reinterpret_cast<const InT*>(&column_run[i])[e]);
            cast_values(scaler, values, q + static_cast<uint64_t>(k_first + e) * shape_m + m_first);
        }
        if (run == e)
            run_column_scale = scaler.scale;
    }
    if (run < kVec)
        store_scale<kLayout>(scales, k_first + run, blockIdx.y, gridDim.y, scale_stride, run_column_scale);
}

}  // namespace deep_kernels
