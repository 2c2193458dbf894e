// Writes one math warpgroup's 64 x BLOCK_N FP32 accumulators (wgmma register layout) into shared memory
// as OutputType, laid out for TMA stores with a kSwizzleBytes swizzle: the tile is cut into chunks of
// kChunkCols columns; chunk c holds rows 0..63 at kSwizzleBytes per row, 16-byte units XOR-swizzled the
// way the TMA unit reads them, which also makes the stores bank-conflict free (stmatrix) or minimal (FP32).
// kPermutedColumns (the per-channel kinds, whose B rows load permuted within 16-row blocks): within each 16-column
// block, accumulator column 8 s + 2 q + t (s = 0, 1: the 8-column group; q = lane % 4; t = 0, 1) holds D column
// 4 q + 2 s + t, so a thread's four values of a row in the block are four consecutive columns of D.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "common/macros.cuh"
#include "ptx/smem_store.cuh"

namespace deep_kernels {

template <typename OutputType, uint32_t BLOCK_N, bool kPermutedColumns = false>
struct AccumulatorStore {
    DK_STATIC_ASSERT((std::is_same_v<OutputType, __nv_bfloat16> || std::is_same_v<OutputType, float>),
                     "D is bf16 or FP32");
    DK_STATIC_ASSERT(BLOCK_N % 16 == 0, "BLOCK_N is a multiple of 16");

    static constexpr uint32_t kRowBytes = BLOCK_N * sizeof(OutputType);
    // The widest TMA swizzle span that divides a row (a multiple of 32 bytes since BLOCK_N % 16 == 0).
    static constexpr uint32_t kSwizzleBytes = kRowBytes % 128 == 0 ? 128 : (kRowBytes % 64 == 0 ? 64 : 32);
    static constexpr uint32_t kChunkCols = kSwizzleBytes / sizeof(OutputType);
    static constexpr uint32_t kNumChunks = BLOCK_N / kChunkCols;
    static constexpr uint32_t kNumRows = 64;
    static constexpr uint32_t kChunkBytes = kNumRows * kSwizzleBytes;
    static constexpr uint32_t kBytes = kNumChunks * kChunkBytes;

    // Byte offset of (row, byte column) inside the warpgroup's buffer (which must be 1024-byte aligned).
    DK_DEVICE static uint32_t offset(uint32_t row, uint32_t byte_col) {
        const uint32_t logical = row * kSwizzleBytes + byte_col % kSwizzleBytes;
        const uint32_t swizzled = logical ^ (((logical >> 7) & (kSwizzleBytes / 16 - 1)) << 4);
        return byte_col / kSwizzleBytes * kChunkBytes + swizzled;
    }

    DK_DEVICE static void write(const float (&acc)[BLOCK_N / 2], uint8_t* smem_d, uint32_t warp_in_wg,
                                uint32_t lane_idx) {
        if constexpr (kPermutedColumns) {
#pragma unroll
            for (uint32_t p = 0; p < BLOCK_N / 16; ++p)
                write_permuted_block(acc, smem_d, warp_in_wg, lane_idx, p, p * 16);
        } else if constexpr (std::is_same_v<OutputType, __nv_bfloat16>) {
            // One stmatrix.x4 per 16 columns: matrices (rows 0-7 | 8-15) x (columns 0-7 | 8-15) of the
            // warp's 16-row slice, in the order the accumulator registers hold them.
            const uint32_t row = warp_in_wg * 16 + lane_idx % 8 + (lane_idx / 8 % 2) * 8;
            const uint32_t col_in_pair = lane_idx / 16 * 8;
#pragma unroll
            for (uint32_t p = 0; p < BLOCK_N / 16; ++p) {
                const uint32_t byte_col = (p * 16 + col_in_pair) * sizeof(OutputType);
                ptx::stmatrix_x4(smem_d + offset(row, byte_col), pack_bf16(acc[p * 8 + 0], acc[p * 8 + 1]),
                                 pack_bf16(acc[p * 8 + 2], acc[p * 8 + 3]), pack_bf16(acc[p * 8 + 4], acc[p * 8 + 5]),
                                 pack_bf16(acc[p * 8 + 6], acc[p * 8 + 7]));
            }
        } else {
            const uint32_t row = warp_in_wg * 16 + lane_idx / 4;
#pragma unroll
            for (uint32_t j = 0; j < BLOCK_N / 8; ++j) {
                const uint32_t byte_col = (j * 8 + lane_idx % 4 * 2) * sizeof(float);
                ptx::st_shared(smem_d + offset(row, byte_col), acc[j * 4 + 0], acc[j * 4 + 1]);
                ptx::st_shared(smem_d + offset(row + 8, byte_col), acc[j * 4 + 2], acc[j * 4 + 3]);
            }
        }
    }

