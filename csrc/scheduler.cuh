// The persistent block scheduler shared by every GEMM kind.
//
// Work is cut into "units": one tile, or with a 2-CTA multicast cluster a pair of tiles that share the
// multicast operand (multicast on A: same M-block, N-blocks 2u and 2u + 1; on B: same N-block, M-blocks
// 2u and 2u + 1). Cluster c walks units c, c + num_clusters, ... and its CTA of rank r takes member r of
// each pair, so both CTAs of a cluster always run the same number of tiles in lockstep, which the
// shared pipeline barriers require. A member past the matrix edge (odd block count) or on padding is
// still walked as an invalid tile: the kernel keeps the pipeline going but computes and stores nothing.
//
// Split-K (Normal kind, no multicast): with kNumSplits > 1 the tiles from num_unsplit_tiles on are
// kNumSplits jobs each, one per K range; earlier tiles are one job. The walk is over jobs (tiles
// [0, num_unsplit_tiles) first, then split tile t's jobs side by side), so the splits of a tile run in the
// same wave and the last one to finish reduces soon after the others. The host splits every tile at decode
// sizes (num_unsplit_tiles = 0) and only the last, partial wave's tiles when there are more tiles than SMs.
// kSplitsInCluster: every tile is split and its kNumSplits jobs are one cluster of kNumSplits CTAs (cluster c runs
// tile c, its CTA of rank r split r); the grid is tiles x kNumSplits CTAs, one job each.
//
// Rasterisation: units are walked in bands of kNumNUnitsPerBand N-units; inside a band the N-unit varies
// fastest, so the CTAs running at the same time touch a compact block of A rows and B rows in L2.
//
// Kinds (GemmType):
//   Normal               A [M, K], B [N, K], D [M, N].
//   MGroupedContiguous   A holds the rows of all groups back to back, each group's segment padded to a
//                        multiple of 128 rows; grouped_layout[row] is the row's group, -1 on padding
//                        (any id outside [0, num_groups) counts as padding).
//                        An M-block's group is that of its first row; blocks starting on padding are
//                        skipped. B is [G, N, K]; D rows follow A's.
//                        256-row tiles (kHalfBlockTiles): a segment may start at an odd 128-row half, so
//                        tiles start on halves: the even halves' tiles first (rows 256 i on), then the odd
//                        halves' (rows 256 i + 128 on), an odd half's tile taken only where its group starts
//                        there (differs from the half before). Such a tile writes only its first 128 rows
//                        (the rows after are the next even half's tile's); a tile's rows of another group
//                        are never written (is_valid_row). Which odd halves start a tile is read once per CTA
//                        into a shared-memory bit table (build_odd_half_table) for the first kNumOddHalfBits
//                        odd halves, so that the walk skips the others without a global load each. With
//                        multicast on B, a pair is two consecutive M-units of that walk (halves 4u and 4u + 2,
//                        or two odd halves in turn), sharing B where both tiles are of one group; a pair
//                        is skipped where neither member starts a tile, else a member that starts none is
//                        walked as an invalid tile.
//   MGroupedMasked       A [G, M_max, K] (shape_m = M_max); grouped_layout[g] = valid rows of group g
//                        (masked_m, read on the device, clamped to [0, M_max]); only the M-blocks holding
//                        valid rows are walked.
//   KGrouped             A [M, sum k_g], B [N, sum k_g], D [G, M, N]: group g's K range is the segment of
//                        grouped_layout[g] = k_g columns (read on the device, negative counts as 0) starting
//                        at the sum of the earlier groups' k_g. Every group walks all of its M x N tiles
//                        (an empty group's tiles have no K blocks); the tile's K blocks are
//                        [k_block_begin, k_block_begin + num_k_blocks) of A and B (k_g / kKBlock of them:
//                        kKBlock is the kernel's BLOCK_K, 128 for FP8 operands and 64 for BF16).
// is_valid_row tells the epilogue which D rows of a tile it may write (padding and rows past masked_m
// are never written).
#pragma once

#include <cstdint>

#include "common/macros.cuh"
#include "common/math.cuh"

