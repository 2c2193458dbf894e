// D = A * W^T (or D += A * W^T) at decode sizes, FP8 activations x MXFP4 weights, with A and B swapped: the weights
// are wgmma's A operand, expanded from their e2m1 codes straight into the e4m3 register fragment (no expanded tile
// in shared memory), and the tokens are its N (BLOCK_T of them); the kernel computes D^T tiles and stores them as D
// rows. A [M, K] e4m3 with FP32 1x128 scales sfa (M-major, TMA-aligned), M <= BLOCK_T <= 128; W [N, K / 2] e2m1
// codes with UE8M0 scales per 1x32 ([N, K / 32] bytes); D [M, N] bf16, or FP32 accumulated into (kWithAccumulation).
// One CTA per (64 * kNumMathWarpgroups weight rows, K split): the producer warpgroup's first warp loads each K block's activation tile,
// codes, sfa and scale words into a ring of stages (TMA; cp.async for the scale words); each math warpgroup owns
// 64 weight rows, expands the next K block's fragments while the current block's wgmma group runs, and promotes
// per 128-deep block. Numerics as the Fp8Mxfp4 kind's (gemm/sm90_fp4_expand.cuh: the same expansion tables, fold
// of the sub-block scales and per-row promotion scale 2^(e_max - 133) times sfa). Split-K (num_splits > 1): each
// warpgroup stores its FP32 partial sums to a workspace slot and the last split of its rows to arrive (ticket)
// sums slots 0 .. num_splits - 1 in that order and stores (deterministic); with kClusterSplits > 1 a tile's splits
// are one cluster and the leader sums them in the same order through distributed shared memory (the same bits).
// N (a multiple of 16) and K (of 128) are launch parameters. Unsupported: M > BLOCK_T (dense), the contiguous layout.
// Masked grouped layout (kMasked; prepared weights, bf16 D, no split-K): A [G, M_max, K], per-expert weights, D
// [G, M_max, N]; a persistent CTA walks the (expert, token block of BLOCK_T, weight tile) work items of the experts'
// valid rows (masked_m read on the device: an expert without rows costs one load of its count), each item the full
// K loop, and stores D rows below masked_m straight from the accumulators (rows past it are never written). With
// three or more CTAs an SM an item runs its valid tokens rounded up to 16 as wgmma's N (the A rows loaded and the
// tensor and promotion work shrink with the item, not with BLOCK_T: kNarrowItems).
//
// Host contract (tensor maps as sm90_fp8_gemm.cuh's, dims innermost first):
//   tmap_a      UINT8 dims {K, M}, box {128, BLOCK_T}, SWIZZLE_128B.
//   tmap_codes  UINT8 dims {K / 2, N}, box {64, 64 * kNumMathWarpgroups}, SWIZZLE_64B.
//   tmap_sfa    FLOAT32 dims {align_up(M, 4), K / 128}, box {BLOCK_T, 1}, SWIZZLE_NONE.
//   tmap_d      D's type, dims {N, M}, box {128 / sizeof(D), BLOCK_T}, SWIZZLE_128B.
//   sfb_words   the UE8M0 scale bytes [N, K / 32] row-major, 4-byte aligned (one 32-bit word per row and K block).
//   shape_n, shape_k: N and K.
//   prepared_weights (kPreparedWeights; then tmap_codes and sfb_words are not read): prepare_fp4_weights's bytes
//               [ceil(N / 64), K / 128, kPreparedChunkBytes], 16-byte aligned (layout: gemm/fp4_prepared.cuh).
//   Masked (kMasked): tmap_a dims {K, M_max, G} box {128, kMaskedABoxRows, 1}; tmap_sfa dims {M_max, K / 128, G} (FP32,
//               M_max innermost, group stride TMA-aligned) box {BLOCK_T, 1, 1}; tmap_d not read; prepared_weights
//               G experts' tensors back to back; masked_m int32 [G]; shape_m M_max; d [G, M_max, N] contiguous.
//               Grid: any number of CTAs (one per SM and kNumCTAsPerSM).
//   split_workspace / split_tickets (num_splits > 1): FP32 num_tiles * 64 * kNumMathWarpgroups * BLOCK_T *
//               num_splits floats and num_tiles * kNumMathWarpgroups uint32 tickets, zero before the first launch
//               and left zero by each (num_tiles = ceil(N / (64 * kNumMathWarpgroups))).
// Launch: grid num_tiles * num_splits (1 <= num_splits <= K / 128; kClusterSplits > 1: num_splits = kClusterSplits,
// cluster {kClusterSplits, 1, 1}, no workspace), block swap_ab_num_threads(), dynamic shared memory
// Sm90Fp8Fp4SwapAbTraits::kSmemBytes.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "common/fp4.cuh"
#include "common/macros.cuh"
#include "common/math.cuh"
#include "epilogue/cluster_split_sum.cuh"
#include "gemm/fp4_prepared.cuh"
#include "gemm/sm90_fp4_expand.cuh"
#include "gemm/sm90_fp8_mainloop.cuh"
#include "pipeline.cuh"
#include "ptx/cp_async.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/sync.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"
#include "ptx/wgmma_register_a.cuh"

