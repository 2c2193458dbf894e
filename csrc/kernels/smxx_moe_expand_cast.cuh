// Fused MoE token expansion and per-token-group FP8 cast: row r of the grouped-GEMM layout is
// x[row_slots[r] / top_k] (bf16 or fp32; a zero row where row_slots[r] is -1), cast to e4m3 with one scale
// per group of GROUP_SIZE columns: the numerics of smxx_per_token_cast (common/quant.cuh), bit for bit.
// q [rows, K] row-major; scales in any ScaleLayout, batched per expert for the masked layout (ScaleStrides).
// Contiguous layout: rows from *num_rows on are not written; masked layout: num_rows null, every row written.
// Without zero_padding, rows without a slot are not written either.
// Memory-bound: the TokenGroupTile mapping of smxx_per_token_cast with the source row looked up per row.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/macros.cuh"
#include "common/moe_rows.cuh"
#include "common/quant.cuh"
#include "common/token_group_tile.cuh"
#include "common/types.cuh"

namespace deep_kernels {

template <typename InT, int GROUP_SIZE, bool kUE8M0, bool kPackedScales, ScaleMode kScaleMode, int kNumWarps,
          int kPasses>
__global__ void __launch_bounds__(kNumWarps * 32)
smxx_moe_expand_cast_impl(const InT* __restrict__ x, uint8_t* __restrict__ q, void* __restrict__ scales,
                          const int32_t* __restrict__ row_slots, const int32_t* __restrict__ num_rows,
                          uint32_t num_out_rows, uint32_t shape_k, uint32_t x_row_stride, uint32_t top_k,
                          uint32_t scale_batch_rows, uint32_t scale_batch_stride, uint32_t scale_row_stride,
                          uint32_t scale_column_stride, float amax_clamp, uint32_t zero_padding) {
    // Static checks and types
    constexpr int kVec = 16 / sizeof(InT);
    using Tile = TokenGroupTile<GROUP_SIZE, kVec, kNumWarps, kPasses>;
    DK_STATIC_ASSERT(!kPackedScales || kUE8M0, "packed scales are UE8M0");

    // Loads first: num_rows and every pass's slot together, then kPasses gathered 16-byte loads per thread
    // (zeros for padding rows and rows from num_rows on)
    // NOTE: the slots of rows below num_out_rows are in bounds whatever num_rows holds; waiting for num_rows
    // before loading them made num_rows -> slot -> x three dependent round trips before a block's first
    // byte of x, which held the kernel at ~78% of copy bandwidth.
    const Tile tile;
    int32_t slots[kPasses];
    #pragma unroll
    for (int pass = 0; pass < kPasses; ++pass)
        slots[pass] = tile.row(pass) < num_out_rows ? __ldg(row_slots + tile.row(pass)) : -1;
    const uint32_t row_limit = num_rows == nullptr ? num_out_rows : min(num_out_rows, static_cast<uint32_t>(__ldg(num_rows)));
    if (blockIdx.y * Tile::BLOCK_ROWS >= row_limit)
        return;
    #pragma unroll
    for (int pass = 0; pass < kPasses; ++pass)
        slots[pass] = tile.row(pass) < row_limit ? slots[pass] : -1;
    uint4 loaded[kPasses];
    #pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
        const uint64_t token = static_cast<uint32_t>(slots[pass]) / top_k;
        loaded[pass] = slots[pass] < 0 ? make_uint4(0, 0, 0, 0)
                                       : __ldg(reinterpret_cast<const uint4*>(x + token * x_row_stride + tile.column));
    }

    // Per pass: group amax, scale, cast, store
    const ScaleStrides strides{scale_batch_rows, scale_batch_stride, scale_row_stride, scale_column_stride};
    #pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
        const uint32_t row = tile.row(pass);
        float values[kVec];
        const float amax = max_nan(Tile::group_reduce(unpack_vector<InT>(loaded[pass], values), max_nan), amax_clamp);
        if (row >= row_limit || (!zero_padding && slots[pass] < 0))
            continue;

        const E4M3Scaler<kUE8M0, kScaleMode> scaler(amax);
        uint32_t codes[kVec / 4];
        scaler.quantize(values, codes);
        store_codes(q + static_cast<uint64_t>(row) * shape_k + tile.column, codes);

        if (tile.is_group_leader) {
            const uint32_t group = blockIdx.x;
            if constexpr (kPackedScales) {
                uint8_t* bytes = static_cast<uint8_t*>(scales) + strides.offset(row, group / 4) * 4;
                bytes[group % 4] = ue8m0_byte(scaler.scale);
                // NOTE: the last group also zeroes the unused bytes of its word, as smxx_per_token_cast does.
                if (group + 1 == gridDim.x)
                    for (uint32_t pad = group % 4 + 1; pad < 4; ++pad)
                        bytes[pad] = 0;
            } else {
                static_cast<float*>(scales)[strides.offset(row, group)] = scaler.scale;
            }
        }
    }
}

}  // namespace deep_kernels
