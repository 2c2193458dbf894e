// D = A * B^T (or D += A * B^T) on Hopper (sm_90a) with FP8 e4m3 inputs and DeepSeek-V3 scaling:
// A [M, K] and B [N, K] K-major, 1 x 128 scales sfa for A, 128 x 128 block scales sfb for B; D [M, N]
// row-major bf16 or FP32. Persistent and warp-specialised: warpgroups 0 .. kNumMathThreads / 128 - 1 issue
// wgmma (64 rows each), promote every 128-deep K block into FP32 registers with sfa * sfb and store tiles
// through shared memory with TMA (setmaxnreg 232, 240 with one math warpgroup); the last warpgroup's first
// warp issues the TMA loads (setmaxnreg 40). Optional 2-CTA cluster multicasting A or B. Optional split-K
// (Normal kind, no multicast): the tiles from num_unsplit_tiles on (scheduler.cuh) are kNumSplits jobs each,
// each over an even share of the K blocks; each math warpgroup stores its FP32 partial sums to a workspace
// slot, and the last job of the tile to arrive (per-warpgroup ticket) sums slots 0 .. kNumSplits - 1 in that
// fixed order and stores D (deterministic).
// kPipelined (tiles narrow enough for a second accumulator set, kMaxPipelinedBlockN): each warpgroup issues
// K block i + 1's wgmma group before it waits for and promotes block i, so the promotion, the barrier waits
// and the wgmma latency overlap the tensor cores' work instead of draining them every K block.
// kOverlapEpilogue (BLOCK_M 128, no split-K; grouped kinds: BLOCK_N a multiple of 64): the next tile's first K
// block's wgmma group is issued before a tile's store, so the tensor cores work while the store converts and stages.
// Unsupported: K % 128 != 0, N % 16 != 0, BLOCK_M other than 64 / 128, BLOCK_N > 192, C distinct from D
// (the host copies C into D first).
//
// Host contract (tensor maps from cuTensorMapEncodeTiled, dims and strides innermost first, interleave
// none, OOB fill none (= zeros), coordinates in elements; L2 promotion 256B recommended for A and B, whose
// boxes read 128 bytes per row; measured with it):
//   tmap_a    UINT8 (e4m3 bytes). Normal / contiguous: dims {K, M}, strides {K} bytes, box {128, BLOCK_M}.
//             Masked: dims {K, M_max, G}, strides {K, M_max * K}, box {128, BLOCK_M, 1}. SWIZZLE_128B.
//   tmap_b    UINT8. dims {K, G * N} (G = 1 for Normal), strides {K}, box {128, BLOCK_N}, SWIZZLE_128B.
//   tmap_sfa  FLOAT32, M-major with rows padded to align_up(M, 4) (element (m, kb) at kb * align_up(M, 4) + m).
//             Normal / contiguous: dims {align_up(M, 4), K / 128}, strides {align_up(M, 4) * 4}, box {BLOCK_M, 1}.
//             Masked: dims {align_up(M_max, 4), K / 128, G}, strides {align_up(M_max, 4) * 4,
//             align_up(M_max, 4) * 4 * K / 128}, box {BLOCK_M, 1, 1}. SWIZZLE_NONE.
//   tmap_d    BFLOAT16 or FLOAT32 (FP32 with kWithAccumulation). Normal / contiguous: dims {N, M}, strides
//             {N * sizeof(D)}, box {S / sizeof(D), 64}. Masked: dims {N, M_max, G}, strides {N * sizeof(D),
//             M_max * N * sizeof(D)}, box {S / sizeof(D), 64, 1}. Swizzle S bytes =
//             AccumulatorStore<D, BLOCK_N>::kSwizzleBytes (128 if BLOCK_N * sizeof(D) % 128 == 0, else 64 if
//             % 64 == 0, else 32; heuristics: Fp8GemmConfig.swizzle_d_bytes).
//   sfb       FP32 [G, ceil(N / 128), K / 128] row-major, read directly.
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
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "common/macros.cuh"
#include "common/math.cuh"
#include "epilogue/sm90_accumulator_store.cuh"
#include "epilogue/sm90_row_predicated_store.cuh"
#include "pipeline.cuh"
#include "ptx/global_memory.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/sync.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"
#include "scheduler.cuh"

namespace deep_kernels {

namespace sm90_fp8_gemm_detail {

enum class WarpRole : uint32_t { Math, Producer };

// Barrier 0 is __syncthreads; each math warpgroup owns one barrier for its epilogue.
enum class NamedBarrier : uint32_t { EpilogueWarpgroup0 = 1 };

constexpr uint32_t kNumThreadsPerWarpgroup = 128;
constexpr uint32_t kWarpgroupBlockM = 64;
constexpr uint32_t kScaleBlock = 128;
constexpr uint32_t kWgmmaK = 32;
constexpr uint32_t kMaxSmemBytes = 232448;
// Widest pipelined tile by math warpgroup count: three sets of BLOCK_N / 2 accumulators (two partial, one
// final) plus addressing fit the 240 (one warpgroup) or 232 (two) registers without spilling.
constexpr uint32_t kMaxPipelinedBlockN[2] = {128, 128};

// gcd(n, 128) for n > 0: tiles of width n start at multiples of it inside a 128-wide scale block.
DK_HOST_DEVICE constexpr uint32_t gcd_with_scale_block(uint32_t n) {
    const uint32_t lowest_bit = n & (~n + 1);
    return lowest_bit < kScaleBlock ? lowest_bit : kScaleBlock;
}

// Per-stage shared-memory tiles: A (BLOCK_M x BLOCK_K e4m3), B (BLOCK_N x BLOCK_K e4m3), sfa (BLOCK_M FP32).
template <uint32_t kStageABytes, uint32_t kStageBBytes, uint32_t kStageSfaFloats>
struct StageBuffers {
    uint8_t* a;
    uint8_t* b;
    float* sfa;