namespace deep_kernels {

enum class GemmType : uint32_t {
    Normal = 0,
    MGroupedContiguous = 1,
    MGroupedMasked = 2,
    KGrouped = 3,
};

struct TileInfo {
    uint32_t m_block_idx;
    uint32_t n_block_idx;
    uint32_t group_idx;
    // K range of the job: split split_idx of the tile's num_splits (1, or kNumSplits for a split tile).
    uint32_t split_idx;
    uint32_t num_splits;
    // A split tile's index among the split tiles (its workspace slots and tickets).
    uint32_t split_tile_idx;
    // This CTA computes and stores the tile (false: pipeline-only lockstep partner of a valid tile).
    bool is_valid;
    // Both CTAs of the cluster need the same shared-operand tile, so the leader may multicast it.
    bool is_multicast_valid;
    // KGrouped: the group's K blocks (the other kinds take their K range from the split).
    uint32_t k_block_begin;
    uint32_t num_k_blocks;
    // MGroupedMasked: the tile's rows below masked_m (at most BLOCK_M; the others are never written).
    uint32_t num_masked_rows;
};

// kLookAhead (the block-scaled FP8 kernel's M-grouped kinds): contiguous tiles' groups are loaded one call ahead, and
// masked tiles carry their rows below masked_m (TileInfo::num_masked_rows).
template <GemmType kGemmType, uint32_t SHAPE_N, uint32_t BLOCK_M, uint32_t BLOCK_N, uint32_t kNumTMAMulticast,
          bool kIsMulticastOnA, uint32_t kNumSplits = 1, uint32_t kKBlock = 128, bool kSplitsInCluster = false,
          bool kLookAhead = false>
struct Scheduler {
    DK_STATIC_ASSERT(kNumTMAMulticast == 1 || kNumTMAMulticast == 2, "clusters of 1 or 2 CTAs");
    DK_STATIC_ASSERT(kNumSplits >= 1 && (kNumSplits == 1 || (kGemmType == GemmType::Normal && kNumTMAMulticast == 1)),
                     "split-K only for the Normal kind without multicast");

    DK_STATIC_ASSERT(!kSplitsInCluster || (kNumSplits > 1 && kNumTMAMulticast == 1), "splits in a cluster: split-K");
    static constexpr uint32_t kClusterSize = kSplitsInCluster ? kNumSplits : kNumTMAMulticast;
    static constexpr bool kPairsShareM = kNumTMAMulticast == 2 && kIsMulticastOnA;
    static constexpr bool kPairsShareN = kNumTMAMulticast == 2 && !kIsMulticastOnA;
    // Contiguous 256-row tiles start on 128-row halves (the segment alignment); m_block_idx counts halves.
    static constexpr bool kHalfBlockTiles = kGemmType == GemmType::MGroupedContiguous && BLOCK_M == 256;
    static constexpr uint32_t kMBlockRows = kHalfBlockTiles ? BLOCK_M / 2 : BLOCK_M;
    // Contiguous 256-row tiles: odd halves 2i + 1 (i < kNumOddHalfBits, M below 512K rows) whose tile start is in the
    // shared-memory table; later ones are looked up in global memory.
    static constexpr uint32_t kNumOddHalfWords = kHalfBlockTiles ? 64 : 0;
    static constexpr uint32_t kNumOddHalfBits = kNumOddHalfWords * 32;
    static constexpr uint32_t kNumNBlocks = ceil_div(SHAPE_N, BLOCK_N);
    static constexpr uint32_t kNumNUnits = kPairsShareM ? ceil_div(kNumNBlocks, 2u) : kNumNBlocks;
    static constexpr bool kPrefetchGroups = kLookAhead && kGemmType == GemmType::MGroupedContiguous;
    static constexpr bool kTracksMaskedRows = kLookAhead && kGemmType == GemmType::MGroupedMasked;
    // NOTE: 8 N-units per band: ~16 concurrent M-blocks x 8 N-blocks per 132-SM wave at large M.
    static constexpr uint32_t kNumNUnitsPerBand = 8;

    const uint32_t shape_m;
    const int* const grouped_layout;
    const uint32_t num_groups;
    const uint32_t num_unsplit_tiles;
    const uint32_t cta_rank;
    const uint32_t num_clusters;
    // Contiguous 256-row tiles: the table build_odd_half_table wrote (shared memory; nullptr otherwise).
    const uint32_t* const odd_half_table;
    // The next unit (job, with split-K) of this cluster.
    uint32_t next_unit_idx;

