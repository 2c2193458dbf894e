// Per-token E5M6 cast: x [M, K] (bf16 or fp32, row stride >= K, K a multiple of 8) -> packed codes
// int32 [M, 3K/8] (common/e5m6.cuh's packing, contiguous) and one FP32 scale per row, scales [M]:
//   amax = max |x| over the row (NaN propagates), clamped below by amax_clamp
//   scale = amax / 65024, code = RNE_e5m6(x * (65024 / amax)) (IEEE divisions), or with ScaleMode::Divide
//   RNE_e5m6(x / scale); kUE8M0: scale = the smallest power of two >= amax / 65024, code =
//   RNE_e5m6(x * (1 / scale))
// A CTA owns kRows whole rows, staged in shared memory both ways: one thread bulk-loads the rows (TMA), the
// CTA reduces each row's amax, each thread converts groups of 8 values into 3 packed words in shared memory
// (consecutive threads, consecutive groups: no bank conflicts), and one thread bulk-stores the CTA's packed
// rows. kRows * K is a multiple of 32, so every CTA's output starts 16-byte aligned and (the last CTA's
// aside) spans whole 16-byte units. Rows longer than shared memory allows are not supported (host checks).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/e5m6.cuh"
#include "common/macros.cuh"
#include "common/quant.cuh"
#include "common/types.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/sync.cuh"
#include "ptx/tma.cuh"

