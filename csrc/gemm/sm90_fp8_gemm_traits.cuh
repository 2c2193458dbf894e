// One instantiation of the SM90 FP8 GEMM named in one place: problem (SHAPE_N, SHAPE_K), tile (BLOCK_M x
// BLOCK_N x BLOCK_K), pipeline depth, cluster, kind and schedule, with every size derived from them (warpgroups,
// waves, registers, the shared-memory carve-up) and every legality check. The producer, the mainloop, the
// epilogue and the kernel entry all read these traits; a GEMM kind is a traits choice, never a kernel copy.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "common/macros.cuh"
#include "common/math.cuh"
#include "epilogue/sm90_accumulator_store.cuh"
#include "gemm/gemm_operands.cuh"
#include "gemm/sm90_math_schedule.cuh"
#include "scheduler.cuh"

namespace deep_kernels {

namespace sm90_fp8_gemm_detail {

constexpr uint32_t kNumThreadsPerWarpgroup = 128;
constexpr uint32_t kWarpgroupBlockM = 64;
constexpr uint32_t kScaleBlock = 128;
constexpr uint32_t kWgmmaK = 32;
constexpr uint32_t kMaxSmemBytes = 232448;
// Widest pipelined tile by math warpgroup count: three sets of BLOCK_N / 2 accumulators (two partial, one
// final) plus addressing fit the 240 (one warpgroup) or 232 (two) registers without spilling.
constexpr uint32_t kMaxPipelinedBlockN[2] = {128, 128};
// Widest tile of 256 rows: each math warpgroup keeps two 64-row sets of final accumulators plus one partial set.
constexpr uint32_t kMaxTwoWaveBlockN = 128;

// Math warpgroups of a BLOCK_M-row tile: one for 64 rows, else two, each owning BLOCK_M / 2 rows as
// kNumMWaves consecutive 64-row wgmma blocks that share every B stage.
DK_HOST_DEVICE constexpr uint32_t math_warpgroups_of(uint32_t block_m) { return block_m <= 64 ? 1 : 2; }
DK_HOST_DEVICE constexpr uint32_t m_waves_of(uint32_t block_m) {
    return block_m / (math_warpgroups_of(block_m) * kWarpgroupBlockM);
}

// gcd(n, 128) for n > 0: tiles of width n start at multiples of it inside a 128-wide scale block.
DK_HOST_DEVICE constexpr uint32_t gcd_with_scale_block(uint32_t n) {
    const uint32_t lowest_bit = n & (~n + 1);
    return lowest_bit < kScaleBlock ? lowest_bit : kScaleBlock;
}

// K blocks [split_k_block_begin(s, n), split_k_block_begin(s + 1, n)) belong to split s of n.
template <uint32_t kNumKBlocks>
DK_DEVICE uint32_t split_k_block_begin(uint32_t split_idx, uint32_t num_splits) {
    return split_idx * kNumKBlocks / num_splits;
}

// Per-stage shared-memory tiles: A (BLOCK_M x BLOCK_K e4m3), B (BLOCK_N x BLOCK_K e4m3), sfa (BLOCK_M FP32).
template <uint32_t kStageABytes, uint32_t kStageBBytes, uint32_t kStageSfaFloats>
struct StageBuffers {
    uint8_t* a;
    uint8_t* b;
    float* sfa;

