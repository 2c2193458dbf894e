// Fused MoE token expansion and per-token-group FP8 cast, token-major: each token row of x [T, K] (bf16 or
// fp32) is read and cast to e4m3 once, one scale per group of GROUP_SIZE columns (the numerics of
// smxx_per_token_cast, common/quant.cuh, bit for bit), and its codes and scales are stored to the rows of its
// routed slots (slot s = t * kTopK + j; common/moe_rows.cuh: slot_row); dropped slots are not written.
// q [rows, K] row-major; scales in any ScaleLayout, batched per expert for the masked layout (ScaleStrides).
// Rows without a slot are the cast of a zero row (codes 0, the scale of amax_clamp) when zero_rows_per_block > 0
// (common/moe_rows.cuh: PaddingRows). Contiguous layout: rows from *num_rows on are never written.
// Memory-bound: the TokenGroupTile mapping of smxx_per_token_cast over tokens with 16 elements per thread, so
// that each token's codes are cast once and stored as one 16-byte vector per thread to each of its kTopK rows.
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

// The scale of (row, group) of an expanded row: an FP32 value, or the UE8M0 byte of a packed word; the last
// group also zeroes the unused bytes of its word, as smxx_per_token_cast does.
template <bool kPackedScales>
DK_DEVICE void store_expanded_scale(void* scales, const ScaleStrides& strides, uint32_t row, uint32_t group,
                                    uint32_t num_groups, float scale) {
    if constexpr (kPackedScales) {
        uint8_t* bytes = static_cast<uint8_t*>(scales) + strides.offset(row, group / 4) * 4;
        bytes[group % 4] = ue8m0_byte(scale);
        if (group + 1 == num_groups)
            for (uint32_t pad = group % 4 + 1; pad < 4; ++pad)
                bytes[pad] = 0;
    } else {
        static_cast<float*>(scales)[strides.offset(row, group)] = scale;
    }
}

// NOTE: asking for 4 blocks per SM (up to 64 registers) keeps every specialization free of spills; left to
// itself, ptxas gives some a 40-register budget and spills across the calls of the IEEE divisions' slow paths.
template <typename InT, int kTopK, int GROUP_SIZE, bool kUE8M0, bool kPackedScales, ScaleMode kScaleMode,
          int kNumWarps, int kPasses>