namespace deep_kernels {

namespace sm90_fp8_fp4_swap_ab_detail {

using sm90_fp8_gemm_detail::kFp4ExpandTableBytes;
using sm90_fp8_gemm_detail::kFp4MaxExpandShift;
using sm90_fp8_gemm_detail::kNumThreadsPerWarpgroup;
using sm90_fp8_gemm_detail::kScaleBlock;
using sm90_fp8_gemm_detail::kWarpgroupBlockM;
using sm90_fp8_gemm_detail::kWgmmaK;
using fp4_prepared::expand_prepared_e2m1x8;
using fp4_prepared::kPreparedChunkBytes;
using fp4_prepared::kPreparedCodesBytes;
using fp4_prepared::prepared_promotion_scale;
using fp4_prepared::kTilePairTableBytes;

// The masked layout's token granularity where its work items narrow (Sm90Fp8Fp4SwapAbTraits::kNarrowItems).
constexpr uint32_t kMaskedTokenStep = 16;

// Named barriers: the math warpgroups together (before D's staging reuses the stages), and each one alone.
enum class SwapAbBarrier : uint32_t { AllMath = 1, FirstWarpgroup = 2 };

// Dynamic shared memory of each of n CTAs on one SM (the SM's 228 KB, less 1 KB the system keeps per CTA).
constexpr uint32_t max_smem_bytes_per_cta(uint32_t n) { return (233472 - n * 1024) / n; }
constexpr uint32_t kMaxSmemBytesOfTwo = max_smem_bytes_per_cta(2);

// Threads of a CTA: the math warpgroups and the producer, a whole warpgroup (setmaxnreg's unit) except with three or
// more one-warpgroup CTAs an SM, or two of more than 64 tokens, where it is one warp (so that their registers fit:
// 160 threads at 136 with three, at 168 with two).
constexpr uint32_t swap_ab_num_threads(uint32_t num_math_warpgroups, uint32_t num_ctas_per_sm, uint32_t block_t) {
    return 128 * num_math_warpgroups +
           (num_math_warpgroups == 1 && (num_ctas_per_sm >= 3 || (num_ctas_per_sm == 2 && block_t > 64)) ? 32 : 128);
}

template <uint32_t BLOCK_T_, uint32_t kNumMathWarpgroups_, uint32_t kNumStages_, typename OutputType_,
          bool kWithAccumulation_, uint32_t kNumCTAsPerSM_ = 1, uint32_t kNumChains_ = 1, bool kPreparedWeights_ = false,
          bool kMasked_ = false, bool kTileScaled_ = false, bool kPipelinedPromotion_ = false,
          uint32_t kClusterSplits_ = 1>
struct Sm90Fp8Fp4SwapAbTraits {
    static constexpr uint32_t BLOCK_T = BLOCK_T_;
    static constexpr uint32_t kNumMathWarpgroups = kNumMathWarpgroups_, kNumStages = kNumStages_;
    using OutputType = OutputType_;
    static constexpr bool kWithAccumulation = kWithAccumulation_;
    // CTAs an SM runs at once (the launch bounds' minimum): two with one math warpgroup, at 128 registers a thread
    // (above 64 tokens with a one-warp producer, 168); three or four with one math warpgroup and a one-warp
    // producer (136 / 102 registers).
    static constexpr uint32_t kNumCTAsPerSM = kNumCTAsPerSM_;
    // Independent wgmma accumulator chains of a K block (run_k_loop).
    static constexpr uint32_t kNumChains = kNumChains_;
    // The weights in the prepared layout (one bulk copy a warpgroup and K block, codes and scale words together).
    static constexpr bool kPreparedWeights = kPreparedWeights_;
    // The masked grouped layout: a persistent CTA walks the (expert, token block, weight tile) work items.
    static constexpr bool kMasked = kMasked_;
    // Prepared weights whose 64-row tiles share one block exponent per K block (PreparedFp4Weights.tile_scaled): a
    // thread's two rows share their promotion scale, one product with sfa per token; the expansion tables are the
    // pair tables (gemm/fp4_prepared.cuh), two sub-blocks' tables a load.
    static constexpr bool kTileScaled = kTileScaled_;
    static constexpr uint32_t kTableBytes = kTileScaled ? kTilePairTableBytes : kFp4ExpandTableBytes;
    // Prepared weights: each K block's promotion overlapped with the next block's wgmma group (run_k_loop_pipelined;
    // twice the accumulator registers).
    static constexpr bool kPipelinedPromotion = kPipelinedPromotion_;
    // Split-K with a tile's splits in one cluster of this many CTAs (reduce_splits_in_cluster; 1: the workspace).
    static constexpr uint32_t kClusterSplits = kClusterSplits_;
    // The masked layout with three or more CTAs an SM: each work item runs its valid tokens rounded up to
    // kMaskedTokenStep (its A rows and wgmma N; masked_item_width), not BLOCK_T.
    // NOTE: items then take unequal times, and a CTA that runs out of them early leaves its SM to the others: with one
    // other, a lone warpgroup, which runs latency-bound (16 experts of 64 rows, N x K 4096 x 7168: 7% slower).
    static constexpr bool kNarrowItems = kMasked && kNumCTAsPerSM >= 3;
    // The rows of the masked layout's A box (tmap_a): an item's A tile is one box, or narrowed, one per
    // kMaskedTokenStep tokens.
    static constexpr uint32_t kMaskedABoxRows = kNarrowItems ? kMaskedTokenStep : BLOCK_T;

    static constexpr uint32_t BLOCK_W = kWarpgroupBlockM * kNumMathWarpgroups;  // weight rows of a tile
    static constexpr uint32_t kNumMathThreads = kNumMathWarpgroups * kNumThreadsPerWarpgroup;
    static constexpr uint32_t kNumThreads = swap_ab_num_threads(kNumMathWarpgroups, kNumCTAsPerSM, BLOCK_T);
    // NOTE: registers are allocated per SM sub-partition, so the producer is a whole warpgroup (its first warp
    // loads, the others exit) that gives its registers to the math warpgroups: 128 x 40 + 256 x 232 = 64,512 with
    // two; one math warpgroup keeps what the launch gives (255).
    static constexpr uint32_t kNumProducerRegisters = 40, kNumMathRegisters = 232;

    // Shared memory, per stage: the activation tile (BLOCK_T x 128 e4m3, 128-byte swizzle), the codes (BLOCK_W x 64
    // bytes, 64-byte swizzle; prepared: a chunk per warpgroup, scale words included), sfa (BLOCK_T FP32, padded to
    // 128 bytes), the rows' scale words (unprepared); then the expansion tables and the full and empty barriers.
    // D's staging (BLOCK_T rows of BLOCK_W, as boxes of 128-byte rows) reuses the stages once every K block is done.
    static constexpr uint32_t kStageABytes = BLOCK_T * kScaleBlock;
    static constexpr uint32_t kStageCodesBytes =
        kPreparedWeights ? kNumMathWarpgroups * kPreparedChunkBytes : BLOCK_W * kScaleBlock / 2;
    static constexpr uint32_t kStageSfaBytes = align_up<uint32_t>(BLOCK_T * sizeof(float), 128);
    static constexpr uint32_t kStageWordsBytes = kPreparedWeights ? 0 : BLOCK_W * sizeof(uint32_t);
    static constexpr uint32_t kOffsetA = 0;
    static constexpr uint32_t kOffsetCodes = kOffsetA + kNumStages * kStageABytes;
    static constexpr uint32_t kOffsetSfa = kOffsetCodes + kNumStages * kStageCodesBytes;
    static constexpr uint32_t kOffsetWords = kOffsetSfa + kNumStages * kStageSfaBytes;
    static constexpr uint32_t kOffsetTables = kOffsetWords + kNumStages * kStageWordsBytes;
    static constexpr uint32_t kOffsetBarriers = kOffsetTables + kTableBytes;
    static constexpr uint32_t kSmemBytes = kOffsetBarriers + 2 * kNumStages * sizeof(uint64_t);
    // TMA-loaded bytes of a stage (unprepared, the scale words come by cp.async).
    static constexpr uint32_t kStageTxBytes = kStageABytes + kStageCodesBytes + BLOCK_T * sizeof(float);
    // Arrivals on a stage's full barrier: the TMA thread's, and the 32 lanes' cp.async ones (unprepared).
    static constexpr uint32_t kFullArrivals = kPreparedWeights ? 1 : 1 + 32;

    // D's staging: boxes of kBoxCols weight rows (128 bytes of D) by BLOCK_T tokens.
    static constexpr uint32_t kBoxCols = 128 / sizeof(OutputType);
    static constexpr uint32_t kBoxBytes = BLOCK_T * 128;
    static constexpr uint32_t kSmemDBytes = BLOCK_W / kBoxCols * kBoxBytes;