    DK_DEVICE uint8_t* a_stage(uint32_t stage) const { return a + stage * kStageABytes; }
    DK_DEVICE uint8_t* b_stage(uint32_t stage) const { return b + stage * kStageBBytes; }
    DK_DEVICE float* sfa_stage(uint32_t stage) const { return sfa + stage * kStageSfaFloats; }
};

template <uint32_t SHAPE_N_, uint32_t SHAPE_K_, uint32_t BLOCK_M_, uint32_t BLOCK_N_, uint32_t BLOCK_K_,
          uint32_t kNumStages_, uint32_t kNumTMAMulticast_, bool kIsMulticastOnA_, GemmType kGemmType_,
          typename OutputType_, bool kWithAccumulation_, uint32_t kNumSplits_, bool kPipelined_,
          bool kOverlapEpilogue_, GemmOperands kOperands_, MathSchedule kMathSchedule_ = MathSchedule::Lockstep>
struct Sm90Fp8GemmTraits {
    // Problem, tile, pipeline, cluster, kind and schedule
    static constexpr uint32_t SHAPE_N = SHAPE_N_, SHAPE_K = SHAPE_K_;
    static constexpr uint32_t BLOCK_M = BLOCK_M_, BLOCK_N = BLOCK_N_, BLOCK_K = BLOCK_K_;
    static constexpr uint32_t kNumStages = kNumStages_;
    static constexpr uint32_t kNumTMAMulticast = kNumTMAMulticast_;
    static constexpr bool kIsMulticastOnA = kIsMulticastOnA_;
    static constexpr GemmType kGemmType = kGemmType_;
    using OutputType = OutputType_;
    static constexpr bool kWithAccumulation = kWithAccumulation_;
    static constexpr uint32_t kNumSplits = kNumSplits_;
    static constexpr bool kPipelined = kPipelined_;
    static constexpr bool kOverlapEpilogue = kOverlapEpilogue_;
    static constexpr GemmOperands kOperands = kOperands_;
    static constexpr MathSchedule kMathSchedule = kMathSchedule_;

    // Derived sizes
    static constexpr uint32_t kNumKBlocks = ceil_div(SHAPE_K, BLOCK_K);
    static constexpr uint32_t kNumSfbRows = ceil_div(SHAPE_N, kScaleBlock);
    static constexpr uint32_t kNumMathWarpgroups = math_warpgroups_of(BLOCK_M);
    static constexpr uint32_t kNumMWaves = m_waves_of(BLOCK_M);
    static constexpr uint32_t kNumMathThreads = kNumMathWarpgroups * kNumThreadsPerWarpgroup;
    static constexpr uint32_t kNumTMAThreads = kNumThreadsPerWarpgroup;
    // Tiles start at multiples of kTileOffsetStep inside a 128-wide sfb block.
    static constexpr uint32_t kTileOffsetStep = gcd_with_scale_block(BLOCK_N);
    static constexpr uint32_t kNumTileOffsets = kScaleBlock / kTileOffsetStep;

    // Register budgets: 128 x 40 + 256 x 232 = 64,512 of 65,536 with two math warpgroups.
    static constexpr uint32_t kNumTMARegisters = 40;
    static constexpr uint32_t kNumMathRegisters = kNumMathWarpgroups == 1 ? 240 : 232;

    // Shared-memory carve-up (deep_kernels/heuristics/fp8_gemm.py: smem_bytes mirrors it): D staging (one
    // 64-row buffer per warpgroup and wave), then per stage A, B, sfa, then the full and empty barriers.
    using Store = AccumulatorStore<OutputType, BLOCK_N>;
    static constexpr uint32_t kSmemDBytes = align_up<uint32_t>(kNumMathWarpgroups * kNumMWaves * Store::kBytes, 1024);
    static constexpr uint32_t kStageABytes = BLOCK_M * BLOCK_K;
    static constexpr uint32_t kStageBBytes = BLOCK_N * BLOCK_K;
    static constexpr uint32_t kStageSfaBytes = BLOCK_M * sizeof(float);
    static constexpr uint32_t kOffsetA = kSmemDBytes;
    static constexpr uint32_t kOffsetB = kOffsetA + kNumStages * kStageABytes;
    static constexpr uint32_t kOffsetSfa = kOffsetB + kNumStages * kStageBBytes;
    static constexpr uint32_t kOffsetBarriers = kOffsetSfa + kNumStages * kStageSfaBytes;
    static constexpr uint32_t kSmemBytes = kOffsetBarriers + 2 * kNumStages * sizeof(uint64_t);
    // NOTE: TMA counts a box's zero-filled bytes past K too, so every stage delivers the full box.
    static constexpr uint32_t kStageTxBytes = (BLOCK_M + BLOCK_N) * BLOCK_K + BLOCK_M * sizeof(float);

