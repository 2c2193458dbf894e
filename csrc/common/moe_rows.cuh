// What the MoE expand and reduce kernels share: the row a routed slot occupies in either grouped-GEMM
// layout, the padding rows an expand block zeroes, and the addressing of per-row scales that may be batched
// per expert (the masked layout).
#pragma once

#include <cstdint>

#include "common/macros.cuh"

namespace deep_kernels {

// Where (row, column) of a scale tensor lives, in 4-byte words: rows come in batches of batch_rows (one
// batch per expert in the masked layout, one batch in all in the contiguous layout), each batch a 2-D
// [batch_rows, columns] tensor with the given strides. Columns are groups, or words of four packed groups.
struct ScaleStrides {
    uint32_t batch_rows;
    uint32_t batch_stride;
    uint32_t row_stride;
    uint32_t column_stride;

    DK_DEVICE uint64_t offset(uint32_t row, uint32_t column) const {
        const uint32_t batch = row / batch_rows, row_in_batch = row % batch_rows;
        return static_cast<uint64_t>(batch) * batch_stride + static_cast<uint64_t>(row_in_batch) * row_stride +
               static_cast<uint64_t>(column) * column_stride;
    }
};

// The rows a block of the expand kernels zeroes: those without a slot (row_slots[row] < 0) among its share
// [first_row, first_row + rows_per_block) (rows_per_block <= 32, first_row from the block's linear index),
// below the row limit (*num_rows, or num_out_rows where num_rows is null). Bit i of bits is row first_row + i.
// Every thread of the block constructs it (one ballot per warp: every warp gets the same bits).
struct PaddingRows {
    uint32_t first_row;
    uint32_t bits;

    DK_DEVICE PaddingRows(const int32_t* __restrict__ row_slots, const int32_t* __restrict__ num_rows,
                          uint32_t num_out_rows, uint32_t rows_per_block) {
        const uint32_t lane = threadIdx.x % 32;
        first_row = (blockIdx.y * gridDim.x + blockIdx.x) * rows_per_block;
        const uint32_t row = first_row + lane;
        const bool in_share = lane < rows_per_block && row < num_out_rows;
        // NOTE: the slot is in bounds whatever num_rows holds, so both loads are in flight together.
        const bool unslotted = in_share && __ldg(row_slots + row) < 0;
        const uint32_t row_limit =
            num_rows == nullptr ? num_out_rows : min(num_out_rows, static_cast<uint32_t>(__ldg(num_rows)));
        bits = __ballot_sync(0xffffffffu, unslotted && row < row_limit);
    }
};

// The row of slot `slot` in the contiguous layout (masked_tokens == 0) or in the flattened masked layout
// [E * masked_tokens], or -1 where the slot was dropped (or, masked, did not fit in max_tokens).
// NOTE: the masked position is derived, not stored: within an expert both layouts keep slots in ascending
// order, so a slot's rank is its contiguous row minus the row of the expert's first slot (masked_slots[e, 0]).
DK_DEVICE int32_t slot_row(const int32_t* __restrict__ slot_to_row, const int32_t* __restrict__ m_indices,
                           const int32_t* __restrict__ masked_slots, uint32_t masked_tokens, uint32_t slot) {
    const int32_t row = __ldg(slot_to_row + slot);
    if (masked_tokens == 0 || row < 0)
        return row;
    const int32_t expert = __ldg(m_indices + row);
    const int32_t first_slot = __ldg(masked_slots + static_cast<uint64_t>(expert) * masked_tokens);
    const uint32_t rank = static_cast<uint32_t>(row - __ldg(slot_to_row + first_slot));
    return rank < masked_tokens ? static_cast<int32_t>(expert * masked_tokens + rank) : -1;
}

}  // namespace deep_kernels
