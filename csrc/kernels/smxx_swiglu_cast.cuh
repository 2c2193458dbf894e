// Fused SwiGLU and per-token FP8 cast: x [rows, 2H] bf16 (gate | up) -> y [rows, H], per element in FP32
//   y = (silu(min(gate, c)) * max(min(up, c), -c)) * w,  silu(g) = g / (1 + expf(-g))  (IEEE division)
// (min/max propagate NaN, only with kClamped, on the loaded bf16 pairs with kBf16Clamp, where c is a bf16 value;
// w is the row's weight, no product without weights), then y
// goes to e4m3 in 1x128 groups with per_token_cast's numerics (common/quant.cuh), or with kQuantize = false
// to bf16 (RNE). Rows: blockIdx.z is the expert of the masked layout (rows = E x T_max, rows of expert e from
// masked_m[e] on are skipped) or 0; with pos, a row whose position is outside [0, pos_limit) is skipped,
// and its weight is weights[pos[row]]. Skipped rows are neither read nor written.
// Memory-bound: each thread takes 16 columns of a group (two 16-byte vectors of each half) in each of kPasses
// rows, a warp's lanes the groups of 4 rows or (kRowsPerWarp = 1) 4 groups of one row; no shared memory. The
// structure is chosen by template arguments for experiments (DK_SWIGLU_CAST_CONFIG, deep_kernels/quant/swiglu.py):
//   kPassesInFlight: the passes whose loads are issued up front; each finished pass then issues the loads of
//     the pass kPassesInFlight further (kPassesInFlight = kPasses: all loads in flight before use).
//   kRangeCheck: silu by fast_silu's steps (common/swiglu.cuh), and by ScaledSigmoidDenominator's for a
//     thread's 8 gates of a row when one is outside GatePairRange's range (below 2^-20 in magnitude, or +inf
//     without a clamp); else by the latter for every gate.
//   kMinBlocks: the blocks per SM __launch_bounds__ asks for (a register cap), 0 for none.
// Either way silu is IEEE division's quotient for every bf16 gate without its per-element check and slow-path
// call. A gate clamped by a float c takes silu(c), computed once per thread by IEEE division (the fast steps take
// min(gate, c) when they give that quotient for c, which each thread checks once); a bf16 c needs neither.
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

template <int kNumWarps, int kRowsPerWarp, int kPasses, int kPassesInFlight, bool kRangeCheck, int kMinBlocks,
          bool kClamped, bool kBf16Clamp, bool kQuantize, bool kUE8M0, ScaleLayout kLayout, ScaleMode kScaleMode>
