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
#include "ptx/wgmma.cuh"
#include "scheduler.cuh"

namespace deep_kernels {

namespace sm90_fp8_gemm_detail {

using ptx::kNumThreadsPerWarpgroup;
constexpr uint32_t kWarpgroupBlockM = 64;
constexpr uint32_t kScaleBlock = 128;
constexpr uint32_t kWgmmaK = 32;
constexpr uint32_t kMaxSmemBytes = 232448;
// The e2m1 -> e4m3 expansion's tables: 8 bytes (one per e2m1 magnitude) for each exponent shift 0..31.
constexpr uint32_t kFp4ExpandTableBytes = 32 * 8;
// Deepest ring of FP4 code stages.
constexpr uint32_t kMaxFp4CodeStages = 32;
// Widest 128-row FP4 tile with split-K (the math warpgroups' 224 registers).
constexpr uint32_t kMaxFp4SplitBlockN = 96;
// Widest pipelined tile by math warpgroup count: three sets of BLOCK_N / 2 accumulators (two partial, one
// final) plus addressing fit the 240 (one warpgroup) or 232 (two) registers without spilling.
constexpr uint32_t kMaxPipelinedBlockN[2] = {128, 128};
// Widest tile of 256 rows: each math warpgroup keeps two 64-row sets of final accumulators plus one partial set.
constexpr uint32_t kMaxTwoWaveBlockN = 128;
// Widest pipelined tile of 256 rows: two sets of final and two of partial accumulators (2 x BLOCK_N) fit the 240
// registers (the producer warpgroup then keeps 24).
constexpr uint32_t kMaxPipelinedTwoWaveBlockN = 96;
// BF16 operands: a stage holds 64 columns (128 bytes a row, the FP8 stage's bytes and swizzle); with no
// partial accumulator sets a 64-row wave's tile may be as wide as one wgmma (256 columns).
constexpr uint32_t kBf16BlockK = 64;
constexpr uint32_t kMaxBf16BlockN = 256;

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

// Per-stage shared-memory tiles: A (BLOCK_M x BLOCK_K e4m3), B (BLOCK_N x BLOCK_K e4m3), sfa (BLOCK_M FP32) and,
// with per-channel B scales (Fp8ChannelScaled), sfb (BLOCK_N FP32).
template <uint32_t kStageABytes, uint32_t kStageBBytes, uint32_t kStageSfaFloats, uint32_t kStageSfbFloats = 0>
struct StageBuffers {
    uint8_t* a;
    uint8_t* b;
    float* sfa;
    float* sfb;

    DK_DEVICE uint8_t* a_stage(uint32_t stage) const { return a + stage * kStageABytes; }
    DK_DEVICE uint8_t* b_stage(uint32_t stage) const { return b + stage * kStageBBytes; }
    DK_DEVICE float* sfa_stage(uint32_t stage) const { return sfa + stage * kStageSfaFloats; }
    DK_DEVICE float* sfb_stage(uint32_t stage) const { return sfb + stage * kStageSfbFloats; }
};

// The K blocks of a tile's job: the group's for KGrouped, else split split_idx of the tile's num_splits.
template <typename Traits>
DK_DEVICE uint32_t tile_k_block_begin(const TileInfo& tile) {
    if constexpr (Traits::kGemmType == GemmType::KGrouped)
        return tile.k_block_begin;
    else
        return split_k_block_begin<Traits::kNumKBlocks>(tile.split_idx, tile.num_splits);
}

template <typename Traits>
DK_DEVICE uint32_t tile_k_block_end(const TileInfo& tile) {
    if constexpr (Traits::kGemmType == GemmType::KGrouped)
        return tile.k_block_begin + tile.num_k_blocks;
    else
        return split_k_block_begin<Traits::kNumKBlocks>(tile.split_idx + 1, tile.num_splits);
}

// A if kFirst, else B (std::conditional_t, which NVRTC's trimmed <type_traits> lacks).
template <bool kFirst, typename A, typename B>
struct SelectType {
    using type = A;
};
template <typename A, typename B>
struct SelectType<false, A, B> {
    using type = B;
};

// FP4 weights: the stage tiles (sfb: the per-column promotion scales the expanders write, BLOCK_N FP32) plus, per
// code stage (a ring of its own), the e2m1 codes (BLOCK_N x 64 bytes, rows of 128 K), the barriers its loads
// complete on and its expanders free it by, and the B rows' scale words; and the expansion tables.
template <uint32_t kStageABytes, uint32_t kStageBBytes, uint32_t kStageSfaFloats, uint32_t kStageCodesBytes,
          uint32_t BLOCK_N>
struct Fp4StageBuffers : StageBuffers<kStageABytes, kStageBBytes, kStageSfaFloats, BLOCK_N> {
    uint8_t* codes;
    uint64_t* loaded_barriers;
    uint64_t* codes_empty_barriers;
    uint2* expand_tables;
    uint32_t* scale_words;

