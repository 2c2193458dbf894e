// FP4 weights on the SM90 GEMM engine (GemmOperands::Fp8Mxfp4). The producer warp loads B's e2m1 codes and their
// scale words into a ring of code stages of its own (run_fp4_code_loader); the expander warps (the producer
// warpgroup's three others, and a second warpgroup with one math warpgroup) load each math stage's A and sfa, turn
// the codes into the e4m3 B tile that wgmma reads, in its 128-byte swizzle, and write the stage's per-column
// promotion scales; then they arrive on the stage's full barrier, so the math warpgroups and their wgmma see an
// ordinary stage with per-column scales.
//
// Numerics, per B row n and 128-deep K block: the four UE8M0 scales 2^(e_j - 127) of its 32-wide sub-blocks
// have the largest exponent e_max; a code c of sub-block j becomes the e4m3 value c * 2^(6 - d), d = e_max - e_j,
// and the column's promotion scale is 2^(e_max - 127 - 6) (times sfa[row] in the mainloop). The e4m3 value is
// exact for d <= 14 (e2m1's 0.5 * 2^(6 - d) and 1.5 * 2^(6 - d) are multiples of e4m3's smallest subnormal 2^-9
// down to there, and 6 * 2^6 = 384 <= 448); for d > 14 it is e4m3's round-to-nearest-even of it (a sub-block
// whose scale lies more than 2^14 below its 128-block's largest: its values are under 2^-12 of that block's
// largest magnitude). A NaN scale (0xFF) makes the column's scale NaN.
// The expansion is a byte permute: per sub-block, the 8 e4m3 bytes of the shift d's magnitudes (a table built
// once per CTA) indexed by the codes' 3 magnitude bits, then each code's sign bit moved to its byte's bit 7.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "common/fp4.cuh"
#include "common/macros.cuh"
#include "gemm/sm90_fp8_gemm_traits.cuh"
#include "gemm/sm90_fp8_producer.cuh"
#include "pipeline.cuh"
#include "ptx/cp_async.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/tma.cuh"
#include "ptx/sync.cuh"
#include "scheduler.cuh"

