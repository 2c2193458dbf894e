// The SM90 GEMM engine's mainloop for BF16 operands (GemmOperands::Bf16), one per math warpgroup: it owns the
// consumer's pipeline state and the FP32 accumulators, which are the result (no scales, no promotion). Per
// 64-deep K block it waits for the stage and issues one wgmma group (m64nNk16, every 64-row wave of the
// warpgroup) straight into the accumulators, then waits for the previous K block's group only and frees its
// stage: one group stays in flight across K blocks, so the tensor cores never drain between them. KGrouped: the
// tile's K blocks are its group's (an empty group's tile has none: its accumulators are zeros).
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/macros.cuh"
#include "gemm/sm90_fp8_gemm_traits.cuh"
#include "pipeline.cuh"
#include "ptx/wgmma.cuh"
#include "scheduler.cuh"

namespace deep_kernels {

namespace sm90_fp8_gemm_detail {

template <typename Traits, typename Ring>
struct Sm90Bf16Mainloop {
    static constexpr uint32_t BLOCK_N = Traits::BLOCK_N;
    static constexpr uint32_t kNumKBlocks = Traits::kNumKBlocks;
    static constexpr uint32_t kNumMWaves = Traits::kNumMWaves;
    // One wgmma is 16 bf16 deep: 32 bytes of a K-major 128-byte swizzled row, or 16 rows (2048 bytes) of an
    // MN-major box.
    static constexpr uint32_t kWgmmaK = 16;
    static constexpr uint32_t kWaveBytes = kWarpgroupBlockM * Traits::BLOCK_K * Traits::kOperandBytes;
    using State = PipelineState<Traits::kNumStages>;
    DK_STATIC_ASSERT(Traits::kIsBf16, "the BF16 mainloop reads bf16 stages");

    const typename Traits::Stages& stages;
    const Ring& ring;

    State state;
    float final_acc[kNumMWaves][BLOCK_N / 2];

    // sfb is the FP8 kinds' (unused here: one constructor for every mainloop).
    DK_DEVICE Sm90Bf16Mainloop(const typename Traits::Stages& stages, const Ring& ring, const float*)
        : stages(stages), ring(ring) {}

    DK_DEVICE static uint32_t wg_idx() { return threadIdx.x / kNumThreadsPerWarpgroup; }
    DK_DEVICE static uint32_t lane_idx() { return threadIdx.x % 32; }

    // The tile's K loop into final_acc (the epilogue overlap is not offered: `first` is always std::false_type).
    template <typename First>
    DK_DEVICE void accumulate(const TileInfo& tile, First) {
        DK_STATIC_ASSERT((std::is_same_v<First, std::false_type>), "no K block is issued ahead");
        const uint32_t k_block_begin = tile_k_block_begin<Traits>(tile);
        const uint32_t k_block_end = tile_k_block_end<Traits>(tile);
        if constexpr (Traits::kIsKGrouped) {
            if (k_block_begin == k_block_end) {
#pragma unroll
                for (uint32_t wave = 0; wave < kNumMWaves; ++wave) {
#pragma unroll
                    for (uint32_t i = 0; i < BLOCK_N / 2; ++i)
                        final_acc[wave][i] = 0.0f;
                }
                return;
            }
        }

        // The first K block overwrites the accumulators (scale-d 0), so they need no zeroing.
        issue_k_block(state, 0u);
        State retiring = state;
        state.advance();
        for (uint32_t k_block = k_block_begin + 1; k_block < k_block_end; ++k_block) {
            issue_k_block(state, 1u);
            // NOTE: the accumulators are not touched here (no operand fence): the group just issued still
            // writes them, and any other access would make ptxas wait for every group.
            ptx::wgmma_wait_group<1>();
            ring.consumer_release(retiring, lane_idx());
            retiring = state;
            state.advance();
        }
        ptx::wgmma_wait_group<0>();
#pragma unroll
        for (uint32_t wave = 0; wave < kNumMWaves; ++wave)
            ptx::fence_operands(final_acc[wave]);
        ring.consumer_release(retiring, lane_idx());
    }

    // Lockstep partner of a valid tile (never with split-K): consume the stages so the cluster's barriers stay in
    // step.
    DK_DEVICE void skip_tile(const TileInfo& tile) {
        const uint32_t num_k_blocks = tile_k_block_end<Traits>(tile) - tile_k_block_begin<Traits>(tile);
        for (uint32_t k_block = 0; k_block < num_k_blocks; ++k_block) {
            ring.consumer_wait(state);
            ring.consumer_release(state, lane_idx());
            state.advance();
        }
    }

private:
    // Waits for the K block's stage and issues its wgmma group for every wave (accumulate 0: overwrite).
    DK_DEVICE void issue_k_block(const State& k_state, uint32_t accumulate) {
        ring.consumer_wait(k_state);
        const uint64_t desc_b = descriptor<Traits::kIsMNMajorB>(stages.b_stage(k_state.stage));
        ptx::wgmma_fence();
#pragma unroll
        for (uint32_t wave = 0; wave < kNumMWaves; ++wave) {
            // NOTE: a wave's 64 rows are one MN-major box, or 64 K-major rows: kWaveBytes either way.
            const uint64_t desc_a = descriptor<Traits::kIsMNMajorA>(
                stages.a_stage(k_state.stage) + (wg_idx() * kNumMWaves + wave) * kWaveBytes);
#pragma unroll
            for (uint32_t k = 0; k < Traits::BLOCK_K / kWgmmaK; ++k) {
                ptx::Bf16Wgmma<BLOCK_N, Traits::kIsMNMajorA, Traits::kIsMNMajorB>::mma(
                    desc_a + k_offset<Traits::kIsMNMajorA>(k), desc_b + k_offset<Traits::kIsMNMajorB>(k),
                    final_acc[wave], k > 0 ? 1u : accumulate);
            }
        }
        ptx::wgmma_commit_group();
    }

    template <bool kIsMNMajor>
    DK_DEVICE static uint64_t descriptor(const uint8_t* smem_tile) {
        if constexpr (kIsMNMajor)
            return ptx::make_smem_desc_mn_major_sw128(smem_tile, Traits::kMNMajorBoxBytes);
        else
            return ptx::make_smem_desc_k_major_sw128(smem_tile);
    }

    // The descriptor's advance (16-byte units) to the k-th 16-deep step of a K block.
    template <bool kIsMNMajor>
    DK_DEVICE static uint64_t k_offset(uint32_t k) {
        const uint32_t bytes = kIsMNMajor ? k * kWgmmaK * 128 : k * kWgmmaK * Traits::kOperandBytes;
        return bytes / 16;
    }
};

}  // namespace sm90_fp8_gemm_detail

}  // namespace deep_kernels