    using Stages = StageBuffers<kStageABytes, kStageBBytes, BLOCK_M>;
    using TileScheduler = Scheduler<kGemmType, SHAPE_N, BLOCK_M, BLOCK_N, kNumTMAMulticast, kIsMulticastOnA, kNumSplits>;

    // Static checks
    DK_STATIC_ASSERT(kOperands == GemmOperands::Fp8BlockScaled, "operands: e4m3 with 1x128 and 128x128 scales");
    DK_STATIC_ASSERT(BLOCK_K == kScaleBlock, "one K block per 128-wide scale block");
    DK_STATIC_ASSERT(SHAPE_K % 16 == 0 && SHAPE_K > 0, "K is a positive multiple of 16 (the last K block zero-filled)");
    DK_STATIC_ASSERT(SHAPE_N % 16 == 0 && SHAPE_N > 0, "N is a positive multiple of 16");
    DK_STATIC_ASSERT(BLOCK_M == 64 || BLOCK_M == 128 || BLOCK_M == 256,
                     "BLOCK_M 64 (one math warpgroup), 128 or 256 (two, each owning half the rows)");
    DK_STATIC_ASSERT(kNumMWaves == 1 || (BLOCK_N <= kMaxTwoWaveBlockN && kGemmType == GemmType::Normal &&
                                         kNumSplits == 1 && !kPipelined),
                     "256-row tiles: Normal kind, BLOCK_N <= 128, no split-K or pipelining");
    DK_STATIC_ASSERT(BLOCK_N % 16 == 0 && BLOCK_N >= 16 && BLOCK_N <= 192, "BLOCK_N in 16..192, a multiple of 16");
    DK_STATIC_ASSERT(BLOCK_N <= kScaleBlock + gcd_with_scale_block(BLOCK_N), "a tile covers at most two sfb blocks");
    DK_STATIC_ASSERT(kNumTMAMulticast == 1 || kNumTMAMulticast == 2, "clusters of 1 or 2 CTAs");
    DK_STATIC_ASSERT((!kWithAccumulation || std::is_same_v<OutputType, float>), "accumulation into FP32 D");
    DK_STATIC_ASSERT(kNumSplits >= 1 && kNumSplits <= kNumKBlocks, "every split has at least one K block");
    DK_STATIC_ASSERT(!kPipelined || BLOCK_N <= kMaxPipelinedBlockN[kNumMathWarpgroups - 1],
                     "three accumulator sets fit the math warpgroups' registers");
    // NOTE: ptxas serializes every wgmma of a kernel whose group in flight meets a divergent path, as the
    // split-K reduction is, and (C7514) of the one-warpgroup tiles. The grouped kinds' vote and row-predicated
    // store keep the group in flight only where the K loop has at most two sfb offsets to dispatch on (BLOCK_N a
    // multiple of 64); at 96, 112, 144 and 160 columns ptxas serializes (C7518).
    DK_STATIC_ASSERT(!kOverlapEpilogue || (kNumSplits == 1 &&
                                           (BLOCK_M == 128 || BLOCK_M == 256) &&
                                           (kGemmType == GemmType::Normal || BLOCK_N % 64 == 0)),
                     "the epilogue overlap is for 128- and 256-row tiles without split-K (grouped: BLOCK_N a multiple "
                     "of 64)");
    DK_STATIC_ASSERT(kMathSchedule == MathSchedule::Lockstep || (kNumMathWarpgroups == 2 && !kPipelined),
                     "ping-pong issue: two math warpgroups with the plain K loop (one group in flight each)");
    DK_STATIC_ASSERT(kStageABytes % 1024 == 0 && kStageBBytes % 1024 == 0, "swizzle atoms stay 1024-byte aligned");
    DK_STATIC_ASSERT(kSmemBytes <= kMaxSmemBytes, "stages fit in shared memory");
};

}  // namespace sm90_fp8_gemm_detail

}  // namespace deep_kernels
