// Shared-memory stores of accumulator fragments: stmatrix for 16-bit outputs, vector stores for FP32; a float2 load that
// stays in program order.
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

DK_DEVICE void st_shared(void* smem_ptr, float x, float y, float z, float w) {
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(smem_address(smem_ptr)), "f"(x), "f"(y), "f"(z),
                 "f"(w)
                 : "memory");
}

DK_DEVICE void st_shared(void* smem_ptr, uint32_t x, uint32_t y) {
    asm volatile("st.shared.v2.b32 [%0], {%1, %2};" ::"r"(smem_address(smem_ptr)), "r"(x), "r"(y) : "memory");
}

DK_DEVICE float2 ld_shared_in_order(const void* smem_ptr) {
    float2 value;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(value.x), "=f"(value.y) : "r"(smem_address(smem_ptr)));
    return value;
}

}  // namespace deep_kernels::ptx
