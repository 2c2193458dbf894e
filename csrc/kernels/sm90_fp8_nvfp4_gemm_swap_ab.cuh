// D = A * W^T (or D += A * W^T) at decode sizes, FP8 activations x NVFP4 weights, with A and B swapped as in
// sm90_fp8_fp4_gemm_swap_ab.cuh (whose split-K reduction and D store it reuses): the weights are wgmma's A operand,
// expanded from their e2m1 codes and E4M3 1x16 scales straight into the f16 register fragment, and the tokens are
// its N (BLOCK_T of them). A [M, K] e4m3 with FP32 1x128 scales sfa (M-major, TMA-aligned), M <= BLOCK_T <= 128;
// W [N, K / 2] e2m1 codes with E4M3 scales per 1x16 ([N, K / 16] bytes) and one FP32 global scale (on the device);
// D [M, N] bf16, or FP32 accumulated into (kWithAccumulation).
// One CTA per (64 * kNumMathWarpgroups weight rows, K split): the producer warpgroup's first warp loads each K
// block's activation tile, codes, sfa and scale bytes into a ring of stages (TMA; cp.async for the scales); each
// math warpgroup owns 64 weight rows, converts the stage's activations to its own f16 tile and expands the next K
// block's fragments while the current block's wgmma group (m64nNk16 f16, eight per block) runs, and promotes per
// 128-deep block with sfa[token] * global_scale. Numerics: gemm/sm90_nvfp4_expand.cuh (exact expansion, one FP32
// promotion per 128-deep block). Split-K as the MXFP4 swapped kernel's (deterministic).
// N (a multiple of 16) and K (of 128) are launch parameters. Unsupported: M > BLOCK_T, grouped kinds.
//
// Host contract (tensor maps as sm90_fp8_fp4_gemm_swap_ab.cuh's, dims innermost first):
//   tmap_a      UINT8 dims {K, M}, box {128, BLOCK_T}, SWIZZLE_128B.
//   tmap_codes  UINT8 dims {K / 2, N}, box {64, 64 * kNumMathWarpgroups}, SWIZZLE_64B.
//   tmap_sfa    FLOAT32 dims {align_up(M, 4), K / 128}, box {BLOCK_T, 1}, SWIZZLE_NONE.
//   tmap_d      D's type, dims {N, M}, box {128 / sizeof(D), BLOCK_T}, SWIZZLE_128B.
//   sfb         the E4M3 scale bytes [N, K / 16] row-major, 4-byte aligned (two 32-bit words per row and K block).
//   global_scale  one FP32 on the device.
//   shape_n, shape_k, num_splits, split_workspace, split_tickets: as the MXFP4 swapped kernel's.
// Launch: grid num_tiles * num_splits (1 <= num_splits <= K / 128), block 128 * (kNumMathWarpgroups + 1), dynamic
// shared memory Sm90Fp8Nvfp4SwapAbTraits::kSmemBytes.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "common/macros.cuh"
#include "common/math.cuh"
#include "gemm/sm90_nvfp4_expand.cuh"
#include "kernels/sm90_fp8_fp4_gemm_swap_ab.cuh"
#include "pipeline.cuh"
#include "ptx/cp_async.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/sync.cuh"
#include "ptx/tma.cuh"
#include "ptx/wgmma.cuh"
#include "ptx/wgmma_register_a.cuh"

