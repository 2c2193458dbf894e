// mbarrier wrappers: the shared-memory transaction barriers that TMA loads complete on.
#pragma once

#include <cstdint>

#include "common/macros.cuh"

namespace deep_kernels::ptx {

DK_DEVICE uint32_t smem_address(const void* ptr) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

DK_DEVICE void mbarrier_init(uint64_t* barrier, uint32_t arrive_count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(barrier)), "r"(arrive_count));
}

// Makes barrier initialisation visible to the async proxy (TMA) and to the other CTAs of the cluster.
DK_DEVICE void fence_mbarrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

DK_DEVICE void mbarrier_arrive(uint64_t* barrier) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_address(barrier)) : "memory");
}

// Arrives only where `pred` holds. NOTE: a predicated instruction instead of a branch, so no divergent
// path sits between wgmma instructions in flight (ptxas would serialize them, C7518).
DK_DEVICE void mbarrier_arrive_if(uint64_t* barrier, bool pred) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %1, 0;\n"
        "@p mbarrier.arrive.shared::cta.b64 _, [%0];\n"
        "}" ::"r"(smem_address(barrier)),
        "r"(static_cast<uint32_t>(pred))
        : "memory");
}

// Arrives once and announces `bytes` more transaction bytes for the current phase.
DK_DEVICE void mbarrier_arrive_expect_tx(uint64_t* barrier, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(barrier)), "r"(bytes)
                 : "memory");
}

// Announces `bytes` more transaction bytes for the current phase without arriving.
DK_DEVICE void mbarrier_expect_tx(uint64_t* barrier, uint32_t bytes) {
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(smem_address(barrier)), "r"(bytes)
                 : "memory");
}

// Where `pred` holds, arrives on the barrier at the same shared-memory offset in cluster CTA `cta_rank`
// (which may be this CTA); predicated like mbarrier_arrive_if.
// NOTE: default (.release.cta) semantics: `.release.cluster` costs a GPU-wide MEMBAR per arrive, and the
// arrive only has to order this thread's own reads of the stage before the peer's TMA overwrites it.
DK_DEVICE void mbarrier_arrive_cluster_if(uint64_t* barrier, uint32_t cta_rank, bool pred) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        ".reg .b32 remote_address;\n"
        "setp.ne.b32 p, %2, 0;\n"
        "mapa.shared::cluster.u32 remote_address, %0, %1;\n"
        "@p mbarrier.arrive.shared::cluster.b64 _, [remote_address];\n"
        "}" ::"r"(smem_address(barrier)),
        "r"(cta_rank), "r"(static_cast<uint32_t>(pred))
        : "memory");
}

DK_DEVICE bool mbarrier_try_wait(uint64_t* barrier, uint32_t parity) {
    uint32_t done;
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}"
        : "=r"(done)
        : "r"(smem_address(barrier)), "r"(parity)
        : "memory");
    return done != 0;
}

// Blocks until the phase with the given parity has completed.
DK_DEVICE void mbarrier_wait(uint64_t* barrier, uint32_t parity) {
    while (!mbarrier_try_wait(barrier, parity)) {
    }
}

}  // namespace deep_kernels::ptx