    DK_DEVICE uint8_t* codes_stage(uint32_t stage) const { return codes + stage * kStageCodesBytes; }
    DK_DEVICE uint32_t* scale_words_stage(uint32_t stage) const { return scale_words + stage * BLOCK_N; }
};

template <uint32_t SHAPE_N_, uint32_t SHAPE_K_, uint32_t BLOCK_M_, uint32_t BLOCK_N_, uint32_t BLOCK_K_,
          uint32_t kNumStages_, uint32_t kNumTMAMulticast_, bool kIsMulticastOnA_, GemmType kGemmType_,
          typename OutputType_, bool kWithAccumulation_, uint32_t kNumSplits_, bool kPipelined_,
          bool kOverlapEpilogue_, GemmOperands kOperands_, bool kIsMNMajorA_ = false, bool kIsMNMajorB_ = false,
          MathSchedule kMathSchedule_ = MathSchedule::Lockstep, bool kSplitsInCluster_ = false,
          bool kEvictFirstB_ = false, bool kThreadMajorSfb_ = false>
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
    static constexpr bool kIsBf16 = kOperands == GemmOperands::Bf16;
    // BF16 operands may be MN-major in global memory (A [K, M] or B [K, N] with M / N contiguous): a stage then holds
    // the operand as 64-column (128-byte) boxes along M / N, each BLOCK_K rows of K, which wgmma reads transposed.
    static constexpr bool kIsMNMajorA = kIsMNMajorA_, kIsMNMajorB = kIsMNMajorB_;
    static constexpr MathSchedule kMathSchedule = kMathSchedule_;
    // Split-K with a tile's kNumSplits jobs as one cluster of kNumSplits CTAs, one job each: the leader (split 0) sums
    // the others' partial sums from their shared memory (epilogue/sm90_fp8_gemm_epilogue.cuh), no global workspace.
    static constexpr bool kSplitsInCluster = kSplitsInCluster_;
    static constexpr uint32_t kClusterSize = kSplitsInCluster ? kNumSplits_ : kNumTMAMulticast_;
    // B's boxes load with an L2 evict-first policy (a decode GEMM whose B is read once: one M block, or a pair of M
    // blocks multicasting it), so that B's lines, not lines other data still needs, make room in L2 for the lines that
    // follow.
    static constexpr bool kEvictFirstB = kEvictFirstB_;
    // Per-channel B scales: a producer warp copies each stage's sfb into shared memory thread-major (sfb_thread_major.cuh),
    // so that the promotion reads a thread's sfb of two 8-column groups with one 16-byte load, not one 8-byte load per
    // group; the TMA thread then loads no sfb.
    static constexpr bool kThreadMajorSfb = kThreadMajorSfb_;