namespace deep_kernels {

namespace sm90_fp8_nvfp4_swap_ab_detail {

using sm90_fp8_fp4_swap_ab_detail::SwapAbBarrier;
using sm90_fp8_gemm_detail::kNumThreadsPerWarpgroup;
using sm90_fp8_gemm_detail::kScaleBlock;
using sm90_fp8_gemm_detail::kWarpgroupBlockM;

// NVFP4 groups (and 16-deep f16 wgmma steps) of a 128-deep K block.
constexpr uint32_t kGroupsPerBlock = 8;

template <uint32_t BLOCK_T_, uint32_t kNumMathWarpgroups_, uint32_t kNumStages_, typename OutputType_,
          bool kWithAccumulation_, uint32_t kNumChains_, uint32_t kNumCTAsPerSM_ = 1>
struct Sm90Fp8Nvfp4SwapAbTraits {
    static constexpr uint32_t BLOCK_T = BLOCK_T_;
    static constexpr uint32_t kNumMathWarpgroups = kNumMathWarpgroups_, kNumStages = kNumStages_;
    using OutputType = OutputType_;
    static constexpr bool kWithAccumulation = kWithAccumulation_;
    // Independent wgmma accumulator chains of a K block.
    static constexpr uint32_t kNumChains = kNumChains_;
    // CTAs an SM runs at once (the launch bounds' minimum): two with one math warpgroup of 16 tokens, at 128
    // registers a thread (the math warps of two CTAs hide each other's latency).
    static constexpr uint32_t kNumCTAsPerSM = kNumCTAsPerSM_;

    static constexpr uint32_t BLOCK_W = kWarpgroupBlockM * kNumMathWarpgroups;
    static constexpr uint32_t kNumMathThreads = kNumMathWarpgroups * kNumThreadsPerWarpgroup;
    static constexpr uint32_t kNumThreads = kNumMathThreads + kNumThreadsPerWarpgroup;
    static constexpr uint32_t kNumProducerRegisters = 40, kNumMathRegisters = 232;

    // Shared memory, per stage: the activation tile (BLOCK_T x 128 e4m3, 128-byte swizzle), the codes (BLOCK_W x 64
    // bytes, 64-byte swizzle), sfa (BLOCK_T FP32, padded to 128 bytes), the rows' E4M3 scales (8 bytes a row); then
    // each math warpgroup's two f16 activation tiles (BLOCK_T x 128 f16 as two 64-deep swizzled tiles, 1024-byte
    // aligned), and the full and empty barriers. D's staging reuses the stages once every K block is done.
    static constexpr uint32_t kStageABytes = BLOCK_T * kScaleBlock;
    static constexpr uint32_t kStageCodesBytes = BLOCK_W * kScaleBlock / 2;
    static constexpr uint32_t kStageSfaBytes = align_up<uint32_t>(BLOCK_T * sizeof(float), 128);
    static constexpr uint32_t kStageScalesBytes = BLOCK_W * kGroupsPerBlock;
    static constexpr uint32_t kF16TileBytes = BLOCK_T * kScaleBlock * 2;
    static constexpr uint32_t kOffsetA = 0;
    static constexpr uint32_t kOffsetCodes = kOffsetA + kNumStages * kStageABytes;
    static constexpr uint32_t kOffsetSfa = kOffsetCodes + kNumStages * kStageCodesBytes;
    static constexpr uint32_t kOffsetScales = kOffsetSfa + kNumStages * kStageSfaBytes;
    static constexpr uint32_t kOffsetF16Tiles = align_up<uint32_t>(kOffsetScales + kNumStages * kStageScalesBytes, 1024);
    static constexpr uint32_t kOffsetBarriers = kOffsetF16Tiles + 2 * kNumMathWarpgroups * kF16TileBytes;
    static constexpr uint32_t kSmemBytes = kOffsetBarriers + 2 * kNumStages * sizeof(uint64_t);
    static constexpr uint32_t kStageTxBytes = kStageABytes + kStageCodesBytes + BLOCK_T * sizeof(float);

    // D's staging (as the MXFP4 swapped kernel's store_tile reads it).
    static constexpr uint32_t kBoxCols = 128 / sizeof(OutputType);
    static constexpr uint32_t kBoxBytes = BLOCK_T * 128;
    static constexpr uint32_t kSmemDBytes = BLOCK_W / kBoxCols * kBoxBytes;