    // Unit range of the current group: all units for Normal / contiguous, one group's for masked.
    uint32_t group_idx = 0;
    uint32_t group_first_unit = 0;
    uint32_t group_num_m_blocks = 0;
    // MGroupedMasked: the current group's valid rows (masked_m clamped to [0, M_max]).
    uint32_t group_num_rows = 0;
    // Contiguous: the unit the walk looks at next and its M-blocks' groups, loaded during the previous call so that
    // the loads' latency hides behind a tile rather than stalling the math warpgroups between tiles (kNoUnit: none).
    static constexpr uint32_t kNoUnit = 0xffffffffu;
    uint32_t prefetched_unit = kNoUnit;
    int prefetched_group_0 = -1;
    int prefetched_group_1 = -1;
    // KGrouped: the current group's first K column and columns.
    uint32_t group_k_begin = 0;
    uint32_t group_k = 0;

    DK_DEVICE Scheduler(uint32_t shape_m, const int* grouped_layout, uint32_t num_groups, uint32_t num_unsplit_tiles = 0,
                        const uint32_t* odd_half_table = nullptr)
        : shape_m(shape_m),
          grouped_layout(grouped_layout),
          num_groups(num_groups),
          num_unsplit_tiles(num_unsplit_tiles),
          cta_rank(blockIdx.x % kNumTMAMulticast),
          num_clusters(gridDim.x / kClusterSize),
          odd_half_table(odd_half_table),
          next_unit_idx(blockIdx.x / kClusterSize) {
        if constexpr (kTracksMaskedRows) {
            group_num_rows = num_groups > 0 ? masked_num_rows(0) : 0;
            group_num_m_blocks = ceil_div(group_num_rows, BLOCK_M);
        } else if constexpr (kGemmType == GemmType::MGroupedMasked) {
            group_num_m_blocks = num_groups > 0 ? masked_num_m_blocks(0) : 0;
        }
        else if constexpr (kHalfBlockTiles)
            group_num_m_blocks = ceil_div(shape_m, kMBlockRows);
        else
            group_num_m_blocks = ceil_div(shape_m, BLOCK_M);
        if constexpr (kGemmType == GemmType::KGrouped)
            group_k = num_groups > 0 ? group_columns(0) : 0;
    }

    // Advances to this CTA's next tile; false once the cluster has no work left.
    DK_DEVICE bool get_next_tile(TileInfo& tile) {
        while (true) {
            const uint32_t job_idx = next_unit_idx;
            next_unit_idx += num_clusters;
            uint32_t unit_idx = job_idx;
            tile.split_idx = 0;
            tile.num_splits = 1;
            tile.split_tile_idx = 0;
            if constexpr (kSplitsInCluster) {
                tile.split_tile_idx = job_idx;
                tile.split_idx = blockIdx.x % kNumSplits;
                tile.num_splits = kNumSplits;
            } else if (kNumSplits > 1 && job_idx >= num_unsplit_tiles) {
                const uint32_t split_job_idx = job_idx - num_unsplit_tiles;
                tile.split_tile_idx = split_job_idx / kNumSplits;
                tile.split_idx = split_job_idx - tile.split_tile_idx * kNumSplits;
                tile.num_splits = kNumSplits;
                unit_idx = num_unsplit_tiles + tile.split_tile_idx;
            }
            if (!seek_group(unit_idx))
                return false;

            uint32_t m_unit, n_unit;
            rasterize(unit_idx - group_first_unit, m_unit, n_unit);
            // Pair member r (r = CTA rank; always 0 without multicast).
            const uint32_t m_block_0 = first_m_block(m_unit);
            const uint32_t m_block_1 = second_m_block(m_unit);
            const uint32_t n_block_0 = kPairsShareM ? 2 * n_unit : n_unit;
            // Odd halves that start no tile are skipped before their groups are looked up.
            const bool starts_0 = starts_tile(m_block_0);
            const bool starts_1 = !kPairsShareN || starts_tile(m_block_1);
            if (!starts_0 && (!kPairsShareN || !starts_1))
                continue;
            const uint32_t n_block_1 = kPairsShareM ? n_block_0 + 1 : n_block_0;
            const bool prefetched = kPrefetchGroups && job_idx == prefetched_unit;
            const int group_0 = prefetched ? prefetched_group_0 : block_group(m_block_0);
            const int group_1 = kPairsShareN ? (prefetched ? prefetched_group_1 : block_group(m_block_1)) : group_0;
            const bool valid_0 = starts_0 && is_valid_block(m_block_0, n_block_0, group_0);
            const bool valid_1 = kNumTMAMulticast == 2 && starts_1 && is_valid_block(m_block_1, n_block_1, group_1);
            if (!valid_0 && !valid_1)
                continue;

            // NOTE: select with the rank rather than index arrays by it, which would put them in local memory.
            const bool second = cta_rank == 1;
            const int group = second ? group_1 : group_0;
            tile.m_block_idx = second ? m_block_1 : m_block_0;
            tile.n_block_idx = second ? n_block_1 : n_block_0;
            tile.group_idx = group < 0 ? 0 : static_cast<uint32_t>(group);
            tile.is_valid = second ? valid_1 : valid_0;
            // The leader (rank 0) multicasts its own tile's operand: fine when it is valid and the partner
            // either needs the same tile (same group) or is invalid and ignores what it receives.
            tile.is_multicast_valid = kNumTMAMulticast == 2 && valid_0 && (!valid_1 || group_0 == group_1);
            if constexpr (kGemmType == GemmType::KGrouped) {
                tile.k_block_begin = group_k_begin / kKBlock;
                tile.num_k_blocks = group_k / kKBlock;
            }
            if constexpr (kTracksMaskedRows) {
                const uint32_t first = tile.m_block_idx * BLOCK_M;
                tile.num_masked_rows = group_num_rows > first ? min(group_num_rows - first, BLOCK_M) : 0;
            }
            if constexpr (kPrefetchGroups)
                prefetch_next_groups();
            return true;
        }
    }

