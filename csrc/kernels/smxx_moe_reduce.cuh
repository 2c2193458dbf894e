// MoE weighted reduction: out[t] = sum over j = 0 .. kTopK - 1 of weights[t, j] * y[row of slot t * kTopK + j],
// slots without a row (dropped) skipped. y [rows, H] is bf16, fp32 or e4m3 with one scale per row and group of
// GROUP_SIZE columns (y = float(q) * scale); out [T, H] bf16 or fp32. Rows come from the contiguous layout
// (slot_to_row) or the flattened masked layout [E * masked_tokens] (common/moe_rows.cuh: slot_row).
// Arithmetic, FP32, in slot order and without fused multiply-adds: acc = 0; acc = acc + w_j * y_j; out = RNE(acc).
// Memory-bound: a thread owns one 16-byte vector column of one token and issues its kTopK row loads before the
// sums. No shared memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "common/macros.cuh"
#include "common/moe_rows.cuh"
#include "common/quant.cuh"

namespace deep_kernels {

// Element i of a 16-byte vector of InT, from the 32-bit word holding it, as fp32 (exact), in registers.
template <typename InT>
DK_DEVICE float element_to_float(uint32_t word, int i) {
    if constexpr (sizeof(InT) == 4) {
        return __uint_as_float(word);
    } else if constexpr (sizeof(InT) == 2) {
        return __uint_as_float(i % 2 == 0 ? word << 16 : word & 0xffff0000u);
    } else {
        __nv_fp8_e4m3 element;
        element.__x = static_cast<__nv_fp8_storage_t>((word >> (8 * (i % 4))) & 0xffu);
        return static_cast<float>(element);
    }
}

// NOTE: 16-bit and 32-bit rows cap registers at 64 a thread (blocks of half the SM's threads fit), so the SM keeps
// more rows' loads in flight: 88 -> 97-99% of copy bandwidth at T = 4096 (H200, bf16). FP8 rows (16 accumulators,
// scales) would spill under that cap.
template <typename InT, typename OutT, int kTopK, int GROUP_SIZE, bool kPackedScales, int kColumnThreads,
          int kTokenLanes>
__global__ void __launch_bounds__(kColumnThreads * kTokenLanes,
                                  sizeof(InT) == 1 ? 1 : 1024 / (kColumnThreads * kTokenLanes))
smxx_moe_reduce_impl(const uint4* __restrict__ y, const void* __restrict__ y_scales, const float* __restrict__ weights,
                     const int32_t* __restrict__ slot_to_row, const int32_t* __restrict__ m_indices,
                     const int32_t* __restrict__ masked_slots, OutT* __restrict__ out, uint32_t num_tokens,
                     uint32_t row_vectors, uint32_t masked_tokens, uint32_t scale_batch_rows,
                     uint32_t scale_batch_stride, uint32_t scale_row_stride, uint32_t scale_column_stride) {
    // Static checks and types
    constexpr bool kScaled = sizeof(InT) == 1;
    constexpr int kVec = 16 / sizeof(InT);
    constexpr int kOutBytes = kVec * static_cast<int>(sizeof(OutT));
    DK_STATIC_ASSERT(GROUP_SIZE % kVec == 0, "a vector lies within one scale group");
    DK_STATIC_ASSERT(kOutBytes == 8 || kOutBytes % 16 == 0, "outputs are one 8-byte or whole 16-byte vectors");
    DK_STATIC_ASSERT((sizeof(OutT) == 4 || std::is_same_v<OutT, __nv_bfloat16>), "bf16 or fp32 outputs");

    // Tile: blockIdx.x is the column chunk (the chunks of a token's rows run together), blockIdx.z * gridDim.y +
    // blockIdx.y the token block
    const uint32_t token_block = blockIdx.z * gridDim.y + blockIdx.y;
    const uint32_t token = token_block * kTokenLanes + threadIdx.x / kColumnThreads;
    const uint32_t column = blockIdx.x * kColumnThreads + threadIdx.x % kColumnThreads;
    if (token >= num_tokens || column >= row_vectors)
        return;

    // Rows of the token's slots, then every row's load before any sum (a bit per slot with a row: the rows
    // themselves are dead after the loads), then the weights
    uint32_t present = 0;
    uint4 vectors[kTopK];
    float scales[kTopK];
    #pragma unroll
    for (int j = 0; j < kTopK; ++j) {
        const int32_t row = slot_row(slot_to_row, m_indices, masked_slots, masked_tokens, token * kTopK + j);
        if (row < 0)
            continue;
        present |= 1u << j;
        vectors[j] = __ldg(y + static_cast<uint64_t>(row) * row_vectors + column);
        if constexpr (kScaled) {
            const ScaleStrides strides{scale_batch_rows, scale_batch_stride, scale_row_stride, scale_column_stride};
            const uint32_t group = column * kVec / GROUP_SIZE;
            if constexpr (kPackedScales) {
                const auto* bytes = static_cast<const uint8_t*>(y_scales);
                scales[j] = ue8m0_to_float(__ldg(bytes + strides.offset(row, group / 4) * 4 + group % 4));
            } else {
                scales[j] = __ldg(static_cast<const float*>(y_scales) + strides.offset(row, group));
            }
        }
    }
    float slot_weights[kTopK];
    #pragma unroll
    for (int j = 0; j < kTopK; ++j)
        slot_weights[j] = __ldg(weights + token * kTopK + j);

    // Weighted sum in slot order
    float acc[kVec];
    #pragma unroll
    for (int i = 0; i < kVec; ++i)
        acc[i] = 0.0f;
    #pragma unroll
    for (int j = 0; j < kTopK; ++j) {
        if ((present >> j & 1u) == 0)
            continue;
        const uint32_t words[4] = {vectors[j].x, vectors[j].y, vectors[j].z, vectors[j].w};
        #pragma unroll
        for (int i = 0; i < kVec; ++i) {
            float value = element_to_float<InT>(words[i * sizeof(InT) / 4], i);
            if constexpr (kScaled)
                value = __fmul_rn(value, scales[j]);
            acc[i] = __fadd_rn(acc[i], __fmul_rn(slot_weights[j], value));
        }
    }

    // Store: the results as 32-bit words (bf16 pairs or fp32 bits), in registers
    constexpr int kWords = kOutBytes / 4;
    uint32_t words[kWords];
    #pragma unroll
    for (int w = 0; w < kWords; ++w) {
        if constexpr (sizeof(OutT) == 2) {
            words[w] = static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(acc[2 * w]))) |
                       static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(acc[2 * w + 1]))) << 16;
        } else {
            words[w] = __float_as_uint(acc[w]);
        }
    }
    OutT* dst = out + static_cast<uint64_t>(token) * row_vectors * kVec + column * kVec;
    if constexpr (kOutBytes % 16 == 0) {
        #pragma unroll
        for (int i = 0; i < kOutBytes / 16; ++i)
            reinterpret_cast<uint4*>(dst)[i] = make_uint4(words[4 * i], words[4 * i + 1], words[4 * i + 2], words[4 * i + 3]);
    } else {
        *reinterpret_cast<uint2*>(dst) = make_uint2(words[0], words[1]);
    }
}

}  // namespace deep_kernels
