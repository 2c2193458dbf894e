// MoE token expansion, token-major: each token row of x [T, H] is read once and stored to the rows of its
// routed slots (slot s = t * kTopK + j) in a grouped-GEMM layout: the contiguous layout (row slot_to_row[s]) or
// the flattened masked layout (common/moe_rows.cuh: slot_row); dropped slots are not written. Rows are raw
// 16-byte vectors (any element type: bf16, fp32, fp8), so one kernel serves every dtype.
// Shares: the block of linear index b owns rows [b * rows_per_block, ...), at most 32. With zero_padding it
// zeroes those without a slot (row_slots[r] == -1; PaddingRows): with kBulkZero by bulk copies (TMA) of a zeroed
// shared-memory row, else by the threads' stores. With scales it writes its share's scale
// rows (FP32 values or packed UE8M0 words; ScaleStrides): each row's from its token (row_slots[r] / kTopK),
// zero for a row without a slot (with zero_padding).
// Contiguous layout: rows from *num_rows on are never written; masked layout: num_rows null.
// Memory-bound: a block covers kTokenLanes tokens of one chunk of kColumnThreads * kVectorsPerThread vectors;
// each thread issues its kVectorsPerThread 16-byte loads before the kTopK stores of each, then (the rows leave
// first) kScaleLoads scale loads before their stores. The tile is the launcher's choice (moe/expand.py:
// DEFAULT_EXPAND_TILE). No shared memory.
#pragma once

#include <cstdint>

#include "common/macros.cuh"
#include "common/moe_rows.cuh"
#include "ptx/global_memory.cuh"
#include "ptx/sync.cuh"
#include "ptx/tma.cuh"