    // The value in global memory that decides whether D row `row` of a tile of group `group` is written
    // (contiguous: the row's id in grouped_layout, -1 past M; masked: masked_m[group]). Apart from
    // is_valid_row(key, ...) so that a caller can issue the load long before it needs the answer.
    DK_DEVICE int row_key(uint32_t row, uint32_t group) const {
        if constexpr (kGemmType == GemmType::MGroupedContiguous)
            return row < shape_m ? __ldg(grouped_layout + row) : -1;
        else if constexpr (kGemmType == GemmType::MGroupedMasked)
            return __ldg(grouped_layout + group);
        else
            return 0;
    }

    // Whether the row is written: inside M, of the group (contiguous: its id is the group's, which lies in
    // [0, num_groups); masked: row, counted inside the group, below masked_m[group] clamped to [0, M_max]).
    DK_DEVICE bool is_valid_row(int key, uint32_t row, uint32_t group) const {
        if constexpr (kGemmType == GemmType::MGroupedContiguous)
            return key == static_cast<int>(group);
        else if constexpr (kGemmType == GemmType::MGroupedMasked)
            return row < clamp_masked_rows(key);
        else
            return row < shape_m;
    }

    DK_DEVICE bool is_valid_row(uint32_t row, uint32_t group) const {
        return is_valid_row(row_key(row, group), row, group);
    }

    // The tile's first row (counted inside the group when masked).
    DK_DEVICE static uint32_t first_row(const TileInfo& tile) { return tile.m_block_idx * kMBlockRows; }

    // Contiguous 256-row tiles: whether the tile starts on an odd half, so that its last 128 rows are the next
    // tile's and are not written by this one.
    DK_DEVICE static bool is_odd_half_tile(const TileInfo& tile) { return kHalfBlockTiles && tile.m_block_idx % 2 == 1; }

private:
    // KGrouped: group g's K columns (a negative count is 0).
    DK_DEVICE uint32_t group_columns(uint32_t group) const {
        const int columns = __ldg(grouped_layout + group);
        return columns < 0 ? 0u : static_cast<uint32_t>(columns);
    }

    // A contiguous row's group; ids outside [0, num_groups) count as padding (-1).
    DK_DEVICE static int contiguous_group(const int* grouped_layout, uint32_t num_groups, uint32_t row) {
        const int group = __ldg(grouped_layout + row);
        return static_cast<uint32_t>(group) < num_groups ? group : -1;
    }

    DK_DEVICE int contiguous_group(uint32_t row) const { return contiguous_group(grouped_layout, num_groups, row); }

    // A masked_m entry clamped to [0, M_max].
    DK_DEVICE uint32_t clamp_masked_rows(int rows) const {
        return rows <= 0 ? 0u : min(static_cast<uint32_t>(rows), shape_m);
    }

    DK_DEVICE uint32_t masked_num_rows(uint32_t group) const {
        return clamp_masked_rows(__ldg(grouped_layout + group));
    }