    DK_STATIC_ASSERT(BLOCK_T % 16 == 0 && BLOCK_T >= 16 && BLOCK_T <= 128, "BLOCK_T in 16..128, a multiple of 16");
    DK_STATIC_ASSERT(kNumMathWarpgroups == 1 || kNumMathWarpgroups == 2, "one or two math warpgroups");
    DK_STATIC_ASSERT(kNumStages >= 2, "at least two stages");
    DK_STATIC_ASSERT(kNumChains == 1 || kNumChains == 2 || kNumChains == 4, "1, 2 or 4 accumulator chains");
    DK_STATIC_ASSERT(kNumCTAsPerSM == 1 ||
                     (kNumCTAsPerSM <= 4 && kNumMathWarpgroups == 1 &&
                      BLOCK_T <= (kNumCTAsPerSM == 4 ? 32 : kNumCTAsPerSM == 3 ? 64 : 96)),
                     "two to four CTAs an SM: one math warpgroup, up to 96 / 64 / 32 tokens (registers)");
    DK_STATIC_ASSERT((std::is_same_v<OutputType, float> || (std::is_same_v<OutputType, __nv_bfloat16> && !kWithAccumulation)),
                     "bf16 D, or FP32 D (accumulated into with kWithAccumulation)");
    DK_STATIC_ASSERT(kSmemDBytes <= kOffsetTables, "D's staging fits in the stages");
    DK_STATIC_ASSERT(!kMasked || (kPreparedWeights && std::is_same_v<OutputType, __nv_bfloat16>),
                     "the masked layout: prepared weights, bf16 D");
    DK_STATIC_ASSERT(!kTileScaled || kPreparedWeights, "one scale a tile: prepared weights");
    DK_STATIC_ASSERT(kClusterSplits >= 1 && kClusterSplits <= 8 && (kClusterSplits == 1 || !kMasked),
                     "up to 8 splits in a cluster (the portable cluster size), not in the masked layout");
    DK_STATIC_ASSERT(kClusterSplits == 1 || kNumMathWarpgroups * kNumThreadsPerWarpgroup * BLOCK_T / 2 * sizeof(float) <=
                                                kNumStages * (kStageABytes + kStageCodesBytes),
                     "splits in a cluster: the partial sums fit in the stages");
    DK_STATIC_ASSERT(!kPipelinedPromotion || (kPreparedWeights && kNumStages >= 3),
                     "the pipelined promotion: prepared weights, at least three stages (it holds three)");
    DK_STATIC_ASSERT(kSmemBytes <= (kNumCTAsPerSM == 1 ? sm90_fp8_gemm_detail::kMaxSmemBytes
                                                       : max_smem_bytes_per_cta(kNumCTAsPerSM)),
                     "stages fit in shared memory");
};

// This thread's half of a K block's A fragments: its rows r0 (16w + g of its warpgroup's 64) and r0 + 8, the four
// k32 steps, and the rows' promotion scales.
struct Fragments {
    uint32_t regs[4][4];
    float scale_lo, scale_hi;
};

// One row's codes of step s (its 32-wide sub-block s) for lane quad position q: the e2m1 codes of columns 4q .. 4q + 3
// (low half) and 16 + 4q .. 16 + 4q + 3 (high half), as expand_e2m1x8 takes them.
// NOTE: the 64 code bytes of a row sit in four 16-byte chunks, chunk s at s ^ ((row / 2) % 4) (TMA's 64-byte
// swizzle), so that the eight rows of a warp's load hit distinct banks; the four lanes of a quad load the same chunk.
DK_DEVICE uint32_t codes_of_step(const uint8_t* smem_codes, uint32_t row, uint32_t s, uint32_t q) {
    const uint4 chunk = *reinterpret_cast<const uint4*>(smem_codes + row * 64 + ((s ^ ((row / 2) % 4)) * 16));
    const uint32_t lo = q < 2 ? chunk.x : chunk.y;
    const uint32_t hi = q < 2 ? chunk.z : chunk.w;
    return sm90_fp8_gemm_detail::byte_perm(lo, hi, q % 2 ? 0x7632u : 0x5410u);
}

// Expands a stage's codes of rows r0 and r0 + 8 into `frag` (e4m3 bytes in the register A layout) with the rows'
// promotion scales, folding the sub-block scales as the Fp8Mxfp4 kind does.
DK_DEVICE void expand_fragments(Fragments& frag, const uint8_t* smem_codes, const uint32_t* smem_words,
                                const uint2* tables, uint32_t r0, uint32_t q) {
    uint32_t words[2], codes[2][4];
#pragma unroll
    for (uint32_t h = 0; h < 2; ++h) {
        words[h] = smem_words[r0 + 8 * h];
#pragma unroll
        for (uint32_t s = 0; s < 4; ++s)
            codes[h][s] = codes_of_step(smem_codes, r0 + 8 * h, s, q);
    }
    uint2 expanded[2][4];
#pragma unroll
    for (uint32_t h = 0; h < 2; ++h) {
        const uint32_t e_max = sm90_fp8_gemm_detail::max_exponent(words[h]);
        const float scale = e8m0_to_float(static_cast<uint8_t>(e_max)) * 0x1p-6f;
        if (h == 0)
            frag.scale_lo = scale;
        else
            frag.scale_hi = scale;
#pragma unroll
        for (uint32_t s = 0; s < 4; ++s) {
            const uint32_t e_sub = (words[h] >> (8 * s)) & 0xFFu;
            expanded[h][s] = sm90_fp8_gemm_detail::expand_e2m1x8(codes[h][s], tables[min(e_max - e_sub, kFp4MaxExpandShift)]);
        }
    }
#pragma unroll
    for (uint32_t s = 0; s < 4; ++s) {
        frag.regs[s][0] = expanded[0][s].x;
        frag.regs[s][1] = expanded[1][s].x;
        frag.regs[s][2] = expanded[0][s].y;
        frag.regs[s][3] = expanded[1][s].y;
    }
}

// expand_fragments from the prepared layout: this thread's two 16-byte halves of codes (rows r0, r0 + 8; steps
// 0..3 each, from `codes`) and its rows' scale words (`words`), one shared-memory load each. kTileScaled: the rows'
// words hold one block exponent, so the promotion scale is taken once, from r0's, and `tables` are the pair tables.
template <bool kTileScaled>
DK_DEVICE void expand_prepared_fragments(Fragments& frag, const uint8_t* codes_ptr, const uint8_t* words_ptr,
                                         const uint8_t* tables) {
    const uint4 codes_lo = *reinterpret_cast<const uint4*>(codes_ptr);
    const uint4 codes_hi = *reinterpret_cast<const uint4*>(codes_ptr + kPreparedCodesBytes / 2);
    const uint2 words = *reinterpret_cast<const uint2*>(words_ptr);
    const uint32_t codes[2][4] = {{codes_lo.x, codes_lo.y, codes_lo.z, codes_lo.w},
                                  {codes_hi.x, codes_hi.y, codes_hi.z, codes_hi.w}};
    const uint32_t scale_words[2] = {words.x, words.y};
    if constexpr (kTileScaled) {
        frag.scale_lo = fp4_prepared::tile_promotion_scale(scale_words[0]);
#pragma unroll
        for (uint32_t h = 0; h < 2; ++h) {
            uint2 table[4];
#pragma unroll
            for (uint32_t pair = 0; pair < 2; ++pair) {
                const uint4 tables_of_pair =
                    *reinterpret_cast<const uint4*>(tables + fp4_prepared::tile_pair_offset(scale_words[h], pair));
                table[2 * pair] = make_uint2(tables_of_pair.x, tables_of_pair.y);
                table[2 * pair + 1] = make_uint2(tables_of_pair.z, tables_of_pair.w);
            }
#pragma unroll
            for (uint32_t s = 0; s < 4; ++s) {
                const uint2 expanded = expand_prepared_e2m1x8(codes[h][s], table[s]);
                frag.regs[s][h] = expanded.x;
                frag.regs[s][2 + h] = expanded.y;
            }
        }
        return;
    }
#pragma unroll
    for (uint32_t h = 0; h < 2; ++h) {
        if (h == 0)
            frag.scale_lo = prepared_promotion_scale(scale_words[0]);
        else
            frag.scale_hi = prepared_promotion_scale(scale_words[1]);
        const uint32_t offsets = scale_words[h] & 0xF8F8F8F8u;
#pragma unroll
        for (uint32_t s = 0; s < 4; ++s) {
            const uint32_t offset = sm90_fp8_gemm_detail::byte_perm(offsets, 0, 0x4440u + s);
            const uint2 expanded = expand_prepared_e2m1x8(codes[h][s], *reinterpret_cast<const uint2*>(tables + offset));
            frag.regs[s][h] = expanded.x;
            frag.regs[s][2 + h] = expanded.y;
        }
    }
}

// The pair tables (kTileScaled): entry 8 d + d' is tables d and d' (fp4_prepared::kTilePairTables of them).
DK_DEVICE void init_pair_tables(uint4* tables, uint32_t thread, uint32_t num_threads) {
    using fp4_prepared::kTileMaxShift;
    for (uint32_t i = thread; i < fp4_prepared::kTilePairTables; i += num_threads) {
        const uint2 first = sm90_fp8_gemm_detail::fp4_expand_table(i / (kTileMaxShift + 1));
        const uint2 second = sm90_fp8_gemm_detail::fp4_expand_table(i % (kTileMaxShift + 1));
        tables[i] = make_uint4(first.x, first.y, second.x, second.y);
    }
}

// D^T's element (weight row `row` of the tile, token `token`) in the staging: box row / kBoxCols, a 128-byte row per
// token, 16-byte chunks swizzled by token % 8 (TMA's 128-byte swizzle).
template <typename Traits>
DK_DEVICE typename Traits::OutputType* staged_element(uint8_t* smem_d, uint32_t row, uint32_t token) {
    using OutputType = typename Traits::OutputType;
    const uint32_t byte = row % Traits::kBoxCols * sizeof(OutputType);
    return reinterpret_cast<OutputType*>(smem_d + row / Traits::kBoxCols * Traits::kBoxBytes + token * 128 +
                                         (((byte / 16) ^ (token % 8)) * 16) + byte % 16);
}

// One K block's stage of unprepared weights (the producer warp, every lane): lane 0 loads the activation tile, the
// codes and sfa by TMA, and the 32 lanes copy each weight row's kWordsPerRow scale words of the block (sfb_words:
// rows of num_k_blocks * kWordsPerRow words) into smem_words by cp.async, rows past N as zeros; all complete on
// full_barrier (1 + 32 arrivals).
template <typename Traits, uint32_t kWordsPerRow>
DK_DEVICE void load_unprepared_stage(uint8_t* smem, uint32_t stage, uint64_t* full_barrier, uint8_t* smem_words,
                                     const CUtensorMap* tmap_a, const CUtensorMap* tmap_codes,
                                     const CUtensorMap* tmap_sfa, const uint32_t* sfb_words, uint32_t shape_n,
                                     uint32_t num_k_blocks, uint32_t w_first, uint32_t k_block) {
    const uint32_t lane_idx = threadIdx.x % 32;
    if (lane_idx == 0) {
        ptx::mbarrier_arrive_expect_tx(full_barrier, Traits::kStageTxBytes);
        ptx::tma_load(smem + Traits::kOffsetA + stage * Traits::kStageABytes, tmap_a, full_barrier,
                      static_cast<int32_t>(k_block * kScaleBlock), 0);
        ptx::tma_load(smem + Traits::kOffsetCodes + stage * Traits::kStageCodesBytes, tmap_codes, full_barrier,
                      static_cast<int32_t>(k_block * kScaleBlock / 2), static_cast<int32_t>(w_first));
        ptx::tma_load(smem + Traits::kOffsetSfa + stage * Traits::kStageSfaBytes, tmap_sfa, full_barrier, 0,
                      static_cast<int32_t>(k_block));
    }
    auto* words = reinterpret_cast<uint32_t*>(smem_words);
#pragma unroll
    for (uint32_t i = lane_idx; i < Traits::BLOCK_W * kWordsPerRow; i += 32) {
        const uint32_t row = i / kWordsPerRow;
        const bool valid = w_first + row < shape_n;
        const uint32_t word = ((w_first + row) * num_k_blocks + k_block) * kWordsPerRow + i % kWordsPerRow;
        ptx::cp_async_4(words + i, sfb_words + (valid ? word : 0), valid ? 4 : 0);
    }
    ptx::cp_async_mbarrier_arrive_noinc(full_barrier);
}

// The producer warp: per K block of the CTA's split, once the stage is free, its loads (load_unprepared_stage, one
// scale word a row and K block).
// Prepared weights: lane 0 alone, one bulk copy of each warpgroup's chunk (tiles past the prepared ones are not
// loaded: their rows lie past N, never stored).
// Masked layout: the tiles of expert `group` from token t0 (A and sfa by 3-D maps, tokens past M_max zero-filled):
// A's first `num_a_rows` tokens (masked_item_width: boxes of kMaskedABoxRows); prepared_weights is the expert's.
template <typename Traits, typename Ring>
DK_DEVICE void run_producer(const Ring& ring, uint8_t* smem, const CUtensorMap* tmap_a, const CUtensorMap* tmap_codes,
                            const CUtensorMap* tmap_sfa, const uint32_t* sfb_words, uint32_t shape_n,
                            uint32_t num_k_blocks, uint32_t w_first, uint32_t k_block_begin, uint32_t k_block_end,
                            const uint8_t* prepared_weights, PipelineState<Traits::kNumStages>& state,
                            uint32_t group = 0, uint32_t t0 = 0, uint32_t num_a_rows = Traits::BLOCK_T) {
    const uint32_t lane_idx = threadIdx.x % 32;
    if constexpr (Traits::kPreparedWeights) {
        if (lane_idx != 0)
            return;
        const uint32_t first_chunk_tile = w_first / kWarpgroupBlockM;
        const uint32_t num_prepared_tiles = (shape_n + kWarpgroupBlockM - 1) / kWarpgroupBlockM;
        const uint32_t num_chunks = min(Traits::kNumMathWarpgroups, num_prepared_tiles - first_chunk_tile);
        const uint32_t tx_bytes = Traits::kStageTxBytes -
                                  (Traits::kNumMathWarpgroups - num_chunks) * kPreparedChunkBytes -
                                  (Traits::BLOCK_T - num_a_rows) * kScaleBlock;
        for (uint32_t k_block = k_block_begin; k_block < k_block_end; ++k_block) {
            ring.producer_acquire(state);
            uint64_t* full_barrier = ring.full_barriers + state.stage;
            ptx::mbarrier_arrive_expect_tx(full_barrier, tx_bytes);
            if constexpr (Traits::kMasked) {
                uint8_t* smem_a = smem + Traits::kOffsetA + state.stage * Traits::kStageABytes;
                for (uint32_t row = 0; row < num_a_rows; row += Traits::kMaskedABoxRows)
                    ptx::tma_load(smem_a + row * kScaleBlock, tmap_a, full_barrier,
                                  static_cast<int32_t>(k_block * kScaleBlock), static_cast<int32_t>(t0 + row),
                                  static_cast<int32_t>(group));
                ptx::tma_load(smem + Traits::kOffsetSfa + state.stage * Traits::kStageSfaBytes, tmap_sfa, full_barrier,
                              static_cast<int32_t>(t0), static_cast<int32_t>(k_block), static_cast<int32_t>(group));
            } else {
                ptx::tma_load(smem + Traits::kOffsetA + state.stage * Traits::kStageABytes, tmap_a, full_barrier,
                              static_cast<int32_t>(k_block * kScaleBlock), 0);
                ptx::tma_load(smem + Traits::kOffsetSfa + state.stage * Traits::kStageSfaBytes, tmap_sfa, full_barrier,
                              0, static_cast<int32_t>(k_block));
            }
            for (uint32_t c = 0; c < num_chunks; ++c)
                ptx::bulk_load(smem + Traits::kOffsetCodes + state.stage * Traits::kStageCodesBytes + c * kPreparedChunkBytes,
                               prepared_weights + (static_cast<uint64_t>(first_chunk_tile + c) * num_k_blocks + k_block) *
                                                      kPreparedChunkBytes,
                               kPreparedChunkBytes, full_barrier);
            state.advance();
        }
        return;
    }
    for (uint32_t k_block = k_block_begin; k_block < k_block_end; ++k_block) {
        ring.producer_acquire(state);
        load_unprepared_stage<Traits, 1>(smem, state.stage, ring.full_barriers + state.stage,
                                         smem + Traits::kOffsetWords + state.stage * Traits::kStageWordsBytes, tmap_a,
                                         tmap_codes, tmap_sfa, sfb_words, shape_n, num_k_blocks, w_first, k_block);
        state.advance();
    }
}

// This thread's codes and scale words in its warpgroup's chunk of a stage (prepared weights): offsets from the
// stages' base.
// NOTE: through an empty asm, so that the compiler keeps them rather than recomputing them from the thread index
// in every K block.
struct PreparedThreadOffsets {
    uint32_t codes, words;
};

template <typename Traits>
DK_DEVICE PreparedThreadOffsets prepared_thread_offsets() {
    const uint32_t wg_idx = threadIdx.x / kNumThreadsPerWarpgroup;
    const uint32_t lane_idx = threadIdx.x % 32;
    PreparedThreadOffsets offsets{
        Traits::kOffsetCodes + wg_idx * kPreparedChunkBytes + threadIdx.x % kNumThreadsPerWarpgroup * 16,
        Traits::kOffsetCodes + wg_idx * kPreparedChunkBytes + kPreparedCodesBytes + (threadIdx.x / 32 % 4 * 8 + lane_idx / 4) * 8};
    if constexpr (Traits::kPreparedWeights)
        asm volatile("" : "+r"(offsets.codes), "+r"(offsets.words));
    return offsets;
}

// A K block's partial sums of N tokens (N < BLOCK_T: a narrowed masked work item, Traits::kNarrowItems).
template <typename Traits, uint32_t N = Traits::BLOCK_T>
using BlockPartial = float[Traits::kNumChains][N / 2];

// The tokens a masked work item of num_tokens valid ones runs: its A rows and wgmma N.
template <typename Traits>
DK_DEVICE uint32_t masked_item_width(uint32_t num_tokens) {
    return Traits::kNarrowItems ? align_up(num_tokens, kMaskedTokenStep) : Traits::BLOCK_T;
}

// Expands a stage's prepared codes into this thread's fragments.
template <typename Traits>
DK_DEVICE void expand_prepared_block(Fragments& frag, const uint8_t* smem, const PreparedThreadOffsets& thread,
                                     uint32_t stage) {
    const uint8_t* stage_codes = smem + stage * Traits::kStageCodesBytes;
    expand_prepared_fragments<Traits::kTileScaled>(frag, stage_codes + thread.codes, stage_codes + thread.words,
                                                   smem + Traits::kOffsetTables);
}

// Issues the K block's wgmma group (the stage's A tile): its four k32 steps, round-robin into kNumChains accumulator
// sets, so that up to four wgmma of a block run independently instead of each waiting for the last's accumulators
// (narrow tiles are latency-bound).
template <typename Traits, uint32_t N>
DK_DEVICE void issue_block(const Fragments& frag, BlockPartial<Traits, N>& partial, const uint8_t* smem, uint32_t stage) {
    const uint64_t desc_a = ptx::make_smem_desc_k_major_sw128(smem + Traits::kOffsetA + stage * Traits::kStageABytes);
    ptx::wgmma_fence();
#pragma unroll
    for (uint32_t s = 0; s < kScaleBlock / kWgmmaK; ++s)
        ptx::Fp8WgmmaRegisterA<N>::mma(frag.regs[s], desc_a + s * kWgmmaK / 16, partial[s % Traits::kNumChains],
                                       s >= Traits::kNumChains ? 1u : 0u);
    ptx::wgmma_commit_group();
}

// Once its group is done: the block's partial sum, the sets' FP32 sum ((0 + 1) + 2) + 3, promoted into final_acc
// with the fragments' row scales and the stage's sfa.
template <typename Traits, uint32_t N>
DK_DEVICE void promote_block(BlockPartial<Traits, N>& partial, float (&final_acc)[N / 2],
                             const Fragments& frag, const uint8_t* smem, uint32_t stage, uint32_t lane_idx) {
#pragma unroll
    for (uint32_t c = 0; c < Traits::kNumChains; ++c)
        ptx::fence_operands(partial[c]);
#pragma unroll
    for (uint32_t c = 1; c < Traits::kNumChains; ++c) {
#pragma unroll
        for (uint32_t i = 0; i < N / 2; ++i)
            partial[0][i] += partial[c][i];
    }
    sm90_fp8_gemm_detail::promote_per_column<N>(
        partial[0], final_acc, frag.scale_lo, Traits::kTileScaled ? frag.scale_lo : frag.scale_hi,
        reinterpret_cast<const float*>(smem + Traits::kOffsetSfa + stage * Traits::kStageSfaBytes), lane_idx);
}

// One math warpgroup: the K loop of its 64 rows and N tokens over the split's K blocks into final_acc.
// NOTE: K block i + 1's fragments are expanded (into the other register set) while block i's wgmma group runs; the
// loop is unrolled by two so that each set is named at compile time.
// `state` is the ring's position at the first block, and after the last one on return.
template <typename Traits, uint32_t N, typename Ring>
DK_DEVICE void run_k_loop(const Ring& ring, uint8_t* smem, float (&final_acc)[N / 2], uint32_t k_block_begin,
                          uint32_t k_block_end, PipelineState<Traits::kNumStages>& state) {
    using State = PipelineState<Traits::kNumStages>;
    const uint32_t wg_idx = threadIdx.x / kNumThreadsPerWarpgroup;
    const uint32_t lane_idx = threadIdx.x % 32;
    const uint32_t r0 = wg_idx * kWarpgroupBlockM + threadIdx.x / 32 % 4 * 16 + lane_idx / 4;
    const uint32_t q = lane_idx % 4;
    const auto* tables = reinterpret_cast<const uint2*>(smem + Traits::kOffsetTables);
    const PreparedThreadOffsets thread = prepared_thread_offsets<Traits>();

    auto expand = [&](Fragments& frag, const State& state) {
        ring.consumer_wait(state);
        if constexpr (Traits::kPreparedWeights)
            expand_prepared_block<Traits>(frag, smem, thread, state.stage);
        else
            expand_fragments(frag, smem + Traits::kOffsetCodes + state.stage * Traits::kStageCodesBytes,
                             reinterpret_cast<const uint32_t*>(smem + Traits::kOffsetWords + state.stage * Traits::kStageWordsBytes),
                             tables, r0, q);
    };

#pragma unroll
    for (uint32_t i = 0; i < N / 2; ++i)
        final_acc[i] = 0.0f;
    BlockPartial<Traits, N> partial;
    Fragments frags[2];
    State previous_state = state;
    expand(frags[0], state);
    // Issues the block's wgmma group from `current` and frees the previous block's stage, expands the next block into
    // `next` meanwhile, then promotes the block. Returns whether the split has another block.
    auto step = [&](Fragments& current, Fragments& next, uint32_t k_block) {
        issue_block<Traits, N>(current, partial, smem, state.stage);
        // The previous block's stage: its promotion's sfa loads are done (this group overwrites what they feed).
        ring.consumer_release_if(previous_state, lane_idx, k_block != k_block_begin);
        State next_state = state;
        next_state.advance();
        const bool has_next = k_block + 1 < k_block_end;
        if (has_next)
            expand(next, next_state);
        ptx::wgmma_wait_group<0>();
        promote_block<Traits, N>(partial, final_acc, current, smem, state.stage, lane_idx);
        previous_state = state;
        state = next_state;
        return has_next;
    };
    for (uint32_t k_block = k_block_begin;; k_block += 2) {
        if (!step(frags[0], frags[1], k_block) || !step(frags[1], frags[0], k_block + 1))
            break;
    }
    ring.consumer_release_after_loads(previous_state, lane_idx);
}

// run_k_loop with each block's promotion overlapped with the next block's wgmma group (kPipelinedPromotion): two
// accumulator sets as well as two fragment sets, so that block i's promotion (and block i + 1's expansion) runs
// while block i + 1's group does, and the tensor cores wait neither for the promotion nor for the group's latency.
// Same sums in the same order as run_k_loop (bitwise equal).
// NOTE: a stage is freed once the wgmma group that overwrites the accumulators its sfa fed has been issued (two
// blocks later): by then the promotion's loads have returned, and the group that read its A tile and the fragments
// expanded from its codes has completed. The last two stages are freed after their loads (fenced).
template <typename Traits, uint32_t N, typename Ring>
DK_DEVICE void run_k_loop_pipelined(const Ring& ring, uint8_t* smem, float (&final_acc)[N / 2], uint32_t k_block_begin,
                                    uint32_t k_block_end, PipelineState<Traits::kNumStages>& state) {
    using State = PipelineState<Traits::kNumStages>;
    using Partial = BlockPartial<Traits, N>;
    const uint32_t lane_idx = threadIdx.x % 32;
    const PreparedThreadOffsets thread = prepared_thread_offsets<Traits>();

    auto expand = [&](Fragments& frag, const State& block_state) {
        ring.consumer_wait(block_state);
        expand_prepared_block<Traits>(frag, smem, thread, block_state.stage);
    };
    auto issue = [&](const Fragments& frag, Partial& partial, const State& block_state) {
        issue_block<Traits, N>(frag, partial, smem, block_state.stage);
    };
    auto promote = [&](Partial& partial, const Fragments& frag, const State& block_state) {
        promote_block<Traits, N>(partial, final_acc, frag, smem, block_state.stage, lane_idx);
    };

#pragma unroll
    for (uint32_t i = 0; i < N / 2; ++i)
        final_acc[i] = 0.0f;
    Partial partials[2];
    Fragments frags[2];
    // The split's first block, in set 0.
    State previous_state = state, before_previous_state = state;
    expand(frags[0], state);
    issue(frags[0], partials[0], state);
    state.advance();
    if (k_block_begin + 1 == k_block_end) {
        ptx::wgmma_wait_group<0>();
        promote(partials[0], frags[0], previous_state);
        ring.consumer_release_after_loads(previous_state, lane_idx);
        return;
    }
    expand(frags[1], state);
    // Block k_block (expanded into set `current`) issued, block k_block - 1 (set `previous`) promoted and, if there
    // is one, block k_block + 1 expanded into `previous`; at the split's last block, that block promoted and the last
    // two stages freed. Returns whether the split has another block.
    auto step = [&](Fragments& current, Partial& current_partial, Fragments& previous, Partial& previous_partial,
                    uint32_t k_block) {
        issue(current, current_partial, state);
        ring.consumer_release_if(before_previous_state, lane_idx, k_block >= k_block_begin + 2);
        ptx::wgmma_wait_group<1>();
        promote(previous_partial, previous, previous_state);
        before_previous_state = previous_state;
        previous_state = state;
        state.advance();
        if (k_block + 1 == k_block_end) {
            ptx::wgmma_wait_group<0>();
            promote(current_partial, current, previous_state);
            ring.consumer_release_after_loads(before_previous_state, lane_idx);
            ring.consumer_release_after_loads(previous_state, lane_idx);
            return false;
        }
        expand(previous, state);
        return true;
    };
    for (uint32_t k_block = k_block_begin + 1;; k_block += 2) {
        if (!step(frags[1], partials[1], frags[0], partials[0], k_block) ||
            !step(frags[0], partials[0], frags[1], partials[1], k_block + 1))
            break;
    }
}

// The warpgroup's K loop of N tokens, pipelined or not (Traits::kPipelinedPromotion).
template <typename Traits, uint32_t N = Traits::BLOCK_T, typename Ring>
DK_DEVICE void run_math(const Ring& ring, uint8_t* smem, float (&final_acc)[N / 2], uint32_t k_block_begin,
                        uint32_t k_block_end, PipelineState<Traits::kNumStages>& state) {
    if constexpr (Traits::kPipelinedPromotion)
        run_k_loop_pipelined<Traits, N>(ring, smem, final_acc, k_block_begin, k_block_end, state);
    else
        run_k_loop<Traits, N>(ring, smem, final_acc, k_block_begin, k_block_end, state);
}

// The warpgroup's split-K reduction: stores its partial sums to its slot; the last split of its rows to arrive sums
// every slot in order into final_acc and returns true (the others return false).
template <typename Traits>
DK_DEVICE bool reduce_splits(float (&final_acc)[Traits::BLOCK_T / 2], float* split_workspace, uint32_t* split_tickets,
                             uint32_t tile_idx, uint32_t split_idx, uint32_t num_splits) {
    constexpr uint32_t kSlotFloats = kNumThreadsPerWarpgroup * Traits::BLOCK_T / 2;
    const uint32_t wg_idx = threadIdx.x / kNumThreadsPerWarpgroup;
    const uint32_t thread = threadIdx.x % kNumThreadsPerWarpgroup;
    const uint32_t barrier_id = static_cast<uint32_t>(SwapAbBarrier::FirstWarpgroup) + wg_idx;
    const uint32_t slots = tile_idx * Traits::kNumMathWarpgroups + wg_idx;
    float* slot_base = split_workspace + static_cast<uint64_t>(slots) * num_splits * kSlotFloats + thread;
#pragma unroll
    for (uint32_t i = 0; i < Traits::BLOCK_T / 2; ++i)
        slot_base[split_idx * kSlotFloats + i * kNumThreadsPerWarpgroup] = final_acc[i];
    __threadfence();
    bool is_last = false;
    ptx::named_barrier_sync(barrier_id, kNumThreadsPerWarpgroup);
    if (thread == 0) {
        is_last = atomicAdd(split_tickets + slots, 1u) == num_splits - 1;
        if (is_last)
            atomicExch(split_tickets + slots, 0u);
    }
    is_last = ptx::named_barrier_sync_or(barrier_id, kNumThreadsPerWarpgroup, is_last);
    if (!is_last)
        return false;
    __threadfence();
#pragma unroll
    for (uint32_t i = 0; i < Traits::BLOCK_T / 2; ++i)
        final_acc[i] = 0.0f;
    for (uint32_t split = 0; split < num_splits; ++split) {
#pragma unroll
        for (uint32_t i = 0; i < Traits::BLOCK_T / 2; ++i)
            final_acc[i] += __ldcg(slot_base + split * kSlotFloats + i * kNumThreadsPerWarpgroup);
    }
    return true;
}

// Split-K with the splits in one cluster (kClusterSplits > 1): the other splits store each warpgroup's FP32 partial
// sums into their own stages (free once every math warpgroup's K loop is done; epilogue/cluster_split_sum.cuh's
// layout), a cluster barrier publishes them, and the leader (split 0) adds splits 1 .. kClusterSplits - 1 in that
// order to its own, read from their shared memory, and returns true. The same sums in the same order as
// reduce_splits (the same bits: final_acc is never -0, so starting from the leader's own partial sum is starting from
// 0 + it). A second cluster barrier keeps the others' shared memory until the leader has read it.
template <typename Traits>
DK_DEVICE bool reduce_splits_in_cluster(float (&final_acc)[Traits::BLOCK_T / 2], float* exchange, uint32_t split_idx) {
    float* own = cluster_split_sum::thread_slot(exchange + threadIdx.x / kNumThreadsPerWarpgroup *
                                                               kNumThreadsPerWarpgroup * Traits::BLOCK_T / 2);
    if (split_idx != 0)
        cluster_split_sum::store_partials(final_acc, own);
    __syncwarp();
    ptx::cluster_sync();
    if (split_idx != 0) {
        ptx::cluster_sync();
        return false;
    }
#pragma unroll 1
    for (uint32_t split = 1; split < Traits::kClusterSplits; ++split)
        cluster_split_sum::add_remote_partials(final_acc, own, split);
    __syncwarp();
    ptx::cluster_sync();
    return true;
}

// The warpgroup's 64 rows of D^T, staged transposed (tokens as rows) and stored as D rows by TMA (reduce-add when
// accumulating); TMA clips tokens past M and rows past N.
template <typename Traits>
DK_DEVICE void store_tile(const float (&final_acc)[Traits::BLOCK_T / 2], uint8_t* smem_d, const CUtensorMap* tmap_d,
                          uint32_t w_first) {
    using OutputType = typename Traits::OutputType;
    const uint32_t wg_idx = threadIdx.x / kNumThreadsPerWarpgroup;
    const uint32_t lane_idx = threadIdx.x % 32;
    const uint32_t r0 = wg_idx * kWarpgroupBlockM + threadIdx.x / 32 % 4 * 16 + lane_idx / 4;
#pragma unroll
    for (uint32_t j = 0; j < Traits::BLOCK_T / 8; ++j) {
#pragma unroll
        for (uint32_t e = 0; e < 4; ++e) {
            const uint32_t token = j * 8 + lane_idx % 4 * 2 + e % 2;
            *staged_element<Traits>(smem_d, r0 + e / 2 * 8, token) = static_cast<OutputType>(final_acc[j * 4 + e]);
        }
    }
    ptx::fence_proxy_async_shared();
    ptx::named_barrier_sync(static_cast<uint32_t>(SwapAbBarrier::FirstWarpgroup) + wg_idx, kNumThreadsPerWarpgroup);
    if (threadIdx.x % kNumThreadsPerWarpgroup == 0) {
        constexpr uint32_t kBoxesPerWarpgroup = kWarpgroupBlockM / Traits::kBoxCols;
#pragma unroll
        for (uint32_t box = wg_idx * kBoxesPerWarpgroup; box < (wg_idx + 1) * kBoxesPerWarpgroup; ++box) {
            const int32_t col = static_cast<int32_t>(w_first + box * Traits::kBoxCols);
            if constexpr (Traits::kWithAccumulation)
                ptx::tma_reduce_add(tmap_d, smem_d + box * Traits::kBoxBytes, col, 0);
            else
                ptx::tma_store(tmap_d, smem_d + box * Traits::kBoxBytes, col, 0);
        }
        ptx::tma_store_commit();
        ptx::tma_store_wait_read<0>();
    }
}

// The masked layout's work items in order: for each expert g, ceil(rows_g / BLOCK_T) token blocks (rows_g =
// masked_m[g] clamped to [0, M_max]) of num_tiles weight tiles each; experts without rows have none. Every thread
// of a CTA walks the same items (item indices only grow, so the expert cursor only moves forward).
template <uint32_t BLOCK_T>
struct MaskedSchedule {
    const int32_t* masked_m;
    uint32_t shape_m, num_groups, num_tiles;
    uint32_t group = 0, items_before = 0;