    // Kind
    static constexpr bool kIsChannelScaled = kOperands == GemmOperands::Fp8ChannelScaled;
    static constexpr bool kIsKGrouped = kGemmType == GemmType::KGrouped;
    static constexpr bool kIsFp4B = kOperands == GemmOperands::Fp8Mxfp4;
    // The promotion scales each column by its own factor from the stage's sfb (loaded, or the FP4 expanders').
    static constexpr bool kHasColumnScales = kIsChannelScaled || kIsFp4B;
    // Per-channel B scales, pipelined tiles wider than a second full accumulator set allows: each K block runs as two
    // wgmma groups of BLOCK_N / 2 columns, each into a partial set of its own, so that one half is promoted while the
    // other half's group runs (the mainloop's pipelined halves).
    static constexpr bool kPipelinedHalves =
        kIsChannelScaled && kPipelined && BLOCK_N > kMaxPipelinedBlockN[math_warpgroups_of(BLOCK_M) - 1];

    // Derived sizes (KGrouped: K is the groups' on the device, SHAPE_K is 0)
    static constexpr uint32_t kNumKBlocks = ceil_div(SHAPE_K, BLOCK_K);
    static constexpr uint32_t kNumSfbRows = ceil_div(SHAPE_N, kScaleBlock);
    // Own tiles (MathSchedule::OwnTilePingPong): two math warpgroups, each owning whole BLOCK_M-row tiles in turn.
    static constexpr bool kOwnTiles = kMathSchedule == MathSchedule::OwnTilePingPong;
    static constexpr uint32_t kNumMathWarpgroups = kOwnTiles ? 2 : math_warpgroups_of(BLOCK_M);
    static constexpr uint32_t kNumMWaves = kOwnTiles ? BLOCK_M / kWarpgroupBlockM : m_waves_of(BLOCK_M);
    // Warps that read a stage and release it: one warpgroup's with own tiles, every math warp's otherwise.
    static constexpr uint32_t kNumStageConsumerWarps = (kOwnTiles ? 1 : kNumMathWarpgroups) * kNumThreadsPerWarpgroup / 32;
    // Tile rows above a math warpgroup's first (its index times this many 64-row waves): none with own tiles.
    static constexpr uint32_t kWarpgroupRowWaves = kOwnTiles ? 0 : kNumMWaves;
    // Pipelined 256-row tiles: each wave's wgmma group runs while the other wave's is promoted (the mainloop's
    // pipelined waves).
    static constexpr bool kPipelinedWaves = kPipelined && kNumMWaves == 2 && !kOwnTiles;
    static constexpr uint32_t kNumMathThreads = kNumMathWarpgroups * kNumThreadsPerWarpgroup;
    // FP4 weights with one math warpgroup: a second producer-side warpgroup of expanders (gemm/sm90_fp4_expand.cuh).
    static constexpr uint32_t kNumTMAThreads =
        (kOperands_ == GemmOperands::Fp8Mxfp4 && kNumMathWarpgroups == 1 ? 2 : 1) * kNumThreadsPerWarpgroup;
    // Tiles start at multiples of kTileOffsetStep inside a 128-wide sfb block.
    static constexpr uint32_t kTileOffsetStep = gcd_with_scale_block(BLOCK_N);
    static constexpr uint32_t kNumTileOffsets = kScaleBlock / kTileOffsetStep;

    // Register budgets: 128 x 40 + 256 x 232 = 64,512 of 65,536 with two math warpgroups.
    // Pipelined 256-row tiles (four accumulator sets): the producer's 24 leave the math warpgroups 240
    // (128 x 24 + 256 x 240 = 64,512).
    static constexpr uint32_t kNumTMARegisters = kPipelinedWaves ? 24 : 40;
    static constexpr uint32_t kNumMathRegisters = kNumMathWarpgroups == 1 || kPipelinedWaves ? 240 : 232;