    DK_DEVICE uint32_t masked_num_m_blocks(uint32_t group) const {
        return ceil_div(masked_num_rows(group), BLOCK_M);
    }

    DK_DEVICE void enter_masked_group(uint32_t group) {
        if constexpr (kTracksMaskedRows) {
            group_num_rows = masked_num_rows(group);
            group_num_m_blocks = ceil_div(group_num_rows, BLOCK_M);
        } else {
            group_num_m_blocks = masked_num_m_blocks(group);
        }
    }

    // M-units of a group: M-blocks, or pairs of them with multicast on B; contiguous 256-row tiles: one per
    // 128-row half (the halves' tiles that do not start a tile are skipped).
    DK_DEVICE uint32_t num_m_units(uint32_t num_m_blocks) const {
        return kPairsShareN ? ceil_div(num_m_blocks, 2u) : num_m_blocks;
    }

    DK_DEVICE uint32_t num_units(uint32_t num_m_blocks) const { return num_m_units(num_m_blocks) * kNumNUnits; }

    // Contiguous 256-row tiles: the half an M-unit's tile starts on, the even halves' first.
    DK_DEVICE uint32_t half_of_m_unit(uint32_t m_unit) const {
        const uint32_t num_even = ceil_div(group_num_m_blocks, 2u);
        return m_unit < num_even ? 2 * m_unit : 2 * (m_unit - num_even) + 1;
    }

    // An M-unit's first M-block (the pair's first with multicast on B; contiguous 256-row tiles: its half, or with
    // multicast on B the half of the pair's first walk position).
    DK_DEVICE uint32_t first_m_block(uint32_t m_unit) const {
        if constexpr (kHalfBlockTiles)
            return half_of_m_unit(kPairsShareN ? 2 * m_unit : m_unit);
        return kPairsShareN ? 2 * m_unit : m_unit;
    }

    // The M-block of the pair's second member (multicast on B; the first member's otherwise).
    DK_DEVICE uint32_t second_m_block(uint32_t m_unit) const {
        if constexpr (kHalfBlockTiles && kPairsShareN)
            return half_of_m_unit(2 * m_unit + 1);
        return kPairsShareN ? 2 * m_unit + 1 : first_m_block(m_unit);
    }

    // Whether an M-block starts a tile: always, but for contiguous 256-row tiles an odd half that starts no segment (or
    // a half past M, checked first: the table holds the halves inside M only).
    DK_DEVICE bool starts_tile(uint32_t m_block) const {
        if constexpr (kHalfBlockTiles)
            return m_block % 2 == 0 || (m_block < group_num_m_blocks && odd_half_starts_tile(m_block));
        return true;
    }

    // Contiguous: moves the walk past the odd halves that start no tile (256-row tiles; their check reads shared memory
    // only) and loads the groups of the unit it then points at, for the next call.
    DK_DEVICE void prefetch_next_groups() {
        const uint32_t units = num_units(group_num_m_blocks);
        while (next_unit_idx < units) {
            uint32_t m_unit, n_unit;
            rasterize(next_unit_idx, m_unit, n_unit);
            const uint32_t m_block_0 = first_m_block(m_unit);
            const uint32_t m_block_1 = second_m_block(m_unit);
            if (!starts_tile(m_block_0) && (!kPairsShareN || !starts_tile(m_block_1))) {
                next_unit_idx += num_clusters;
                continue;
            }
            prefetched_unit = next_unit_idx;
            prefetched_group_0 = block_group(m_block_0);
            prefetched_group_1 = kPairsShareN ? block_group(m_block_1) : prefetched_group_0;
            return;
        }
    }

    // Makes [group_first_unit, group_first_unit + num_units) hold unit_idx; false past the last unit.
    // Units only grow per CTA, so the masked group cursor only moves forward.
    DK_DEVICE bool seek_group(uint32_t unit_idx) {
        if constexpr (kGemmType == GemmType::MGroupedMasked) {
            while (group_idx < num_groups && unit_idx >= group_first_unit + num_units(group_num_m_blocks)) {
                group_first_unit += num_units(group_num_m_blocks);
                if (++group_idx < num_groups)
                    enter_masked_group(group_idx);
            }
            return group_idx < num_groups;
        } else if constexpr (kGemmType == GemmType::KGrouped) {
            // Every group has the same tiles; the cursor carries the sum of the earlier groups' columns.
            const uint32_t group_units = num_units(group_num_m_blocks);
            while (group_idx < num_groups && unit_idx >= group_first_unit + group_units) {
                group_first_unit += group_units;
                group_k_begin += group_k;
                if (++group_idx < num_groups)
                    group_k = group_columns(group_idx);
            }
            return group_idx < num_groups;
        } else {
            return unit_idx < num_units(group_num_m_blocks);
        }
    }

