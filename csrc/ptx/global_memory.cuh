// Global-memory accesses with explicit caching and ordering: L2-only (.cg) vector loads and stores for
// data another CTA reads or wrote, a read-only load that asks L2 to keep its line, and the gpu-scope
// atomic, load and store of an arrival counter.
#pragma once

#include <cstdint>

#include "common/macros.cuh"

namespace deep_kernels::ptx {

// NOTE: .cg keeps the data out of the (non-coherent) L1, so another CTA's writes are never hidden by a
// stale line of this SM.
DK_DEVICE void st_global_cg(float* ptr, float x, float y, float z, float w) {
    asm volatile("st.global.cg.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(ptr), "f"(x), "f"(y), "f"(z), "f"(w)
                 : "memory");
}

DK_DEVICE void ld_global_cg(const float* ptr, float& x, float& y, float& z, float& w) {
    asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(x), "=f"(y), "=f"(z), "=f"(w) : "l"(ptr)
                 : "memory");
}

// A read-only (.nc) load whose L2 line is evicted after others (evict_last): for small data that many CTAs
// read again while a larger stream passes through L2.
DK_DEVICE uint32_t ld_global_nc_evict_last(const uint32_t* ptr) {
    uint64_t policy;
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    uint32_t value;
    asm("ld.global.nc.L2::cache_hint.u32 %0, [%1], %2;" : "=r"(value) : "l"(ptr), "l"(policy));
    return value;
}

// Orders this thread's earlier memory accesses before its later ones for every thread of the GPU.
DK_DEVICE void fence_acq_rel_gpu() {
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
}

// Returns the old value. Release: writes that precede the add (this thread's, and its CTA's ordered before
// it by a barrier) are visible to whoever acquires the counter later; acquire: the writes released by
// earlier adds are visible to this thread (and, after a barrier, to its CTA).
DK_DEVICE uint32_t atomic_add_acq_rel_gpu(uint32_t* counter, uint32_t value) {
    uint32_t old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(counter), "r"(value) : "memory");
    return old;
}

DK_DEVICE void store_relaxed_gpu(uint32_t* ptr, uint32_t value) {
    asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(ptr), "r"(value) : "memory");
}

// Brings the line of `ptr` into L2 without waiting for it (e.g. a counter that an atomic later takes).
DK_DEVICE void prefetch_l2(const void* ptr) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(ptr));
}

// Acquire: the writes released by the adds this load observes are visible to this thread (and, after a
// barrier, to its CTA).
DK_DEVICE uint32_t load_acquire_gpu(const uint32_t* ptr) {
    uint32_t value;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(value) : "l"(ptr) : "memory");
    return value;
}

}  // namespace deep_kernels::ptx
