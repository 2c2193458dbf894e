// D = A * B^T (or D += A * B^T) on Hopper (sm_90a) with FP8 e4m3 inputs and DeepSeek-V3 scaling:
// A [M, K] and B [N, K] K-major, 1 x 128 scales sfa for A, 128 x 128 block scales sfb for B (kOperands
// Fp8BlockScaled) or 1 x 128 scales sfb per row of B (Fp8ChannelScaled, the weight-gradient recipe: the promotion
// scales each column by its own sfb); D [M, N] row-major bf16 or FP32. The KGrouped kind (Fp8ChannelScaled or Bf16, FP32 D)
// computes D[g] = A_g B_g^T for the groups' K segments of A [M, sum k] and B [N, sum k] (scheduler.cuh). Persistent and warp-specialised over one set of traits (gemm/sm90_fp8_gemm_traits.cuh):
// the last warpgroup's first thread is the TMA producer (gemm/sm90_fp8_producer.cuh, setmaxnreg 40); math
// warpgroups 0 .. kNumMathThreads / 128 - 1 run the mainloop (gemm/sm90_fp8_mainloop.cuh: wgmma and the FP32
// promotion every 128-deep K block) and the epilogue (epilogue/sm90_fp8_gemm_epilogue.cuh) per tile
// (setmaxnreg 232, 240 with one math warpgroup).
// Tiles: 64 rows (one math warpgroup), 128 (two of 64 rows), 256 (two of 128 rows, each as two 64-row waves
// sharing every B stage); BLOCK_N 16..192. Optional 2-CTA cluster multicasting A or B. Optional split-K
// (Normal kind, no multicast, up to 128 rows): the tiles from num_unsplit_tiles on (scheduler.cuh) are
// kNumSplits jobs each, each over an even share of the K blocks; each math warpgroup stores its FP32 partial
// sums to a workspace slot, and the last job of the tile to arrive (per-warpgroup ticket) sums slots
// 0 .. kNumSplits - 1 in that fixed order and stores D (deterministic).
// kSplitsInCluster (every tile split, one job per CTA): a tile's kNumSplits jobs are one cluster; the others leave
// their partial sums in their stage buffers and the leader (split 0) adds them, in split order, through distributed
// shared memory (no workspace, no tickets; the same D bits).
// kPipelined (tiles narrow enough for a second accumulator set, kMaxPipelinedBlockN): each warpgroup issues
// K block i + 1's wgmma group before it waits for and promotes block i, so the promotion, the barrier waits
// and the wgmma latency overlap the tensor cores' work instead of draining them every K block. 256-row tiles
// (block scales, Normal kind, BLOCK_N <= kMaxPipelinedTwoWaveBlockN): each wave is promoted while the other wave's
// group runs (the mainloop's pipelined waves).
// kOverlapEpilogue (BLOCK_M 128 or 256, no split-K; M-grouped kinds: BLOCK_N a multiple of 64): the next tile's first
// K block's wgmma group (its first wave's) is issued before a tile's store, so the tensor cores work while the store
// converts and stages.
// kMathSchedule (gemm/sm90_math_schedule.cuh): Lockstep, or PingPong (two math warpgroups, plain K loop): the
// warpgroups take turns running their wgmma groups, so one's group runs while the other promotes or stores; or
// OwnTilePingPong (Normal kind, block scales, no split-K, no kOverlapEpilogue): two math warpgroups, each owning whole
// BLOCK_M x BLOCK_N tiles (BLOCK_M 64 or 128 rows per warpgroup, consecutive tiles alternating, one staging buffer and
// a stage ring position per warpgroup), take turns tile by tile, so one's promotion tail and store run while the
// other's wgmma groups run.
// K is any multiple of 16: past the last multiple of 128, TMA zero-fills the last K block, whose scale group
// covers the remaining columns. Unsupported: N % 16 != 0, BLOCK_N > 192, C distinct from D (the host copies C
// into D first).
// BF16 operands (kOperands Bf16, gemm/sm90_bf16_mainloop.cuh): A and B bf16, BLOCK_K 64 (128-byte rows, the same
// swizzle and stage bytes), no scales (tmap_sfa and sfb unused: pass any valid map and nullptr), BLOCK_N up to 256;
// the K loop keeps one wgmma group in flight across K blocks; no kPipelined, no kOverlapEpilogue. Normal kind with one
// M block (decode): B's boxes load with an L2 evict-first policy (each is read once). Tensor maps as
// below with BFLOAT16 A and B and boxes {64, BLOCK_M} / {64, BLOCK_N} (128 bytes a row). kIsMNMajorA / B (BF16,
// Normal and KGrouped kinds; B: BLOCK_N a multiple of 64): the operand is M- / N-contiguous in global memory, its map has dims
// {M (or N), K}, strides {row stride of K}, box {64, 64}, SWIZZLE_128B; wgmma reads it transposed.
//
// Host contract (tensor maps from cuTensorMapEncodeTiled, dims and strides innermost first, interleave
// none, OOB fill none (= zeros), coordinates in elements; L2 promotion 256B recommended for A and B, whose
// boxes read 128 bytes per row; measured with it):
//   tmap_a    UINT8 (e4m3 bytes). Normal / contiguous: dims {K, M}, strides {K} bytes, box {128, BLOCK_M}.
//             Masked: dims {K, M_max, G}, strides {K, M_max * K}, box {128, BLOCK_M, 1}. SWIZZLE_128B.
//   tmap_b    UINT8. dims {K, G * N} (G = 1 for Normal), strides {K}, box {128, BLOCK_N}, SWIZZLE_128B.
//   tmap_sfa  FLOAT32, M-major with rows padded to align_up(M, 4) (element (m, kb) at kb * align_up(M, 4) + m).
//             Normal / contiguous: dims {align_up(M, 4), ceil(K / 128)}, strides {align_up(M, 4) * 4}, box {BLOCK_M, 1}.
//             Masked: dims {align_up(M_max, 4), ceil(K / 128), G}, strides {align_up(M_max, 4) * 4,
//             align_up(M_max, 4) * 4 * ceil(K / 128)}, box {BLOCK_M, 1, 1}. SWIZZLE_NONE.
//   tmap_d    BFLOAT16 or FLOAT32 (FP32 with kWithAccumulation). Normal / contiguous: dims {N, M}, strides
//             {N * sizeof(D)}, box {S / sizeof(D), 64}. Masked: dims {N, M_max, G}, strides {N * sizeof(D),
//             M_max * N * sizeof(D)}, box {S / sizeof(D), 64, 1}. Swizzle S bytes =
//             AccumulatorStore<D, BLOCK_N>::kSwizzleBytes (128 if BLOCK_N * sizeof(D) % 128 == 0, else 64 if
//             % 64 == 0, else 32; heuristics: Fp8GemmConfig.swizzle_d_bytes).
//   sfb       Fp8BlockScaled: FP32 [G, ceil(N / 128), ceil(K / 128)] row-major, read directly (nullptr otherwise).
//   tmap_sfb  Fp8ChannelScaled: FLOAT32 as tmap_sfa of Normal with N for M (dims {align_up(N, 4), ceil(K / 128)},
//             box {BLOCK_N, 1}); loaded per stage next to sfa. Any valid map otherwise (unused).
//   kThreadMajorSfb (Fp8ChannelScaled): sfb points at those scales, FP32 [ceil(K / 128), N] row-major (16-byte
//             aligned), which the producer warpgroup's second warp copies into each stage thread-major
//             (gemm/sm90_sfb_thread_major.cuh); tmap_sfb is then unused.
//   KGrouped  tmap_a {sum k, M}, tmap_b {sum k, N}, tmap_sfa / tmap_sfb over sum k / 128 K blocks, tmap_d as
//             masked with G groups of M rows; grouped_layout = int32 k_g per group (multiples of BLOCK_K: 128, BF16
//             64) and num_groups = G; SHAPE_K = 0 (K comes from the device); an empty group's tiles store zeros (add
//             nothing when accumulating). BF16: no scale maps; A and B K-major or MN-major as above.
//   Fp8Mxfp4 operands (gemm/sm90_fp4_expand.cuh; K a multiple of 128, no multicast): tmap_b maps B's e2m1 codes
//             as UINT8 dims {K / 2, G * N}, strides {K / 2}, box {64, BLOCK_N}, SWIZZLE_NONE; sfb points at the
//             UE8M0 scale bytes [G * N, K / 32] row-major (4-byte aligned), read by the producer warpgroup's
//             expander warps, which build each stage's e4m3 B tile and its per-column promotion scales.
//   grouped_layout / num_groups: nullptr / 0 (Normal), int32 group per A row (contiguous; -1 = padding),
//             int32 valid rows per group (masked).
//   split_workspace / split_tickets (kNumSplits > 1; else unused, may be nullptr): FP32 workspace of
//             num_split_tiles * BLOCK_M * BLOCK_N * kNumSplits floats, 16-byte aligned, and uint32 tickets,
//             one per (split tile, math warpgroup), ZERO before the first launch; each launch leaves them
//             zero again. num_split_tiles = ceil(M / BLOCK_M) * ceil(N / BLOCK_N) - num_unsplit_tiles.
//             Launches sharing them must not overlap in time (stream order does it).
//   num_unsplit_tiles (kNumSplits > 1): tiles, in the scheduler's order, run as one job each (0: every tile
//             is split); at most the tile count.
//   d         D's base address (dense, as tmap_d describes it); read only by the grouped kinds' row-predicated
//             store (nullptr for Normal).
//   Rows past M (past M_max per group when masked) load as zeros and are clipped on store. D rows of
//   contiguous padding (any row whose grouped_layout entry differs from its M-block's group) and masked
//   rows at or past masked_m[g] are never written: a grouped tile with such a row is stored row by row
//   (epilogue/sm90_row_predicated_store.cuh) instead of by TMA. With kWithAccumulation, D must hold C before
//   the launch (C may be D): the kernel adds the product with TMA reduce-add (read-add-write on that path).
// Launch: grid = a multiple of kNumTMAMulticast, at most the SM count; block kNumTMAThreads +
// kNumMathThreads; cluster {kNumTMAMulticast, 1, 1}; dynamic shared memory = heuristics' smem_bytes.
// kSplitsInCluster: grid = tiles x kNumSplits (at most the SM count), cluster {kNumSplits, 1, 1}, num_unsplit_tiles 0;
// split_workspace and split_tickets unused.
// kEvictFirstB (Fp8BlockScaled, Normal kind, no multicast or multicast on B): B's boxes load with an L2 evict-first
// policy (decode: one M block, or one pair multicasting B, reads each B line once).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <type_traits>

