// Per-block FP8 cast: x [M, K] (bf16 or fp32, row stride >= K) -> q [M, K] float8_e4m3fn and one FP32 scale
// per BLOCK_SIZE x BLOCK_SIZE block, scales [ceil(M / BLOCK_SIZE), K / BLOCK_SIZE] row-major (the FP8 GEMM's sfb).
// The per-token cast's numerics (common/quant.cuh's E4M3Scaler) with amax over the whole block; rows past M
// count as zeros. A CTA covers BLOCK_SIZE rows of kTileBlocks neighbouring blocks: every thread loads its
// 16-byte vectors into registers, block amaxes are reduced by warp shuffles then across warps in shared
// memory, and each thread quantizes and stores its vectors. K must be a multiple of BLOCK_SIZE (host checks).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/macros.cuh"
#include "common/quant.cuh"
#include "common/types.cuh"

namespace deep_kernels {

// NOTE: 1536 threads per SM (at most 40 registers) keep 96 KB of loads in flight per SM where ptxas's own choice
// (43-64 registers) keeps 64 KB; with more than 4 vectors per thread 40 registers would spill, so those keep
// ptxas's choice.
template <typename InT, int BLOCK_SIZE, int kTileBlocks, int kNumWarps>
constexpr int per_block_cast_min_blocks() {
    const int threads_per_row = BLOCK_SIZE * kTileBlocks / (16 / static_cast<int>(sizeof(InT)));
    const int passes = BLOCK_SIZE * threads_per_row / (kNumWarps * 32);
    return passes <= 4 ? 1536 / (kNumWarps * 32) : 1;
}

template <typename InT, int BLOCK_SIZE, int kTileBlocks, int kNumWarps, bool kUE8M0, ScaleMode kScaleMode>
__global__ void __launch_bounds__(kNumWarps * 32,
                                  (per_block_cast_min_blocks<InT, BLOCK_SIZE, kTileBlocks, kNumWarps>()))
smxx_per_block_cast_impl(const InT* __restrict__ x, uint8_t* __restrict__ q, float* __restrict__ scales,
                         uint32_t shape_m, uint32_t shape_k, uint32_t x_row_stride, float amax_clamp) {
    // Static checks and thread mapping: kThreadsPerRow threads cover one row of the tile, kLanesPerBlock
    // of them one block's columns; a pass covers kRowsPerPass rows, kPasses passes the block's rows.
    constexpr int kVec = 16 / sizeof(InT);
    constexpr int TILE_K = BLOCK_SIZE * kTileBlocks;
    constexpr int kThreadsPerRow = TILE_K / kVec;
    constexpr int kLanesPerBlock = BLOCK_SIZE / kVec;
    constexpr int kRowsPerPass = kNumWarps * 32 / kThreadsPerRow;
    constexpr int kPasses = BLOCK_SIZE / kRowsPerPass;
    DK_STATIC_ASSERT(BLOCK_SIZE % kVec == 0, "a block row holds whole vectors");
    DK_STATIC_ASSERT(kThreadsPerRow <= 32 && (kThreadsPerRow & (kThreadsPerRow - 1)) == 0,
                     "a tile row spans a power-of-two number of lanes within one warp");
    DK_STATIC_ASSERT((kLanesPerBlock & (kLanesPerBlock - 1)) == 0, "a block row spans a power-of-two number of lanes");
    DK_STATIC_ASSERT(kPasses >= 1 && BLOCK_SIZE % kRowsPerPass == 0, "passes cover the block's rows exactly");

    // Shared memory: each warp's amax of each block of the tile
    __shared__ float smem_amax[kNumWarps][kTileBlocks];

    const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const uint32_t row_lane = threadIdx.x % kThreadsPerRow;
    const uint32_t block_in_tile = row_lane / kLanesPerBlock;
    const uint32_t first_row = blockIdx.y * BLOCK_SIZE + threadIdx.x / kThreadsPerRow;
    const uint32_t column = blockIdx.x * TILE_K + row_lane * kVec;
    // NOTE: the last tile may reach past K by whole blocks; their threads still join the reductions.
    const bool column_valid = column < shape_k;

    // Loads first: kPasses independent 16-byte loads per thread.
    // NOTE: rows past M (zeros in the reference) load row M - 1 instead, a row of the same block, so the block's
    // amax is unchanged (max is idempotent and |x| >= 0); columns past K load column 0, and their block amaxes are
    // never read. Unpredicated loads need no zero fill (two byte permutes per bf16 element) and fewer registers.
    const uint32_t load_column = column_valid ? column : 0;
    uint4 loaded[kPasses];
    #pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
        const uint32_t row = min(first_row + pass * kRowsPerPass, shape_m - 1);
        loaded[pass] = __ldg(reinterpret_cast<const uint4*>(x + static_cast<uint64_t>(row) * x_row_stride + load_column));
    }

    // Block amax: this thread's vectors, then the lanes of its block in the warp (the same bits of
    // row_lane / kLanesPerBlock), then the warps through shared memory
    float amax = vectors_amax<InT>(loaded);
    #pragma unroll
    for (int offset = kLanesPerBlock / 2; offset > 0; offset /= 2)
        amax = max_nan(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
    #pragma unroll
    for (int offset = kThreadsPerRow; offset < 32; offset *= 2)
        amax = max_nan(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
    if (lane < kThreadsPerRow && lane % kLanesPerBlock == 0)
        smem_amax[warp][block_in_tile] = amax;
    __syncthreads();
    amax = amax_clamp;
    #pragma unroll
    for (int i = 0; i < kNumWarps; ++i)
        amax = max_nan(amax, smem_amax[i][block_in_tile]);
    if (!column_valid)
        return;

    // Quantize and store; the first row's block leaders write the scales
    const E4M3Scaler<kUE8M0, kScaleMode> scaler(amax);
    #pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
        const uint32_t row = first_row + pass * kRowsPerPass;
        if (row < shape_m)
            cast_vector<InT>(scaler, loaded[pass], q + static_cast<uint64_t>(row) * shape_k + column);
    }
    if (threadIdx.x < kThreadsPerRow && row_lane % kLanesPerBlock == 0)
        scales[static_cast<uint64_t>(blockIdx.y) * (shape_k / BLOCK_SIZE) + column / BLOCK_SIZE] = scaler.scale;
}

}  // namespace deep_kernels
