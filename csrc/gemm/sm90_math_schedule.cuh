// How the SM90 FP8 GEMM's two math warpgroups share the tensor cores.
//
// Lockstep: both warpgroups wait for the same stage and issue their wgmma groups at once; the tensor cores
// interleave the two groups, both finish together, and the tensor pipe drains while both promote.
// PingPong: the warpgroups take turns (warpgroup 0, 1, 0, 1, ... one wgmma group per turn: per K block and 64-row
// wave); a turn lasts from the issue until the group is done, so the tensor cores run one warpgroup's group at a
// time and a warpgroup promotes (and at a tile's end stores) while the other's group runs. Two named barriers
// hand the turn over: a warpgroup waits (bar.sync) on its own before it issues and arrives (bar.arrive) on the
// other's once its group is done, before it promotes. (Handing over at the issue lets the tensor cores interleave
// both groups as in lockstep: measured on the H200, no faster.) Both warpgroups run the same groups (they share
// every tile), so the turns stay balanced.
// OwnTilePingPong: each math warpgroup owns its own tile (BLOCK_M rows: one or two 64-row waves), consecutive tiles
// of the CTA's schedule alternating between warpgroups 0 and 1, and the producer fills the stages in tile order. The
// turn is a whole tile's mainloop: a warpgroup waits for it before its tile's first wgmma group and passes it right
// after issuing the tile's last group, so that its promotion tail and its epilogue (staging and TMA store) run while
// the other warpgroup's wgmma groups run. Within a turn only one warpgroup feeds the tensor cores, so its K loop keeps
// a group in flight across K blocks (the pipelined loop).
#pragma once

#include <cstdint>

#include "common/macros.cuh"
#include "ptx/sync.cuh"

namespace deep_kernels {

enum class MathSchedule : uint32_t {
    Lockstep = 0,
    PingPong = 1,
    OwnTilePingPong = 2,
};

namespace sm90_fp8_gemm_detail {

// The issue turns of math warpgroups 0 and 1 (barrier 0 is __syncthreads; the epilogue takes 1 and 2, the FP4
// expanders 15).
class MathTurns {
    static constexpr uint32_t kFirstBarrier = 12;
    // Each turn barrier completes with the waiting warpgroup's bar.sync and the other's bar.arrive.
    static constexpr uint32_t kNumThreads = 2 * 128;
    const uint32_t own_barrier, other_barrier;

public:
    DK_DEVICE explicit MathTurns(uint32_t wg_idx)
        : own_barrier(kFirstBarrier + wg_idx), other_barrier(kFirstBarrier + 1 - wg_idx) {}

    // Before the first turn: warpgroup 1 gives warpgroup 0 the first turn.
    DK_DEVICE void start() const {
        if (own_barrier != kFirstBarrier)
            ptx::named_barrier_arrive(kFirstBarrier, kNumThreads);
    }

    DK_DEVICE void wait() const { ptx::named_barrier_sync(own_barrier, kNumThreads); }

    DK_DEVICE void pass() const { ptx::named_barrier_arrive(other_barrier, kNumThreads); }

    // Own tiles, after the CTA's last tile: the warpgroup whose turn comes next (that of tile num_tiles) takes the turn
    // the other's last pass gave it, so that no barrier is left half-arrived when the CTA exits.
    DK_DEVICE void finish_tiles(uint32_t num_tiles) const {
        if (own_barrier == kFirstBarrier + num_tiles % 2)
            ptx::named_barrier_sync(own_barrier, kNumThreads);
    }

    // After the last turn: warpgroup 0 takes the turn that warpgroup 1's last pass gave it, so that no barrier is
    // left half-arrived when the CTA exits.
    DK_DEVICE void finish() const {
        if (own_barrier == kFirstBarrier)
            ptx::named_barrier_sync(kFirstBarrier, kNumThreads);
    }
};

}  // namespace sm90_fp8_gemm_detail

}  // namespace deep_kernels