#include "common/macros.cuh"
#include "epilogue/sm90_fp8_gemm_epilogue.cuh"
#include "gemm/sm90_bf16_mainloop.cuh"
#include "gemm/sm90_fp4_expand.cuh"
#include "gemm/sm90_fp8_gemm_traits.cuh"
#include "gemm/sm90_fp8_mainloop.cuh"
#include "gemm/sm90_fp8_producer.cuh"
#include "gemm/sm90_sfb_thread_major.cuh"
#include "pipeline.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/sync.cuh"
#include "ptx/tma.cuh"
#include "scheduler.cuh"

namespace deep_kernels {

namespace sm90_fp8_gemm_detail {

enum class WarpRole : uint32_t { Math, Producer };

// The mainloop of the traits' operands: BF16 needs no promotion, every other kind promotes per 128-deep K block.
template <typename Traits, typename Ring, bool kIsBf16 = Traits::kIsBf16>
struct MainloopOf {
    using type = Sm90Fp8Mainloop<Traits, Ring>;
};

template <typename Traits, typename Ring>
struct MainloopOf<Traits, Ring, true> {
    using type = Sm90Bf16Mainloop<Traits, Ring>;
};

// Shared memory of the contiguous 256-row tiles' odd-half table (Scheduler::build_odd_half_table), allocated only
// where a kernel calls this.
template <uint32_t kNumWords>
DK_DEVICE uint32_t* odd_half_table_storage() {
    __shared__ uint32_t table[kNumWords];
    return table;
}

// Whether a tile has K blocks to issue ahead (KGrouped: an empty group's tiles have none).
template <typename Traits>
DK_DEVICE bool has_k_blocks(const TileInfo& tile) {
    if constexpr (Traits::kIsKGrouped)
        return tile.num_k_blocks > 0;
    else
        return true;
}

// Whether the math warpgroup has rows of the tile to compute: not where every row of its part lies at or past masked_m
// (a masked group's last M-block; block-scaled FP8, lockstep schedule). Such a warpgroup only steps through the tile's
// stages, while the other computes and stores the tile's valid rows alone.
template <typename Traits, typename Mainloop>
DK_DEVICE bool has_warpgroup_rows(const TileInfo& tile, const Mainloop& mainloop) {
    if constexpr (Traits::kGemmType == GemmType::MGroupedMasked && Traits::kOperands == GemmOperands::Fp8BlockScaled &&
                  Traits::kNumMathWarpgroups == 2 && Traits::kMathSchedule == MathSchedule::Lockstep)
        return tile.num_masked_rows > mainloop.a_row_offset;
    else
        return true;
}

// Own-tile ping-pong (gemm/sm90_math_schedule.cuh): the warpgroup takes every other tile of the CTA's schedule (the
// other's stages it steps over) and runs each in its turn; the mainloop passes the turn on at the tile's last issue.
template <typename Traits, typename Mainloop, typename Epilogue>
DK_DEVICE void run_own_tiles(Mainloop& mainloop, const Epilogue& epilogue, typename Traits::TileScheduler& scheduler) {
    const uint32_t wg_idx = __shfl_sync(0xffffffff, threadIdx.x / kNumThreadsPerWarpgroup, 0);
    const MathTurns turns(wg_idx);
    turns.start();
    uint32_t num_tiles = 0;
    TileInfo tile;
    while (scheduler.get_next_tile(tile)) {
        if (num_tiles++ % 2 != wg_idx) {
            mainloop.state.advance_by(Traits::kNumKBlocks);
            continue;
        }
        turns.wait();
        if (!tile.is_valid) {
            mainloop.skip_tile(tile);
            turns.pass();
            continue;
        }
        mainloop.accumulate(tile, std::false_type{});
        epilogue.store(tile, epilogue.row_keys_of(tile), mainloop.final_acc);
    }
    turns.finish_tiles(num_tiles);
    if (threadIdx.x % kNumThreadsPerWarpgroup == 0)
        ptx::tma_store_wait_read<0>();
}

// One math warpgroup's walk over the scheduler's tiles: the mainloop accumulates each tile, the epilogue stores it.
template <typename Traits, typename Ring>
DK_DEVICE void run_math_warpgroup(const typename Traits::Stages& stages, const Ring& ring,
                                  typename Traits::TileScheduler& scheduler, uint8_t* smem_d_wg,
                                  const CUtensorMap* tmap_d, const float* sfb, typename Traits::OutputType* d,
                                  float* split_workspace, uint32_t* split_tickets) {
    typename MainloopOf<Traits, Ring>::type mainloop(stages, ring, sfb);
    const Sm90Fp8Epilogue<Traits> epilogue{scheduler, smem_d_wg, tmap_d, d, split_workspace, split_tickets,
                                           reinterpret_cast<float*>(stages.a_stage(0))};
    if constexpr (Traits::kOwnTiles) {
        run_own_tiles<Traits>(mainloop, epilogue, scheduler);
        return;
    }
    constexpr bool kPingPong = Traits::kMathSchedule == MathSchedule::PingPong;
    if constexpr (kPingPong)
        MathTurns(threadIdx.x / kNumThreadsPerWarpgroup).start();
    TileInfo tile;
    if constexpr (!Traits::kOverlapEpilogue) {
        while (scheduler.get_next_tile(tile)) {
            if (!tile.is_valid || !has_warpgroup_rows<Traits>(tile, mainloop)) {
                mainloop.skip_tile(tile);
                continue;
            }
            const auto row_keys = epilogue.row_keys_of(tile);
            mainloop.accumulate(tile, std::false_type{});
            epilogue.store(tile, row_keys, mainloop.final_acc);
        }
    } else {
        // NOTE: the next tile's first K block is issued before this tile's store, so that its wgmma group runs on
        // the tensor cores while the store converts and stages. The issue, the store and the next tile's K loop
        // stay on one path up to that block's wait: where control flow merged the group in flight with another
        // definition of `partial`, ptxas would wait for it right away.
        bool has_tile = scheduler.get_next_tile(tile);
        while (has_tile) {
            if (!tile.is_valid || !has_warpgroup_rows<Traits>(tile, mainloop)) {
                mainloop.skip_tile(tile);
                has_tile = scheduler.get_next_tile(tile);
                continue;
            }
            auto row_keys = epilogue.row_keys_of(tile);
            mainloop.accumulate(tile, std::false_type{});
            // NOTE: zeroed, so that the copy into `tile` after the last tile copies defined values.
            TileInfo next{};
            has_tile = scheduler.get_next_tile(next);
            while (has_tile && next.is_valid && has_k_blocks<Traits>(next) &&
                   has_warpgroup_rows<Traits>(next, mainloop)) {
                const auto first = mainloop.issue_ahead(next);
                epilogue.store(tile, row_keys, mainloop.final_acc);
                tile = next;
                row_keys = epilogue.row_keys_of(tile);
                mainloop.accumulate(tile, first);
                has_tile = scheduler.get_next_tile(next);
            }
            epilogue.store(tile, row_keys, mainloop.final_acc);
            tile = next;
        }
    }

    if constexpr (kPingPong)
        MathTurns(threadIdx.x / kNumThreadsPerWarpgroup).finish();

    // The last stores must have read their shared memory before the CTA exits; their global writes complete
    // with the grid (nothing in this launch reads them), so the CTA does not wait for them.
    if (threadIdx.x % kNumThreadsPerWarpgroup == 0)
        ptx::tma_store_wait_read<0>();
}

}  // namespace sm90_fp8_gemm_detail

template <uint32_t SHAPE_N, uint32_t SHAPE_K,
          uint32_t BLOCK_M, uint32_t BLOCK_N, uint32_t BLOCK_K,
          uint32_t kNumStages,
          uint32_t kNumTMAThreads, uint32_t kNumMathThreads,
          uint32_t kNumTMAMulticast, bool kIsMulticastOnA,
          GemmType kGemmType, typename OutputType, bool kWithAccumulation,
          uint32_t kNumSplits, bool kPipelined, bool kOverlapEpilogue, GemmOperands kOperands, bool kIsMNMajorA,
          bool kIsMNMajorB,
          MathSchedule kMathSchedule, bool kSplitsInCluster, bool kEvictFirstB, bool kThreadMajorSfb>
__global__ void __launch_bounds__(kNumTMAThreads + kNumMathThreads, 1)
sm90_fp8_gemm_impl(const __grid_constant__ CUtensorMap tmap_a, const __grid_constant__ CUtensorMap tmap_b,
                   const __grid_constant__ CUtensorMap tmap_sfa, const __grid_constant__ CUtensorMap tmap_d,
                   const float* sfb, uint32_t shape_m, const int* grouped_layout, uint32_t num_groups,
                   OutputType* d, float* split_workspace, uint32_t* split_tickets, uint32_t num_unsplit_tiles,
                   const __grid_constant__ CUtensorMap tmap_sfb) {
    using namespace sm90_fp8_gemm_detail;
    using Traits = Sm90Fp8GemmTraits<SHAPE_N, SHAPE_K, BLOCK_M, BLOCK_N, BLOCK_K, kNumStages, kNumTMAMulticast,
                                     kIsMulticastOnA, kGemmType, OutputType, kWithAccumulation, kNumSplits,
                                     kPipelined, kOverlapEpilogue, kOperands, kIsMNMajorA, kIsMNMajorB,
                                     kMathSchedule, kSplitsInCluster, kEvictFirstB, kThreadMajorSfb>;

    // Static checks (the traits hold the rest)
    DK_STATIC_ASSERT(kNumTMAThreads == Traits::kNumTMAThreads && kNumMathThreads == Traits::kNumMathThreads,
                     "one producer warpgroup; one math warpgroup for 64-row tiles, two otherwise");

    // Shared memory
    extern __shared__ __align__(1024) uint8_t smem[];
    const typename Traits::Stages stages = Traits::stages_of(smem);
    auto* barriers = reinterpret_cast<uint64_t*>(smem + Traits::kOffsetBarriers);
    const StageRing<kNumStages, Traits::kNumStageConsumerWarps, kNumTMAMulticast> ring{barriers, barriers + kNumStages};

    // Barrier init
    const uint32_t warp_idx = __shfl_sync(0xffffffff, threadIdx.x / 32, 0);
    const uint32_t lane_idx = threadIdx.x % 32;
    const WarpRole role = warp_idx < kNumMathThreads / 32 ? WarpRole::Math : WarpRole::Producer;
    const bool is_tma_thread = warp_idx == kNumMathThreads / 32 && lane_idx == 0;
    if (is_tma_thread) {
        ptx::tma_prefetch_descriptor(&tmap_a);
        ptx::tma_prefetch_descriptor(&tmap_b);
        if constexpr (!Traits::kIsBf16)
            ptx::tma_prefetch_descriptor(&tmap_sfa);
        ptx::tma_prefetch_descriptor(&tmap_d);
        if constexpr (Traits::kIsChannelScaled)
            ptx::tma_prefetch_descriptor(&tmap_sfb);
        ring.init(Traits::kThreadMajorSfb ? 1 + kSfbCopyArrivals : 1);
        if constexpr (Traits::kIsFp4B) {
#pragma unroll
            for (uint32_t s = 0; s < Traits::kNumCodeStages; ++s) {
                // The code loader's TMA arrival and its 32 lanes' cp.async arrivals; the expanders' one.
                ptx::mbarrier_init(stages.loaded_barriers + s, 1 + 32);
                ptx::mbarrier_init(stages.codes_empty_barriers + s, 1);
            }
        }
        ptx::fence_mbarrier_init();
    }
    // NOTE: with multicast, a peer may signal this CTA's barriers as soon as it passes this point.
    if constexpr (kNumTMAMulticast > 1)
        ptx::cluster_sync_relaxed();
    else
        __syncthreads();

    // Scheduler
    using TileScheduler = typename Traits::TileScheduler;
    uint32_t* odd_half_table = nullptr;
    if constexpr (TileScheduler::kHalfBlockTiles) {
        odd_half_table = odd_half_table_storage<TileScheduler::kNumOddHalfWords>();
        TileScheduler::build_odd_half_table(odd_half_table, shape_m, grouped_layout, num_groups);
        __syncthreads();
    }
    TileScheduler scheduler(shape_m, grouped_layout, num_groups, num_unsplit_tiles, odd_half_table);

    if (role == WarpRole::Producer) {
        // Producer branch: register reconfiguration, then one thread issues every TMA load.
        ptx::setmaxnreg_dec<Traits::kNumProducerRegisters>();
        if constexpr (Traits::kIsFp4B) {
            // FP4 weights: the TMA thread's warp loads the codes and their scale words (sfb: the UE8M0 scales'
            // bytes); the producer side's other warps load A and sfa and expand the codes (gemm/sm90_fp4_expand.cuh).
            if (warp_idx == kNumMathThreads / 32)
                run_fp4_code_loader<Traits>(stages, scheduler, &tmap_b, reinterpret_cast<const uint32_t*>(sfb));
            else
                run_fp4_expander<Traits>(stages, ring, scheduler, &tmap_a, &tmap_sfa, threadIdx.x - kNumMathThreads - 32);
        } else if (is_tma_thread) {
            run_tma_producer<Traits>(stages, ring, scheduler, &tmap_a, &tmap_b, &tmap_sfa, &tmap_sfb);
        } else if (Traits::kThreadMajorSfb && warp_idx == kNumMathThreads / 32 + 1) {
            run_sfb_copier<Traits>(stages, ring, scheduler, sfb, lane_idx);
        }
        // The math warpgroups' cluster barrier that publishes the splits' partial sums counts these threads too.
        if constexpr (Traits::kSplitsInCluster) {
            __syncwarp();
            ptx::cluster_sync();
        }
    } else {
        // Consumer branch: register reconfiguration, then MMA, promotion and epilogue per tile.
        ptx::setmaxnreg_inc<Traits::kNumConsumerRegisters>();
        uint8_t* smem_d_wg = smem + threadIdx.x / kNumThreadsPerWarpgroup * Traits::kSmemDBytesPerWarpgroup;
        run_math_warpgroup<Traits>(stages, ring, scheduler, smem_d_wg, &tmap_d, sfb, d, split_workspace,
                                   split_tickets);
    }

    // Teardown
    // NOTE: a peer CTA may still arrive on this CTA's empty barriers until it finishes its last stage (multicast), or
    // read this CTA's partial sums (splits in a cluster).
    if constexpr (Traits::kClusterSize > 1) {
        __syncwarp();
        ptx::cluster_sync();
    }
}

}  // namespace deep_kernels
