// Shared-memory stores of accumulator fragments: stmatrix for 16-bit outputs, vector stores for FP32.
#pragma once

#include <cstdint>

#include "common/macros.cuh"
#include "ptx/mbarrier.cuh"

namespace deep_kernels::ptx {

// Four 8x8 b16 matrices: lane l gives the address of row l % 8 of matrix l / 8; register i holds this
// lane's two elements (row lane / 4, columns 2 * (lane % 4) + {0, 1}) of matrix i.
DK_DEVICE void stmatrix_x4(void* smem_row, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
    asm volatile("stmatrix.sync.aligned.x4.m8n8.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(smem_address(smem_row)),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}

DK_DEVICE void st_shared(void* smem_ptr, float x, float y) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(smem_address(smem_ptr)), "f"(x), "f"(y) : "memory");
}

}  // namespace deep_kernels::ptx