    // Shared-memory carve-up (deep_kernels/heuristics/fp8_gemm.py: smem_bytes mirrors it): D staging (one
    // 64-row buffer per warpgroup and wave), then per stage A, B, sfa (and sfb, per-channel B scales), then the
    // full and empty barriers.
    using Store = AccumulatorStore<OutputType, BLOCK_N>;
    // Per-channel kinds and k-grouped BF16 with FP32 D stream the store: each warpgroup stages its tile one chunk of
    // columns at a time through two chunk buffers in turn (the epilogue's store_tile_streamed), which leaves the stages
    // the rest of the shared memory (FP32 tiles are twice bf16's: staged whole, 128 x 192 left three stages and
    // 256 x 128 none).
    static constexpr bool kStreamedStore =
        (kIsChannelScaled || (kIsBf16 && kIsKGrouped)) && std::is_same_v<OutputType, float>;
    // Bytes of one operand element (e4m3 or bf16); BF16 stages hold no sfa.
    static constexpr uint32_t kOperandBytes = kIsBf16 ? sizeof(__nv_bfloat16) : 1;
    static constexpr uint32_t kStageABytes = BLOCK_M * BLOCK_K * kOperandBytes;
    static constexpr uint32_t kStageBBytes = BLOCK_N * BLOCK_K * kOperandBytes;
    static constexpr uint32_t kStageSfaBytes = kIsBf16 ? 0 : BLOCK_M * sizeof(float);
    // NOTE: TMA writes shared memory at 128-byte aligned addresses: TMA-loaded (per-channel) sfb stages are padded
    // to it; the FP4 expanders' sfb stages are not.
    static constexpr uint32_t kSfbBoxBytes = kHasColumnScales ? BLOCK_N * sizeof(float) : 0;
    static constexpr uint32_t kStageSfbBytes = kIsChannelScaled ? align_up<uint32_t>(kSfbBoxBytes, 128) : kSfbBoxBytes;
    // 256-row tiles (the Normal kind with block scales, lockstep) with more stages than fit beside the whole tile's D
    // staging: each warpgroup stages and stores its tile in parts, one after the other, through one buffer of a
    // 64-row wave (Store::kBytes) or, where that does not fit either, of one chunk (Store::kChunkBytes: kChunkCols
    // columns of 64 rows); the epilogue's store_tile_in_parts. 0: the whole tile is staged at once.
    static constexpr bool kMayStageDInParts = kNumMWaves == 2 && !kOwnTiles && !kStreamedStore &&
                                              kGemmType == GemmType::Normal && kOperands == GemmOperands::Fp8BlockScaled &&
                                              kMathSchedule == MathSchedule::Lockstep;
    static constexpr uint32_t kAllStagesBytes =
        kNumStages * (kStageABytes + kStageBBytes + kStageSfaBytes + kStageSfbBytes) + 2 * kNumStages * sizeof(uint64_t);
    static constexpr uint32_t kStagedPartBytes =
        !kMayStageDInParts ||
                align_up<uint32_t>(kNumMathWarpgroups * kNumMWaves * Store::kBytes, 1024) + kAllStagesBytes <= kMaxSmemBytes
            ? 0
            : (align_up<uint32_t>(kNumMathWarpgroups * Store::kBytes, 1024) + kAllStagesBytes <= kMaxSmemBytes
                   ? Store::kBytes
                   : Store::kChunkBytes);
    static constexpr uint32_t kSmemDBytesPerWarpgroup =
        kStreamedStore ? 2 * Store::kChunkBytes : (kStagedPartBytes > 0 ? kStagedPartBytes : kNumMWaves * Store::kBytes);
    static constexpr uint32_t kSmemDBytes = align_up<uint32_t>(kNumMathWarpgroups * kSmemDBytesPerWarpgroup, 1024);
    static constexpr uint32_t kOffsetA = kSmemDBytes;
    static constexpr uint32_t kOffsetB = kOffsetA + kNumStages * kStageABytes;
    static constexpr uint32_t kOffsetSfa = kOffsetB + kNumStages * kStageBBytes;
    static constexpr uint32_t kOffsetSfb = kOffsetSfa + kNumStages * kStageSfaBytes;
    static constexpr uint32_t kOffsetBarriers = kOffsetSfb + kNumStages * kStageSfbBytes;
    // NOTE: TMA counts a box's zero-filled bytes past K too, so every stage delivers the full box.
    static constexpr uint32_t kStageTxBytes =
        kStageABytes + kStageBBytes + kStageSfaBytes + (kThreadMajorSfb ? 0 : kSfbBoxBytes);
    // An MN-major operand's box: 64 elements (128 bytes) of M or N by BLOCK_K rows of K.
    static constexpr uint32_t kMNMajorBoxCols = 128 / kOperandBytes;
    static constexpr uint32_t kMNMajorBoxBytes = 128 * BLOCK_K;