namespace deep_kernels {

// Converts the staged rows' groups of 8 values (group g of row g / groups_per_row) into packed words
// [3g, 3g + 3) of smem_packed.
template <typename InT, int kNumThreads, bool kSpecials, typename Scaler, int kRows>
DK_DEVICE void convert_groups(const uint4* smem_vectors, const Scaler (&scalers)[kRows], uint32_t groups_per_row,
                              uint32_t num_groups, uint32_t* smem_packed) {
    constexpr int kVec = 16 / sizeof(InT);
    for (uint32_t group = threadIdx.x; group < num_groups; group += kNumThreads) {
        Scaler scaler = scalers[0];
        #pragma unroll
        for (int r = 1; r < kRows; ++r)
            if (group >= r * groups_per_row)
                scaler = scalers[r];
        uint32_t codes[kE5M6PerGroup];
        #pragma unroll
        for (int v = 0; v < kE5M6PerGroup / kVec; ++v) {
            const uint4 vector = smem_vectors[group * (kE5M6PerGroup / kVec) + v];
            float values[kVec];
            unpack_vector<InT>(vector, values);
            #pragma unroll
            for (int i = 0; i < kVec; ++i)
                codes[v * kVec + i] = e5m6_code<kSpecials>(scaler.apply(values[i]));
        }
        uint32_t words[kE5M6GroupWords];
        pack_e5m6(codes, words);
        #pragma unroll
        for (int w = 0; w < kE5M6GroupWords; ++w)
            smem_packed[group * kE5M6GroupWords + w] = words[w];
    }
}

template <typename InT, int kRows, int kNumWarps, bool kUE8M0, ScaleMode kScaleMode>
__global__ void __launch_bounds__(kNumWarps * 32)
smxx_e5m6_cast_impl(const InT* __restrict__ x, uint32_t* __restrict__ packed, float* __restrict__ scales,
                    uint32_t shape_m, uint32_t shape_k, uint32_t x_row_stride, float amax_clamp) {
    // Static checks and types
    constexpr int kVec = 16 / sizeof(InT);
    constexpr int kNumThreads = kNumWarps * 32;
    using Scaler = GroupScaler<kUE8M0, kScaleMode>;
    DK_STATIC_ASSERT(kE5M6PerGroup % kVec == 0, "a group of 8 codes holds whole input vectors");
    DK_STATIC_ASSERT(kRows == 1 || kRows == 2 || kRows == 4, "kRows * K must be a multiple of 32 for any K % 8 == 0");

    // Shared memory: the input rows back to back, then their packed words; the load barrier and each
    // warp's partial row amaxes
    extern __shared__ __align__(16) uint8_t smem_buffer[];
    __shared__ uint64_t full_barrier;
    __shared__ float smem_amax[kNumWarps][kRows];
    const uint32_t row_bytes = shape_k * sizeof(InT);
    const auto* smem_vectors = reinterpret_cast<const uint4*>(smem_buffer);
    auto* smem_packed = reinterpret_cast<uint32_t*>(smem_buffer + kRows * row_bytes);

    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint32_t first_row = blockIdx.x * kRows;
    const uint32_t num_rows = min(static_cast<uint32_t>(kRows), shape_m - first_row);

    // Bulk loads of the CTA's rows
    if (threadIdx.x == 0) {
        ptx::mbarrier_init(&full_barrier, 1);
        ptx::fence_mbarrier_init();
        ptx::mbarrier_arrive_expect_tx(&full_barrier, num_rows * row_bytes);
        for (uint32_t r = 0; r < num_rows; ++r)
            ptx::bulk_load(smem_buffer + r * row_bytes, x + static_cast<uint64_t>(first_row + r) * x_row_stride,
                           row_bytes, &full_barrier);
    }
    __syncthreads();
    ptx::mbarrier_wait(&full_barrier, 0);

    // Row amaxes: this thread's vectors, the warp, then the warps through shared memory
    const uint32_t vectors_per_row = shape_k / kVec;
    #pragma unroll
    for (int r = 0; r < kRows; ++r) {
        float amax = 0.0f;
        if (r < num_rows) {
            for (uint32_t v = threadIdx.x; v < vectors_per_row; v += kNumThreads) {
                float values[kVec];
                const uint4 vector = smem_vectors[r * vectors_per_row + v];
                amax = max_nan(amax, unpack_vector<InT>(vector, values));
            }
        }
        #pragma unroll
        for (int offset = 16; offset > 0; offset /= 2)
            amax = max_nan(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
        if (lane == 0)
            smem_amax[warp][r] = amax;
    }
    __syncthreads();

    // Every thread derives each row's scaler; thread r writes row r's scale
    Scaler scalers[kRows];
    #pragma unroll
    for (int r = 0; r < kRows; ++r) {
        float amax = amax_clamp;
        #pragma unroll
        for (int w = 0; w < kNumWarps; ++w)
            amax = max_nan(amax, smem_amax[w][r]);
        scalers[r] = Scaler(amax, kE5M6Max);
        if (threadIdx.x == r && r < num_rows)
            scales[first_row + r] = scalers[r].scale;
    }

    // Convert into shared memory. NOTE: with finite scales and multipliers, and normal scales, |x| <= amax
    // bounds every scaled value below 65025 (a few FP32 roundings above 65024), so no NaN or overflow can
    // occur and the rows take the conversion without those checks.
    constexpr float kMinNormal = 0x1p-126f;  // FP32's smallest normal
    bool specials = false;
    #pragma unroll
    for (int r = 0; r < kRows; ++r)
        specials |= !(isfinite(scalers[r].multiplier) && isfinite(scalers[r].scale) && scalers[r].scale >= kMinNormal);
    const uint32_t groups_per_row = shape_k / kE5M6PerGroup;
    const uint32_t num_groups = num_rows * groups_per_row;
    if (specials)
        convert_groups<InT, kNumThreads, true>(smem_vectors, scalers, groups_per_row, num_groups, smem_packed);
    else
        convert_groups<InT, kNumThreads, false>(smem_vectors, scalers, groups_per_row, num_groups, smem_packed);

    // Store: one bulk copy of the whole 16-byte units, then the last CTA's 1 to 3 words past them
    ptx::fence_proxy_async_shared();
    __syncthreads();
    uint32_t* packed_rows = packed + static_cast<uint64_t>(first_row) * groups_per_row * kE5M6GroupWords;
    const uint32_t num_words = num_groups * kE5M6GroupWords;
    const uint32_t bulk_words = num_words / 4 * 4;
    if (threadIdx.x == 0 && bulk_words > 0) {
        ptx::bulk_store(packed_rows, smem_packed, bulk_words * sizeof(uint32_t));
        ptx::tma_store_commit();
        // NOTE: shared memory must outlive the copy's reads of it.
        ptx::tma_store_wait_read<0>();
    }
    if (threadIdx.x < num_words - bulk_words)
        packed_rows[bulk_words + threadIdx.x] = smem_packed[bulk_words + threadIdx.x];
}

}  // namespace deep_kernels
