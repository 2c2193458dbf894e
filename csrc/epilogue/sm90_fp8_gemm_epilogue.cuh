// The SM90 FP8 GEMM's epilogue: each math warpgroup stages its FP32 accumulators in shared memory as D's type
// and stores them with TMA (added with TMA reduce-add when accumulating), or, for the grouped kinds' tiles with
// rows that must not be written, row by row; with split-K, the FP32 partial sums meet in a workspace and the
// last job of a tile sums them in split order before the store.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "common/macros.cuh"
#include "epilogue/cluster_split_sum.cuh"
#include "epilogue/sm90_accumulator_store.cuh"
#include "epilogue/sm90_row_predicated_store.cuh"
#include "gemm/sm90_fp8_gemm_traits.cuh"
#include "ptx/dsmem.cuh"
#include "ptx/global_memory.cuh"
#include "ptx/special_registers.cuh"
#include "ptx/sync.cuh"
#include "ptx/tma.cuh"
#include "scheduler.cuh"

namespace deep_kernels {

namespace sm90_fp8_gemm_detail {

// Barrier 0 is __syncthreads; each math warpgroup owns one barrier for its epilogue.
enum class NamedBarrier : uint32_t { EpilogueWarpgroup0 = 1, AllMathWarpgroups = 3 };

// Writes the warpgroup's accumulators (kNumMWaves sets of 64 rows) into its staging buffers, one
// Store::kBytes buffer per set, visible to the whole warpgroup and to TMA.
template <typename Store, uint32_t BLOCK_N, uint32_t kNumMWaves>
DK_DEVICE void stage_tile(const float (&final_acc)[kNumMWaves][BLOCK_N / 2], uint8_t* smem_d_wg, uint32_t wg_idx) {
    const uint32_t thread_in_wg = threadIdx.x % kNumThreadsPerWarpgroup;
    const uint32_t barrier_id = static_cast<uint32_t>(NamedBarrier::EpilogueWarpgroup0) + wg_idx;

    // The previous tile's store must have finished reading the buffers before they are overwritten.
    if (thread_in_wg == 0)
        ptx::tma_store_wait_read<0>();
    ptx::named_barrier_sync(barrier_id, kNumThreadsPerWarpgroup);
#pragma unroll
    for (uint32_t wave = 0; wave < kNumMWaves; ++wave) {
        // NOTE: the thread's row and column are recomputed here rather than kept live through the K loop: the
        // FP32 128 x 192 tiles with the epilogue overlap otherwise spill one register.
        const uint32_t tid = ptx::thread_idx_x_here();
        Store::write(final_acc[wave], smem_d_wg + wave * Store::kBytes, tid % kNumThreadsPerWarpgroup / 32, tid % 32);
    }
    ptx::fence_proxy_async_shared();
    ptx::named_barrier_sync(barrier_id, kNumThreadsPerWarpgroup);
}

// Issues the TMA store (reduce-add when accumulating) of one staged chunk at column `col` and row `row` of D.
template <typename Traits>
DK_DEVICE void store_chunk(const CUtensorMap* tmap_d, const uint8_t* src, int32_t col, int32_t row, int32_t group) {
    constexpr GemmType kGemmType = Traits::kGemmType;
    constexpr bool kWithAccumulation = Traits::kWithAccumulation;
    // D [G, M, N] through a 3D map, the group outermost (masked; KGrouped).
    constexpr bool kGroupedD = kGemmType == GemmType::MGroupedMasked || kGemmType == GemmType::KGrouped;
    if constexpr (kWithAccumulation && kGroupedD)
        ptx::tma_reduce_add(tmap_d, src, col, row, group);
    else if constexpr (kWithAccumulation)
        ptx::tma_reduce_add(tmap_d, src, col, row);
    else if constexpr (kGroupedD)
        ptx::tma_store(tmap_d, src, col, row, group);
    else
        ptx::tma_store(tmap_d, src, col, row);
}

// FP32 D of the per-channel kinds (Traits::kStreamedStore): the warpgroup's tile goes out one chunk (kChunkCols columns
// of 64 rows) at a time through two chunk buffers in turn, each stored by TMA as soon as it is written.
template <typename Traits, uint32_t kNumMWaves>
DK_DEVICE void store_tile_streamed(const float (&final_acc)[kNumMWaves][Traits::BLOCK_N / 2], uint8_t* smem_d_wg,
                                   const CUtensorMap* tmap_d, const TileInfo& tile, uint32_t wg_idx) {
    constexpr uint32_t SHAPE_N = Traits::SHAPE_N, BLOCK_N = Traits::BLOCK_N;
    using Store = typename Traits::Store;
    const uint32_t thread_in_wg = threadIdx.x % kNumThreadsPerWarpgroup;
    const uint32_t barrier_id = static_cast<uint32_t>(NamedBarrier::EpilogueWarpgroup0) + wg_idx;
#pragma unroll
    for (uint32_t wave = 0; wave < kNumMWaves; ++wave) {
#pragma unroll
        for (uint32_t c = 0; c < Store::kNumChunks; ++c) {
            const uint32_t i = wave * Store::kNumChunks + c;
            uint8_t* buffer = smem_d_wg + i % 2 * Store::kChunkBytes;
            // The buffer's previous store (two chunks back, or the previous tile's, whose last chunk may have used
            // either buffer) must have read it.
            if (thread_in_wg == 0) {
                if (i == 0)
                    ptx::tma_store_wait_read<0>();
                else
                    ptx::tma_store_wait_read<1>();
            }
            ptx::named_barrier_sync(barrier_id, kNumThreadsPerWarpgroup);
            // NOTE: the thread's row and column are recomputed here rather than kept live through the K loop.
            const uint32_t tid = ptx::thread_idx_x_here();
            Store::write_chunk(final_acc[wave], buffer, tid % kNumThreadsPerWarpgroup / 32, tid % 32, c);
            ptx::fence_proxy_async_shared();
            ptx::named_barrier_sync(barrier_id, kNumThreadsPerWarpgroup);
            const uint32_t col = tile.n_block_idx * BLOCK_N + c * Store::kChunkCols;
            if (thread_in_wg == 0 && col < SHAPE_N) {
                const int32_t row =
                    static_cast<int32_t>(Traits::TileScheduler::first_row(tile) + (wg_idx * Traits::kWarpgroupRowWaves + wave) * kWarpgroupBlockM);
                store_chunk<Traits>(tmap_d, buffer, static_cast<int32_t>(col), row, static_cast<int32_t>(tile.group_idx));
            }
            if (thread_in_wg == 0)
                ptx::tma_store_commit();
        }
    }
}

// 256-row tiles staged in parts (Traits::kStagedPartBytes: one 64-row wave, or one chunk of it, per warpgroup): each
// part is staged once the buffer's previous store has read it, then stored by TMA.
template <typename Traits, uint32_t kNumMWaves>
DK_DEVICE void store_tile_in_parts(const float (&final_acc)[kNumMWaves][Traits::BLOCK_N / 2], uint8_t* smem_d_wg,
                                   const CUtensorMap* tmap_d, const TileInfo& tile, uint32_t wg_idx) {
    constexpr uint32_t SHAPE_N = Traits::SHAPE_N, BLOCK_N = Traits::BLOCK_N;
    using Store = typename Traits::Store;
    constexpr uint32_t kChunksPerPart = Traits::kStagedPartBytes / Store::kChunkBytes;
    constexpr uint32_t kPartsPerWave = Store::kNumChunks / kChunksPerPart;
    const uint32_t thread_in_wg = threadIdx.x % kNumThreadsPerWarpgroup;
    const uint32_t barrier_id = static_cast<uint32_t>(NamedBarrier::EpilogueWarpgroup0) + wg_idx;
#pragma unroll
    for (uint32_t wave = 0; wave < kNumMWaves; ++wave) {
#pragma unroll
        for (uint32_t part = 0; part < kPartsPerWave; ++part) {
            if (thread_in_wg == 0)
                ptx::tma_store_wait_read<0>();
            ptx::named_barrier_sync(barrier_id, kNumThreadsPerWarpgroup);
            // NOTE: the thread's row and column are recomputed here rather than kept live through the K loop.
            const uint32_t tid = ptx::thread_idx_x_here();
            if constexpr (kPartsPerWave == 1)
                Store::write(final_acc[wave], smem_d_wg, tid % kNumThreadsPerWarpgroup / 32, tid % 32);
            else
                Store::write_chunk(final_acc[wave], smem_d_wg, tid % kNumThreadsPerWarpgroup / 32, tid % 32, part);
            ptx::fence_proxy_async_shared();
            ptx::named_barrier_sync(barrier_id, kNumThreadsPerWarpgroup);
            if (thread_in_wg == 0) {
                const int32_t row = static_cast<int32_t>(Traits::TileScheduler::first_row(tile) +
                                                         (wg_idx * Traits::kWarpgroupRowWaves + wave) * kWarpgroupBlockM);
#pragma unroll
                for (uint32_t c = 0; c < kChunksPerPart; ++c) {
                    const uint32_t col = tile.n_block_idx * BLOCK_N + (part * kChunksPerPart + c) * Store::kChunkCols;
                    if (col >= SHAPE_N)
                        break;
                    store_chunk<Traits>(tmap_d, smem_d_wg + c * Store::kChunkBytes, static_cast<int32_t>(col), row,
                                        static_cast<int32_t>(tile.group_idx));
                }
                ptx::tma_store_commit();
            }
        }
    }
}

// The warpgroup's TMA store of its kNumMWaves x 64 tile rows, from row wg_idx * kNumMWaves * 64 of the tile (row 0 with
// own tiles).
template <typename Traits, uint32_t kNumMWaves>
DK_DEVICE void store_tile(const float (&final_acc)[kNumMWaves][Traits::BLOCK_N / 2], uint8_t* smem_d_wg,
                          const CUtensorMap* tmap_d, const TileInfo& tile, uint32_t wg_idx) {
    if constexpr (Traits::kStreamedStore) {
        store_tile_streamed<Traits, kNumMWaves>(final_acc, smem_d_wg, tmap_d, tile, wg_idx);
        return;
    }
    if constexpr (Traits::kStagedPartBytes > 0) {
        store_tile_in_parts<Traits, kNumMWaves>(final_acc, smem_d_wg, tmap_d, tile, wg_idx);
        return;
    }
    constexpr uint32_t SHAPE_N = Traits::SHAPE_N, BLOCK_N = Traits::BLOCK_N;
    constexpr GemmType kGemmType = Traits::kGemmType;
    constexpr bool kWithAccumulation = Traits::kWithAccumulation;
    // D [G, M, N] through a 3D map, the group outermost (masked; KGrouped).
    constexpr bool kGroupedD = kGemmType == GemmType::MGroupedMasked || kGemmType == GemmType::KGrouped;
    using Store = typename Traits::Store;
    const uint32_t thread_in_wg = threadIdx.x % kNumThreadsPerWarpgroup;
    stage_tile<Store, BLOCK_N, kNumMWaves>(final_acc, smem_d_wg, wg_idx);

    if (thread_in_wg == 0) {
        const int32_t group = static_cast<int32_t>(tile.group_idx);
#pragma unroll
        for (uint32_t wave = 0; wave < kNumMWaves; ++wave) {
            const int32_t row =
                static_cast<int32_t>(Traits::TileScheduler::first_row(tile) + (wg_idx * Traits::kWarpgroupRowWaves + wave) * kWarpgroupBlockM);
#pragma unroll
            for (uint32_t c = 0; c < Store::kNumChunks; ++c) {
                const uint32_t col = tile.n_block_idx * BLOCK_N + c * Store::kChunkCols;
                if (col >= SHAPE_N)
                    break;
                const uint8_t* src = smem_d_wg + wave * Store::kBytes + c * Store::kChunkBytes;
                const int32_t n = static_cast<int32_t>(col);
                if constexpr (kWithAccumulation && kGroupedD)
                    ptx::tma_reduce_add(tmap_d, src, n, row, group);
                else if constexpr (kWithAccumulation)
                    ptx::tma_reduce_add(tmap_d, src, n, row);
                else if constexpr (kGroupedD)
                    ptx::tma_store(tmap_d, src, n, row, group);
                else
                    ptx::tma_store(tmap_d, src, n, row);
            }
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

// Split-K with the splits in one cluster (kSplitsInCluster; one job per CTA): the other splits write their warpgroup's
// FP32 partial sums into their own stage buffers (`exchange`, free once every math warpgroup's K loop is done), a
// cluster barrier publishes them, and the leader (split 0) adds splits 1 .. kNumSplits - 1 in that order to its own,
// read from their shared memory, and returns true. The same order as reduce_splits: the same bits. The kernel's
// closing cluster barrier keeps the other CTAs alive until the leader has read them.
template <typename Traits>
DK_DEVICE bool reduce_splits_in_cluster(float (&total)[Traits::BLOCK_N / 2], float* exchange, uint32_t split_idx) {
    // The layout of reduce_splits' slots (epilogue/cluster_split_sum.cuh's).
    float* own = cluster_split_sum::thread_slot(exchange + threadIdx.x / kNumThreadsPerWarpgroup * kWarpgroupBlockM *
                                                               Traits::BLOCK_N);
    if (split_idx != 0) {
        // Every math warpgroup's wgmma have read their last stage before it holds partial sums.
        ptx::named_barrier_sync(static_cast<uint32_t>(NamedBarrier::AllMathWarpgroups), Traits::kNumMathThreads);
        cluster_split_sum::store_partials(total, own);
    }
    __syncwarp();
    ptx::cluster_sync();
    if (split_idx != 0)
        return false;
#pragma unroll 1
    for (uint32_t split = 1; split < Traits::kNumSplits; ++split)
        cluster_split_sum::add_remote_partials(total, own, split);
    return true;
}

// One 64-row wave of the grouped kinds' row-predicated store (store_tile_rows), from its staging buffer.
template <typename Traits>
DK_DEVICE void store_wave_rows(const uint8_t* smem_d_wave, typename Traits::OutputType* d, const TileInfo& tile,
                               uint32_t first_row, const typename Traits::TileScheduler& scheduler) {
    constexpr uint32_t SHAPE_N = Traits::SHAPE_N, BLOCK_N = Traits::BLOCK_N;
    constexpr GemmType kGemmType = Traits::kGemmType;
    using OutputType = typename Traits::OutputType;
    using RowStore = RowPredicatedStore<OutputType, BLOCK_N, kNumThreadsPerWarpgroup, Traits::kWithAccumulation>;
    // Rows are counted inside the group for masked (D [G, M_max, N]), inside D for contiguous.
    const uint32_t first_col = tile.n_block_idx * BLOCK_N;
    const size_t group_first_row =
        kGemmType == GemmType::MGroupedMasked ? static_cast<size_t>(tile.group_idx) * scheduler.shape_m : 0;
    OutputType* d_tile = d + (group_first_row + first_row) * SHAPE_N + first_col;
    const uint32_t num_cols = SHAPE_N - first_col < BLOCK_N ? SHAPE_N - first_col : BLOCK_N;
    RowStore::store(smem_d_wave, d_tile, SHAPE_N, num_cols, threadIdx.x % kNumThreadsPerWarpgroup,
                    [&](uint32_t row) { return scheduler.is_valid_row(first_row + row, tile.group_idx); });
}

// The grouped kinds' store of a tile whose rows are not all valid: through the same staging buffers, then
// row-predicated 16-byte stores, so padding rows and rows past masked_m are never written.
template <typename Traits>
DK_DEVICE void store_tile_rows(const float (&final_acc)[Traits::kNumMWaves][Traits::BLOCK_N / 2], uint8_t* smem_d_wg,
                               typename Traits::OutputType* d, const TileInfo& tile, uint32_t wg_idx,
                               const typename Traits::TileScheduler& scheduler) {
    constexpr uint32_t kNumMWaves = Traits::kNumMWaves;
    DK_STATIC_ASSERT(Traits::kGemmType != GemmType::Normal, "Normal tiles are clipped by the TMA store");
    DK_STATIC_ASSERT(kNumMWaves == 1 || kNumMWaves == 2, "one or two 64-row waves per warpgroup");
    stage_tile<typename Traits::Store, Traits::BLOCK_N, kNumMWaves>(final_acc, smem_d_wg, wg_idx);
    const uint32_t first_row = Traits::TileScheduler::first_row(tile) + wg_idx * Traits::kWarpgroupRowWaves * kWarpgroupBlockM;
    store_wave_rows<Traits>(smem_d_wg, d, tile, first_row, scheduler);
    if constexpr (kNumMWaves == 2)
        store_wave_rows<Traits>(smem_d_wg + Traits::Store::kBytes, d, tile, first_row + kWarpgroupBlockM, scheduler);
}

// Scheduler::row_key of a lane's two rows of each of its warpgroup's 64-row waves (the grouped kinds' store reads
// them).
template <uint32_t kNumMWaves>
struct RowKeysOf {
    int even[kNumMWaves], odd[kNumMWaves];
};

// One math warpgroup's store of its tile rows: split-K partial sums and their reduction, the grouped kinds'
// row-predicated store, or the TMA store.
template <typename Traits>
struct Sm90Fp8Epilogue {
    using RowKeys = RowKeysOf<Traits::kNumMWaves>;

    typename Traits::TileScheduler& scheduler;
    uint8_t* smem_d_wg;
    const CUtensorMap* tmap_d;
    typename Traits::OutputType* d;
    float* split_workspace;
    uint32_t* split_tickets;
    // kSplitsInCluster: the CTA's stage buffers, where its partial sums wait for the leader.
    float* split_exchange;

    DK_DEVICE static uint32_t wg_idx() { return threadIdx.x / kNumThreadsPerWarpgroup; }

    // Grouped kinds: the first of the lane's two rows (2 * lane, 2 * lane + 1 of the wave's 64) whose keys it
    // loads and checks for the store's vote.
    DK_DEVICE uint32_t vote_row(const TileInfo& tile, uint32_t wave) const {
        return Traits::TileScheduler::first_row(tile) + (wg_idx() * Traits::kWarpgroupRowWaves + wave) * kWarpgroupBlockM +
               2 * (threadIdx.x % 32);
    }

    // Grouped kinds: the row keys (Scheduler::row_key) of the lane's vote rows; loaded before the K loop,
    // compared at the store, so that the loads' latency hides behind the tile.
    DK_DEVICE RowKeys row_keys_of(const TileInfo& tile) const {
        RowKeys keys{};
        if constexpr (Traits::kGemmType != GemmType::Normal && Traits::kGemmType != GemmType::KGrouped) {
#pragma unroll
            for (uint32_t wave = 0; wave < Traits::kNumMWaves; ++wave) {
                const uint32_t row = vote_row(tile, wave);
                keys.even[wave] = scheduler.row_key(row, tile.group_idx);
                keys.odd[wave] = scheduler.row_key(row + 1, tile.group_idx);
            }
        }
        return keys;
    }

    // With split-K the last job reduces into its own final accumulators (one wave).
    DK_DEVICE void store(const TileInfo& tile, const RowKeys& row_keys,
                         float (&final_acc)[Traits::kNumMWaves][Traits::BLOCK_N / 2]) const {
        if constexpr (Traits::kNumSplits > 1) {
            if (tile.num_splits > 1) {
                if constexpr (Traits::kSplitsInCluster) {
                    if (reduce_splits_in_cluster<Traits>(final_acc[0], split_exchange, tile.split_idx))
                        store_tile<Traits>(final_acc, smem_d_wg, tmap_d, tile, wg_idx());
                    return;
                }
                constexpr uint32_t kSlotsPerWarpgroup = Traits::kNumSplits * kWarpgroupBlockM * Traits::BLOCK_N;
                const uint32_t wg_slot = tile.split_tile_idx * Traits::kNumMathWarpgroups + wg_idx();
                float* slots = split_workspace + static_cast<size_t>(wg_slot) * kSlotsPerWarpgroup;
                const uint32_t barrier_id = static_cast<uint32_t>(NamedBarrier::EpilogueWarpgroup0) + wg_idx();
                if (reduce_splits<Traits::BLOCK_N, Traits::kNumSplits>(final_acc[0], final_acc[0], slots,
                                                                       split_tickets + wg_slot, tile.split_idx,
                                                                       barrier_id))
                    store_tile<Traits>(final_acc, smem_d_wg, tmap_d, tile, wg_idx());
                return;
            }
        }
        // Normal and KGrouped tiles rely on the TMA store's clipping at M; M-grouped ones store a warpgroup's rows
        // with any rejected row through the row-predicated path. Every warp votes over all of its rows, so the warps
        // agree.
        // NOTE: a warp vote rather than a warpgroup barrier's reduction: with the latter the contiguous kind ran
        // 7-11% behind the dense GEMM at the same tiles, with the vote 1-4% (H200, timed in turns).
        if constexpr (Traits::kGemmType != GemmType::Normal && Traits::kGemmType != GemmType::KGrouped) {
            // A contiguous 256-row tile starting on an odd half leaves its last 128 rows to the next tile.
            if (Traits::TileScheduler::is_odd_half_tile(tile) && wg_idx() == 1)
                return;
            bool rows_valid = true;
#pragma unroll
            for (uint32_t wave = 0; wave < Traits::kNumMWaves; ++wave) {
                const uint32_t row = vote_row(tile, wave);
                rows_valid = rows_valid && scheduler.is_valid_row(row_keys.even[wave], row, tile.group_idx) &&
                             scheduler.is_valid_row(row_keys.odd[wave], row + 1, tile.group_idx);
            }
            if (!__all_sync(0xffffffffu, rows_valid)) {
                store_tile_rows<Traits>(final_acc, smem_d_wg, d, tile, wg_idx(), scheduler);
                return;
            }
        }
        store_tile<Traits>(final_acc, smem_d_wg, tmap_d, tile, wg_idx());
    }
};

}  // namespace sm90_fp8_gemm_detail

}  // namespace deep_kernels