    DK_DEVICE uint8_t* a_stage(uint32_t stage) const { return a + stage * kStageABytes; }
    DK_DEVICE uint8_t* b_stage(uint32_t stage) const { return b + stage * kStageBBytes; }
    DK_DEVICE float* sfa_stage(uint32_t stage) const { return sfa + stage * kStageSfaFloats; }
};

// K blocks [split_k_block_begin(s, n), split_k_block_begin(s + 1, n)) belong to split s of n.
template <uint32_t kNumKBlocks>
DK_DEVICE uint32_t split_k_block_begin(uint32_t split_idx, uint32_t num_splits) {
    return split_idx * kNumKBlocks / num_splits;
}

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

template <uint32_t SHAPE_N, uint32_t SHAPE_K, uint32_t BLOCK_M, uint32_t BLOCK_N, uint32_t BLOCK_K, uint32_t kNumStages,
          uint32_t kNumTMAMulticast, bool kIsMulticastOnA, GemmType kGemmType, uint32_t kNumSplits, typename Stages,
          typename Ring, typename TileScheduler>
DK_DEVICE void run_tma_producer(const Stages& stages, const Ring& ring, TileScheduler& scheduler,
                                const CUtensorMap* tmap_a, const CUtensorMap* tmap_b, const CUtensorMap* tmap_sfa) {
    constexpr uint32_t kStageTxBytes = (BLOCK_M + BLOCK_N) * BLOCK_K + BLOCK_M * sizeof(float);
    PipelineState<kNumStages> state;
    TileInfo tile;
    while (scheduler.get_next_tile(tile)) {
        const int32_t a_row = static_cast<int32_t>(tile.m_block_idx * BLOCK_M);
        const int32_t b_row = static_cast<int32_t>((kGemmType == GemmType::Normal ? 0 : tile.group_idx * SHAPE_N) +
                                                   tile.n_block_idx * BLOCK_N);
        const bool multicast = kNumTMAMulticast > 1 && tile.is_multicast_valid;
        const uint32_t k_block_end = split_k_block_begin<SHAPE_K / BLOCK_K>(tile.split_idx + 1, tile.num_splits);
        for (uint32_t k_block = split_k_block_begin<SHAPE_K / BLOCK_K>(tile.split_idx, tile.num_splits);
             k_block < k_block_end; ++k_block) {
            ring.producer_acquire(state);
            uint64_t* full_barrier = ring.producer_expect_bytes(state, kStageTxBytes);
            const int32_t k = static_cast<int32_t>(k_block * BLOCK_K);
            uint8_t* smem_a = stages.a_stage(state.stage);
            uint8_t* smem_b = stages.b_stage(state.stage);
            if constexpr (kIsMulticastOnA) {
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
            state.advance();
        }
    }
}

// The factors sfa[row] * sfb of one K block for a thread's two rows (lo, hi), against the tile's first and
// second sfb block.
struct PromotionScales {
    float lo, hi, second_lo, second_hi;
};

// final += partial * sfa[row] * sfb: accumulator groups (8 columns each) from kSecondGroup on use the
// second sfb block (kSecondGroup = BLOCK_N / 8: the tile lies in one block).
template <uint32_t BLOCK_N, uint32_t kSecondGroup>
DK_DEVICE void promote(const float (&partial)[BLOCK_N / 2], float (&final_acc)[BLOCK_N / 2],
                       const PromotionScales& scales) {
#pragma unroll
    for (uint32_t j = 0; j < BLOCK_N / 8; ++j) {
        const float lo = j < kSecondGroup ? scales.lo : scales.second_lo;
        const float hi = j < kSecondGroup ? scales.hi : scales.second_hi;
        final_acc[j * 4 + 0] += lo * partial[j * 4 + 0];
        final_acc[j * 4 + 1] += lo * partial[j * 4 + 1];
        final_acc[j * 4 + 2] += hi * partial[j * 4 + 2];
        final_acc[j * 4 + 3] += hi * partial[j * 4 + 3];
    }
}

// Calls f(std::integral_constant<uint32_t, i>) for the runtime index i < sizeof...(Is).
template <typename F, uint32_t... Is>
DK_DEVICE void dispatch_index(uint32_t i, F&& f, std::integer_sequence<uint32_t, Is...>) {
    ((i == Is ? (f(std::integral_constant<uint32_t, Is>{}), 0) : 0), ...);
}

// Writes the warpgroup's accumulators into its staging buffer, visible to the whole warpgroup and to TMA.
template <typename Store, uint32_t BLOCK_N>
DK_DEVICE void stage_tile(const float (&final_acc)[BLOCK_N / 2], uint8_t* smem_d_wg, uint32_t wg_idx) {
    const uint32_t thread_in_wg = threadIdx.x % kNumThreadsPerWarpgroup;
    const uint32_t barrier_id = static_cast<uint32_t>(NamedBarrier::EpilogueWarpgroup0) + wg_idx;

    // The previous tile's store must have finished reading the buffer before it is overwritten.
    if (thread_in_wg == 0)
        ptx::tma_store_wait_read<0>();
    ptx::named_barrier_sync(barrier_id, kNumThreadsPerWarpgroup);
    Store::write(final_acc, smem_d_wg, thread_in_wg / 32, thread_in_wg % 32);
    ptx::fence_proxy_async_shared();
    ptx::named_barrier_sync(barrier_id, kNumThreadsPerWarpgroup);
}

template <uint32_t SHAPE_N, uint32_t BLOCK_M, uint32_t BLOCK_N, GemmType kGemmType, typename OutputType,
          bool kWithAccumulation>
DK_DEVICE void store_tile(const float (&final_acc)[BLOCK_N / 2], uint8_t* smem_d_wg, const CUtensorMap* tmap_d,
                          const TileInfo& tile, uint32_t wg_idx) {
    using Store = AccumulatorStore<OutputType, BLOCK_N>;
    const uint32_t thread_in_wg = threadIdx.x % kNumThreadsPerWarpgroup;
    stage_tile<Store, BLOCK_N>(final_acc, smem_d_wg, wg_idx);

    if (thread_in_wg == 0) {
        const int32_t row = static_cast<int32_t>(tile.m_block_idx * BLOCK_M + wg_idx * kWarpgroupBlockM);
        const int32_t group = static_cast<int32_t>(tile.group_idx);
#pragma unroll
        for (uint32_t c = 0; c < Store::kNumChunks; ++c) {
            const uint32_t col = tile.n_block_idx * BLOCK_N + c * Store::kChunkCols;
            if (col >= SHAPE_N)
                break;
            const uint8_t* src = smem_d_wg + c * Store::kChunkBytes;
            const int32_t n = static_cast<int32_t>(col);
            if constexpr (kWithAccumulation && kGemmType == GemmType::MGroupedMasked)
                ptx::tma_reduce_add(tmap_d, src, n, row, group);
            else if constexpr (kWithAccumulation)
                ptx::tma_reduce_add(tmap_d, src, n, row);
            else if constexpr (kGemmType == GemmType::MGroupedMasked)
                ptx::tma_store(tmap_d, src, n, row, group);
            else
                ptx::tma_store(tmap_d, src, n, row);
        }
        ptx::tma_store_commit();
    }
}

// Split-K: stores one warpgroup's FP32 partial sums of its 64 tile rows into workspace slot split_idx of
// `slots` and takes the warpgroup's ticket; the job that arrives last (every split's slot is written)
// resets the ticket, sums slots 0 .. kNumSplits - 1 in that order into `total` and returns true. The
// fixed order makes D independent of which job arrives last.
template <uint32_t BLOCK_N, uint32_t kNumSplits>
DK_DEVICE bool reduce_splits(const float (&partial_sums)[BLOCK_N / 2], float (&total)[BLOCK_N / 2], float* slots,
                             uint32_t* ticket, uint32_t split_idx, uint32_t barrier_id) {
    constexpr uint32_t kSlotFloats = kWarpgroupBlockM * BLOCK_N;
    const uint32_t thread_in_wg = threadIdx.x % kNumThreadsPerWarpgroup;
    // A slot mirrors the registers: float4 j of thread t sits at float (j * 128 + t) * 4, so a warp's stores
    // are 512 contiguous bytes and the reducing thread reads back the elements it holds itself.
    float* own_slot = slots + split_idx * kSlotFloats;
#pragma unroll
    for (uint32_t j = 0; j < BLOCK_N / 8; ++j) {
        ptx::st_global_cg(own_slot + (j * kNumThreadsPerWarpgroup + thread_in_wg) * 4, partial_sums[j * 4 + 0],
                          partial_sums[j * 4 + 1], partial_sums[j * 4 + 2], partial_sums[j * 4 + 3]);
    }
    // NOTE: each thread fences its own stores at gpu scope (rather than relying on the barrier making thread
    // 0's release cumulative), then thread 0 takes the ticket; on the last job, thread 0's acquire and the
    // barrier below order the other jobs' stores before every thread's loads (which bypass L1).
    ptx::fence_acq_rel_gpu();
    ptx::named_barrier_sync(barrier_id, kNumThreadsPerWarpgroup);
    uint32_t num_arrived_before = 0;
    if (thread_in_wg == 0)
        num_arrived_before = ptx::atomic_add_acq_rel_gpu(ticket, 1);
    if (!ptx::named_barrier_sync_or(barrier_id, kNumThreadsPerWarpgroup, num_arrived_before == kNumSplits - 1))
        return false;

    // Every split has arrived, so no job of this launch touches the ticket again.
    if (thread_in_wg == 0)
        ptx::store_relaxed_gpu(ticket, 0);
    const float* first = slots + thread_in_wg * 4;
#pragma unroll
    for (uint32_t j = 0; j < BLOCK_N / 8; ++j) {
        ptx::ld_global_cg(first + j * kNumThreadsPerWarpgroup * 4, total[j * 4 + 0], total[j * 4 + 1],
                          total[j * 4 + 2], total[j * 4 + 3]);
    }
    // NOTE: unrolled so that several slots' loads are in flight at once (L2 latency, not bandwidth, bounds
    // this loop); fewer at once for wide tiles, which hold more registers per slot.
    constexpr uint32_t kSlotsInFlight = BLOCK_N <= 64 ? 4 : (BLOCK_N <= 128 ? 2 : 1);
#pragma unroll kSlotsInFlight
    for (uint32_t split = 1; split < kNumSplits; ++split) {
        const float* slot = first + split * kSlotFloats;
#pragma unroll
        for (uint32_t j = 0; j < BLOCK_N / 8; ++j) {
            float x, y, z, w;
            ptx::ld_global_cg(slot + j * kNumThreadsPerWarpgroup * 4, x, y, z, w);
            total[j * 4 + 0] += x;
            total[j * 4 + 1] += y;
            total[j * 4 + 2] += z;
            total[j * 4 + 3] += w;
        }
    }
    return true;
}

// The grouped kinds' store of a tile whose rows are not all valid: through the same staging buffer, then
// row-predicated 16-byte stores, so padding rows and rows past masked_m are never written.
template <uint32_t SHAPE_N, uint32_t BLOCK_M, uint32_t BLOCK_N, GemmType kGemmType, typename OutputType,
          bool kWithAccumulation, typename TileScheduler>
DK_DEVICE void store_tile_rows(const float (&final_acc)[BLOCK_N / 2], uint8_t* smem_d_wg, OutputType* d,
                               const TileInfo& tile, uint32_t wg_idx, const TileScheduler& scheduler) {
    DK_STATIC_ASSERT(kGemmType != GemmType::Normal, "Normal tiles are clipped by the TMA store");
    using RowStore = RowPredicatedStore<OutputType, BLOCK_N, kNumThreadsPerWarpgroup, kWithAccumulation>;
    stage_tile<AccumulatorStore<OutputType, BLOCK_N>, BLOCK_N>(final_acc, smem_d_wg, wg_idx);

    // Rows are counted inside the group for masked (D [G, M_max, N]), inside D for contiguous.
    const uint32_t first_row = tile.m_block_idx * BLOCK_M + wg_idx * kWarpgroupBlockM;
    const uint32_t first_col = tile.n_block_idx * BLOCK_N;
    const size_t group_first_row =
        kGemmType == GemmType::MGroupedMasked ? static_cast<size_t>(tile.group_idx) * scheduler.shape_m : 0;
    OutputType* d_tile = d + (group_first_row + first_row) * SHAPE_N + first_col;
    const uint32_t num_cols = SHAPE_N - first_col < BLOCK_N ? SHAPE_N - first_col : BLOCK_N;
    RowStore::store(smem_d_wg, d_tile, SHAPE_N, num_cols, threadIdx.x % kNumThreadsPerWarpgroup,
                    [&](uint32_t row) { return scheduler.is_valid_row(first_row + row, tile.group_idx); });
}

// Scheduler::row_key of a lane's two rows of its warpgroup's 64 (the grouped kinds' store reads them).
struct RowKeys {
    int even, odd;
};

// The rows of sfb (one per K block) of a tile's first 128-wide block of columns and of the next one.
struct SfbBlocks {
    const float* first;
    const float* second;
};

// A K block whose wgmma group was issued ahead (the first of a tile, issued during the previous tile's
// epilogue): its promotion scales and the stage it reads, which it frees when retired.
template <uint32_t kNumStages>
struct IssuedKBlock {
    PromotionScales scales;
    PipelineState<kNumStages> state;
};

template <uint32_t SHAPE_N, uint32_t SHAPE_K, uint32_t BLOCK_M, uint32_t BLOCK_N, uint32_t BLOCK_K, uint32_t kNumStages,
          GemmType kGemmType, typename OutputType, bool kWithAccumulation, uint32_t kNumSplits, bool kPipelined,
          bool kOverlapEpilogue, typename Stages, typename Ring, typename TileScheduler>
DK_DEVICE void run_math_warpgroup(const Stages& stages, const Ring& ring, TileScheduler& scheduler,
                                  uint8_t* smem_d_wg, const CUtensorMap* tmap_d, const float* sfb, OutputType* d,
                                  float* split_workspace, uint32_t* split_tickets) {
    constexpr uint32_t kNumKBlocks = SHAPE_K / BLOCK_K;
    constexpr uint32_t kNumSfbRows = ceil_div(SHAPE_N, kScaleBlock);
    // Tiles start at multiples of kTileOffsetStep inside a 128-wide sfb block.
    constexpr uint32_t kTileOffsetStep = gcd_with_scale_block(BLOCK_N);
    constexpr uint32_t kNumTileOffsets = kScaleBlock / kTileOffsetStep;
    constexpr uint32_t kNumMathWarpgroups = BLOCK_M / kWarpgroupBlockM;
    const uint32_t wg_idx = threadIdx.x / kNumThreadsPerWarpgroup;
    const uint32_t lane_idx = threadIdx.x % 32;
    // This thread's accumulator rows inside the tile: row_lo and row_lo + 8.
    const uint32_t row_lo = wg_idx * kWarpgroupBlockM + (threadIdx.x / 32 % 4) * 16 + lane_idx / 4;

    float partial[BLOCK_N / 2];
    // Only the pipelined K loop uses it (the compiler drops it otherwise).
    float partial_next[BLOCK_N / 2];
    float final_acc[BLOCK_N / 2];
    PipelineState<kNumStages> state;

    // The tile's first sfb block and the next one (the first again past the last block: a straddling tile past
    // the last sfb block only has columns past N, which are never stored).
    const auto sfb_blocks = [&](const TileInfo& tile) -> SfbBlocks {
        const uint32_t n_first = tile.n_block_idx * BLOCK_N;
        const uint32_t sfb_row =
            (kGemmType == GemmType::Normal ? 0 : tile.group_idx * kNumSfbRows) + n_first / kScaleBlock;
        const float* first = sfb + sfb_row * kNumKBlocks;
        return {first, first + (n_first / kScaleBlock + 1 < kNumSfbRows ? kNumKBlocks : 0)};
    };

    // Waits for the K block's stage, issues its wgmma group into `acc` and returns its promotion scales (the
    // second sfb block's only where the tile straddles two).
    const auto issue_k_block = [&](auto straddles, const SfbBlocks& sfb_rows,
                                   float(&acc)[BLOCK_N / 2], uint32_t k_block,
                                   const PipelineState<kNumStages>& k_state) -> PromotionScales {
        // NOTE: sfb comes from global memory; its latency hides behind the wgmma group.
        const float sfb_0 = __ldg(sfb_rows.first + k_block);
        const float sfb_1 = decltype(straddles)::value ? __ldg(sfb_rows.second + k_block) : sfb_0;
        ring.consumer_wait(k_state);
        const float* smem_sfa = stages.sfa_stage(k_state.stage);
        const float sfa_lo = smem_sfa[row_lo];
        const float sfa_hi = smem_sfa[row_lo + 8];
        const PromotionScales scales{sfa_lo * sfb_0, sfa_hi * sfb_0, sfa_lo * sfb_1, sfa_hi * sfb_1};

        const uint64_t desc_a =
            ptx::make_smem_desc_k_major_sw128(stages.a_stage(k_state.stage) + wg_idx * kWarpgroupBlockM * BLOCK_K);
        const uint64_t desc_b = ptx::make_smem_desc_k_major_sw128(stages.b_stage(k_state.stage));
        ptx::wgmma_fence();
#pragma unroll
        for (uint32_t k = 0; k < BLOCK_K / kWgmmaK; ++k) {
            // Descriptor addresses are in 16-byte units: one k32 step of e4m3 is 32 bytes.
            const uint64_t k_offset = k * kWgmmaK / 16;
            ptx::Fp8Wgmma<BLOCK_N>::mma(desc_a + k_offset, desc_b + k_offset, acc, k > 0 ? 1u : 0u);
        }
        ptx::wgmma_commit_group();
        return scales;
    };

    // The K loop of one tile whose first column sits kTileOffset columns into its sfb block; `first` is its first
    // K block if that was issued ahead (into `partial`), else std::false_type.
    auto accumulate_tile = [&](const TileInfo& tile, auto tile_offset_idx, auto first) {
        constexpr bool kIssuedAhead = !std::is_same_v<decltype(first), std::false_type>;
        constexpr uint32_t kTileOffset = decltype(tile_offset_idx)::value * kTileOffsetStep;
        constexpr uint32_t kSecondGroup = (kScaleBlock - kTileOffset < BLOCK_N ? kScaleBlock - kTileOffset : BLOCK_N) / 8;
        constexpr std::integral_constant<bool, (kSecondGroup < BLOCK_N / 8)> kStraddles;
        const auto sfb_rows = sfb_blocks(tile);
        auto issue = [&](float(&acc)[BLOCK_N / 2], uint32_t k_block) {
            return issue_k_block(kStraddles, sfb_rows, acc, k_block, state);
        };
        // Once at most kNumPending later groups are in flight, `acc`'s group is done: frees its stage and
        // adds it into final_acc.
        auto retire_k_block = [&](auto num_pending, float(&acc)[BLOCK_N / 2], const PromotionScales& scales,
                                  const PipelineState<kNumStages>& k_state) {
            ptx::wgmma_wait_group<decltype(num_pending)::value>();
            ptx::fence_operands(acc);
            ring.consumer_release(k_state, lane_idx);
            promote<BLOCK_N, kSecondGroup>(acc, final_acc, scales);
        };
        constexpr std::integral_constant<int, 0> kNoneInFlight;
        constexpr std::integral_constant<int, 1> kOneInFlight;

#pragma unroll
        for (uint32_t i = 0; i < BLOCK_N / 2; ++i)
            final_acc[i] = 0.0f;
        const uint32_t k_block_begin = split_k_block_begin<kNumKBlocks>(tile.split_idx, tile.num_splits);
        const uint32_t k_block_end = split_k_block_begin<kNumKBlocks>(tile.split_idx + 1, tile.num_splits);
        if constexpr (!kPipelined) {
            uint32_t k_block = k_block_begin;
            if constexpr (kIssuedAhead) {
                retire_k_block(kNoneInFlight, partial, first.scales, first.state);
                ++k_block;
            }
            for (; k_block < k_block_end; ++k_block) {
                const PromotionScales scales = issue(partial, k_block);
                retire_k_block(kNoneInFlight, partial, scales, state);
                state.advance();
            }
        } else {
            // Two accumulator sets: K block i + 1's wgmma group runs on the tensor cores while block i is
            // promoted. The loop is unrolled by two so that each set is named at compile time. The first block's
            // group goes to `partial` (unless it was issued ahead).
            PipelineState<kNumStages> retiring = state;
            PromotionScales scales;
            if constexpr (kIssuedAhead) {
                retiring = first.state;
                scales = first.scales;
            } else {
                scales = issue(partial, k_block_begin);
                state.advance();
            }
            for (uint32_t k_block = k_block_begin + 1;; k_block += 2) {
                if (k_block == k_block_end) {
                    retire_k_block(kNoneInFlight, partial, scales, retiring);
                    break;
                }
                const PromotionScales next_scales = issue(partial_next, k_block);
                retire_k_block(kOneInFlight, partial, scales, retiring);
                retiring = state;
                state.advance();
                if (k_block + 1 == k_block_end) {
                    retire_k_block(kNoneInFlight, partial_next, next_scales, retiring);
                    break;
                }
                scales = issue(partial, k_block + 1);
                retire_k_block(kOneInFlight, partial_next, next_scales, retiring);
                retiring = state;
                state.advance();
            }
        }
    };

    // Grouped kinds: the first of the lane's two rows (2 * lane, 2 * lane + 1 of its warpgroup's 64) whose keys it
    // loads and checks for the store's vote.
    const auto vote_row = [&](const TileInfo& tile) {
        return tile.m_block_idx * BLOCK_M + wg_idx * kWarpgroupBlockM + 2 * lane_idx;
    };

    // The tile's store: split-K partial sums and their reduction, the grouped kinds' row-predicated store, or
    // the TMA store. With split-K it reduces into `partial`.
    auto store = [&](const TileInfo& tile, const RowKeys& row_keys) {
        if constexpr (kNumSplits > 1) {
            if (tile.num_splits > 1) {
                // The wgmma accumulators are free until the next tile: they receive the sum of the splits.
                const uint32_t wg_slot = tile.split_tile_idx * kNumMathWarpgroups + wg_idx;
                float* slots = split_workspace + static_cast<size_t>(wg_slot) * kNumSplits * kWarpgroupBlockM * BLOCK_N;
                const uint32_t barrier_id = static_cast<uint32_t>(NamedBarrier::EpilogueWarpgroup0) + wg_idx;
                if (reduce_splits<BLOCK_N, kNumSplits>(final_acc, partial, slots, split_tickets + wg_slot,
                                                       tile.split_idx, barrier_id)) {
                    store_tile<SHAPE_N, BLOCK_M, BLOCK_N, kGemmType, OutputType, kWithAccumulation>(
                        partial, smem_d_wg, tmap_d, tile, wg_idx);
                }
                return;
            }
        }
        // Normal tiles rely on the TMA store's clipping at M; grouped ones store a warpgroup's rows with any
        // rejected row through the row-predicated path. Every warp votes over all 64 rows, so the warps agree.
        // NOTE: a warp vote rather than a warpgroup barrier's reduction: with the latter the contiguous kind ran
        // 7-11% behind the dense GEMM at the same tiles, with the vote 1-4% (H200, timed in turns).
        if constexpr (kGemmType != GemmType::Normal) {
            const uint32_t row = vote_row(tile);
            const bool rows_valid = scheduler.is_valid_row(row_keys.even, row, tile.group_idx) &&
                                    scheduler.is_valid_row(row_keys.odd, row + 1, tile.group_idx);
            if (!__all_sync(0xffffffffu, rows_valid)) {
                store_tile_rows<SHAPE_N, BLOCK_M, BLOCK_N, kGemmType, OutputType, kWithAccumulation>(
                    final_acc, smem_d_wg, d, tile, wg_idx, scheduler);
                return;
            }
        }
        store_tile<SHAPE_N, BLOCK_M, BLOCK_N, kGemmType, OutputType, kWithAccumulation>(final_acc, smem_d_wg, tmap_d,
                                                                                          tile, wg_idx);
    };

    // Grouped kinds: the row keys (Scheduler::row_key) of the lane's two vote rows; loaded before the K loop,
    // compared at the store, so that the loads' latency hides behind the tile.
    const auto row_keys_of = [&](const TileInfo& tile) -> RowKeys {
        if constexpr (kGemmType == GemmType::Normal)
            return {};
        const uint32_t row = vote_row(tile);
        return {scheduler.row_key(row, tile.group_idx), scheduler.row_key(row + 1, tile.group_idx)};
    };
    // NOTE: one K loop per possible straddle point keeps the per-column scale choice out of the loop.
    const auto accumulate = [&](const TileInfo& tile, auto first) {
        const uint32_t tile_offset_idx = tile.n_block_idx * BLOCK_N % kScaleBlock / kTileOffsetStep;
        dispatch_index(
            tile_offset_idx, [&](auto offset_idx) { accumulate_tile(tile, offset_idx, first); },
            std::make_integer_sequence<uint32_t, kNumTileOffsets>{});
    };

    // Lockstep partner of a valid tile (never with split-K): consume the stages so the cluster's barriers stay in
    // step.
    const auto skip_tile = [&]() {
        for (uint32_t k_block = 0; k_block < kNumKBlocks; ++k_block) {
            ring.consumer_wait(state);
            ring.consumer_release(state, lane_idx);
            state.advance();
        }
    };

    TileInfo tile;
    if constexpr (!kOverlapEpilogue) {
        while (scheduler.get_next_tile(tile)) {
            if (!tile.is_valid) {
                skip_tile();
                continue;
            }
            const RowKeys row_keys = row_keys_of(tile);
            accumulate(tile, std::false_type{});
            store(tile, row_keys);
        }
    } else {
        // NOTE: the next tile's first K block is issued before this tile's store, so that its wgmma group runs on
        // the tensor cores while the store converts and stages. The issue, the store and the next tile's K loop
        // stay on one path up to that block's wait: where control flow merged the group in flight with another
        // definition of `partial`, ptxas would wait for it right away.
        bool has_tile = scheduler.get_next_tile(tile);
        while (has_tile) {
            if (!tile.is_valid) {
                skip_tile();
                has_tile = scheduler.get_next_tile(tile);
                continue;
            }
            RowKeys row_keys = row_keys_of(tile);
            accumulate(tile, std::false_type{});
            // NOTE: zeroed, so that the copy into `tile` after the last tile copies defined values.
            TileInfo next{};
            has_tile = scheduler.get_next_tile(next);
            while (has_tile && next.is_valid) {
                IssuedKBlock<kNumStages> first;
                first.state = state;
                first.scales = issue_k_block(std::true_type{}, sfb_blocks(next), partial,
                                             split_k_block_begin<kNumKBlocks>(next.split_idx, next.num_splits), state);
                state.advance();
                store(tile, row_keys);
                tile = next;
                row_keys = row_keys_of(tile);
                accumulate(tile, first);
                has_tile = scheduler.get_next_tile(next);
            }
            store(tile, row_keys);
            tile = next;
        }
    }

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
          uint32_t kNumSplits, bool kPipelined, bool kOverlapEpilogue>
__global__ void __launch_bounds__(kNumTMAThreads + kNumMathThreads, 1)
sm90_fp8_gemm_impl(const __grid_constant__ CUtensorMap tmap_a, const __grid_constant__ CUtensorMap tmap_b,
                   const __grid_constant__ CUtensorMap tmap_sfa, const __grid_constant__ CUtensorMap tmap_d,
                   const float* sfb, uint32_t shape_m, const int* grouped_layout, uint32_t num_groups,
                   OutputType* d, float* split_workspace, uint32_t* split_tickets, uint32_t num_unsplit_tiles) {
    using namespace sm90_fp8_gemm_detail;

    // Static checks
    constexpr uint32_t kNumMathWarpgroups = kNumMathThreads / kNumThreadsPerWarpgroup;
    DK_STATIC_ASSERT(BLOCK_K == kScaleBlock, "one K block per 128-wide scale block");
    DK_STATIC_ASSERT(SHAPE_K % BLOCK_K == 0 && SHAPE_K > 0, "K is a positive multiple of 128");
    DK_STATIC_ASSERT(SHAPE_N % 16 == 0 && SHAPE_N > 0, "N is a positive multiple of 16");
    DK_STATIC_ASSERT(kNumTMAThreads == kNumThreadsPerWarpgroup, "one producer warpgroup");
    DK_STATIC_ASSERT(kNumMathThreads % kNumThreadsPerWarpgroup == 0 && BLOCK_M == kNumMathWarpgroups * kWarpgroupBlockM &&
                         (BLOCK_M == 64 || BLOCK_M == 128),
                     "one math warpgroup per 64 rows, BLOCK_M 64 or 128");
    DK_STATIC_ASSERT(BLOCK_N % 16 == 0 && BLOCK_N >= 16 && BLOCK_N <= 192, "BLOCK_N in 16..192, a multiple of 16");
    DK_STATIC_ASSERT(BLOCK_N <= kScaleBlock + gcd_with_scale_block(BLOCK_N), "a tile covers at most two sfb blocks");
    DK_STATIC_ASSERT(kNumTMAMulticast == 1 || kNumTMAMulticast == 2, "clusters of 1 or 2 CTAs");
    DK_STATIC_ASSERT((!kWithAccumulation || std::is_same_v<OutputType, float>), "accumulation into FP32 D");
    DK_STATIC_ASSERT(kNumSplits >= 1 && kNumSplits <= SHAPE_K / BLOCK_K, "every split has at least one K block");
    DK_STATIC_ASSERT(!kPipelined || BLOCK_N <= kMaxPipelinedBlockN[kNumMathWarpgroups - 1],
                     "three accumulator sets fit the math warpgroups' registers");
    // NOTE: ptxas serializes every wgmma of a kernel whose group in flight meets a divergent path, as the
    // split-K reduction is, and (C7514) of the one-warpgroup tiles. The grouped kinds' vote and row-predicated
    // store keep the group in flight only where the K loop has at most two sfb offsets to dispatch on (BLOCK_N a
    // multiple of 64); at 96, 112, 144 and 160 columns ptxas serializes (C7518).
    DK_STATIC_ASSERT(!kOverlapEpilogue || (kNumSplits == 1 && BLOCK_M == 128 &&
                                           (kGemmType == GemmType::Normal || BLOCK_N % 64 == 0)),
                     "the epilogue overlap is for 128-row tiles without split-K (grouped: BLOCK_N a multiple of 64)");

    // Register budgets: 128 x 40 + 256 x 232 = 64,512 of 65,536 with two math warpgroups.
    constexpr uint32_t kNumTMARegisters = 40;
    constexpr uint32_t kNumMathRegisters = kNumMathWarpgroups == 1 ? 240 : 232;

    // Shared-memory carve-up (deep_kernels/heuristics/fp8_gemm.py: smem_bytes mirrors it)
    using Store = AccumulatorStore<OutputType, BLOCK_N>;
    constexpr uint32_t kSmemDBytes = align_up<uint32_t>(kNumMathWarpgroups * Store::kBytes, 1024);
    constexpr uint32_t kStageABytes = BLOCK_M * BLOCK_K;
    constexpr uint32_t kStageBBytes = BLOCK_N * BLOCK_K;
    constexpr uint32_t kStageSfaBytes = BLOCK_M * sizeof(float);
    constexpr uint32_t kOffsetA = kSmemDBytes;
    constexpr uint32_t kOffsetB = kOffsetA + kNumStages * kStageABytes;
    constexpr uint32_t kOffsetSfa = kOffsetB + kNumStages * kStageBBytes;
    constexpr uint32_t kOffsetBarriers = kOffsetSfa + kNumStages * kStageSfaBytes;
    constexpr uint32_t kSmemBytes = kOffsetBarriers + 2 * kNumStages * sizeof(uint64_t);
    DK_STATIC_ASSERT(kStageABytes % 1024 == 0 && kStageBBytes % 1024 == 0, "swizzle atoms stay 1024-byte aligned");
    DK_STATIC_ASSERT(kSmemBytes <= kMaxSmemBytes, "stages fit in shared memory");

    extern __shared__ __align__(1024) uint8_t smem[];
    const StageBuffers<kStageABytes, kStageBBytes, BLOCK_M> stages{
        smem + kOffsetA, smem + kOffsetB, reinterpret_cast<float*>(smem + kOffsetSfa)};
    auto* barriers = reinterpret_cast<uint64_t*>(smem + kOffsetBarriers);
    const StageRing<kNumStages, kNumMathThreads / 32, kNumTMAMulticast> ring{barriers, barriers + kNumStages};

    // Barrier init
    const uint32_t warp_idx = __shfl_sync(0xffffffff, threadIdx.x / 32, 0);
    const uint32_t lane_idx = threadIdx.x % 32;
    const WarpRole role = warp_idx < kNumMathThreads / 32 ? WarpRole::Math : WarpRole::Producer;
    const bool is_tma_thread = warp_idx == kNumMathThreads / 32 && lane_idx == 0;
    if (is_tma_thread) {
        ptx::tma_prefetch_descriptor(&tmap_a);
        ptx::tma_prefetch_descriptor(&tmap_b);
        ptx::tma_prefetch_descriptor(&tmap_sfa);
        ptx::tma_prefetch_descriptor(&tmap_d);
        ring.init();
        ptx::fence_mbarrier_init();
    }
    // NOTE: with multicast, a peer may signal this CTA's barriers as soon as it passes this point.
    if constexpr (kNumTMAMulticast > 1)
        ptx::cluster_sync_relaxed();
    else
        __syncthreads();

    // Scheduler
    Scheduler<kGemmType, SHAPE_N, BLOCK_M, BLOCK_N, kNumTMAMulticast, kIsMulticastOnA, kNumSplits> scheduler(
        shape_m, grouped_layout, num_groups, num_unsplit_tiles);

    if (role == WarpRole::Producer) {
        // Producer branch: register reconfiguration, then one thread issues every TMA load.
        ptx::setmaxnreg_dec<kNumTMARegisters>();
        if (is_tma_thread) {
            run_tma_producer<SHAPE_N, SHAPE_K, BLOCK_M, BLOCK_N, BLOCK_K, kNumStages, kNumTMAMulticast,
                             kIsMulticastOnA, kGemmType, kNumSplits>(stages, ring, scheduler, &tmap_a, &tmap_b,
                                                                     &tmap_sfa);
        }
    } else {
        // Consumer branch: register reconfiguration, then MMA, promotion and epilogue per tile.
        ptx::setmaxnreg_inc<kNumMathRegisters>();
        uint8_t* smem_d_wg = smem + threadIdx.x / kNumThreadsPerWarpgroup * Store::kBytes;
        run_math_warpgroup<SHAPE_N, SHAPE_K, BLOCK_M, BLOCK_N, BLOCK_K, kNumStages, kGemmType, OutputType,
                           kWithAccumulation, kNumSplits, kPipelined, kOverlapEpilogue>(
            stages, ring, scheduler, smem_d_wg, &tmap_d, sfb, d, split_workspace, split_tickets);
    }

    // Teardown
    // NOTE: a peer CTA may still arrive on this CTA's empty barriers until it finishes its last stage.
    if constexpr (kNumTMAMulticast > 1) {
        __syncwarp();
        ptx::cluster_sync();
    }
}

}  // namespace deep_kernels
