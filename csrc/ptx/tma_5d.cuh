// 5D TMA tile loads (the per-channel kinds' B tile, whose rows a 5D view of B permutes within 16-row blocks).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "common/macros.cuh"
#include "ptx/mbarrier.cuh"

namespace deep_kernels::ptx {

DK_DEVICE void tma_load(void* smem_dst, const CUtensorMap* tmap, uint64_t* barrier, int32_t c0, int32_t c1, int32_t c2,
                        int32_t c3, int32_t c4) {
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6, %7}], "
        "[%2];" ::"r"(smem_address(smem_dst)),
        "l"(reinterpret_cast<uint64_t>(tmap)), "r"(smem_address(barrier)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
        : "memory");
}

// Writes the box into the same shared-memory offset of every CTA in `cta_mask` and completes the transaction bytes
// on the barrier at `barrier`'s offset in each of them.
DK_DEVICE void tma_load_multicast(void* smem_dst, const CUtensorMap* tmap, uint64_t* barrier, uint16_t cta_mask,
                                  int32_t c0, int32_t c1, int32_t c2, int32_t c3, int32_t c4) {
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, "
        "{%4, %5, %6, %7, %8}], [%2], %3;" ::"r"(smem_address(smem_dst)),
        "l"(reinterpret_cast<uint64_t>(tmap)), "r"(smem_address(barrier)), "h"(cta_mask), "r"(c0), "r"(c1), "r"(c2),
        "r"(c3), "r"(c4)
        : "memory");
}

}  // namespace deep_kernels::ptx