    DK_DEVICE uint32_t rows_of(uint32_t g) const {
        return static_cast<uint32_t>(min(max(__ldg(masked_m + g), 0), static_cast<int32_t>(shape_m)));
    }

    // Whether `item` exists; if so its expert, first token, tile and valid tokens (1 .. BLOCK_T).
    DK_DEVICE bool get(uint32_t item, uint32_t& g, uint32_t& t0, uint32_t& tile, uint32_t& num_tokens) {
        while (group < num_groups) {
            const uint32_t rows = rows_of(group);
            const uint32_t items = (rows + BLOCK_T - 1) / BLOCK_T * num_tiles;
            if (item < items_before + items) {
                const uint32_t local = item - items_before;
                g = group;
                t0 = local / num_tiles * BLOCK_T;
                tile = local % num_tiles;
                num_tokens = min(rows - t0, BLOCK_T);
                return true;
            }
            items_before += items;
            ++group;
        }
        return false;
    }
};

// The warpgroup's 64 rows of D^T (accumulators of N tokens) stored straight from the accumulators as D[first_row +
// token, w_first + row] for tokens below num_tokens and columns below shape_n (the masked layout: rows past masked_m
// are never written).
template <uint32_t N>
DK_DEVICE void store_tile_rows(const float (&final_acc)[N / 2], __nv_bfloat16* d, uint32_t shape_n,
                               uint64_t first_row, uint32_t num_tokens, uint32_t w_first) {
    const uint32_t lane_idx = threadIdx.x % 32;
    const uint32_t col = w_first + threadIdx.x / kNumThreadsPerWarpgroup * kWarpgroupBlockM +
                         threadIdx.x / 32 % 4 * 16 + lane_idx / 4;
#pragma unroll
    for (uint32_t j = 0; j < N / 8; ++j) {
#pragma unroll
        for (uint32_t e = 0; e < 4; ++e) {
            const uint32_t token = j * 8 + lane_idx % 4 * 2 + e % 2;
            const uint32_t c = col + e / 2 * 8;
            if (token < num_tokens && c < shape_n)
                d[(first_row + token) * shape_n + c] = __float2bfloat16_rn(final_acc[j * 4 + e]);
        }
    }
}

}  // namespace sm90_fp8_fp4_swap_ab_detail

template <uint32_t BLOCK_T, uint32_t kNumMathWarpgroups, uint32_t kNumStages, typename OutputType, bool kWithAccumulation,
          uint32_t kNumCTAsPerSM, uint32_t kNumChains, bool kPreparedWeights, bool kMasked, bool kTileScaled,
          bool kPipelinedPromotion, uint32_t kClusterSplits>
__global__ void __launch_bounds__(sm90_fp8_fp4_swap_ab_detail::swap_ab_num_threads(kNumMathWarpgroups, kNumCTAsPerSM,
                                                                                   BLOCK_T),
                                  kNumCTAsPerSM)
sm90_fp8_fp4_gemm_swap_ab_impl(const __grid_constant__ CUtensorMap tmap_a, const __grid_constant__ CUtensorMap tmap_codes,
                               const __grid_constant__ CUtensorMap tmap_sfa, const __grid_constant__ CUtensorMap tmap_d,
                               const uint32_t* sfb_words, uint32_t shape_n, uint32_t shape_k, uint32_t num_splits,
                               float* split_workspace,
                               uint32_t* split_tickets, const uint8_t* prepared_weights, const int32_t* masked_m,
                               uint32_t shape_m, uint32_t num_groups, OutputType* d) {
    using namespace sm90_fp8_fp4_swap_ab_detail;
    using Traits = Sm90Fp8Fp4SwapAbTraits<BLOCK_T, kNumMathWarpgroups, kNumStages, OutputType, kWithAccumulation,
                                          kNumCTAsPerSM, kNumChains, kPreparedWeights, kMasked, kTileScaled,
                                          kPipelinedPromotion, kClusterSplits>;
    constexpr uint32_t kNumMathThreads = Traits::kNumMathThreads;

    // Shared memory and barriers
    extern __shared__ __align__(1024) uint8_t smem[];
    auto* barriers = reinterpret_cast<uint64_t*>(smem + Traits::kOffsetBarriers);
    const StageRing<kNumStages, kNumMathThreads / 32, 1> ring{barriers, barriers + kNumStages};
    const uint32_t warp_idx = __shfl_sync(0xffffffff, threadIdx.x / 32, 0);
    const bool is_producer_warpgroup = warp_idx >= kNumMathThreads / 32;
    const bool is_producer = warp_idx == kNumMathThreads / 32;
    if (is_producer && threadIdx.x % 32 == 0) {
        ptx::tma_prefetch_descriptor(&tmap_a);
        if constexpr (!kPreparedWeights)
            ptx::tma_prefetch_descriptor(&tmap_codes);
        ptx::tma_prefetch_descriptor(&tmap_sfa);
        ptx::tma_prefetch_descriptor(&tmap_d);
#pragma unroll
        for (uint32_t s = 0; s < kNumStages; ++s) {
            // The TMA thread's arrival (and unprepared, the 32 lanes' cp.async arrivals); one per math warp to free it.
            ptx::mbarrier_init(ring.full_barriers + s, Traits::kFullArrivals);
            ptx::mbarrier_init(ring.empty_barriers + s, kNumMathThreads / 32);
        }
        ptx::fence_mbarrier_init();
    }
    if (!is_producer_warpgroup) {
        if constexpr (kTileScaled)
            init_pair_tables(reinterpret_cast<uint4*>(smem + Traits::kOffsetTables), threadIdx.x, kNumMathThreads);
        else
            sm90_fp8_gemm_detail::init_fp4_expand_tables(reinterpret_cast<uint2*>(smem + Traits::kOffsetTables),
                                                         threadIdx.x, kNumMathThreads);
    }
    __syncthreads();

    // The CTA's rows and split
    const uint32_t num_tiles = (shape_n + Traits::BLOCK_W - 1) / Traits::BLOCK_W;
    const uint32_t num_k_blocks = shape_k / kScaleBlock;
    if constexpr (kMasked) {
        // Persistent: the CTA takes every gridDim.x-th work item (MaskedSchedule), the ring's position carried over.
        const uint64_t group_bytes = static_cast<uint64_t>((shape_n + kWarpgroupBlockM - 1) / kWarpgroupBlockM) *
                                     num_k_blocks * kPreparedChunkBytes;
        MaskedSchedule<BLOCK_T> schedule{masked_m, shape_m, num_groups, num_tiles};
        PipelineState<kNumStages> state;
        uint32_t group, t0, tile, num_tokens;
        if (is_producer_warpgroup) {
            if constexpr (kNumMathWarpgroups == 2)
                ptx::setmaxnreg_dec<Traits::kNumProducerRegisters>();
            if (!is_producer || threadIdx.x % 32 != 0)
                return;
            for (uint32_t item = blockIdx.x; schedule.get(item, group, t0, tile, num_tokens); item += gridDim.x)
                run_producer<Traits>(ring, smem, &tmap_a, &tmap_codes, &tmap_sfa, sfb_words, shape_n, num_k_blocks,
                                     tile * Traits::BLOCK_W, 0, num_k_blocks, prepared_weights + group * group_bytes,
                                     state, group, t0, masked_item_width<Traits>(num_tokens));
            return;
        }
        if constexpr (kNumMathWarpgroups == 2)
            ptx::setmaxnreg_inc<Traits::kNumMathRegisters>();
        // One item, its wgmma as wide as the A rows the producer loaded (masked_item_width).
        auto run_item = [&](auto width) {
            constexpr uint32_t N = decltype(width)::value;
            float final_acc[N / 2];
            run_math<Traits, N>(ring, smem, final_acc, 0, num_k_blocks, state);
            store_tile_rows<N>(final_acc, d, shape_n, static_cast<uint64_t>(group) * shape_m + t0, num_tokens,
                               tile * Traits::BLOCK_W);
        };
        for (uint32_t item = blockIdx.x; schedule.get(item, group, t0, tile, num_tokens); item += gridDim.x) {
            if constexpr (Traits::kNarrowItems) {
                sm90_fp8_gemm_detail::dispatch_index_exhaustive<0, BLOCK_T / kMaskedTokenStep>(
                    masked_item_width<Traits>(num_tokens) / kMaskedTokenStep - 1, [&](auto index) {
                        run_item(std::integral_constant<uint32_t, (decltype(index)::value + 1) * kMaskedTokenStep>{});
                    });
            } else {
                run_item(std::integral_constant<uint32_t, BLOCK_T>{});
            }
        }
        return;
    }
    // NOTE: a cluster's CTAs are consecutive blocks, so splits in a cluster take the tile from the block index's
    // high part.
    const uint32_t tile_idx = kClusterSplits > 1 ? blockIdx.x / kClusterSplits : blockIdx.x % num_tiles;
    const uint32_t split_idx = kClusterSplits > 1 ? blockIdx.x % kClusterSplits : blockIdx.x / num_tiles;
    const uint32_t w_first = tile_idx * Traits::BLOCK_W;
    const uint32_t k_block_begin = split_idx * num_k_blocks / num_splits;
    const uint32_t k_block_end = (split_idx + 1) * num_k_blocks / num_splits;

    if (is_producer_warpgroup) {
        if constexpr (kNumMathWarpgroups == 2)
            ptx::setmaxnreg_dec<Traits::kNumProducerRegisters>();
        if (!is_producer)
            return;
        PipelineState<kNumStages> state;
        run_producer<Traits>(ring, smem, &tmap_a, &tmap_codes, &tmap_sfa, sfb_words, shape_n, num_k_blocks,
                             w_first, k_block_begin, k_block_end, prepared_weights, state);
        return;
    }
    if constexpr (kNumMathWarpgroups == 2)
        ptx::setmaxnreg_inc<Traits::kNumMathRegisters>();
    float final_acc[BLOCK_T / 2];
    PipelineState<kNumStages> state;
    run_math<Traits>(ring, smem, final_acc, k_block_begin, k_block_end, state);
    // NOTE: D's staging reuses the stages, which the other math warpgroup reads until its K loop ends (every stage's
    // loads have landed by then: the math waited for each).
    ptx::named_barrier_sync(static_cast<uint32_t>(SwapAbBarrier::AllMath), kNumMathThreads);
    if constexpr (kClusterSplits > 1) {
        if (!reduce_splits_in_cluster<Traits>(final_acc, reinterpret_cast<float*>(smem), split_idx))
            return;
    } else if (num_splits > 1 &&
               !reduce_splits<Traits>(final_acc, split_workspace, split_tickets, tile_idx, split_idx, num_splits)) {
        return;
    }
    store_tile<Traits>(final_acc, smem, &tmap_d, w_first);
}

}  // namespace deep_kernels
