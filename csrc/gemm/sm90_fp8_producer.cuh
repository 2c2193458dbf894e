// The SM90 FP8 GEMM's producer: one thread walks the scheduler's tiles and, per K block, waits for a free
// stage and loads A, B and sfa (and, with per-channel B scales, sfb) into it with TMA (the multicast operand
// through the cluster leader; each CTA loads its own scales). With FP4 weights the whole warp walks them
// (load_fp4_stage).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "common/macros.cuh"
#include "gemm/sm90_fp8_gemm_traits.cuh"
#include "pipeline.cuh"
#include "ptx/cp_async.cuh"
#include "ptx/tma.cuh"
#include "scheduler.cuh"

namespace deep_kernels {

namespace sm90_fp8_gemm_detail {

// Loads one box; masked grouped GEMMs address A, sfa (and store D) through 3D maps with the group outermost.
template <GemmType kGemmType>
DK_DEVICE void load_box(void* smem_dst, const CUtensorMap* tmap, uint64_t* full_barrier, int32_t inner, int32_t outer,
                        uint32_t group_idx) {
    if constexpr (kGemmType == GemmType::MGroupedMasked)
        ptx::tma_load(smem_dst, tmap, full_barrier, inner, outer, static_cast<int32_t>(group_idx));
    else
        ptx::tma_load(smem_dst, tmap, full_barrier, inner, outer);
}

// The shared operand of a multicast pair: the leader writes it into both CTAs, the other CTA loads nothing.
template <GemmType kGemmType>
DK_DEVICE void load_shared_box(void* smem_dst, const CUtensorMap* tmap, uint64_t* full_barrier, int32_t inner,
                               int32_t outer, uint32_t group_idx, bool multicast, uint32_t cta_rank) {
    constexpr uint16_t kBothCTAs = 0b11;
    if (!multicast) {
        load_box<kGemmType>(smem_dst, tmap, full_barrier, inner, outer, group_idx);
    } else if (cta_rank == 0) {
        if constexpr (kGemmType == GemmType::MGroupedMasked)
            ptx::tma_load_multicast(smem_dst, tmap, full_barrier, kBothCTAs, inner, outer,
                                    static_cast<int32_t>(group_idx));
        else
            ptx::tma_load_multicast(smem_dst, tmap, full_barrier, kBothCTAs, inner, outer);
    }
}

// FP4 weights: the producer warp's lane 0 loads A, sfa and B's e2m1 codes (tmap_b: the codes as bytes
// [G * N, K / 2], box {64, BLOCK_N}) by TMA, and its 32 lanes copy the B rows' UE8M0 scale words of the K block
// (sfb: bytes [G * N, K / 32], a row's four scales of a K block one word) with cp.async; all complete on the
// stage's loaded barrier (1 + 32 arrivals). The expanders (gemm/sm90_fp4_expand.cuh) then fill the B tile and
// arrive on its full barrier. Rows past N copy zeros.
template <typename Traits, typename State>
DK_DEVICE void load_fp4_stage(const typename Traits::Stages& stages, const State& state, const CUtensorMap* tmap_a,
                              const CUtensorMap* tmap_b, const CUtensorMap* tmap_sfa, const uint32_t* sfb_words,
                              int32_t a_row, int32_t b_row, uint32_t n_first, uint32_t k_block, uint32_t group_idx) {
    constexpr uint32_t kTxBytes = Traits::kStageABytes + Traits::kStageCodesBytes + Traits::kStageSfaBytes;
    const uint32_t lane_idx = threadIdx.x % 32;
    uint64_t* loaded_barrier = stages.loaded_barriers + state.stage;
    if (lane_idx == 0) {
        ptx::mbarrier_arrive_expect_tx(loaded_barrier, kTxBytes);
        const int32_t k = static_cast<int32_t>(k_block * Traits::BLOCK_K);
        load_box<Traits::kGemmType>(stages.a_stage(state.stage), tmap_a, loaded_barrier, k, a_row, group_idx);
        ptx::tma_load(stages.codes_stage(state.stage), tmap_b, loaded_barrier, k / 2, b_row);
        load_box<Traits::kGemmType>(stages.sfa_stage(state.stage), tmap_sfa, loaded_barrier, a_row,
                                    static_cast<int32_t>(k_block), group_idx);
    }
    uint32_t* smem_words = stages.scale_words_stage(state.stage);
#pragma unroll
    for (uint32_t row = lane_idx; row < Traits::BLOCK_N; row += 32) {
        const bool valid = n_first + row < Traits::SHAPE_N;
        ptx::cp_async_4(smem_words + row, sfb_words + (valid ? (b_row + row) * Traits::kNumKBlocks + k_block : 0),
                        valid ? 4 : 0);
    }
    ptx::cp_async_mbarrier_arrive_noinc(loaded_barrier);
}

template <typename Traits, typename Ring>
DK_DEVICE void run_tma_producer(const typename Traits::Stages& stages, const Ring& ring,
                                typename Traits::TileScheduler& scheduler, const CUtensorMap* tmap_a,
                                const CUtensorMap* tmap_b, const CUtensorMap* tmap_sfa, const CUtensorMap* tmap_sfb,
                                const uint32_t* sfb_words = nullptr) {
    constexpr GemmType kGemmType = Traits::kGemmType;
    // B [G * N, K] per group for the M-grouped kinds; one B [N, sum k] for KGrouped.
    constexpr bool kGroupedB = kGemmType == GemmType::MGroupedContiguous || kGemmType == GemmType::MGroupedMasked;
    PipelineState<Traits::kNumStages> state;
    TileInfo tile;
    while (scheduler.get_next_tile(tile)) {
        const int32_t a_row = static_cast<int32_t>(tile.m_block_idx * Traits::BLOCK_M);
        const int32_t b_row = static_cast<int32_t>((kGroupedB ? tile.group_idx * Traits::SHAPE_N : 0) +
                                                   tile.n_block_idx * Traits::BLOCK_N);
        const bool multicast = Traits::kNumTMAMulticast > 1 && tile.is_multicast_valid;
        const uint32_t k_block_end = tile_k_block_end<Traits>(tile);
        for (uint32_t k_block = tile_k_block_begin<Traits>(tile); k_block < k_block_end; ++k_block) {
            ring.producer_acquire(state);
            if constexpr (Traits::kIsFp4B) {
                load_fp4_stage<Traits>(stages, state, tmap_a, tmap_b, tmap_sfa, sfb_words, a_row, b_row,
                                       tile.n_block_idx * Traits::BLOCK_N, k_block, tile.group_idx);
                state.advance();
                continue;
            }
            uint64_t* full_barrier = ring.producer_expect_bytes(state, Traits::kStageTxBytes);
            const int32_t k = static_cast<int32_t>(k_block * Traits::BLOCK_K);
            uint8_t* smem_a = stages.a_stage(state.stage);
            uint8_t* smem_b = stages.b_stage(state.stage);
            if constexpr (Traits::kIsMulticastOnA) {
                load_shared_box<kGemmType>(smem_a, tmap_a, full_barrier, k, a_row, tile.group_idx, multicast,
                                           scheduler.cta_rank);
                ptx::tma_load(smem_b, tmap_b, full_barrier, k, b_row);
            } else {
                load_box<kGemmType>(smem_a, tmap_a, full_barrier, k, a_row, tile.group_idx);
                load_shared_box<GemmType::Normal>(smem_b, tmap_b, full_barrier, k, b_row, 0, multicast,
                                                  scheduler.cta_rank);
            }
            load_box<kGemmType>(stages.sfa_stage(state.stage), tmap_sfa, full_barrier, a_row,
                                static_cast<int32_t>(k_block), tile.group_idx);
            if constexpr (Traits::kIsChannelScaled)
                ptx::tma_load(stages.sfb_stage(state.stage), tmap_sfb, full_barrier, b_row, static_cast<int32_t>(k_block));
            state.advance();
        }
    }
}

}  // namespace sm90_fp8_gemm_detail

}  // namespace deep_kernels