namespace deep_kernels {

template <int kTopK, int kColumnThreads, int kTokenLanes, int kVectorsPerThread, int kScaleLoads, bool kBulkZero>
__global__ void __launch_bounds__(kColumnThreads * kTokenLanes)
smxx_moe_expand_impl(const uint4* x, uint4* __restrict__ out, const uint32_t* __restrict__ x_scales,
                     uint32_t* __restrict__ out_scales, const int32_t* __restrict__ slot_to_row,
                     const int32_t* __restrict__ m_indices, const int32_t* __restrict__ masked_slots,
                     const int32_t* __restrict__ row_slots, const int32_t* __restrict__ num_rows,
                     uint32_t num_tokens, uint32_t num_out_rows, uint32_t masked_tokens, uint32_t row_vectors,
                     uint32_t x_row_vectors, uint32_t rows_per_block, uint32_t zero_padding,
                     uint32_t scale_columns, uint32_t x_scale_row_stride, uint32_t x_scale_column_stride,
                     uint32_t scale_batch_rows, uint32_t scale_batch_stride, uint32_t scale_column_stride) {
    DK_STATIC_ASSERT(kColumnThreads % 32 == 0 && kColumnThreads * kTokenLanes <= 1024, "whole warps, one block");
    DK_STATIC_ASSERT(kVectorsPerThread >= 1 && kScaleLoads >= 1, "at least one load in flight");

    // Tile: blockIdx.x is the token block, blockIdx.y the column chunk; a token lane per token
    constexpr uint32_t kChunkVectors = kColumnThreads * kVectorsPerThread;
    const uint32_t token = blockIdx.x * kTokenLanes + threadIdx.x / kColumnThreads;
    const uint32_t first_column = blockIdx.y * kChunkVectors + threadIdx.x % kColumnThreads;
    const bool has_token = token < num_tokens;

    // Loads first: the token's vectors, its slots' rows, and which of this block's share of rows are padding
    // NOTE: plain (not read-only .nc) loads of x, which is not __restrict__: ptxas then cannot hoist a store
    // above a later load, so all kVectorsPerThread loads stay in flight together instead of one or two.
    uint4 vectors[kVectorsPerThread];
    #pragma unroll
    for (int i = 0; i < kVectorsPerThread; ++i) {
        const uint32_t column = first_column + i * kColumnThreads;
        vectors[i] = has_token && column < row_vectors ? x[static_cast<uint64_t>(token) * x_row_vectors + column]
                                                       : make_uint4(0, 0, 0, 0);
    }
    int32_t rows[kTopK];
    #pragma unroll
    for (int j = 0; j < kTopK; ++j)
        rows[j] = has_token ? slot_row(slot_to_row, m_indices, masked_slots, masked_tokens, token * kTopK + j) : -1;
    const PaddingRows padding(row_slots, num_rows, num_out_rows, zero_padding ? rows_per_block : 0);

    // Rows: each vector to each of the token's rows
    // NOTE: every store of the kernel streams (.cs: evict first), which leaves L2 to the tokens' scales; with the
    // scales' evict_last, 3-5% faster at T = 16384 (bf16 86.5 -> 87%, FP8 with scales 81 -> 85% of copy).
    #pragma unroll
    for (int j = 0; j < kTopK; ++j) {
        if (rows[j] < 0)
            continue;
        uint4* row = out + static_cast<uint64_t>(rows[j]) * row_vectors;
        #pragma unroll
        for (int i = 0; i < kVectorsPerThread; ++i) {
            const uint32_t column = first_column + i * kColumnThreads;
            if (column < row_vectors)
                __stcs(row + column, vectors[i]);
        }
    }

    // Padding rows: the whole block zeroes each one
    if constexpr (kBulkZero) {
        constexpr uint32_t kZeroBytes = 16384;
        __shared__ __align__(128) uint4 smem_zeros[kZeroBytes / 16];
        if (padding.bits != 0) {
            for (uint32_t i = threadIdx.x; i < kZeroBytes / 16; i += blockDim.x)
                smem_zeros[i] = make_uint4(0, 0, 0, 0);
            ptx::fence_proxy_async_shared();
            __syncthreads();
            const uint32_t row_bytes = row_vectors * 16;
            const uint32_t pieces = (row_bytes + kZeroBytes - 1) / kZeroBytes;
            const uint32_t items = __popc(padding.bits) * pieces;
            for (uint32_t item = threadIdx.x; item < items; item += blockDim.x) {
                const uint32_t padding_row = padding.first_row + __fns(padding.bits, 0, item / pieces + 1);
                const uint32_t offset = item % pieces * kZeroBytes;
                ptx::bulk_store(reinterpret_cast<uint8_t*>(out) + static_cast<uint64_t>(padding_row) * row_bytes +
                                    offset, smem_zeros, min(kZeroBytes, row_bytes - offset));
            }
            ptx::tma_store_commit();
            ptx::tma_store_wait_read<0>();
        }
    }
    for (uint32_t bits = kBulkZero ? 0u : padding.bits; bits != 0; bits &= bits - 1) {
        const uint32_t padding_row = padding.first_row + __ffs(bits) - 1;
        uint4* row = out + static_cast<uint64_t>(padding_row) * row_vectors;
        for (uint32_t column = threadIdx.x; column < row_vectors; column += blockDim.x)
            __stcs(row + column, make_uint4(0, 0, 0, 0));
    }

    // Scales of the share's rows: lane i takes row i of the share and warp w scale columns w, w + kNumWarps, ...,
    // so a warp's stores are 32 consecutive rows of one column (128 contiguous bytes in the MN-major layouts).
    // NOTE: written by rows, not by tokens: a token's rows lie far apart, and single words scattered over the
    // layout cost partial-sector writes to DRAM (moe/expand.py aligns the shares to whole sectors). The tokens'
    // scales (a few MB) are read from L2, where evict_last keeps them while the rows stream through.
    if (out_scales != nullptr) {
        constexpr uint32_t kNumWarps = kColumnThreads * kTokenLanes / 32;
        const ScaleStrides strides{scale_batch_rows, scale_batch_stride, 1, scale_column_stride};
        const uint32_t lane = threadIdx.x % 32;
        const uint32_t row = (blockIdx.y * gridDim.x + blockIdx.x) * rows_per_block + lane;
        const uint32_t row_limit =
            num_rows == nullptr ? num_out_rows : min(num_out_rows, static_cast<uint32_t>(__ldg(num_rows)));
        const bool in_share = lane < rows_per_block && row < row_limit;
        const int32_t slot = in_share ? __ldg(row_slots + row) : -1;
        if (in_share && (slot >= 0 || zero_padding)) {
            const uint32_t* token_scales =
                x_scales + static_cast<uint64_t>(slot < 0 ? 0 : static_cast<uint32_t>(slot) / kTopK) * x_scale_row_stride;
            // NOTE: ptxas keeps each load of the loop after the stores before it (an L2 round trip per column),
            // so the kScaleLoads loads of a pass are all issued before its stores (one: the loop unrolled 4 times).
            #pragma unroll (kScaleLoads == 1 ? 4 : 1)
            for (uint32_t first_column = threadIdx.x / 32; first_column < scale_columns;
                 first_column += kNumWarps * kScaleLoads) {
                uint32_t values[kScaleLoads];
                #pragma unroll
                for (int i = 0; i < kScaleLoads; ++i) {
                    const uint32_t column = first_column + i * kNumWarps;
                    values[i] = slot < 0 || column >= scale_columns
                                    ? 0u
                                    : ptx::ld_global_nc_evict_last(token_scales +
                                                                   static_cast<uint64_t>(column) * x_scale_column_stride);
                }
                #pragma unroll
                for (int i = 0; i < kScaleLoads; ++i) {
                    const uint32_t column = first_column + i * kNumWarps;
                    if (column < scale_columns)
                        __stcs(out_scales + strides.offset(row, column), values[i]);
                }
            }
        }
    }
}

}  // namespace deep_kernels