namespace deep_kernels {

namespace sm90_fp8_gemm_detail {

enum class Fp4NamedBarrier : uint32_t { Expanders = 15 };

// e2m1 magnitudes land in e4m3 as e2m1 * 2^kFp4ExpandExponent (the largest power keeping 6 * 2^k <= 448).
constexpr int kFp4ExpandExponent = 6;
constexpr uint32_t kFp4MaxExpandShift = kFp4ExpandTableBytes / 8 - 1;
// Codes of one 32-wide sub-block: 16 bytes.
constexpr uint32_t kFp4SubBlocksPerKBlock = kScaleBlock / 32;

// Table d (d = 0 .. kFp4MaxExpandShift): byte i is e4m3(e2m1 magnitude i * 2^(6 - d)), round-to-nearest-even
// (exact for d <= 14; all zero from d = 19 on).
DK_DEVICE uint2 fp4_expand_table(uint32_t d) {
    uint32_t words[2] = {0, 0};
#pragma unroll
    for (uint32_t i = 0; i < 8; ++i) {
        const float value = ldexpf(e2m1_value(i), kFp4ExpandExponent - static_cast<int>(d));
        const uint32_t byte = __nv_cvt_float_to_fp8(value, __NV_SATFINITE, __NV_E4M3);
        words[i / 4] |= byte << (8 * (i % 4));
    }
    return make_uint2(words[0], words[1]);
}

DK_DEVICE void init_fp4_expand_tables(uint2* tables, uint32_t thread, uint32_t num_threads) {
    for (uint32_t d = thread; d <= kFp4MaxExpandShift; d += num_threads)
        tables[d] = fp4_expand_table(d);
}

DK_DEVICE uint32_t byte_perm(uint32_t lo, uint32_t hi, uint32_t selector) {
    uint32_t result;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(result) : "r"(lo), "r"(hi), "r"(selector));
    return result;
}

// Eight e2m1 codes (element i in bits [4i, 4i + 4) of `word`) as eight e4m3 bytes (element i in byte i of the
// pair), magnitudes through `table`.
// NOTE: 9 integer ops for 8 codes: the magnitudes (bit 3 of each nibble cleared, so prmt's sign-replicate
// mode stays off) select the table's bytes four at a time; element i's sign, bit 4i + 3, reaches bit 7 of byte
// i % 4 from either the word or the word shifted by 4, which one byte permute per half picks.
DK_DEVICE uint2 expand_e2m1x8(uint32_t word, uint2 table) {
    constexpr uint32_t kSignBits = 0x80808080u;
    const uint32_t magnitudes = word & 0x77777777u;
    const uint32_t shifted = word << 4;
    const uint32_t lo = byte_perm(table.x, table.y, magnitudes);
    const uint32_t hi = byte_perm(table.x, table.y, magnitudes >> 16);
    // Byte i of the result holds element i's sign at bit 7: (shifted, word) bytes 0, 0, 1, 1 (and 2, 2, 3, 3).
    const uint32_t signs_lo = byte_perm(word, shifted, 0x1504u);
    const uint32_t signs_hi = byte_perm(word, shifted, 0x3726u);
    return make_uint2(lo | (signs_lo & kSignBits), hi | (signs_hi & kSignBits));
}

// The largest of the four UE8M0 bytes of `scales`.
DK_DEVICE uint32_t max_exponent(uint32_t scales) {
    const uint32_t lo = max(scales & 0xFFu, (scales >> 8) & 0xFFu);
    const uint32_t hi = max((scales >> 16) & 0xFFu, scales >> 24);
    return max(lo, hi);
}

// Expands kNum units (unit = a row's 32-wide sub-block: 16 bytes of codes into 32 e4m3 bytes) of the stage,
// units first_unit, first_unit + kNumExpandThreads, ...; units past the tile's are skipped.
template <typename Traits, uint32_t kNum>
DK_DEVICE void expand_units(const typename Traits::Stages& stages, uint32_t code_stage, uint32_t stage,
                            uint32_t first_unit) {
    constexpr uint32_t kNumUnits = Traits::BLOCK_N * kFp4SubBlocksPerKBlock;
    constexpr uint32_t kStride = Traits::kNumExpandThreads;
    const uint8_t* smem_codes = stages.codes_stage(code_stage);
    uint32_t scale_words[kNum];
    uint4 codes[kNum];
#pragma unroll
    for (uint32_t i = 0; i < kNum; ++i) {
        // Units past the tile's (kNumUnits not a multiple of the thread count) read the last unit and store nothing.
        const uint32_t unit = min(first_unit + i * kStride, kNumUnits - 1);
        scale_words[i] = stages.scale_words_stage(code_stage)[unit / kFp4SubBlocksPerKBlock];
        // Units run along rows, so a quarter warp reads 128 contiguous bytes of codes.
        codes[i] = *reinterpret_cast<const uint4*>(smem_codes + unit * 16);
    }
    uint2 tables[kNum];
    uint32_t e_max[kNum];
#pragma unroll
    for (uint32_t i = 0; i < kNum; ++i) {
        const uint32_t sub_block = (first_unit + i * kStride) % kFp4SubBlocksPerKBlock;
        e_max[i] = max_exponent(scale_words[i]);
        const uint32_t e_sub = (scale_words[i] >> (8 * sub_block)) & 0xFFu;
        tables[i] = stages.expand_tables[min(e_max[i] - e_sub, kFp4MaxExpandShift)];
    }
    uint8_t* smem_b = stages.b_stage(stage);
    float* smem_col_scales = stages.sfb_stage(stage);
#pragma unroll
    for (uint32_t i = 0; i < kNum; ++i) {
        const uint32_t unit = first_unit + i * kStride;
        const uint32_t row = unit / kFp4SubBlocksPerKBlock, sub_block = unit % kFp4SubBlocksPerKBlock;
        const uint2 e0 = expand_e2m1x8(codes[i].x, tables[i]), e1 = expand_e2m1x8(codes[i].y, tables[i]);
        const uint2 e2 = expand_e2m1x8(codes[i].z, tables[i]), e3 = expand_e2m1x8(codes[i].w, tables[i]);
        if (kNumUnits % kStride == 0 || unit < kNumUnits) {
            // The sub-block's 32 e4m3 bytes are 16-byte chunks 2j and 2j + 1 of the row, at chunk ^ (row % 8)
            // (the 128-byte swizzle of an 8-row, 1024-byte atom).
            uint8_t* smem_row = smem_b + row * Traits::BLOCK_K;
            const uint32_t chunk = 2 * sub_block;
            *reinterpret_cast<uint4*>(smem_row + ((chunk ^ (row % 8)) * 16)) = make_uint4(e0.x, e0.y, e1.x, e1.y);
            *reinterpret_cast<uint4*>(smem_row + (((chunk + 1) ^ (row % 8)) * 16)) = make_uint4(e2.x, e2.y, e3.x, e3.y);
            if (sub_block == 0)
                smem_col_scales[row] = e8m0_to_float(static_cast<uint8_t>(e_max[i])) * 0x1p-6f;
        }
    }
}

// This thread's kNumLeft units from first_unit on (stride kNumExpandThreads), kBatch at a time.
template <typename Traits, uint32_t kNumLeft, uint32_t kBatch>
DK_DEVICE void expand_unit_batches(const typename Traits::Stages& stages, uint32_t code_stage, uint32_t stage,
                                   uint32_t first_unit) {
    constexpr uint32_t kNum = kNumLeft < kBatch ? kNumLeft : kBatch;
    expand_units<Traits, kNum>(stages, code_stage, stage, first_unit);
    if constexpr (kNumLeft > kNum)
        expand_unit_batches<Traits, kNumLeft - kNum, kBatch>(stages, code_stage, stage,
                                                             first_unit + kNum * Traits::kNumExpandThreads);
}

// The producer warp's walk (FP4 weights): per K block of the scheduler's tiles, once the code stage is free, lane 0
// loads B's e2m1 codes (tmap_b: bytes [G * N, K / 2], box {64, BLOCK_N}) by TMA and the 32 lanes copy the B rows'
// UE8M0 scale words of the K block (sfb_words: [G * N, K / 128] words, a row's four scales of a K block each) by
// cp.async; all complete on the code stage's loaded barrier (1 + 32 arrivals). Rows past N copy zeros.
// NOTE: the code stages form their own ring, deeper than the math's (all the shared memory the math stages leave),
// so that at decode sizes, where the weight bytes are the work, as many bytes are in flight as fit.
template <typename Traits>
DK_DEVICE void run_fp4_code_loader(const typename Traits::Stages& stages, typename Traits::TileScheduler& scheduler,
                                   const CUtensorMap* tmap_b, const uint32_t* sfb_words) {
    constexpr uint32_t kCodeTxBytes = Traits::kStageCodesBytes;
    const uint32_t lane_idx = threadIdx.x % 32;
    PipelineState<Traits::kNumCodeStages> state;
    TileInfo tile;
    while (scheduler.get_next_tile(tile)) {
        const uint32_t n_first = tile.n_block_idx * Traits::BLOCK_N;
        const uint32_t b_row = (Traits::kGemmType == GemmType::Normal ? 0 : tile.group_idx * Traits::SHAPE_N) + n_first;
        const uint32_t k_block_end = tile_k_block_end<Traits>(tile);
        for (uint32_t k_block = tile_k_block_begin<Traits>(tile); k_block < k_block_end; ++k_block) {
            // A fresh ring starts free: waiting on the parity before phase 0 returns at once.
            ptx::mbarrier_wait(stages.codes_empty_barriers + state.stage, state.phase ^ 1);
            uint64_t* loaded_barrier = stages.loaded_barriers + state.stage;
            if (lane_idx == 0) {
                ptx::mbarrier_arrive_expect_tx(loaded_barrier, kCodeTxBytes);
                ptx::tma_load(stages.codes_stage(state.stage), tmap_b, loaded_barrier,
                              static_cast<int32_t>(k_block * Traits::BLOCK_K / 2), static_cast<int32_t>(b_row));
            }
            uint32_t* smem_words = stages.scale_words_stage(state.stage);
#pragma unroll
            for (uint32_t row = lane_idx; row < Traits::BLOCK_N; row += 32) {
                const bool valid = n_first + row < Traits::SHAPE_N;
                ptx::cp_async_4(smem_words + row,
                                sfb_words + (valid ? (b_row + row) * Traits::kNumKBlocks + k_block : 0), valid ? 4 : 0);
            }
            ptx::cp_async_mbarrier_arrive_noinc(loaded_barrier);
            state.advance();
        }
    }
}

// The expanders' walk: the code loader's tiles and K blocks in the same order. Per K block they take the next math
// stage once the math warpgroups freed it (thread 0 loads its A and sfa by TMA onto its full barrier), wait for the
// code stage, expand the codes into the stage's B tile and write its column scales (sfb), free the code stage and
// arrive on the math stage's full barrier. `thread` counts the expanders.
template <typename Traits, typename Ring>
DK_DEVICE void run_fp4_expander(const typename Traits::Stages& stages, const Ring& ring,
                                typename Traits::TileScheduler& scheduler, const CUtensorMap* tmap_a,
                                const CUtensorMap* tmap_sfa, uint32_t thread) {
    constexpr uint32_t BLOCK_N = Traits::BLOCK_N;
    constexpr uint32_t kNumThreads = Traits::kNumExpandThreads;
    constexpr uint32_t kNumUnits = BLOCK_N * kFp4SubBlocksPerKBlock;
    constexpr uint32_t kUnitsPerThread = (kNumUnits + kNumThreads - 1) / kNumThreads;
    // Units whose loads are in flight together: as many as the expanders' registers hold.
    constexpr uint32_t kUnitsPerBatch = Traits::kNumProducerRegisters >= 96 ? 3 : 1;
    constexpr uint32_t kBarrierId = static_cast<uint32_t>(Fp4NamedBarrier::Expanders);
    constexpr uint32_t kMathTxBytes = Traits::kStageABytes + Traits::kStageSfaBytes;
    DK_STATIC_ASSERT(kNumThreads % 32 == 0 && Traits::BLOCK_K == kScaleBlock, "whole warps, 128-deep K blocks");

    init_fp4_expand_tables(stages.expand_tables, thread, kNumThreads);
    ptx::named_barrier_sync(kBarrierId, kNumThreads);

    PipelineState<Traits::kNumStages> state;
    PipelineState<Traits::kNumCodeStages> code_state;
    TileInfo tile;
    while (scheduler.get_next_tile(tile)) {
        const int32_t a_row = static_cast<int32_t>(tile.m_block_idx * Traits::BLOCK_M);
        const uint32_t k_block_end = tile_k_block_end<Traits>(tile);
        for (uint32_t k_block = tile_k_block_begin<Traits>(tile); k_block < k_block_end; ++k_block) {
            ring.producer_acquire(state);
            uint64_t* full_barrier = ring.full_barriers + state.stage;
            if (thread == 0) {
                // NOTE: expect_tx without an arrival: the one arrival comes after the expansion, from this thread,
                // so the phase cannot complete before the loads are counted.
                ptx::mbarrier_expect_tx(full_barrier, kMathTxBytes);
                load_box<Traits::kGemmType>(stages.a_stage(state.stage), tmap_a, full_barrier,
                                            static_cast<int32_t>(k_block * Traits::BLOCK_K), a_row, tile.group_idx);
                load_box<Traits::kGemmType>(stages.sfa_stage(state.stage), tmap_sfa, full_barrier, a_row,
                                            static_cast<int32_t>(k_block), tile.group_idx);
            }
            ptx::mbarrier_wait(stages.loaded_barriers + code_state.stage, code_state.phase);

            // NOTE: units go in batches whose loads are all issued before any expansion (expand_units), so that
            // the shared-memory latencies (scale word, then its table; codes) overlap rather than add up.
            expand_unit_batches<Traits, kUnitsPerThread, kUnitsPerBatch>(stages, code_state.stage, state.stage, thread);
            ptx::fence_proxy_async_shared();
            ptx::named_barrier_sync(kBarrierId, kNumThreads);
            if (thread == 0) {
                ptx::mbarrier_arrive(stages.codes_empty_barriers + code_state.stage);
                ptx::mbarrier_arrive(full_barrier);
            }
            state.advance();
            code_state.advance();
        }
    }
}

}  // namespace sm90_fp8_gemm_detail

}  // namespace deep_kernels