__global__ void __launch_bounds__(kNumWarps * 32, kMinBlocks)
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
    using Group = TokenGroupTile<GROUP_SIZE, kVec, kNumWarps, kPasses>;
    DK_STATIC_ASSERT(kRowsPerWarp == 1 || kRowsPerWarp == Group::kRowsPerWarp,
                     "a warp takes one row, or one group of rows");
    // A warp's lanes: one group of each of its rows, or (one row) 32 / Group::kLanesPerGroup groups of it
    using Tile = TokenGroupTile<GROUP_SIZE * Group::kRowsPerWarp / kRowsPerWarp, kVec, kNumWarps, kPasses>;
    DK_STATIC_ASSERT(kLayout != ScaleLayout::MNMajorPackedUE8M0 || kUE8M0, "packed scales are UE8M0");
    DK_STATIC_ASSERT(kPassesInFlight >= 1 && kPassesInFlight <= kPasses, "1 to kPasses passes of loads in flight");
    DK_STATIC_ASSERT(kClamped || !kBf16Clamp, "a bf16 clamp is a clamp");
    constexpr bool kFloatClamp = kClamped && !kBf16Clamp;  // else the loaded bf16 pairs are clamped

    // Rows of this expert: the masked count, clamped to [0, num_rows]; blocks past it have no work
    const uint32_t expert = blockIdx.z;
    uint32_t valid_rows = num_rows;
    if (masked_m != nullptr)
        valid_rows = static_cast<uint32_t>(max(0, min(__ldg(masked_m + expert), static_cast<int32_t>(num_rows))));
    if (blockIdx.y * Tile::BLOCK_ROWS >= valid_rows)
        return;
    const uint64_t first_global_row = static_cast<uint64_t>(expert) * num_rows;

    // Row validity and weights, then the loads of the first kPassesInFlight passes
    const Tile tile;
    const uint32_t group = tile.column / GROUP_SIZE;
    const bool is_group_leader = tile.column % GROUP_SIZE == 0;
    const bool column_valid = tile.column < hidden;  // false only in a row's last block with kRowsPerWarp = 1
    bool valid[kPasses];
    uint32_t weight_index[kPasses];
    #pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
        const uint32_t row = tile.row(pass);
        valid[pass] = column_valid && row < valid_rows;
        weight_index[pass] = static_cast<uint32_t>(first_global_row + row);
        if (pos != nullptr && valid[pass]) {
            weight_index[pass] = static_cast<uint32_t>(__ldg(pos + first_global_row + row));
            valid[pass] = weight_index[pass] < pos_limit;
        }
    }
    const auto gate_of = [&](int pass) {  // the thread's first gate element of a pass's row
        return x + (first_global_row + tile.row(pass)) * x_row_stride + tile.column;
    };
    uint4 gate[kPasses][kVectors] = {}, up[kPasses][kVectors] = {};
    float weight[kPasses];
    const auto load_pass = [&](int pass) {
        weight[pass] = 1.0f;
        if (!valid[pass])
            return;
        #pragma unroll
        for (int v = 0; v < kVectors; ++v) {
            gate[pass][v] = __ldg(reinterpret_cast<const uint4*>(gate_of(pass)) + v);
            up[pass][v] = __ldg(reinterpret_cast<const uint4*>(gate_of(pass) + hidden) + v);
        }
        if (weights != nullptr)
            weight[pass] = __ldg(weights + weight_index[pass]);
    };
    #pragma unroll
    for (int pass = 0; pass < kPassesInFlight; ++pass)
        load_pass(pass);

    // Per pass: SwiGLU, then group amax, scale, cast and store (or the bf16 store), then the loads of the
    // pass kPassesInFlight further
    // A float clamp c need not be a bf16 value, which the division steps' proofs cover: a clamped gate takes silu(c)
    // by IEEE division, and fast_silu(min(gate, c)) is silu(c) only where the fast steps give c's IEEE quotient, so
    // otherwise the scaled steps and a select take every gate. A bf16 clamp leaves bf16 gates, whose quotients both
    // steps give: none of this (two divisions a thread, a thread's 16 elements' largest cost).
    const float clamped_silu = silu_of_clamp<kFloatClamp>(clamp);
    const bool clamp_is_fast = !kFloatClamp || __float_as_uint(fast_silu(clamp)) == __float_as_uint(clamped_silu);
    #pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
        float gate_values[kVec], up_values[kVec], y[kVec], amax = 0.0f;
        if constexpr (kBf16Clamp)
            clamp_bf16_pairs<kVectors>(gate[pass], up[pass], clamp);
        unpack_bf16<kVectors>(gate[pass], gate_values);
        unpack_bf16<kVectors>(up[pass], up_values);
        // Per 8 gates: the fast steps where the clamped gates allow them, else the scaled ones (decided before
        // either runs, so large gates pay for one of them; per 8, not 16, so that fewer denominators are live)
        #pragma unroll
        for (int v = 0; v < kVectors; ++v) {
            // The vector's clamped gates: silu(min(gate, c)) is silu(c) where min(gate, c) == c
            float gates[8];
            #pragma unroll
            for (int i = 0; i < 8; ++i)
                gates[i] = clamp_gate<kFloatClamp>(gate_values[8 * v + i], clamp);
            bool fast = false;
            if constexpr (kRangeCheck) {
                // A bf16 clamp has been applied to the pairs, so they hold the clamped gates; a float clamp's
                // clamped gates are the pairs' or c, whose fast steps clamp_is_fast checked.
                GatePairRange<kClamped> range;
                range.add(gate[pass][v]);
                fast = !valid[pass] || (clamp_is_fast && range.silu_fast());
            }
            if (fast) {
                #pragma unroll
                for (int i = 0; i < 8; ++i)
                    y[8 * v + i] = fast_silu(gates[i]);
            } else {
                #pragma unroll
                for (int i = 0; i < 8; ++i)
                    y[8 * v + i] = ScaledSigmoidDenominator(gates[i]).silu(gates[i]);
                #pragma unroll
                for (int i = 0; i < 8; ++i)
                    y[8 * v + i] = kFloatClamp && gates[i] == clamp ? clamped_silu : y[8 * v + i];
            }
            #pragma unroll
            for (int i = 8 * v; i < 8 * v + 8; ++i) {
                y[i] = __fmul_rn(y[i], clamp_up<kFloatClamp>(up_values[i], clamp));
                if (weights != nullptr)
                    y[i] = __fmul_rn(y[i], weight[pass]);
                amax = max_nan(amax, fabsf(y[i]));
            }
        }
        const uint64_t out_offset = (first_global_row + tile.row(pass)) * hidden + tile.column;
        if constexpr (kQuantize) {
            // NOTE: all 32 lanes reach the shuffles; skipped rows reduce their zeros and stop after.
            amax = max_nan(Group::group_reduce(amax, max_nan), amax_clamp);
            if (valid[pass]) {
                // The expert's scales start scale_expert_stride elements (bytes when packed) further.
                const uint64_t expert_offset = static_cast<uint64_t>(expert) * scale_expert_stride;
                void* expert_scales = kLayout == ScaleLayout::MNMajorPackedUE8M0
                                          ? static_cast<void*>(static_cast<uint8_t*>(scales) + expert_offset)
                                          : static_cast<void*>(static_cast<float*>(scales) + expert_offset);
                cast_group_to_e4m3<kUE8M0, kScaleMode, kLayout>(y, amax, static_cast<uint8_t*>(out) + out_offset,
                                                                is_group_leader, expert_scales, tile.row(pass),
                                                                group, hidden / GROUP_SIZE, scale_stride);
            }
        } else if (valid[pass]) {
            uint4 packed[kVectors];
            __nv_bfloat162* pairs = reinterpret_cast<__nv_bfloat162*>(packed);
            #pragma unroll
            for (int i = 0; i < kVec / 2; ++i)
                pairs[i] = __floats2bfloat162_rn(y[2 * i], y[2 * i + 1]);
            #pragma unroll
            for (int v = 0; v < kVectors; ++v)
                reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(out) + out_offset)[v] = packed[v];
        }
        if (pass + kPassesInFlight < kPasses)
            load_pass(pass + kPassesInFlight);
    }
}

}  // namespace deep_kernels
