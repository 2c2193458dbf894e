// TMA (cp.async.bulk.tensor) wrappers: tiled 2D/3D loads into shared memory (optionally multicast to
// the CTAs of a cluster), plain bulk loads and stores of contiguous bytes, tiled stores and reduce-adds
// from shared memory, bulk-group commit/wait, prefetch.
// Coordinates are element indices, innermost dimension first, as in the tensor map.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "common/macros.cuh"
#include "ptx/mbarrier.cuh"

namespace deep_kernels::ptx {

DK_DEVICE void tma_prefetch_descriptor(const CUtensorMap* tmap) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(tmap)) : "memory");
}

DK_DEVICE void tma_load(void* smem_dst, const CUtensorMap* tmap, uint64_t* barrier, int32_t c0, int32_t c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
            smem_address(smem_dst)),
        "l"(reinterpret_cast<uint64_t>(tmap)), "r"(smem_address(barrier)), "r"(c0), "r"(c1)
        : "memory");
}

DK_DEVICE void tma_load(void* smem_dst, const CUtensorMap* tmap, uint64_t* barrier, int32_t c0, int32_t c1,
                        int32_t c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
        "[%2];" ::"r"(smem_address(smem_dst)),
        "l"(reinterpret_cast<uint64_t>(tmap)), "r"(smem_address(barrier)), "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}

// Writes the box into the same shared-memory offset of every CTA in `cta_mask` and completes the
// transaction bytes on the barrier at `barrier`'s offset in each of them.
DK_DEVICE void tma_load_multicast(void* smem_dst, const CUtensorMap* tmap, uint64_t* barrier, uint16_t cta_mask,
                                  int32_t c0, int32_t c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, "
        "{%4, %5}], [%2], %3;" ::"r"(smem_address(smem_dst)),
        "l"(reinterpret_cast<uint64_t>(tmap)), "r"(smem_address(barrier)), "h"(cta_mask), "r"(c0), "r"(c1)
        : "memory");
}

DK_DEVICE void tma_load_multicast(void* smem_dst, const CUtensorMap* tmap, uint64_t* barrier, uint16_t cta_mask,
                                  int32_t c0, int32_t c1, int32_t c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, "
        "{%4, %5, %6}], [%2], %3;" ::"r"(smem_address(smem_dst)),
        "l"(reinterpret_cast<uint64_t>(tmap)), "r"(smem_address(barrier)), "h"(cta_mask), "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}

// Non-tensor bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) from global into
// shared memory, completing the transaction bytes on `barrier`.
DK_DEVICE void bulk_load(void* smem_dst, const void* global_src, uint32_t bytes, uint64_t* barrier) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_address(smem_dst)),
                 "l"(reinterpret_cast<uint64_t>(global_src)), "r"(bytes), "r"(smem_address(barrier))
                 : "memory");
}

// Non-tensor bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) from shared into
// global memory, in this thread's current bulk group (tma_store_commit / tma_store_wait*).
DK_DEVICE void bulk_store(void* global_dst, const void* smem_src, uint32_t bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(reinterpret_cast<uint64_t>(global_dst)),
                 "r"(smem_address(smem_src)), "r"(bytes)
                 : "memory");
}

DK_DEVICE void tma_store(const CUtensorMap* tmap, const void* smem_src, int32_t c0, int32_t c1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
                     reinterpret_cast<uint64_t>(tmap)),
                 "r"(smem_address(smem_src)), "r"(c0), "r"(c1)
                 : "memory");
}

DK_DEVICE void tma_store(const CUtensorMap* tmap, const void* smem_src, int32_t c0, int32_t c1, int32_t c2) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(
                     reinterpret_cast<uint64_t>(tmap)),
                 "r"(smem_address(smem_src)), "r"(c0), "r"(c1), "r"(c2)
                 : "memory");
}

// Element-wise global += shared (the add is done by the TMA unit; FP32 here).
DK_DEVICE void tma_reduce_add(const CUtensorMap* tmap, const void* smem_src, int32_t c0, int32_t c1) {
    asm volatile("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
                     reinterpret_cast<uint64_t>(tmap)),
                 "r"(smem_address(smem_src)), "r"(c0), "r"(c1)
                 : "memory");
}

DK_DEVICE void tma_reduce_add(const CUtensorMap* tmap, const void* smem_src, int32_t c0, int32_t c1, int32_t c2) {
    asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(
                     reinterpret_cast<uint64_t>(tmap)),
                 "r"(smem_address(smem_src)), "r"(c0), "r"(c1), "r"(c2)
                 : "memory");
}

DK_DEVICE void tma_store_commit() {
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Waits until at most kNumPending committed store groups of this thread still read shared memory.
template <int kNumPending>
DK_DEVICE void tma_store_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kNumPending) : "memory");
}

}  // namespace deep_kernels::ptx
