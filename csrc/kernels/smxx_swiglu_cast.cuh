// Fused SwiGLU and per-token FP8 cast: x [rows, 2H] bf16 (gate | up) -> y [rows, H], per element in FP32
//   y = (silu(min(gate, c)) * max(min(up, c), -c)) * w,  silu(g) = g / (1 + expf(-g))  (IEEE division)
// (min/max propagate NaN, only with kClamped; w is the row's weight, no product without weights), then y
// goes to e4m3 in 1x128 groups with per_token_cast's numerics (common/quant.cuh), or with kQuantize = false
// to bf16 (RNE). Rows: blockIdx.z is the expert of the masked layout (rows = E x T_max, rows of expert e from
// masked_m[e] on are skipped) or 0; with pos, a row whose position is outside [0, pos_limit) is skipped,
// and its weight is weights[pos[row]]. Skipped rows are neither read nor written. Memory-bound: each
// thread takes 16 columns of a group (two 16-byte vectors of each half) in each of kPasses rows, all
// loads in flight before use; no shared memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/macros.cuh"
#include "common/quant.cuh"
#include "common/swiglu.cuh"
#include "common/token_group_tile.cuh"
#include "common/types.cuh"

namespace deep_kernels {

template <int kNumWarps, int kPasses, bool kClamped, bool kQuantize, bool kUE8M0, ScaleLayout kLayout,
          ScaleMode kScaleMode>
__global__ void __launch_bounds__(kNumWarps * 32)
smxx_swiglu_cast_impl(const __nv_bfloat16* __restrict__ x, void* __restrict__ out, void* __restrict__ scales,
                      const float* __restrict__ weights, const int32_t* __restrict__ pos,
                      const int32_t* __restrict__ masked_m, uint32_t num_rows, uint32_t hidden, uint32_t x_row_stride,
                      uint32_t scale_stride, uint32_t scale_expert_stride, uint32_t pos_limit, float clamp,
                      float amax_clamp) {
    // Static checks and types
    constexpr int GROUP_SIZE = 128;
    // NOTE: 16 columns per thread (not 8) halve the per-group work per element (shuffles, the scale's two
    // divisions), which matters here: silu's expf and division leave little issue slack at HBM speed.
    constexpr int kVectors = 2;
    constexpr int kVec = 8 * kVectors;
    using Tile = TokenGroupTile<GROUP_SIZE, kVec, kNumWarps, kPasses>;
    DK_STATIC_ASSERT(kLayout != ScaleLayout::MNMajorPackedUE8M0 || kUE8M0, "packed scales are UE8M0");

    // Rows of this expert: the masked count, clamped to [0, num_rows]; blocks past it have no work
    const uint32_t expert = blockIdx.z;
    uint32_t valid_rows = num_rows;
    if (masked_m != nullptr)
        valid_rows = static_cast<uint32_t>(max(0, min(__ldg(masked_m + expert), static_cast<int32_t>(num_rows))));
    if (blockIdx.y * Tile::BLOCK_ROWS >= valid_rows)
        return;
    const uint64_t first_global_row = static_cast<uint64_t>(expert) * num_rows;

    // Row validity and weights, then every pass's loads
    const Tile tile;
    bool valid[kPasses];
    uint32_t weight_index[kPasses];
    #pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
        const uint32_t row = tile.row(pass);
        valid[pass] = row < valid_rows;
        weight_index[pass] = static_cast<uint32_t>(first_global_row + row);
        if (pos != nullptr && valid[pass]) {
            weight_index[pass] = static_cast<uint32_t>(__ldg(pos + first_global_row + row));
            valid[pass] = weight_index[pass] < pos_limit;
        }
    }
    uint4 gate[kPasses][kVectors] = {}, up[kPasses][kVectors] = {};
    float weight[kPasses];
    #pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
        weight[pass] = 1.0f;
        if (!valid[pass])
            continue;
        const __nv_bfloat16* row_x = x + (first_global_row + tile.row(pass)) * x_row_stride + tile.column;
        #pragma unroll
        for (int v = 0; v < kVectors; ++v) {
            gate[pass][v] = __ldg(reinterpret_cast<const uint4*>(row_x) + v);
            up[pass][v] = __ldg(reinterpret_cast<const uint4*>(row_x + hidden) + v);
        }
        if (weights != nullptr)
            weight[pass] = __ldg(weights + weight_index[pass]);
    }

    // Per pass: SwiGLU, then group amax, scale, cast and store (or the bf16 store)
    #pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
        const __nv_bfloat16* gate_values = reinterpret_cast<const __nv_bfloat16*>(gate[pass]);
        const __nv_bfloat16* up_values = reinterpret_cast<const __nv_bfloat16*>(up[pass]);
        float y[kVec];
        float amax = 0.0f;
        #pragma unroll
        for (int i = 0; i < kVec; ++i) {
            const float g = clamp_gate<kClamped>(__bfloat162float(gate_values[i]), clamp);
            const float u = clamp_up<kClamped>(__bfloat162float(up_values[i]), clamp);
            y[i] = __fmul_rn(__fdiv_rn(g, sigmoid_denominator(g)), u);
            if (weights != nullptr)
                y[i] = __fmul_rn(y[i], weight[pass]);
            amax = max_nan(amax, fabsf(y[i]));
        }
        const uint64_t out_offset = (first_global_row + tile.row(pass)) * hidden + tile.column;
        if constexpr (kQuantize) {
            // NOTE: all 32 lanes reach the shuffles; skipped rows reduce their zeros and stop after.
            amax = max_nan(Tile::group_reduce(amax, max_nan), amax_clamp);
            if (!valid[pass])
                continue;
            const E4M3Scaler<kUE8M0, kScaleMode> scaler(amax);
            uint32_t codes[kVec / 4];
            scaler.quantize(y, codes);
            store_codes(static_cast<uint8_t*>(out) + out_offset, codes);
            if (tile.is_group_leader) {
                // The expert's scales start scale_expert_stride elements (bytes when packed) further.
                const uint64_t expert_offset = static_cast<uint64_t>(expert) * scale_expert_stride;
                void* expert_scales = kLayout == ScaleLayout::MNMajorPackedUE8M0
                                          ? static_cast<void*>(static_cast<uint8_t*>(scales) + expert_offset)
                                          : static_cast<void*>(static_cast<float*>(scales) + expert_offset);
                store_scale<kLayout>(expert_scales, tile.row(pass), blockIdx.x, gridDim.x, scale_stride, scaler.scale);
            }
        } else {
            if (!valid[pass])
                continue;
            uint4 packed[kVectors];
            __nv_bfloat162* pairs = reinterpret_cast<__nv_bfloat162*>(packed);
            #pragma unroll
            for (int i = 0; i < kVec / 2; ++i)
                pairs[i] = __floats2bfloat162_rn(y[2 * i], y[2 * i + 1]);
            #pragma unroll
            for (int v = 0; v < kVectors; ++v)
                reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(out) + out_offset)[v] = packed[v];
        }
    }
}

}  // namespace deep_kernels
