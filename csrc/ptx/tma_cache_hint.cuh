// TMA loads with an L2 eviction priority: a cache policy (createpolicy) for the lines a box reads.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "common/macros.cuh"
#include "ptx/mbarrier.cuh"

namespace deep_kernels::ptx {

// The policy of lines read once: they are the first to leave L2 when a line must be allocated.
DK_DEVICE uint64_t l2_evict_first_policy() {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}

// As tma_load (ptx/tma.cuh), with the L2 cache policy `policy` for the lines the box reads.
DK_DEVICE void tma_load_with_policy(void* smem_dst, const CUtensorMap* tmap, uint64_t* barrier, int32_t c0,
                                    int32_t c1, uint64_t policy) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%3, "
        "%4}], [%2], %5;" ::"r"(smem_address(smem_dst)),
        "l"(reinterpret_cast<uint64_t>(tmap)), "r"(smem_address(barrier)), "r"(c0), "r"(c1), "l"(policy)
        : "memory");
}

// As tma_load_multicast (ptx/tma.cuh), with the L2 cache policy `policy` for the lines the box reads.
DK_DEVICE void tma_load_multicast_with_policy(void* smem_dst, const CUtensorMap* tmap, uint64_t* barrier,
                                              uint16_t cta_mask, int32_t c0, int32_t c1, uint64_t policy) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster.L2::cache_hint "
        "[%0], [%1, {%4, %5}], [%2], %3, %6;" ::"r"(smem_address(smem_dst)),
        "l"(reinterpret_cast<uint64_t>(tmap)), "r"(smem_address(barrier)), "h"(cta_mask), "r"(c0), "r"(c1),
        "l"(policy)
        : "memory");
}

}  // namespace deep_kernels::ptx
