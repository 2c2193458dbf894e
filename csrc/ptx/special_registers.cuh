// Special registers read with volatile asm.
#pragma once

#include <cstdint>

#include "common/macros.cuh"

namespace deep_kernels::ptx {

// threadIdx.x read where it is used: a volatile read is neither hoisted nor merged with an earlier one, so
// ptxas recomputes values derived from it at their use instead of keeping them live (near the register cap,
// a long-lived copy can be what spills).
DK_DEVICE uint32_t thread_idx_x_here() {
    uint32_t tid;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
    return tid;
}

}  // namespace deep_kernels::ptx
