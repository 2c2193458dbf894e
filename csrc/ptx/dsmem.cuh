// Distributed shared memory: another cluster CTA's shared memory, addressed through mapa.
#pragma once

#include <cstdint>

#include "common/macros.cuh"
#include "ptx/mbarrier.cuh"

namespace deep_kernels::ptx {

// The shared::cluster address of `ptr`'s offset in the shared memory of cluster CTA `cta_rank`.
DK_DEVICE uint32_t cluster_shared_address(const void* ptr, uint32_t cta_rank) {
    uint32_t address;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(address) : "r"(smem_address(ptr)), "r"(cta_rank));
    return address;
}

// Four floats at a shared::cluster address (16-byte aligned).
DK_DEVICE void ld_shared_cluster(uint32_t address, float& x, float& y, float& z, float& w) {
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(x), "=f"(y), "=f"(z), "=f"(w)
                 : "r"(address)
                 : "memory");
}

}  // namespace deep_kernels::ptx
