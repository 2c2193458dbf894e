// Synchronisation wrappers: register reconfiguration, named barriers, cluster barriers, proxy fences.
#pragma once

#include <cstdint>

#include "common/macros.cuh"

namespace deep_kernels::ptx {

// Every warp of a warpgroup must execute the same setmaxnreg.
template <uint32_t kNumRegisters>
DK_DEVICE void setmaxnreg_inc() {
    DK_STATIC_ASSERT(kNumRegisters % 8 == 0 && kNumRegisters >= 24 && kNumRegisters <= 256, "setmaxnreg range");
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kNumRegisters));
}

template <uint32_t kNumRegisters>
DK_DEVICE void setmaxnreg_dec() {
    DK_STATIC_ASSERT(kNumRegisters % 8 == 0 && kNumRegisters >= 24 && kNumRegisters <= 256, "setmaxnreg range");
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kNumRegisters));
}

// Barrier `id` (1..15; 0 is __syncthreads) among `num_threads` threads, a multiple of 32.
DK_DEVICE void named_barrier_sync(uint32_t id, uint32_t num_threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(num_threads) : "memory");
}

// Arrives on barrier `id` among `num_threads` threads without waiting for the others (a producer's signal to
// threads that bar.sync on it).
DK_DEVICE void named_barrier_arrive(uint32_t id, uint32_t num_threads) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(num_threads) : "memory");
}

// Named barrier `id` that also returns whether `value` holds for any of its `num_threads` threads; orders
// memory like named_barrier_sync.
DK_DEVICE bool named_barrier_sync_or(uint32_t id, uint32_t num_threads, bool value) {
    uint32_t any;
    asm volatile(
        "{\n"
        ".reg .pred value, any;\n"
        "setp.ne.u32 value, %1, 0;\n"
        "bar.red.or.pred any, %2, %3, value;\n"
        "selp.u32 %0, 1, 0, any;\n"
        "}"
        : "=r"(any)
        : "r"(static_cast<uint32_t>(value)), "r"(id), "r"(num_threads)
        : "memory");
    return any != 0;
}

// Cluster-wide execution barrier without memory ordering (e.g. after fence_mbarrier_init, which orders
// the barrier initialisation itself); each warp must be converged.
DK_DEVICE void cluster_sync_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n"
                 "barrier.cluster.wait.aligned;" ::
                     : "memory");
}

// All non-exited threads of every CTA in the cluster; each warp must be converged.
DK_DEVICE void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;" ::
                     : "memory");
}

// Orders this thread's earlier memory accesses (loads included: it waits for their values) before its later ones,
// among the CTA's threads.
DK_DEVICE void fence_acq_rel_cta() {
    asm volatile("fence.acq_rel.cta;" ::: "memory");
}

// Orders this thread's generic-proxy shared-memory writes before later async-proxy (TMA, wgmma) reads.
DK_DEVICE void fence_proxy_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

}  // namespace deep_kernels::ptx
