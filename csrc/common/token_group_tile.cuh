// Thread mapping of the per-token-group kernels: a block covers BLOCK_ROWS rows of one group column;
// blockIdx.x is the group column and blockIdx.y the row block.
#pragma once

#include <cstdint>

#include "common/macros.cuh"

namespace deep_kernels {

// Each thread owns kVec consecutive elements; kLanesPerGroup lanes cover one row's group, so a warp
// covers 32 / kLanesPerGroup rows. The block's warps stack rows, and kPasses repeats the stack so each
// thread has several independent loads in flight. Rows of a block are consecutive, so the scales of a
// group column (MN-major) are written as one contiguous run.
// kGroupsPerBlock > 1 (the packed UE8M0 layout: 4 groups share a word): warp w takes group column
// w % kGroupsPerBlock of the block's kGroupsPerBlock neighbouring ones, and the kGroupsPerBlock blocks of a
// row block (blockIdx.x / kGroupsPerBlock alike) split its BLOCK_ROWS rows, so the grid stays (groups rounded
// up to kGroupsPerBlock) x (row blocks of BLOCK_ROWS rows) and every block still moves BLOCK_ROWS group rows.
// NOTE: the group column is the fast grid index so that blocks running together read neighbouring
// segments of the same rows (DRAM pages) rather than one narrow column down many rows.
template <int GROUP_SIZE, int kVec, int kNumWarps, int kPasses, int kGroupsPerBlock = 1>
struct TokenGroupTile {
    static constexpr int kLanesPerGroup = GROUP_SIZE / kVec;
    DK_STATIC_ASSERT(GROUP_SIZE % kVec == 0, "the group must hold whole vectors");
    DK_STATIC_ASSERT(kLanesPerGroup >= 1 && kLanesPerGroup <= 32 && (kLanesPerGroup & (kLanesPerGroup - 1)) == 0,
                     "a group spans a power-of-two number of lanes within one warp");
    DK_STATIC_ASSERT(kNumWarps % kGroupsPerBlock == 0, "every group column of a block gets whole warps");
    static constexpr int kRowsPerWarp = 32 / kLanesPerGroup;
    static constexpr int kRowsPerPass = kRowsPerWarp * kNumWarps / kGroupsPerBlock;
    static constexpr int BLOCK_ROWS = kRowsPerWarp * kNumWarps * kPasses;
    static constexpr int kBlockRowsPerGroup = BLOCK_ROWS / kGroupsPerBlock;  // rows of one block
    static constexpr int kNumThreads = kNumWarps * 32;

    uint32_t first_block_row;  // the block's first row
    uint32_t first_row;        // of this thread's pass 0
    uint32_t group;            // this warp's group column
    uint32_t column;           // of this thread's first element
    bool is_group_leader;      // the lane that writes the group's scale

    DK_DEVICE TokenGroupTile() {
        const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        first_block_row = blockIdx.y * BLOCK_ROWS + blockIdx.x % kGroupsPerBlock * kBlockRowsPerGroup;
        first_row = first_block_row + warp / kGroupsPerBlock * kRowsPerWarp + lane / kLanesPerGroup;
        group = blockIdx.x / kGroupsPerBlock * kGroupsPerBlock + warp % kGroupsPerBlock;
        column = group * GROUP_SIZE + (lane % kLanesPerGroup) * kVec;
        is_group_leader = lane % kLanesPerGroup == 0;
    }

    DK_DEVICE uint32_t row(int pass) const { return first_row + pass * kRowsPerPass; }

    // Reduce over the lanes of one group (all 32 lanes take part, so call it unconditionally).
    template <typename Op>
    DK_DEVICE static float group_reduce(float value, Op op) {
        #pragma unroll
        for (int offset = kLanesPerGroup / 2; offset > 0; offset /= 2)
            value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
        return value;
    }
};

}  // namespace deep_kernels
