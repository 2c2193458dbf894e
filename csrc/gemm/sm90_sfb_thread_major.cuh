// Per-channel B scales in a thread-major stage layout (Traits::kThreadMajorSfb): in an m64nNk32 wgmma's accumulators,
// lane l holds the columns 8j + 2 (l % 4) + {0, 1} of each 8-column group j. The stage keeps, per pair of groups
// (2c, 2c + 1), the four lane classes' 16 bytes one after another: thread t's sfb of groups 2c and 2c + 1 are one
// float4 at (4c + t) * 4, and a warp's four distinct float4s fill 64 consecutive bytes (no bank conflict). TMA cannot
// write this order (its 8-byte pieces interleave within 32 bytes), so the producer warpgroup's second warp copies each
// stage's sfb with 8-byte cp.async and arrives on the stage's full barrier once they complete.
#pragma once

#include <cstdint>

#include "common/macros.cuh"
#include "gemm/sm90_fp8_gemm_traits.cuh"
#include "pipeline.cuh"
#include "ptx/cp_async.cuh"
#include "scheduler.cuh"

namespace deep_kernels {

namespace sm90_fp8_gemm_detail {

// The float offset of thread lane_idx % 4's sfb pair of 8-column group j in a stage (thread-major or as loaded).
template <bool kThreadMajor>
DK_HOST_DEVICE constexpr uint32_t sfb_pair_offset(uint32_t j, uint32_t lane_idx) {
    return kThreadMajor ? (j / 2 * 4 + lane_idx % 4) * 4 + j % 2 * 2 : j * 8 + lane_idx % 4 * 2;
}

// Thread-major sfb: the full barrier's arrivals past the TMA thread's (one per lane of the copying warp).
constexpr uint32_t kSfbCopyArrivals = 32;

// The copying warp's walk: per K block of each tile, waits for the stage, copies sfb[k_block][n_first, n_first +
// BLOCK_N) (FP32 [K blocks, SHAPE_N] row-major, zeros past N) thread-major into it and arrives on its full barrier
// when the copies land.
template <typename Traits, typename Ring>
DK_DEVICE void run_sfb_copier(const typename Traits::Stages& stages, const Ring& ring,
                              typename Traits::TileScheduler& scheduler, const float* sfb, uint32_t lane_idx) {
    constexpr uint32_t kNumPairs = Traits::BLOCK_N / 2;
    PipelineState<Traits::kNumStages> state;
    TileInfo tile;
    while (scheduler.get_next_tile(tile)) {
        const uint32_t n_first = tile.n_block_idx * Traits::BLOCK_N;
        const uint32_t k_block_end = tile_k_block_end<Traits>(tile);
        for (uint32_t k_block = tile_k_block_begin<Traits>(tile); k_block < k_block_end; ++k_block) {
            ring.producer_acquire(state);
            float* smem_sfb = stages.sfb_stage(state.stage);
            const float* row = sfb + static_cast<uint64_t>(k_block) * Traits::SHAPE_N;
#pragma unroll
            for (uint32_t i = 0; i < (kNumPairs + 31) / 32; ++i) {
                // Pair p: the columns 2p and 2p + 1 of the tile, group p / 4, lane class p % 4.
                const uint32_t p = i * 32 + lane_idx;
                if (kNumPairs % 32 == 0 || p < kNumPairs) {
                    const uint32_t column = n_first + 2 * p;
                    const bool valid = column < Traits::SHAPE_N;
                    ptx::cp_async_8(smem_sfb + sfb_pair_offset<true>(p / 4, p % 4), row + (valid ? column : 0),
                                    valid ? 8 : 0);
                }
            }
            ptx::cp_async_mbarrier_arrive_noinc(ring.full_barriers + state.stage);
            state.advance();
        }
    }
}

}  // namespace sm90_fp8_gemm_detail

}  // namespace deep_kernels