    // FP32 D only: writes chunk `chunk` of the accumulators (columns chunk * kChunkCols onwards) into a buffer of
    // one chunk (kChunkBytes), laid out as chunk 0 of write()'s. Call it with a compile-time chunk (an unrolled
    // loop), so that the registers stay statically indexed.
    DK_DEVICE static void write_chunk(const float (&acc)[BLOCK_N / 2], uint8_t* smem_chunk, uint32_t warp_in_wg,
                                      uint32_t lane_idx, uint32_t chunk) {
        DK_STATIC_ASSERT((std::is_same_v<OutputType, float>), "chunk by chunk staging of FP32 D");
        if constexpr (kPermutedColumns) {
#pragma unroll
            for (uint32_t b = 0; b < kChunkCols / 16; ++b)
                write_permuted_block(acc, smem_chunk, warp_in_wg, lane_idx, chunk * (kChunkCols / 16) + b, b * 16);
            return;
        }
        const uint32_t row = warp_in_wg * 16 + lane_idx / 4;
#pragma unroll
        for (uint32_t g = 0; g < kChunkCols / 8; ++g) {
            const uint32_t j = chunk * (kChunkCols / 8) + g;
            const uint32_t byte_col = (g * 8 + lane_idx % 4 * 2) * sizeof(float);
            ptx::st_shared(smem_chunk + offset(row, byte_col), acc[j * 4 + 0], acc[j * 4 + 1]);
            ptx::st_shared(smem_chunk + offset(row + 8, byte_col), acc[j * 4 + 2], acc[j * 4 + 3]);
        }
    }

private:
    // kPermutedColumns: the thread's values of 16-column block p (accumulator groups 2 p and 2 p + 1), its columns
    // 4 q .. 4 q + 3 of the block, which starts at column `col` of `smem_d`'s layout: one vector store per row.
    DK_DEVICE static void write_permuted_block(const float (&acc)[BLOCK_N / 2], uint8_t* smem_d, uint32_t warp_in_wg,
                                               uint32_t lane_idx, uint32_t p, uint32_t col) {
        const uint32_t row = warp_in_wg * 16 + lane_idx / 4;
        const uint32_t byte_col = (col + lane_idx % 4 * 4) * sizeof(OutputType);
        const uint32_t i = p * 8;
        if constexpr (std::is_same_v<OutputType, float>) {
            ptx::st_shared(smem_d + offset(row, byte_col), acc[i], acc[i + 1], acc[i + 4], acc[i + 5]);
            ptx::st_shared(smem_d + offset(row + 8, byte_col), acc[i + 2], acc[i + 3], acc[i + 6], acc[i + 7]);
        } else {
            ptx::st_shared(smem_d + offset(row, byte_col), pack_bf16(acc[i], acc[i + 1]), pack_bf16(acc[i + 4], acc[i + 5]));
            ptx::st_shared(smem_d + offset(row + 8, byte_col), pack_bf16(acc[i + 2], acc[i + 3]),
                           pack_bf16(acc[i + 6], acc[i + 7]));
        }
    }

    DK_DEVICE static uint32_t pack_bf16(float lo, float hi) {
        const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<const uint32_t*>(&pair);
    }
};

}  // namespace deep_kernels
