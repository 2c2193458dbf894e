// A grid-wide barrier for cooperative launches (every block resident at once) over one uint32 counter that
// is zero in bits 0-30 between launches: block 0 adds 2^31 - (gridDim.x - 1) and every other block 1, so
// bit 31 flips exactly when the last block arrives, and the lower bits are back at zero for the next launch.
// A block with nothing to do after the barrier may arrive without waiting.
#pragma once

#include <cstdint>

#include "common/macros.cuh"
#include "ptx/global_memory.cuh"

namespace deep_kernels {

// The block's arrival (every thread calls it); returns, in thread 0, the counter before the add. The CTA's
// writes before the call are released to whoever waits on the barrier.
DK_DEVICE uint32_t grid_barrier_arrive(uint32_t* counter) {
    constexpr uint32_t kFlipBit = 0x80000000u;
    // NOTE: every thread fences its own writes at gpu scope before the CTA barrier; thread 0's release add
    // then publishes them all.
    ptx::fence_acq_rel_gpu();
    __syncthreads();
    uint32_t before = 0;
    if (threadIdx.x == 0)
        before = ptx::atomic_add_acq_rel_gpu(counter, blockIdx.x == 0 ? kFlipBit - (gridDim.x - 1) : 1u);
    return before;
}

// Waits (thread 0 spins, the CTA barrier holds the rest) until every block has arrived; every thread's
// later loads see every block's writes released by its arrival.
DK_DEVICE void grid_barrier_wait(const uint32_t* counter, uint32_t before) {
    constexpr uint32_t kFlipBit = 0x80000000u;
    if (threadIdx.x == 0) {
        while (((ptx::load_acquire_gpu(counter) ^ before) & kFlipBit) == 0)
            ;
    }
    __syncthreads();
}

DK_DEVICE void grid_barrier_sync(uint32_t* counter) {
    grid_barrier_wait(counter, grid_barrier_arrive(counter));
}

}  // namespace deep_kernels
