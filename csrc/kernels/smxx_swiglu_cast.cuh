// Fused SwiGLU and per-token FP8 cast: x [rows, 2H] bf16 (gate | up) -> y [rows, H], per element in FP32
//   y = (silu(min(gate, c)) * max(min(up, c), -c)) * w,  silu(g) = g / (1 + expf(-g))  (IEEE division)
// (min/max propagate NaN, only with kClamped; w is the row's weight, no product without weights), then y
// goes to e4m3 in 1x128 groups with per_token_cast's numerics (common/quant.cuh), or with kQuantize = false
// to bf16 (RNE). Rows: blockIdx.z is the expert of the masked layout (rows = E x T_max, rows of expert e from
// masked_m[e] on are skipped) or 0; with pos, a row whose position is outside [0, pos_limit) is skipped,
// and its weight is weights[pos[row]]. Skipped rows are neither read nor written. Memory-bound: each
// thread takes 32 columns of a group (four 16-byte vectors of each half) in each of kPasses rows, all
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

// y = (silu(gc) * uc) * w of the vectors' elements (no product without kWeighted); returns their largest
// magnitude (NaN propagates).
template <bool kFastDivision, bool kWeighted, bool kClamped, int kVectors>
DK_DEVICE float swiglu_values(const uint4 (&gate)[kVectors], const uint4 (&up)[kVectors], float clamp, float weight,
                              float (&y)[8 * kVectors]) {
    float amax = 0.0f;
    #pragma unroll
    for (int i = 0; i < 4 * kVectors; ++i) {
        const uint32_t gate_pair = reinterpret_cast<const uint32_t*>(gate)[i];
        const uint32_t up_pair = reinterpret_cast<const uint32_t*>(up)[i];
        const float gates[2] = {bf16_low(gate_pair), bf16_high(gate_pair)};
        const float ups[2] = {bf16_low(up_pair), bf16_high(up_pair)};
        #pragma unroll
        for (int j = 0; j < 2; ++j) {
            const float g = clamp_gate<kClamped>(gates[j], clamp);
            float value = __fmul_rn(silu<kFastDivision>(g), clamp_up<kClamped>(ups[j], clamp));
            if constexpr (kWeighted)
                value = __fmul_rn(value, weight);
            y[2 * i + j] = value;
            amax = max_nan(amax, fabsf(value));
        }
    }
    return amax;
}

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
    // NOTE: 32 columns per thread (not 8 or 16) cut the per-group work per element (shuffles, the scale's
    // two divisions, the scale store's branch), which matters here: silu's expf and division leave little
    // issue slack at HBM speed.
    constexpr int kVectors = 4;
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
    // NOTE: a skipped row's vectors stay unset (no zeroing instructions): only valid rows use them.
    uint4 gate[kPasses][kVectors], up[kPasses][kVectors];
    float weight[kPasses];
    #pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
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

    // Per pass: SwiGLU (the fast division where every gate allows it, no clamping where every |gate| and
    // |up| lies within the clamp, which then changes nothing, the weight's product only with weights),
    // then group amax, scale, cast and store (or the bf16 store)
    const bool fast_clamp = !kClamped || clamp >= kFastClampMin;
    const uint32_t clamp_bits = kClamped ? bf16_floor_bits(clamp) : 0u;
    #pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
        float y[kVec];
        float amax = 0.0f;
        if (valid[pass]) {
            const uint4 (&g)[kVectors] = gate[pass];
            const uint4 (&u)[kVectors] = up[pass];
            const uint2 gate_range = magnitude_range(g);
            const bool fast = fast_clamp && fast_silu_gates(gate_range);
            const bool unclamped = kClamped && fast && gate_range.y <= clamp_bits && largest_magnitude(u) <= clamp_bits;
            if (weights != nullptr)
                amax = unclamped ? swiglu_values<true, true, false>(g, u, clamp, weight[pass], y)
                       : fast    ? swiglu_values<true, true, kClamped>(g, u, clamp, weight[pass], y)
                                 : swiglu_values<false, true, kClamped>(g, u, clamp, weight[pass], y);
            else
                amax = unclamped ? swiglu_values<true, false, false>(g, u, clamp, 1.0f, y)
                       : fast    ? swiglu_values<true, false, kClamped>(g, u, clamp, 1.0f, y)
                                 : swiglu_values<false, false, kClamped>(g, u, clamp, 1.0f, y);
        }
        const uint64_t out_offset = (first_global_row + tile.row(pass)) * hidden + tile.column;
        if constexpr (kQuantize) {
            // NOTE: all 32 lanes reach the shuffles; skipped rows reduce a zero amax and stop after.
            amax = max_nan(Tile::group_reduce(amax, max_nan), amax_clamp);
            if (!valid[pass])
                continue;
            const E4M3Scaler<kUE8M0, kScaleMode> scaler(amax);
            uint32_t codes[kVec / 4];
            scaler.quantize(y, codes);
            #pragma unroll
            for (int v = 0; v < kVec / 16; ++v) {
                const uint32_t vector_codes[4] = {codes[4 * v], codes[4 * v + 1], codes[4 * v + 2], codes[4 * v + 3]};
                store_codes(static_cast<uint8_t*>(out) + out_offset + 16 * v, vector_codes);
            }
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