    // FP4 weights (Fp8Mxfp4): the stage's sfb holds the per-column promotion scales the expanders write. After the
    // barriers, from a 1024-byte boundary, a ring of code stages of its own (gemm/sm90_fp4_expand.cuh), as deep as
    // the shared memory left allows (up to kMaxFp4CodeStages): per code stage the e2m1 codes (BLOCK_N x 64 bytes,
    // TMA), then the code stages' loaded and empty barriers, the e2m1 -> e4m3 tables, and per code stage the B
    // rows' scale words.
    static constexpr uint32_t kStageCodesBytes = kIsFp4B ? BLOCK_N * BLOCK_K / 2 : 0;
    static constexpr uint32_t kOffsetCodes = align_up<uint32_t>(kOffsetBarriers + 2 * kNumStages * sizeof(uint64_t), 1024);
    static constexpr uint32_t kCodeStageBytes = kStageCodesBytes + 2 * sizeof(uint64_t) + BLOCK_N * sizeof(uint32_t);
    static constexpr uint32_t kNumCodeStages =
        !kIsFp4B || kOffsetCodes + kFp4ExpandTableBytes >= kMaxSmemBytes ? 1
        : (kMaxSmemBytes - kOffsetCodes - kFp4ExpandTableBytes) / kCodeStageBytes < kMaxFp4CodeStages
            ? (kMaxSmemBytes - kOffsetCodes - kFp4ExpandTableBytes) / kCodeStageBytes
            : kMaxFp4CodeStages;
    static constexpr uint32_t kOffsetLoadedBarriers = kOffsetCodes + kNumCodeStages * kStageCodesBytes;
    static constexpr uint32_t kOffsetCodesEmptyBarriers = kOffsetLoadedBarriers + kNumCodeStages * sizeof(uint64_t);
    static constexpr uint32_t kOffsetExpandTables = kOffsetCodesEmptyBarriers + kNumCodeStages * sizeof(uint64_t);
    static constexpr uint32_t kOffsetScaleWords = kOffsetExpandTables + kFp4ExpandTableBytes;
    static constexpr uint32_t kFp4SmemBytes = kOffsetScaleWords + kNumCodeStages * BLOCK_N * sizeof(uint32_t);
    static constexpr uint32_t kSmemBytes =
        kIsFp4B ? kFp4SmemBytes : kOffsetBarriers + 2 * kNumStages * sizeof(uint64_t);
    // The producer warpgroup's warps but the TMA thread's, and the second warpgroup's with one math warpgroup.
    static constexpr uint32_t kNumExpandThreads = kIsFp4B ? kNumTMAThreads - 32 : 0;
    // NOTE: setmaxnreg moves registers within what the launch allocated (168 per thread of the 384). One math
    // warpgroup: 240 x 128 + 128 x 256 = 63,488; two: the expanders' 56 take 8 from each math thread (56 x 128 +
    // 224 x 256 = 64,512).
    static constexpr uint32_t kNumProducerRegisters = kIsFp4B ? (kNumMathWarpgroups == 1 ? 128 : 56) : kNumTMARegisters;
    static constexpr uint32_t kNumConsumerRegisters = kIsFp4B && kNumMathWarpgroups == 2 ? 224 : kNumMathRegisters;