__global__ void __launch_bounds__(kNumWarps * 32, 4)
smxx_moe_expand_cast_impl(const InT* __restrict__ x, uint8_t* __restrict__ q, void* __restrict__ scales,
                          const int32_t* __restrict__ slot_to_row, const int32_t* __restrict__ m_indices,
                          const int32_t* __restrict__ masked_slots, const int32_t* __restrict__ row_slots,
                          const int32_t* __restrict__ num_rows, uint32_t num_tokens, uint32_t num_out_rows,
                          uint32_t masked_tokens, uint32_t shape_k, uint32_t x_row_stride,
                          uint32_t zero_rows_per_block, uint32_t scale_batch_rows, uint32_t scale_batch_stride,
                          uint32_t scale_row_stride, uint32_t scale_column_stride, float amax_clamp) {
    // Static checks and types; the tile's rows are tokens
    // NOTE: a thread owns kVec = 16 elements of a token, so that their codes, stored kTopK times, are one
    // 16-byte store each; it loads them as kLoads 16-byte vectors, and kPasses counts loads, not tile passes.
    constexpr int kVec = 16;
    constexpr int kElementsPerLoad = 16 / sizeof(InT);
    constexpr int kLoads = kVec / kElementsPerLoad;
    constexpr int kTilePasses = kPasses / kLoads;
    using Tile = TokenGroupTile<GROUP_SIZE, kVec, kNumWarps, kTilePasses>;
    DK_STATIC_ASSERT(kPasses % kLoads == 0, "whole tile passes");
    DK_STATIC_ASSERT(!kPackedScales || kUE8M0, "packed scales are UE8M0");

    // Loads first: kPasses 16-byte loads per thread
    // NOTE: loads clamp the token to T - 1, as smxx_per_token_cast does, so they need no zero fill; what they
    // read there is never stored. A block past the last token loads nothing (T may be 0).
    const Tile tile;
    const bool has_tokens = tile.first_block_row < num_tokens;
    uint4 loaded[kTilePasses][kLoads];
    #pragma unroll
    for (int pass = 0; pass < kTilePasses; ++pass) {
        const uint64_t token = min(tile.row(pass), num_tokens - 1);
        const auto* vectors = reinterpret_cast<const uint4*>(x + token * x_row_stride + tile.column);
        #pragma unroll
        for (int i = 0; i < kLoads; ++i)
            loaded[pass][i] = has_tokens ? __ldg(vectors + i) : make_uint4(0, 0, 0, 0);
    }

    // Per pass: group amax, scale and codes, once per token (and the scale of a zero row, amax_clamp's)
    // NOTE: the codes of every pass come before the tokens' rows and the padding rows are looked up: the slow
    // paths of the IEEE divisions are calls, and what lives across them may be spilled to the stack.
    const float zero_row_scale = E4M3Scaler<kUE8M0, kScaleMode>(amax_clamp).scale;
    uint32_t codes[kTilePasses][kVec / 4];
    float pass_scales[kTilePasses];
    #pragma unroll
    for (int pass = 0; pass < kTilePasses; ++pass) {
        float values[kVec];
        const float amax = max_nan(Tile::group_reduce(unpack_vectors<InT>(loaded[pass], values), max_nan), amax_clamp);
        const E4M3Scaler<kUE8M0, kScaleMode> scaler(amax);
        scaler.quantize(values, codes[pass]);
        pass_scales[pass] = scaler.scale;
    }

    // Each token's codes and scales to each of its rows
    const PaddingRows padding(row_slots, num_rows, num_out_rows, zero_rows_per_block);
    const ScaleStrides strides{scale_batch_rows, scale_batch_stride, scale_row_stride, scale_column_stride};
    const uint32_t num_groups = shape_k / GROUP_SIZE;
    if (has_tokens) {
        int32_t rows[kTilePasses][kTopK];
        #pragma unroll
        for (int pass = 0; pass < kTilePasses; ++pass) {
            #pragma unroll
            for (int j = 0; j < kTopK; ++j)
                rows[pass][j] = tile.row(pass) < num_tokens ? slot_row(slot_to_row, m_indices, masked_slots,
                                                                       masked_tokens, tile.row(pass) * kTopK + j)
                                                            : -1;
        }
        #pragma unroll
        for (int pass = 0; pass < kTilePasses; ++pass) {
            #pragma unroll
            for (int j = 0; j < kTopK; ++j) {
                const int32_t row = rows[pass][j];
                if (row < 0)
                    continue;
                store_codes(q + static_cast<uint64_t>(row) * shape_k + tile.column, codes[pass]);
                if (tile.is_group_leader)
                    store_expanded_scale<kPackedScales>(scales, strides, row, tile.group, num_groups,
                                                        pass_scales[pass]);
            }
        }
    }

    // Padding rows: the whole block writes each one's zero codes and the scale of a zero row in every group
    for (uint32_t bits = padding.bits; bits != 0; bits &= bits - 1) {
        const uint32_t row = padding.first_row + __ffs(bits) - 1;
        uint4* row_codes = reinterpret_cast<uint4*>(q + static_cast<uint64_t>(row) * shape_k);
        for (uint32_t column = threadIdx.x; column < shape_k / 16; column += blockDim.x)
            row_codes[column] = make_uint4(0, 0, 0, 0);
        if constexpr (kPackedScales) {
            const uint32_t byte = ue8m0_byte(zero_row_scale);
            for (uint32_t word = threadIdx.x; word * 4 < num_groups; word += blockDim.x) {
                const uint32_t used = min(num_groups - word * 4, 4u);
                static_cast<uint32_t*>(scales)[strides.offset(row, word)] =
                    (byte * 0x01010101u) & (0xffffffffu >> (32 - 8 * used));
            }
        } else {
            for (uint32_t group = threadIdx.x; group < num_groups; group += blockDim.x)
                static_cast<float*>(scales)[strides.offset(row, group)] = zero_row_scale;
        }
    }
}

}  // namespace deep_kernels