    // Contiguous 256-row tiles: the even halves' M-units are banded on their own, then the odd halves' (few of which
    // start a tile), so that every band of work is whole tiles rather than half of it skipped.
    DK_DEVICE void rasterize(uint32_t unit_in_group, uint32_t& m_unit, uint32_t& n_unit) const {
        uint32_t first_m_unit = 0;
        uint32_t num_m = num_m_units(group_num_m_blocks);
        if constexpr (kHalfBlockTiles) {
            const uint32_t num_even = num_m_units(ceil_div(group_num_m_blocks, 2u));
            if (unit_in_group < num_even * kNumNUnits) {
                num_m = num_even;
            } else {
                unit_in_group -= num_even * kNumNUnits;
                first_m_unit = num_even;
                num_m -= num_even;
            }
        }
        const uint32_t band_size = num_m * kNumNUnitsPerBand;
        const uint32_t band_idx = unit_in_group / band_size;
        const uint32_t unit_in_band = unit_in_group - band_idx * band_size;
        const uint32_t band_first_n = band_idx * kNumNUnitsPerBand;
        const uint32_t band_width = min(kNumNUnitsPerBand, kNumNUnits - band_first_n);
        const uint32_t m_in_band = unit_in_band / band_width;
        m_unit = first_m_unit + m_in_band;
        n_unit = band_first_n + unit_in_band - m_in_band * band_width;
    }

    DK_DEVICE bool is_valid_block(uint32_t m_block_idx, uint32_t n_block_idx, int group) const {
        // (Contiguous 256-row tiles: get_next_tile has skipped, or marked invalid, the odd halves that start no tile.)
        return m_block_idx < group_num_m_blocks && n_block_idx < kNumNBlocks && group >= 0;
    }

    // Contiguous 256-row tiles: whether odd half `half` (inside M) starts a tile: its group differs from the half
    // before's (an odd half starting a segment).
    DK_DEVICE bool odd_half_starts_tile(uint32_t half) const {
        const uint32_t i = half / 2;
        if (i < kNumOddHalfBits)
            return (odd_half_table[i / 32] >> (i % 32)) & 1u;
        return contiguous_group(half * kMBlockRows) != contiguous_group((half - 1) * kMBlockRows);
    }

public:
    // Contiguous 256-row tiles: writes bit i of `table` (kNumOddHalfWords words of shared memory) as whether odd half
    // 2i + 1 starts a tile, for the odd halves inside M. Every thread of the CTA takes part (one warp per word); the
    // caller synchronizes the CTA before a scheduler reads the table.
    DK_DEVICE static void build_odd_half_table(uint32_t* table, uint32_t shape_m, const int* grouped_layout,
                                               uint32_t num_groups) {
        const uint32_t num_halves = ceil_div(shape_m, kMBlockRows);
        const uint32_t num_words = min(ceil_div(num_halves / 2, 32u), kNumOddHalfWords);
        const uint32_t lane_idx = threadIdx.x % 32;
        for (uint32_t word = threadIdx.x / 32; word < num_words; word += blockDim.x / 32) {
            const uint32_t half = 2 * (word * 32 + lane_idx) + 1;
            const bool starts = half < num_halves && contiguous_group(grouped_layout, num_groups, half * kMBlockRows) !=
                                                         contiguous_group(grouped_layout, num_groups, (half - 1) * kMBlockRows);
            const uint32_t bits = __ballot_sync(0xffffffffu, starts);
            if (lane_idx == 0)
                table[word] = bits;
        }
    }

private:
    // Group of an M-block: the masked cursor's group, the first row's id for contiguous, 0 for Normal.
    DK_DEVICE int block_group(uint32_t m_block_idx) const {
        if constexpr (kGemmType == GemmType::MGroupedContiguous)
            return m_block_idx < group_num_m_blocks ? contiguous_group(m_block_idx * kMBlockRows) : -1;
        else if constexpr (kGemmType == GemmType::MGroupedMasked || kGemmType == GemmType::KGrouped)
            return static_cast<int>(group_idx);
        else
            return 0;
    }
};

}  // namespace deep_kernels
