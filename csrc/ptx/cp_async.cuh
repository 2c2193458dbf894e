// Asynchronous 16-byte (and 4-byte) copies from global to shared memory (cp.async, sm_80+), bypassing L1, with zero fill.
#pragma once

#include <cstdint>

#include "common/macros.cuh"
#include "ptx/mbarrier.cuh"

namespace deep_kernels::ptx {

// Copies the first src_bytes (0 to 16) of the 16 bytes at src to smem_dst and zero-fills the rest; src is not
// read past src_bytes. Both addresses 16-byte aligned.
DK_DEVICE void cp_async_16(void* smem_dst, const void* src, uint32_t src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_address(smem_dst)), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}

// Copies 8 bytes (src_bytes 8) or writes 8 zero bytes (src_bytes 0, src not read) through L1; both addresses
// 8-byte aligned.
DK_DEVICE void cp_async_8(void* smem_dst, const void* src, uint32_t src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(smem_address(smem_dst)), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}

// Copies 4 bytes (src_bytes 4) or writes 4 zero bytes (src_bytes 0, src not read) through L1; both addresses
// 4-byte aligned.
DK_DEVICE void cp_async_4(void* smem_dst, const void* src, uint32_t src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_address(smem_dst)), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}

// Arrives on `barrier` once every cp.async this thread issued so far has completed, without counting itself as an
// expected arrival (.noinc: the barrier's init count must include it).
DK_DEVICE void cp_async_mbarrier_arrive_noinc(uint64_t* barrier) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_address(barrier)) : "memory");
}

// Waits for every cp.async this thread issued (their data is then visible to this thread; a __syncwarp or
// barrier makes it visible to others).
DK_DEVICE void cp_async_wait_all() {
    asm volatile("cp.async.wait_all;" ::: "memory");
}

}  // namespace deep_kernels::ptx