    using Stages = typename SelectType<kIsFp4B, Fp4StageBuffers<kStageABytes, kStageBBytes, BLOCK_M, kStageCodesBytes, BLOCK_N>,
                                       StageBuffers<kStageABytes, kStageBBytes, BLOCK_M, kStageSfbBytes / sizeof(float)>>::type;

    // The stage buffers inside the dynamic shared memory `smem`.
    DK_DEVICE static Stages stages_of(uint8_t* smem) {
        if constexpr (kIsFp4B)
            return {{smem + kOffsetA, smem + kOffsetB, reinterpret_cast<float*>(smem + kOffsetSfa),
                     reinterpret_cast<float*>(smem + kOffsetSfb)},
                    smem + kOffsetCodes, reinterpret_cast<uint64_t*>(smem + kOffsetLoadedBarriers),
                    reinterpret_cast<uint64_t*>(smem + kOffsetCodesEmptyBarriers),
                    reinterpret_cast<uint2*>(smem + kOffsetExpandTables),
                    reinterpret_cast<uint32_t*>(smem + kOffsetScaleWords)};
        else
            return {smem + kOffsetA, smem + kOffsetB, reinterpret_cast<float*>(smem + kOffsetSfa),
                    reinterpret_cast<float*>(smem + kOffsetSfb)};
    }
    using TileScheduler =
        Scheduler<kGemmType, SHAPE_N, BLOCK_M, BLOCK_N, kNumTMAMulticast, kIsMulticastOnA, kNumSplits, BLOCK_K,
                  kSplitsInCluster, kOperands == GemmOperands::Fp8BlockScaled>;

