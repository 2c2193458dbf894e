// Expert parallelism: global expert ids topk_idx [n] (int32 or int64, contiguous) -> local ids int32 [n]:
// index - first_expert where first_expert <= index < first_expert + num_local_experts, else -1 (so -1
// and every other rank's expert drop out of this rank's moe_layout). A grid-stride loop, one slot per
// thread per step: the data are a few KB, latency not bandwidth decides.
#pragma once

#include <cstdint>

#include "common/macros.cuh"

namespace deep_kernels {

template <typename IndexT, int kNumThreads>
__global__ void __launch_bounds__(kNumThreads)
smxx_moe_local_experts_impl(const IndexT* __restrict__ topk_idx, int* __restrict__ local_idx, uint32_t num_slots,
                            uint32_t first_expert, uint32_t num_local_experts) {
    for (uint32_t slot = blockIdx.x * kNumThreads + threadIdx.x; slot < num_slots; slot += gridDim.x * kNumThreads) {
        const IndexT index = topk_idx[slot];
        // NOTE: the unsigned difference puts indices below first_expert (and negative ones) out of range.
        const uint64_t local = static_cast<uint64_t>(static_cast<int64_t>(index) - static_cast<int64_t>(first_expert));
        local_idx[slot] = local < num_local_experts ? static_cast<int>(local) : -1;
    }
}

}  // namespace deep_kernels
