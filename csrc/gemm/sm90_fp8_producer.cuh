// The SM90 FP8 GEMM's producer: one thread walks the scheduler's tiles and, per K block, waits for a free
// stage and loads A, B and sfa (none with BF16 operands; with per-channel B scales, also sfb) into it with TMA (the
// multicast operand through the cluster leader; each CTA loads its own scales; thread-major sfb is another warp's copy,
// gemm/sm90_sfb_thread_major.cuh).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "common/macros.cuh"
#include "gemm/sm90_fp8_gemm_traits.cuh"
#include "pipeline.cuh"
#include "ptx/tma.cuh"
#include "ptx/tma_cache_hint.cuh"
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

// One operand's tile of a stage for the Normal kind: a K-major box {BLOCK_K, kRows}, or, MN-major, kRows / 64
// boxes {64, BLOCK_K} one after another (the shared operand of a multicast pair through the leader).
template <typename Traits, bool kIsMNMajor, uint32_t kRows>
DK_DEVICE void load_operand(uint8_t* smem_dst, const CUtensorMap* tmap, uint64_t* full_barrier, int32_t k, int32_t row,
                            bool shared, bool multicast, uint32_t cta_rank) {
    if constexpr (kIsMNMajor) {
#pragma unroll
        for (uint32_t box = 0; box < kRows / Traits::kMNMajorBoxCols; ++box) {
            const int32_t box_row = row + static_cast<int32_t>(box * Traits::kMNMajorBoxCols);
            load_shared_box<GemmType::Normal>(smem_dst + box * Traits::kMNMajorBoxBytes, tmap, full_barrier, box_row,
                                              k, 0, shared && multicast, cta_rank);
        }
    } else {
        load_shared_box<GemmType::Normal>(smem_dst, tmap, full_barrier, k, row, 0, shared && multicast, cta_rank);
    }
}

template <typename Traits, typename Ring>
DK_DEVICE void run_tma_producer(const typename Traits::Stages& stages, const Ring& ring,
                                typename Traits::TileScheduler& scheduler, const CUtensorMap* tmap_a,
                                const CUtensorMap* tmap_b, const CUtensorMap* tmap_sfa, const CUtensorMap* tmap_sfb) {
    constexpr GemmType kGemmType = Traits::kGemmType;
    // B [G * N, K] per group for the M-grouped kinds; one B [N, sum k] for KGrouped.
    constexpr bool kGroupedB = kGemmType == GemmType::MGroupedContiguous || kGemmType == GemmType::MGroupedMasked;
    // BF16 weights (Normal kind, K-major B, no multicast): where one M block holds every row (decode), each B box is
    // read once, so its lines are loaded evict-first: they, not lines other loads or earlier kernels' writes still
    // hold, make room in L2 for the lines that follow. (Measured on the H200: decode 1.00-1.12x faster; the masked
    // kind's one-block groups ran 1.05-1.08x slower with it, so they load as before.) FP8 block-scaled decode tiles take
    // it where the config says (Traits::kEvictFirstB).
    constexpr bool kHintedB = Traits::kIsBf16 && Traits::kNumTMAMulticast == 1 && kGemmType == GemmType::Normal;
    [[maybe_unused]] uint64_t read_once_policy = 0;
    if constexpr (kHintedB || Traits::kEvictFirstB)
        read_once_policy = ptx::l2_evict_first_policy();
    PipelineState<Traits::kNumStages> state;
    TileInfo tile;
    while (scheduler.get_next_tile(tile)) {
        const int32_t a_row = static_cast<int32_t>(Traits::TileScheduler::first_row(tile));
        const int32_t b_row = static_cast<int32_t>((kGroupedB ? tile.group_idx * Traits::SHAPE_N : 0) +
                                                   tile.n_block_idx * Traits::BLOCK_N);
        const bool multicast = Traits::kNumTMAMulticast > 1 && tile.is_multicast_valid;
        const uint32_t k_block_end = tile_k_block_end<Traits>(tile);
        for (uint32_t k_block = tile_k_block_begin<Traits>(tile); k_block < k_block_end; ++k_block) {
            ring.producer_acquire(state);
            uint64_t* full_barrier = ring.producer_expect_bytes(state, Traits::kStageTxBytes);
            const int32_t k = static_cast<int32_t>(k_block * Traits::BLOCK_K);
            uint8_t* smem_a = stages.a_stage(state.stage);
            uint8_t* smem_b = stages.b_stage(state.stage);
            if constexpr (Traits::kIsMNMajorA || Traits::kIsMNMajorB) {
                load_operand<Traits, Traits::kIsMNMajorA, Traits::BLOCK_M>(smem_a, tmap_a, full_barrier, k, a_row,
                                                                           Traits::kIsMulticastOnA, multicast,
                                                                           scheduler.cta_rank);
                load_operand<Traits, Traits::kIsMNMajorB, Traits::BLOCK_N>(smem_b, tmap_b, full_barrier, k, b_row,
                                                                           !Traits::kIsMulticastOnA, multicast,
                                                                           scheduler.cta_rank);
            } else if constexpr (Traits::kIsMulticastOnA) {
                load_shared_box<kGemmType>(smem_a, tmap_a, full_barrier, k, a_row, tile.group_idx, multicast,
                                           scheduler.cta_rank);
                ptx::tma_load(smem_b, tmap_b, full_barrier, k, b_row);
            } else {
                load_box<kGemmType>(smem_a, tmap_a, full_barrier, k, a_row, tile.group_idx);
                if constexpr (Traits::kEvictFirstB) {
                    // NOTE: with multicast on B the leader's one load feeds both CTAs of the pair.
                    constexpr uint16_t kBothCTAs = 0b11;
                    if (!multicast)
                        ptx::tma_load_with_policy(smem_b, tmap_b, full_barrier, k, b_row, read_once_policy);
                    else if (scheduler.cta_rank == 0)
                        ptx::tma_load_multicast_with_policy(smem_b, tmap_b, full_barrier, kBothCTAs, k, b_row,
                                                            read_once_policy);
                } else if constexpr (kHintedB) {
                    if (scheduler.group_num_m_blocks == 1)
                        ptx::tma_load_with_policy(smem_b, tmap_b, full_barrier, k, b_row, read_once_policy);
                    else
                        ptx::tma_load(smem_b, tmap_b, full_barrier, k, b_row);
                } else {
                    load_shared_box<GemmType::Normal>(smem_b, tmap_b, full_barrier, k, b_row, 0, multicast,
                                                      scheduler.cta_rank);
                }
            }
            if constexpr (!Traits::kIsBf16)
                load_box<kGemmType>(stages.sfa_stage(state.stage), tmap_sfa, full_barrier, a_row,
                                    static_cast<int32_t>(k_block), tile.group_idx);
            if constexpr (Traits::kIsChannelScaled && !Traits::kThreadMajorSfb)
                ptx::tma_load(stages.sfb_stage(state.stage), tmap_sfb, full_barrier, b_row, static_cast<int32_t>(k_block));
            state.advance();
        }
    }
}

}  // namespace sm90_fp8_gemm_detail

}  // namespace deep_kernels