    DK_STATIC_ASSERT(BLOCK_T % 16 == 0 && BLOCK_T >= 16 && BLOCK_T <= 128, "BLOCK_T in 16..128, a multiple of 16");
    DK_STATIC_ASSERT(kNumMathWarpgroups == 1 || kNumMathWarpgroups == 2, "one or two math warpgroups");
    DK_STATIC_ASSERT(kNumStages >= 2, "at least two stages");
    DK_STATIC_ASSERT(kNumChains == 1 || kNumChains == 2 || kNumChains == 4, "1, 2 or 4 accumulator chains");
    DK_STATIC_ASSERT((std::is_same_v<OutputType, float> || (std::is_same_v<OutputType, __nv_bfloat16> && !kWithAccumulation)),
                     "bf16 D, or FP32 D (accumulated into with kWithAccumulation)");
    DK_STATIC_ASSERT(kSmemDBytes <= kOffsetBarriers, "D's staging fits before the barriers");
    DK_STATIC_ASSERT(kNumCTAsPerSM == 1 || (kNumCTAsPerSM == 2 && kNumMathWarpgroups == 1 && BLOCK_T == 16),
                     "two CTAs an SM: one math warpgroup, 16 tokens (128 registers)");
    DK_STATIC_ASSERT(kSmemBytes <= (kNumCTAsPerSM == 1 ? sm90_fp8_gemm_detail::kMaxSmemBytes
                                                       : sm90_fp8_fp4_swap_ab_detail::kMaxSmemBytesOfTwo),
                     "stages fit in shared memory");
};

// The producer warp: per K block of the CTA's split, once the stage is free, its loads (load_unprepared_stage: the
// activation tile, the codes, sfa, and each row's E4M3 scale bytes of the block as two words).
template <typename Traits, typename Ring>
DK_DEVICE void run_producer(const Ring& ring, uint8_t* smem, const CUtensorMap* tmap_a, const CUtensorMap* tmap_codes,
                            const CUtensorMap* tmap_sfa, const uint32_t* sfb_words, uint32_t shape_n,
                            uint32_t num_k_blocks, uint32_t w_first, uint32_t k_block_begin, uint32_t k_block_end) {
    PipelineState<Traits::kNumStages> state;
    for (uint32_t k_block = k_block_begin; k_block < k_block_end; ++k_block) {
        ring.producer_acquire(state);
        sm90_fp8_fp4_swap_ab_detail::load_unprepared_stage<Traits, 2>(
            smem, state.stage, ring.full_barriers + state.stage,
            smem + Traits::kOffsetScales + state.stage * Traits::kStageScalesBytes, tmap_a, tmap_codes, tmap_sfa,
            sfb_words, shape_n, num_k_blocks, w_first, k_block);
        state.advance();
    }
}

// One math warpgroup: the K loop of its 64 rows over the split's K blocks into final_acc.
// NOTE: K block i + 1's activations are converted and its fragments expanded (into the other f16 tile and register
// set) while block i's wgmma group runs; the loop is unrolled by two so that each set is named at compile time. The
// f16 tile the next block writes was last read by the previous block's wgmma group, which every thread has waited
// for before the warpgroup's barrier that precedes this block's group.
template <typename Traits, typename Ring>
DK_DEVICE void run_k_loop(const Ring& ring, uint8_t* smem, float (&final_acc)[Traits::BLOCK_T / 2], float global_scale,
                          uint32_t k_block_begin, uint32_t k_block_end) {
    constexpr uint32_t BLOCK_T = Traits::BLOCK_T;
    using State = PipelineState<Traits::kNumStages>;
    using Fragments = sm90_nvfp4_detail::F16Fragments;
    const uint32_t wg_idx = threadIdx.x / kNumThreadsPerWarpgroup;
    const uint32_t lane_idx = threadIdx.x % 32;
    const uint32_t r0 = wg_idx * kWarpgroupBlockM + threadIdx.x / 32 % 4 * 16 + lane_idx / 4;
    const uint32_t q = lane_idx % 4;
    const uint32_t barrier_id = static_cast<uint32_t>(SwapAbBarrier::FirstWarpgroup) + wg_idx;
    uint8_t* f16_tiles[2] = {smem + Traits::kOffsetF16Tiles + (2 * wg_idx) * Traits::kF16TileBytes,
                             smem + Traits::kOffsetF16Tiles + (2 * wg_idx + 1) * Traits::kF16TileBytes};

    auto prepare = [&](Fragments& frag, uint8_t* f16_tile, const State& state) {
        ring.consumer_wait(state);
        sm90_nvfp4_detail::convert_activations<BLOCK_T>(smem + Traits::kOffsetA + state.stage * Traits::kStageABytes,
                                                        f16_tile, threadIdx.x % kNumThreadsPerWarpgroup);
        sm90_nvfp4_detail::expand_fragments(frag, smem + Traits::kOffsetCodes + state.stage * Traits::kStageCodesBytes,
                                            smem + Traits::kOffsetScales + state.stage * Traits::kStageScalesBytes, r0, q);
    };

#pragma unroll
    for (uint32_t i = 0; i < BLOCK_T / 2; ++i)
        final_acc[i] = 0.0f;
    // NOTE: the block's eight k16 steps go round-robin into kNumChains accumulator sets (independent wgmma chains);
    // the sets' FP32 sum in order is the block's partial sum.
    constexpr uint32_t kNumChains = Traits::kNumChains;
    float partial[kNumChains][BLOCK_T / 2];
    Fragments frags[2];
    State state, previous_state;
    prepare(frags[0], f16_tiles[0], state);
    auto step = [&](Fragments& current, Fragments& next, uint8_t* current_tile, uint8_t* next_tile, uint32_t k_block) {
        // The warpgroup's f16 tile, written by generic stores, is read by the async proxy.
        ptx::fence_proxy_async_shared();
        ptx::named_barrier_sync(barrier_id, kNumThreadsPerWarpgroup);
        ptx::wgmma_fence();
#pragma unroll
        for (uint32_t s = 0; s < kGroupsPerBlock; ++s) {
            const uint64_t desc_b = ptx::make_smem_desc_k_major_sw128(current_tile + (s / 4) * BLOCK_T * 128) + (s % 4) * 2;
            ptx::F16WgmmaRegisterA<BLOCK_T>::mma(current.regs[s], desc_b, partial[s % kNumChains],
                                                 s >= kNumChains ? 1u : 0u);
        }
        ptx::wgmma_commit_group();
        // NOTE: the previous block's stage is freed only now. Its promotion read sfa from the stage with plain loads,
        // which an arrive does not wait for (ptxas issued it with the last of them in flight, and the producer's
        // next TMA into the stage could land first); this group's first wgmma overwrites the accumulators that the
        // promotion's FMAs read, so they, and the loads they wait for, are done by now.
        ring.consumer_release_if(previous_state, lane_idx, k_block != k_block_begin);
        State next_state = state;
        next_state.advance();
        const bool has_next = k_block + 1 < k_block_end;
        if (has_next)
            prepare(next, next_tile, next_state);
        ptx::wgmma_wait_group<0>();
#pragma unroll
        for (uint32_t c = 0; c < kNumChains; ++c)
            ptx::fence_operands(partial[c]);
#pragma unroll
        for (uint32_t c = 1; c < kNumChains; ++c) {
#pragma unroll
            for (uint32_t i = 0; i < BLOCK_T / 2; ++i)
                partial[0][i] += partial[c][i];
        }
        sm90_fp8_gemm_detail::promote_per_column<BLOCK_T>(
            partial[0], final_acc, global_scale, global_scale,
            reinterpret_cast<const float*>(smem + Traits::kOffsetSfa + state.stage * Traits::kStageSfaBytes), lane_idx);
        previous_state = state;
        state = next_state;
        return has_next;
    };
    for (uint32_t k_block = k_block_begin;; k_block += 2) {
        if (!step(frags[0], frags[1], f16_tiles[0], f16_tiles[1], k_block) ||
            !step(frags[1], frags[0], f16_tiles[1], f16_tiles[0], k_block + 1))
            break;
    }
    // The last block's stage: no wgmma group follows it, so a fence waits for the promotion's loads.
    ring.consumer_release_after_loads(previous_state, lane_idx);
}

}  // namespace sm90_fp8_nvfp4_swap_ab_detail

template <uint32_t BLOCK_T, uint32_t kNumMathWarpgroups, uint32_t kNumStages, typename OutputType, bool kWithAccumulation,
          uint32_t kNumChains, uint32_t kNumCTAsPerSM>
__global__ void __launch_bounds__(128 + 128 * kNumMathWarpgroups, kNumCTAsPerSM)
sm90_fp8_nvfp4_gemm_swap_ab_impl(const __grid_constant__ CUtensorMap tmap_a, const __grid_constant__ CUtensorMap tmap_codes,
                                 const __grid_constant__ CUtensorMap tmap_sfa, const __grid_constant__ CUtensorMap tmap_d,
                                 const uint32_t* sfb, const float* global_scale, uint32_t shape_n, uint32_t shape_k,
                                 uint32_t num_splits, float* split_workspace, uint32_t* split_tickets) {
    using namespace sm90_fp8_nvfp4_swap_ab_detail;
    using Traits = Sm90Fp8Nvfp4SwapAbTraits<BLOCK_T, kNumMathWarpgroups, kNumStages, OutputType, kWithAccumulation,
                                            kNumChains, kNumCTAsPerSM>;
    constexpr uint32_t kNumMathThreads = Traits::kNumMathThreads;

    extern __shared__ __align__(1024) uint8_t smem[];
    auto* barriers = reinterpret_cast<uint64_t*>(smem + Traits::kOffsetBarriers);
    const StageRing<kNumStages, kNumMathThreads / 32, 1> ring{barriers, barriers + kNumStages};
    const uint32_t warp_idx = __shfl_sync(0xffffffff, threadIdx.x / 32, 0);
    const bool is_producer_warpgroup = warp_idx >= kNumMathThreads / 32;
    const bool is_producer = warp_idx == kNumMathThreads / 32;
    if (is_producer && threadIdx.x % 32 == 0) {
        ptx::tma_prefetch_descriptor(&tmap_a);
        ptx::tma_prefetch_descriptor(&tmap_codes);
        ptx::tma_prefetch_descriptor(&tmap_sfa);
        ptx::tma_prefetch_descriptor(&tmap_d);
#pragma unroll
        for (uint32_t s = 0; s < kNumStages; ++s) {
            ptx::mbarrier_init(ring.full_barriers + s, 1 + 32);
            ptx::mbarrier_init(ring.empty_barriers + s, kNumMathThreads / 32);
        }
        ptx::fence_mbarrier_init();
    }
    __syncthreads();

    const uint32_t num_tiles = (shape_n + Traits::BLOCK_W - 1) / Traits::BLOCK_W;
    const uint32_t num_k_blocks = shape_k / kScaleBlock;
    const uint32_t tile_idx = blockIdx.x % num_tiles;
    const uint32_t split_idx = blockIdx.x / num_tiles;
    const uint32_t w_first = tile_idx * Traits::BLOCK_W;
    const uint32_t k_block_begin = split_idx * num_k_blocks / num_splits;
    const uint32_t k_block_end = (split_idx + 1) * num_k_blocks / num_splits;

    if (is_producer_warpgroup) {
        if constexpr (kNumMathWarpgroups == 2)
            ptx::setmaxnreg_dec<Traits::kNumProducerRegisters>();
        if (!is_producer)
            return;
        run_producer<Traits>(ring, smem, &tmap_a, &tmap_codes, &tmap_sfa, sfb, shape_n, num_k_blocks, w_first,
                             k_block_begin, k_block_end);
        return;
    }
    if constexpr (kNumMathWarpgroups == 2)
        ptx::setmaxnreg_inc<Traits::kNumMathRegisters>();
    float final_acc[BLOCK_T / 2];
    run_k_loop<Traits>(ring, smem, final_acc, __ldg(global_scale), k_block_begin, k_block_end);
    // NOTE: D's staging reuses the stages, which the other math warpgroup reads until its K loop ends.
    ptx::named_barrier_sync(static_cast<uint32_t>(SwapAbBarrier::AllMath), kNumMathThreads);
    if (num_splits > 1 && !sm90_fp8_fp4_swap_ab_detail::reduce_splits<Traits>(final_acc, split_workspace, split_tickets,
                                                                              tile_idx, split_idx, num_splits))
        return;
    sm90_fp8_fp4_swap_ab_detail::store_tile<Traits>(final_acc, smem, &tmap_d, w_first);
}

}  // namespace deep_kernels
