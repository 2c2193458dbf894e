// MoE token expansion: out[r] = x[row_slots[r] / top_k] for each row r of a grouped-GEMM layout, a zero row
// where row_slots[r] is -1. Rows are raw 16-byte vectors (any element type: bf16, fp8), so one kernel serves
// every dtype. With scales, the per-token scale columns (FP32 values or packed UE8M0 words) are gathered the
// same way into the scale layout of the output rows (zero for zero rows). Without zero_padding, rows without a
// slot are left unwritten.
// Contiguous layout: row_slots = row_to_slot and rows from *num_rows on are not written (they hold no expert's
// rows); masked layout: row_slots = masked_slots flattened, num_rows null, every row written.
// Memory-bound: a block covers BLOCK_ROWS rows of one chunk of kColumnThreads vectors; each thread issues
// kRowsPerThread 16-byte loads before its stores. No shared memory.
#pragma once

#include <cstdint>

#include "common/macros.cuh"
#include "common/moe_rows.cuh"

namespace deep_kernels {

template <int kColumnThreads, int kRowLanes, int kRowsPerThread>
__global__ void __launch_bounds__(kColumnThreads * kRowLanes)
smxx_moe_expand_impl(const uint4* x, uint4* __restrict__ out, const uint32_t* __restrict__ x_scales,
                     uint32_t* __restrict__ out_scales, const int32_t* __restrict__ row_slots,
                     const int32_t* __restrict__ num_rows, uint32_t num_out_rows, uint32_t row_vectors,
                     uint32_t x_row_vectors, uint32_t top_k, uint32_t scale_columns, uint32_t x_scale_row_stride,
                     uint32_t x_scale_column_stride, uint32_t scale_batch_rows, uint32_t scale_batch_stride,
                     uint32_t scale_column_stride, uint32_t zero_padding) {
    // Tile: blockIdx.x is the row block, blockIdx.y the column chunk; row lanes interleave rows
    constexpr uint32_t BLOCK_ROWS = kRowLanes * kRowsPerThread;
    const uint32_t first_row = blockIdx.x * BLOCK_ROWS + threadIdx.x / kColumnThreads;
    const uint32_t column = blockIdx.y * kColumnThreads + threadIdx.x % kColumnThreads;
    const uint32_t row_limit = num_rows == nullptr ? num_out_rows : min(num_out_rows, static_cast<uint32_t>(__ldg(num_rows)));
    if (blockIdx.x * BLOCK_ROWS >= row_limit)
        return;

    // Source tokens of this thread's rows (-1: a zero row)
    int32_t tokens[kRowsPerThread];
    #pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
        const uint32_t row = first_row + i * kRowLanes;
        const int32_t slot = row < row_limit ? __ldg(row_slots + row) : -1;
        tokens[i] = slot < 0 ? -1 : static_cast<int32_t>(static_cast<uint32_t>(slot) / top_k);
    }

    // Loads first, then stores
    // NOTE: plain (not read-only .nc) loads of x, which is not __restrict__: ptxas then cannot hoist a store
    // above a later load, so all kRowsPerThread loads stay in flight together instead of one or two.
    const bool in_row = column < row_vectors;
    uint4 vectors[kRowsPerThread];
    #pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i)
        vectors[i] = tokens[i] < 0 || !in_row ? make_uint4(0, 0, 0, 0)
                                              : x[static_cast<uint64_t>(tokens[i]) * x_row_vectors + column];
    #pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
        const uint32_t row = first_row + i * kRowLanes;
        if (in_row && row < row_limit && (zero_padding || tokens[i] >= 0))
            out[static_cast<uint64_t>(row) * row_vectors + column] = vectors[i];
    }

    // Scales: the first column chunk's threads gather each row's scale columns, loads before stores
    if (out_scales != nullptr && blockIdx.y == 0) {
        const ScaleStrides strides{scale_batch_rows, scale_batch_stride, 1, scale_column_stride};
        for (uint32_t scale_column = threadIdx.x % kColumnThreads; scale_column < scale_columns;
             scale_column += kColumnThreads) {
            uint32_t words[kRowsPerThread];
            #pragma unroll
            for (int i = 0; i < kRowsPerThread; ++i)
                words[i] = tokens[i] < 0 ? 0u
                                         : __ldg(x_scales + static_cast<uint64_t>(tokens[i]) * x_scale_row_stride +
                                                 static_cast<uint64_t>(scale_column) * x_scale_column_stride);
            #pragma unroll
            for (int i = 0; i < kRowsPerThread; ++i) {
                const uint32_t row = first_row + i * kRowLanes;
                if (row < row_limit && (zero_padding || tokens[i] >= 0))
                    out_scales[strides.offset(row, scale_column)] = words[i];
            }
        }
    }
}

}  // namespace deep_kernels