    // Static checks
    DK_STATIC_ASSERT(kOperands == GemmOperands::Fp8BlockScaled || kOperands == GemmOperands::Fp8ChannelScaled ||
                         kOperands == GemmOperands::Fp8Mxfp4 || kIsBf16,
                     "operands: e4m3 with 1x128 scales on A and 128x128 (block) or 1x128 (channel) scales on B, "
                     "MXFP4 B, or bf16");
    DK_STATIC_ASSERT(!kIsFp4B || kGemmType != GemmType::KGrouped, "FP4 weights: the Normal and M-grouped kinds");
    DK_STATIC_ASSERT(!kIsFp4B || (SHAPE_K % kScaleBlock == 0 && kNumTMAMulticast == 1),
                     "FP4 weights: K a multiple of 128, no multicast");
    DK_STATIC_ASSERT(!kIsFp4B || (kNumCodeStages >= 2 && kFp4SmemBytes <= kMaxSmemBytes),
                     "FP4 weights: at least two code stages fit beside the math stages");
    // NOTE: with two math warpgroups at 224 registers, the split-K reduction beside two accumulator sets wider
    // than 96 columns spills.
    DK_STATIC_ASSERT(!kIsFp4B || kNumMathWarpgroups == 1 || kNumSplits == 1 || BLOCK_N <= kMaxFp4SplitBlockN,
                     "FP4 weights, 128-row tiles: split-K up to 96 columns");
    DK_STATIC_ASSERT(kIsBf16 || BLOCK_K == kScaleBlock, "one K block per 128-wide scale block");
    DK_STATIC_ASSERT(!kIsBf16 || BLOCK_K == kBf16BlockK, "BF16: 64-column K blocks (128-byte rows)");
    DK_STATIC_ASSERT((!kIsMNMajorA && !kIsMNMajorB) || (kIsBf16 && (kGemmType == GemmType::Normal || kIsKGrouped)),
                     "MN-major operands: BF16, Normal and KGrouped kinds");
    DK_STATIC_ASSERT(!kIsMNMajorB || BLOCK_N % 64 == 0, "an MN-major B stage is whole 64-column boxes");
    DK_STATIC_ASSERT(!kIsBf16 || (!kPipelined && !kOverlapEpilogue),
                     "BF16: the K loop always keeps a group in flight; no second accumulator set to overlap with");
    DK_STATIC_ASSERT(kIsKGrouped || (SHAPE_K % 16 == 0 && SHAPE_K > 0),
                     "K is a positive multiple of 16 (the last K block zero-filled)");
    DK_STATIC_ASSERT(!kIsChannelScaled || kGemmType == GemmType::Normal || kIsKGrouped,
                     "per-channel B scales: the Normal and KGrouped kinds");
    DK_STATIC_ASSERT(!kIsKGrouped || (SHAPE_K == 0 && (kIsChannelScaled || kIsBf16) &&
                                      std::is_same_v<OutputType, float> && kNumSplits == 1),
                     "KGrouped: K on the device (SHAPE_K 0), per-channel scales or BF16 operands, FP32 D, no split-K");
    DK_STATIC_ASSERT(SHAPE_N % 16 == 0 && SHAPE_N > 0, "N is a positive multiple of 16");
    DK_STATIC_ASSERT(BLOCK_M == 64 || BLOCK_M == 128 || BLOCK_M == 256,
                     "BLOCK_M 64 (one math warpgroup), 128 or 256 (two, each owning half the rows)");
    DK_STATIC_ASSERT(kNumMWaves == 1 || (BLOCK_N <= kMaxTwoWaveBlockN && kNumSplits == 1 &&
                                         (!kPipelined ||
                                          (kPipelinedWaves && BLOCK_N <= kMaxPipelinedTwoWaveBlockN &&
                                           kGemmType == GemmType::Normal && kOperands == GemmOperands::Fp8BlockScaled &&
                                           kMathSchedule == MathSchedule::Lockstep)) &&
                                         (kGemmType == GemmType::Normal || kGemmType == GemmType::KGrouped ||
                                          kOperands == GemmOperands::Fp8BlockScaled) &&
                                         (!kOverlapEpilogue || (kGemmType != GemmType::KGrouped && !kHasColumnScales))),
                     "256-row tiles: BLOCK_N <= 128, no split-K, the M-grouped kinds with block-scaled FP8 operands; "
                     "the epilogue overlap with block scales, not k-grouped; pipelined: BLOCK_N <= 96, the Normal kind "
                     "with block scales, lockstep");
    DK_STATIC_ASSERT(BLOCK_N % 16 == 0 && BLOCK_N >= 16 && BLOCK_N <= (kIsBf16 ? kMaxBf16BlockN : 192),
                     "BLOCK_N in 16..192 (BF16: 16..256), a multiple of 16");
    DK_STATIC_ASSERT(kIsBf16 || BLOCK_N <= kScaleBlock + gcd_with_scale_block(BLOCK_N),
                     "a tile covers at most two sfb blocks");
    DK_STATIC_ASSERT(kNumTMAMulticast == 1 || kNumTMAMulticast == 2, "clusters of 1 or 2 CTAs");
    DK_STATIC_ASSERT((!kWithAccumulation || std::is_same_v<OutputType, float>), "accumulation into FP32 D");
    DK_STATIC_ASSERT(kNumSplits >= 1 && (kIsKGrouped || kNumSplits <= kNumKBlocks),
                     "every split has at least one K block");
    // NOTE: the k-grouped kind's pipelined halves spill at 192 columns.
    DK_STATIC_ASSERT(!kPipelined || BLOCK_N <= kMaxPipelinedBlockN[kNumMathWarpgroups - 1] ||
                         (kPipelinedHalves && BLOCK_N % 32 == 0 && kNumSplits == 1 &&
                          (kGemmType == GemmType::Normal || (kIsKGrouped && BLOCK_N <= 160))),
                     "three accumulator sets fit the math warpgroups' registers (per-channel B scales: or two half "
                     "sets, BLOCK_N a multiple of 32, no split-K; k-grouped: at most 160 columns)");
    // NOTE: ptxas serializes every wgmma of a kernel whose group in flight meets a divergent path, as the
    // split-K reduction is, and (C7514) of the one-warpgroup tiles. The M-grouped kinds' vote and row-predicated
    // store keep the group in flight only where the K loop has at most two sfb offsets to dispatch on (BLOCK_N a
    // multiple of 64); at 96, 112, 144 and 160 columns ptxas serializes (C7517, C7518). Per-channel B scales (the
    // k-grouped kind) have no sfb offsets: any width keeps it.
    DK_STATIC_ASSERT(!kOverlapEpilogue || (kNumSplits == 1 &&
                                           (BLOCK_M == 128 || BLOCK_M == 256) &&
                                           (kGemmType == GemmType::Normal || kIsChannelScaled || BLOCK_N % 64 == 0)),
                     "the epilogue overlap is for 128- and 256-row tiles without split-K (grouped kinds with block "
                     "scales or FP4 weights: BLOCK_N a multiple of 64)");
    // NOTE: ptxas gives the streamed store of two 64-row waves a 1 KB stack frame unless the CTA is in a cluster.
    DK_STATIC_ASSERT(!kStreamedStore || kNumMWaves == 1 || kNumTMAMulticast == 2,
                     "256-row tiles with the streamed FP32 store run in 2-CTA clusters");
    DK_STATIC_ASSERT(kMathSchedule != MathSchedule::PingPong ||
                         (kNumMathWarpgroups == 2 && !kPipelined &&
                          ((kOperands == GemmOperands::Fp8BlockScaled && kGemmType != GemmType::KGrouped) ||
                           kIsChannelScaled)),
                     "ping-pong: two math warpgroups with the plain K loop (one group in flight each), block-scaled "
                     "FP8 operands (not k-grouped) or per-channel scales");
    // NOTE: a job's partial sums wait in its stage buffers (A's and B's, contiguous), free once its K loop is done.
    DK_STATIC_ASSERT(!kSplitsInCluster ||
                         (kNumSplits >= 2 && kNumSplits <= 8 && kNumTMAMulticast == 1 && kGemmType == GemmType::Normal &&
                          kNumMWaves == 1 && (kOperands == GemmOperands::Fp8BlockScaled || kIsBf16) &&
                          BLOCK_M * BLOCK_N * sizeof(float) <= kNumStages * (kStageABytes + kStageBBytes)),
                     "splits in a cluster: 2..8 splits, no multicast, the Normal kind with block scales or bf16 "
                     "operands, up to 128 rows, the partial sums fit in the stage buffers");
    DK_STATIC_ASSERT(!kOwnTiles || ((BLOCK_M == 64 || BLOCK_M == 128) && kGemmType == GemmType::Normal &&
                                    kOperands == GemmOperands::Fp8BlockScaled && kNumSplits == 1 && !kOverlapEpilogue),
                     "own-tile ping-pong: 64- or 128-row tiles per math warpgroup, the Normal kind with block-scaled FP8 "
                     "operands, no split-K, no epilogue overlap (the other warpgroup's turn overlaps the epilogue)");
    DK_STATIC_ASSERT(kStageABytes % 1024 == 0 && kStageBBytes % 1024 == 0, "swizzle atoms stay 1024-byte aligned");
    DK_STATIC_ASSERT(kSmemBytes <= kMaxSmemBytes, "stages fit in shared memory");
    DK_STATIC_ASSERT(!kEvictFirstB || (kOperands == GemmOperands::Fp8BlockScaled && kGemmType == GemmType::Normal &&
                                       (kNumTMAMulticast == 1 || !kIsMulticastOnA)),
                     "evict-first B: the Normal kind with block-scaled FP8 operands, no multicast or multicast on B");
    DK_STATIC_ASSERT(!kThreadMajorSfb || (kIsChannelScaled && !kOwnTiles),
                     "thread-major sfb: per-channel B scales, the producer warpgroup's second warp copying them");
};

}  // namespace sm90_fp8_gemm_detail

}  // namespace deep_kernels
