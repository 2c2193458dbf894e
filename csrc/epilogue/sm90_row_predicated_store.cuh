// Stores one math warpgroup's 64 x BLOCK_N tile, staged in shared memory by AccumulatorStore, to global
// memory row by row with 16-byte stores, writing only the rows a predicate accepts. Grouped GEMMs use it for
// the tiles whose rows are not all valid (rows at or past masked_m[g], contiguous padding rows), which the
// whole-tile TMA store would overwrite. Consecutive threads take consecutive 16-byte runs of a row, so a
// warp's stores coalesce. With kWithAccumulation (FP32 D) each run is read, added to and written back.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "common/macros.cuh"
#include "epilogue/sm90_accumulator_store.cuh"

namespace deep_kernels {

template <typename OutputType, uint32_t BLOCK_N, uint32_t kNumThreads, bool kWithAccumulation>
struct RowPredicatedStore {
    using Staging = AccumulatorStore<OutputType, BLOCK_N>;
    static constexpr uint32_t kVectorBytes = 16;
    static constexpr uint32_t kVectorCols = kVectorBytes / sizeof(OutputType);
    static constexpr uint32_t kVectorsPerRow = BLOCK_N / kVectorCols;
    DK_STATIC_ASSERT(BLOCK_N % kVectorCols == 0, "tile rows are whole 16-byte runs");
    DK_STATIC_ASSERT((!kWithAccumulation || std::is_same_v<OutputType, float>), "accumulation into FP32 D");

    // smem_d: the warpgroup's staging buffer, written and synchronised by the caller. d_tile: D's element
    // (first row, first column) of the tile; rows row_stride elements apart; num_cols: columns of the tile
    // inside D (a multiple of kVectorCols). is_valid_row(r), r in [0, 64): whether tile row r is written.
    template <typename IsValidRow>
    DK_DEVICE static void store(const uint8_t* smem_d, OutputType* d_tile, size_t row_stride, uint32_t num_cols,
                                uint32_t thread_idx, IsValidRow&& is_valid_row) {
        for (uint32_t i = thread_idx; i < Staging::kNumRows * kVectorsPerRow; i += kNumThreads) {
            const uint32_t row = i / kVectorsPerRow;
            const uint32_t col = i % kVectorsPerRow * kVectorCols;
            if (col >= num_cols || !is_valid_row(row))
                continue;
            const uint8_t* src = smem_d + Staging::offset(row, col * sizeof(OutputType));
            OutputType* dst = d_tile + row * row_stride + col;
            if constexpr (kWithAccumulation) {
                float4 sum = *reinterpret_cast<const float4*>(src);
                const float4 previous = *reinterpret_cast<const float4*>(dst);
                sum.x += previous.x;
                sum.y += previous.y;
                sum.z += previous.z;
                sum.w += previous.w;
                *reinterpret_cast<float4*>(dst) = sum;
            } else {
                *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
            }
        }
    }
};

}  // namespace deep_kernels
