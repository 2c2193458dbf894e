// Writes one math warpgroup's 64 x BLOCK_N FP32 accumulators (wgmma register layout) into shared memory
// as OutputType, laid out for TMA stores with a kSwizzleBytes swizzle: the tile is cut into chunks of
// kChunkCols columns; chunk c holds rows 0..63 at kSwizzleBytes per row, 16-byte units XOR-swizzled the
// way the TMA unit reads them, which also makes the stores bank-conflict free (stmatrix) or minimal (FP32).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "common/macros.cuh"
#include "ptx/smem_store.cuh"

namespace deep_kernels {

template <typename OutputType, uint32_t BLOCK_N>
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
        if constexpr (std::is_same_v<OutputType, __nv_bfloat16>) {
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

    // Writes chunk `chunk` of the accumulators (columns chunk * kChunkCols onwards) into a buffer of one chunk
    // (kChunkBytes), laid out as chunk 0 of write()'s. Call it with a compile-time chunk (an unrolled loop), so that
    // the registers stay statically indexed.
    DK_DEVICE static void write_chunk(const float (&acc)[BLOCK_N / 2], uint8_t* smem_chunk, uint32_t warp_in_wg,
                                      uint32_t lane_idx, uint32_t chunk) {
        if constexpr (std::is_same_v<OutputType, __nv_bfloat16>) {
            // As write(): one stmatrix.x4 per 16 columns of the chunk.
            const uint32_t row = warp_in_wg * 16 + lane_idx % 8 + (lane_idx / 8 % 2) * 8;
            const uint32_t col_in_pair = lane_idx / 16 * 8;
#pragma unroll
            for (uint32_t g = 0; g < kChunkCols / 16; ++g) {
                const uint32_t p = chunk * (kChunkCols / 16) + g;
                const uint32_t byte_col = (g * 16 + col_in_pair) * sizeof(OutputType);
                ptx::stmatrix_x4(smem_chunk + offset(row, byte_col), pack_bf16(acc[p * 8 + 0], acc[p * 8 + 1]),
                                 pack_bf16(acc[p * 8 + 2], acc[p * 8 + 3]), pack_bf16(acc[p * 8 + 4], acc[p * 8 + 5]),
                                 pack_bf16(acc[p * 8 + 6], acc[p * 8 + 7]));
            }
        } else {
            const uint32_t row = warp_in_wg * 16 + lane_idx / 4;
#pragma unroll
            for (uint32_t g = 0; g < kChunkCols / 8; ++g) {
                const uint32_t j = chunk * (kChunkCols / 8) + g;
                const uint32_t byte_col = (g * 8 + lane_idx % 4 * 2) * sizeof(float);
                ptx::st_shared(smem_chunk + offset(row, byte_col), acc[j * 4 + 0], acc[j * 4 + 1]);
                ptx::st_shared(smem_chunk + offset(row + 8, byte_col), acc[j * 4 + 2], acc[j * 4 + 3]);
            }
        }
    }

private:
    DK_DEVICE static uint32_t pack_bf16(float lo, float hi) {
        const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<const uint32_t*>(&pair);
    }
};

}  // namespace deep_kernels
