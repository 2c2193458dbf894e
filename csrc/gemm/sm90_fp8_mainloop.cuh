// The SM90 FP8 GEMM's mainloop, one per math warpgroup: it owns the consumer's pipeline state and the
// accumulators. Per K block it waits for the stage, issues the warpgroup's wgmma groups (one per 64-row wave)
// into the partial accumulators and, once they are done, frees the stage and promotes them into the FP32
// final accumulators with sfa[row] * sfb (the recipe's promotion every 128-deep K block; with per-channel B scales,
// Fp8ChannelScaled, and with FP4 weights, whose expanders write it, sfb[column] comes from the stage and the stage
// is freed after the promotion).
// The pipelined K loop (kPipelined) keeps a second partial set, so that K block i + 1's wgmma group runs on the
// tensor cores while block i is promoted. With the ping-pong schedule (gemm/sm90_math_schedule.cuh) the two
// warpgroups take turns running their groups, so that one's group runs while the other promotes.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "common/macros.cuh"
#include "gemm/sm90_fp8_gemm_traits.cuh"
#include "gemm/sm90_sfb_thread_major.cuh"
#include "pipeline.cuh"
#include "ptx/wgmma.cuh"
#include "scheduler.cuh"

namespace deep_kernels {

namespace sm90_fp8_gemm_detail {

// The factors sfa[row] * sfb of one K block for a thread's two rows (lo, hi), against the tile's first and
// second sfb block.
struct PromotionScales {
    float lo, hi, second_lo, second_hi;
};

// final += partial * sfa[row] * sfb: accumulator groups (8 columns each) from kSecondGroup on use the
// second sfb block (kSecondGroup = BLOCK_N / 8: the tile lies in one block).
template <uint32_t BLOCK_N, uint32_t kSecondGroup>
DK_DEVICE void promote(const float (&partial)[BLOCK_N / 2], float (&final_acc)[BLOCK_N / 2],
                       const PromotionScales& scales) {
#pragma unroll
    for (uint32_t j = 0; j < BLOCK_N / 8; ++j) {
        const float lo = j < kSecondGroup ? scales.lo : scales.second_lo;
        const float hi = j < kSecondGroup ? scales.hi : scales.second_hi;
        final_acc[j * 4 + 0] += lo * partial[j * 4 + 0];
        final_acc[j * 4 + 1] += lo * partial[j * 4 + 1];
        final_acc[j * 4 + 2] += hi * partial[j * 4 + 2];
        final_acc[j * 4 + 3] += hi * partial[j * 4 + 3];
    }
}

// A thread's sfb pairs of a stage, 8-column group by group (j in increasing order; thread-major: from an even j on):
// one float2 per group as loaded, or one float4 per two groups where the stage is thread-major
// (gemm/sm90_sfb_thread_major.cuh).
template <bool kThreadMajor>
struct SfbPairs {
    const float* thread_sfb;
    float4 chunk;

    DK_DEVICE SfbPairs(const float* smem_sfb, uint32_t lane_idx)
        : thread_sfb(smem_sfb + sfb_pair_offset<kThreadMajor>(0, lane_idx)) {}

    DK_DEVICE float2 operator()(uint32_t j) {
        if constexpr (kThreadMajor) {
            if (j % 2 == 0)
                chunk = *reinterpret_cast<const float4*>(thread_sfb + sfb_pair_offset<true>(j, 0));
            return j % 2 == 0 ? make_float2(chunk.x, chunk.y) : make_float2(chunk.z, chunk.w);
        } else {
            return *reinterpret_cast<const float2*>(thread_sfb + sfb_pair_offset<false>(j, 0));
        }
    }
};

// final += partial * sfa[row] * sfb[column] (per-channel B scales): the thread's columns 8j + 2 (lane % 4) + {0, 1}
// of each 8-column group j, their scales read from the stage's sfb.
template <uint32_t BLOCK_N, bool kThreadMajor = false>
DK_DEVICE void promote_per_column(const float (&partial)[BLOCK_N / 2], float (&final_acc)[BLOCK_N / 2], float sfa_lo,
                                  float sfa_hi, const float* smem_sfb, uint32_t lane_idx) {
    SfbPairs<kThreadMajor> sfb_pairs(smem_sfb, lane_idx);
#pragma unroll
    for (uint32_t j = 0; j < BLOCK_N / 8; ++j) {
        const float2 sfb = sfb_pairs(j);
        final_acc[j * 4 + 0] += sfa_lo * sfb.x * partial[j * 4 + 0];
        final_acc[j * 4 + 1] += sfa_lo * sfb.y * partial[j * 4 + 1];
        final_acc[j * 4 + 2] += sfa_hi * sfb.x * partial[j * 4 + 2];
        final_acc[j * 4 + 3] += sfa_hi * sfb.y * partial[j * 4 + 3];
    }
}

// promote_per_column with the sfb pairs of the first kNumPreloaded 8-column groups already in registers (loaded before
// the wgmma group's wait, so that their latency hides behind it).
template <uint32_t BLOCK_N, uint32_t kNumPreloaded, bool kThreadMajor>
DK_DEVICE void promote_per_column_preloaded(const float (&partial)[BLOCK_N / 2], float (&final_acc)[BLOCK_N / 2],
                                            float sfa_lo, float sfa_hi, const float2 (&preloaded)[kNumPreloaded],
                                            SfbPairs<kThreadMajor>& sfb_pairs) {
#pragma unroll
    for (uint32_t j = 0; j < BLOCK_N / 8; ++j) {
        const float2 sfb = j < kNumPreloaded ? preloaded[j < kNumPreloaded ? j : 0] : sfb_pairs(j);
        final_acc[j * 4 + 0] += sfa_lo * sfb.x * partial[j * 4 + 0];
        final_acc[j * 4 + 1] += sfa_lo * sfb.y * partial[j * 4 + 1];
        final_acc[j * 4 + 2] += sfa_hi * sfb.x * partial[j * 4 + 2];
        final_acc[j * 4 + 3] += sfa_hi * sfb.y * partial[j * 4 + 3];
    }
}

// Calls f(std::integral_constant<uint32_t, i>) for the runtime index i < sizeof...(Is).
template <typename F, uint32_t... Is>
DK_DEVICE void dispatch_index(uint32_t i, F&& f, std::integer_sequence<uint32_t, Is...>) {
    ((i == Is ? (f(std::integral_constant<uint32_t, Is>{}), 0) : 0), ...);
}

// Calls f(std::integral_constant<uint32_t, i>) for the runtime index i < kCount, the last index taken for any i past
// the others (no path calls none).
template <uint32_t kIndex, uint32_t kCount, typename F>
DK_DEVICE void dispatch_index_exhaustive(uint32_t i, F&& f) {
    if constexpr (kIndex + 1 == kCount) {
        f(std::integral_constant<uint32_t, kIndex>{});
    } else {
        if (i == kIndex)
            f(std::integral_constant<uint32_t, kIndex>{});
        else
            dispatch_index_exhaustive<kIndex + 1, kCount>(i, f);
    }
}

// The rows of sfb (one per K block) of a tile's first 128-wide block of columns and of the next one.
struct SfbBlocks {
    const float* first;
    const float* second;
};

// A K block whose wgmma group was issued ahead (the first of a tile, issued during the previous tile's
// epilogue): its promotion scales and the stage it reads, which it frees when retired.
template <uint32_t kNumStages>
struct IssuedKBlock {
    PromotionScales scales;
    PipelineState<kNumStages> state;
    // Pipelined 256-row tiles: both waves' groups are issued ahead; the second wave's scales.
    PromotionScales second_wave_scales;
};

template <typename Traits, typename Ring>
struct Sm90Fp8Mainloop {
    static constexpr uint32_t BLOCK_N = Traits::BLOCK_N;
    static constexpr uint32_t kNumKBlocks = Traits::kNumKBlocks;
    static constexpr uint32_t kNumMWaves = Traits::kNumMWaves;
    static constexpr bool kPingPong = Traits::kMathSchedule == MathSchedule::PingPong;
    static constexpr bool kOwnTiles = Traits::kOwnTiles;
    // Per-channel B scales, plain K loop of one 64-row wave: the sfb pairs of the promotion's first 8-column groups are
    // loaded before the wgmma group's wait, so that their latency hides behind it; as many as fit in the registers left
    // beside the partial and final accumulators below kPreloadRegisters (by math warpgroups; measured with ptxas: more
    // spill at 64 x 192, and 128 x 192 took a stack frame at 16 pairs, with the epilogue overlap or without it, dense,
    // split-K or k-grouped). Two-wave tiles (whose accumulators leave too few registers) and the pipelined loops preload
    // none.
    static constexpr uint32_t kPreloadRegisters = Traits::kNumMathWarpgroups == 1 ? 216 : 208;
    static constexpr uint32_t kAccumulatorRegisters = (kNumMWaves + 1) * BLOCK_N / 2;
    // (Thread-major sfb: an even count, whole float4 loads.)
    static constexpr uint32_t kNumPreloadedSfbPairs =
        !Traits::kIsChannelScaled || Traits::kPipelined || kNumMWaves > 1 || kAccumulatorRegisters >= kPreloadRegisters
            ? 0
            : ((kPreloadRegisters - kAccumulatorRegisters) / 2 < BLOCK_N / 8 ? (kPreloadRegisters - kAccumulatorRegisters) / 2
                                                                              : BLOCK_N / 8);
    static constexpr uint32_t kNumPreloadedSfb =
        Traits::kThreadMajorSfb ? kNumPreloadedSfbPairs / 2 * 2 : kNumPreloadedSfbPairs;
    static constexpr bool kThreadMajorSfb = Traits::kThreadMajorSfb;
    using State = PipelineState<Traits::kNumStages>;
    static constexpr bool kIsMGrouped =
        Traits::kGemmType == GemmType::MGroupedContiguous || Traits::kGemmType == GemmType::MGroupedMasked;
    // M-grouped two-wave tiles with block scales: where a tile's first K block was issued ahead (the epilogue overlap's
    // steady state), the pipeline state is taken from lane 0 once per tile, so that ptxas sees the K loop's stages as
    // warp-uniform (the walk over tiles, fed by global loads, hides it) and builds the wgmma descriptors in uniform
    // registers without a shuffle every K block (on the other path the shuffle gave the shorter loop).
    static constexpr bool kUniformTileState =
        kIsMGrouped && kNumMWaves == 2 && Traits::kOperands == GemmOperands::Fp8BlockScaled;

    const typename Traits::Stages& stages;
    const Ring& ring;
    const float* sfb;
    // The warpgroup's first A row in a stage, as wg_idx() from a shuffle: ptxas then knows it to be warp-uniform and
    // builds the wgmma descriptors in uniform registers instead of per thread, every K block.
    const uint32_t a_row_offset;

    State state;
    float partial[BLOCK_N / 2];
    // Only the pipelined K loop uses it (the compiler drops it otherwise).
    float partial_next[BLOCK_N / 2];
    // Only the pipelined halves use them: the partial sums of a K block's first and second BLOCK_N / 2 columns.
    float partial_half0[BLOCK_N / 4];
    float partial_half1[BLOCK_N / 4];
    float final_acc[kNumMWaves][BLOCK_N / 2];

    DK_DEVICE Sm90Fp8Mainloop(const typename Traits::Stages& stages, const Ring& ring, const float* sfb)
        : stages(stages), ring(ring), sfb(sfb),
          a_row_offset(__shfl_sync(0xffffffff, wg_idx(), 0) * Traits::kWarpgroupRowWaves * kWarpgroupBlockM) {}

    DK_DEVICE static uint32_t wg_idx() { return threadIdx.x / kNumThreadsPerWarpgroup; }
    DK_DEVICE static uint32_t lane_idx() { return threadIdx.x % 32; }
    // This thread's accumulator rows inside the tile in its first wave: row_lo and row_lo + 8 (64 more per wave).
    DK_DEVICE static uint32_t row_lo() {
        return wg_idx() * Traits::kWarpgroupRowWaves * kWarpgroupBlockM + (threadIdx.x / 32 % 4) * 16 + lane_idx() / 4;
    }

    // The tile's first sfb block and the next one (the first again past the last block: a straddling tile past
    // the last sfb block only has columns past N, which are never stored).
    DK_DEVICE SfbBlocks sfb_blocks(const TileInfo& tile) const {
        if constexpr (Traits::kHasColumnScales)
            return {};
        const uint32_t n_first = tile.n_block_idx * BLOCK_N;
        const uint32_t sfb_row = (Traits::kGemmType == GemmType::Normal ? 0 : tile.group_idx * Traits::kNumSfbRows) +
                                 n_first / kScaleBlock;
        const float* first = sfb + sfb_row * kNumKBlocks;
        return {first, first + (n_first / kScaleBlock + 1 < Traits::kNumSfbRows ? kNumKBlocks : 0)};
    }

    // Waits for the K block's stage (the first wave; the others follow it), issues its wgmma group for the
    // warpgroup's 64-row wave `wave` into `acc` and returns its promotion scales (the second sfb block's only where
    // the tile straddles two; per-channel B scales: sfa alone, as lo and hi, sfb is read at the promotion).
    template <typename Straddles, bool kStateUniform = false>
    DK_DEVICE PromotionScales issue_k_block(Straddles, const SfbBlocks& sfb_rows, float (&acc)[BLOCK_N / 2],
                                            uint32_t k_block, const State& k_state, uint32_t wave = 0,
                                            std::bool_constant<kStateUniform> = {}) {
        // NOTE: the stage from a shuffle too where the K loop hides that it is warp-uniform (the descriptors would
        // otherwise be built per thread, four register moves between consecutive wgmma): the one-wave loops and the
        // M-grouped kinds' two-wave loop, whose tiles come from values loaded from global memory. The dense two-wave
        // loop keeps it uniform by itself, and the per-column kinds have no register to spare for it (the k-grouped
        // 128 x 128 pipelined tile spills). The M-grouped kinds shuffle and build the descriptors before the wait, so
        // that they are ready when the stage is (after it, their latency delayed every K block's first wgmma); not
        // where the caller made the state uniform once per tile (kStateUniform).
        constexpr bool kShuffleStage = (kNumMWaves == 1 || (kIsMGrouped && !kStateUniform)) &&
                                       !Traits::kHasColumnScales;
        constexpr bool kDescriptorsFirst = kShuffleStage && kIsMGrouped;
        uint64_t desc_a, desc_b;
        const auto make_descriptors = [&]() {
            const uint32_t stage = kShuffleStage ? __shfl_sync(0xffffffff, k_state.stage, 0) : k_state.stage;
            desc_a = ptx::make_smem_desc_k_major_sw128(stages.a_stage(stage) +
                                                       (a_row_offset + wave * kWarpgroupBlockM) * Traits::BLOCK_K);
            desc_b = ptx::make_smem_desc_k_major_sw128(stages.b_stage(stage));
        };
        if constexpr (kDescriptorsFirst)
            make_descriptors();

        PromotionScales scales;
        if constexpr (Traits::kHasColumnScales) {
            if (wave == 0)
                ring.consumer_wait(k_state);
            const float* smem_sfa = stages.sfa_stage(k_state.stage) + wave * kWarpgroupBlockM;
            scales = {smem_sfa[row_lo()], smem_sfa[row_lo() + 8], 0.0f, 0.0f};
        } else {
            // NOTE: sfb comes from global memory; its latency hides behind the wgmma group.
            const float sfb_0 = __ldg(sfb_rows.first + k_block);
            const float sfb_1 = Straddles::value ? __ldg(sfb_rows.second + k_block) : sfb_0;
            if (wave == 0)
                ring.consumer_wait(k_state);
            const float* smem_sfa = stages.sfa_stage(k_state.stage) + wave * kWarpgroupBlockM;
            const float sfa_lo = smem_sfa[row_lo()];
            const float sfa_hi = smem_sfa[row_lo() + 8];
            scales = {sfa_lo * sfb_0, sfa_hi * sfb_0, sfa_lo * sfb_1, sfa_hi * sfb_1};
        }

        if constexpr (!kDescriptorsFirst)
            make_descriptors();
        if constexpr (kPingPong)
            MathTurns(wg_idx()).wait();
        ptx::wgmma_fence();
#pragma unroll
        for (uint32_t k = 0; k < Traits::BLOCK_K / kWgmmaK; ++k) {
            // Descriptor addresses are in 16-byte units: one k32 step of e4m3 is 32 bytes.
            const uint64_t k_offset = k * kWgmmaK / 16;
            ptx::Fp8Wgmma<BLOCK_N>::mma(desc_a + k_offset, desc_b + k_offset, acc, k > 0 ? 1u : 0u);
        }
        ptx::wgmma_commit_group();
        return scales;
    }

    // Once at most NumPending later groups are in flight, `acc`'s group is done: frees its stage (after the
    // last wave reading it) and adds it into the wave's final accumulators.
    template <uint32_t kSecondGroup, typename NumPending>
    DK_DEVICE void retire_k_block(NumPending, float (&acc)[BLOCK_N / 2], const PromotionScales& scales,
                                  const State& k_state, uint32_t wave = 0) {
        if constexpr (kNumPreloadedSfb > 0) {
            // The first groups' sfb pairs are loaded before the wait, so that the promotion starts without waiting for
            // shared memory.
            SfbPairs<kThreadMajorSfb> sfb_pairs(stages.sfb_stage(k_state.stage), lane_idx());
            float2 preloaded[kNumPreloadedSfb];
#pragma unroll
            for (uint32_t j = 0; j < kNumPreloadedSfb; ++j)
                preloaded[j] = sfb_pairs(j);
            ptx::wgmma_wait_group<NumPending::value>();
            ptx::fence_operands(acc);
            if constexpr (kPingPong)
                MathTurns(wg_idx()).pass();
            promote_per_column_preloaded<BLOCK_N, kNumPreloadedSfb>(acc, final_acc[wave], scales.lo, scales.hi,
                                                                    preloaded, sfb_pairs);
            ring.consumer_release(k_state, lane_idx());
            return;
        }
        ptx::wgmma_wait_group<NumPending::value>();
        ptx::fence_operands(acc);
        if constexpr (kPingPong)
            MathTurns(wg_idx()).pass();
        if constexpr (Traits::kHasColumnScales) {
            // The promotion reads the stage's sfb, so the stage is freed after it.
            promote_per_column<BLOCK_N, kThreadMajorSfb>(acc, final_acc[wave], scales.lo, scales.hi,
                                                         stages.sfb_stage(k_state.stage), lane_idx());
            if (wave == kNumMWaves - 1)
                ring.consumer_release(k_state, lane_idx());
        } else {
            if (wave == kNumMWaves - 1)
                ring.consumer_release(k_state, lane_idx());
            promote<BLOCK_N, kSecondGroup>(acc, final_acc[wave], scales);
        }
    }

    // The first K block of the next tile, issued ahead into `partial` (the epilogue overlap).
    DK_DEVICE IssuedKBlock<Traits::kNumStages> issue_ahead(const TileInfo& next) {
        IssuedKBlock<Traits::kNumStages> first;
        first.state = state;
        if constexpr (Traits::kPipelinedHalves) {
            first.scales = issue_first_half(state);
        } else {
            first.scales = issue_k_block(std::true_type{}, sfb_blocks(next), partial, tile_k_block_begin<Traits>(next),
                                         state);
            if constexpr (Traits::kPipelinedWaves)
                first.second_wave_scales = issue_k_block(std::true_type{}, sfb_blocks(next), partial_next,
                                                         tile_k_block_begin<Traits>(next), state, 1);
        }
        state.advance();
        return first;
    }

    // The tile's K loop into final_acc; `first` is its first K block if that was issued ahead (into `partial`),
    // else std::false_type.
    // NOTE: one K loop per possible straddle point keeps the per-column scale choice out of the loop (per-channel B
    // scales have no straddle point: one K loop).
    template <typename First>
    DK_DEVICE void accumulate(const TileInfo& tile, First first) {
        if constexpr (Traits::kHasColumnScales) {
            accumulate_tile(tile, std::integral_constant<uint32_t, 0>{}, first);
            return;
        }
        const uint32_t tile_offset_idx = tile.n_block_idx * BLOCK_N % kScaleBlock / Traits::kTileOffsetStep;
        // NOTE: pipelined 256-row tiles take the last offset's K loop for any index past the others: with a path that
        // runs no K loop (the plain dispatch's), ptxas serializes every wgmma of the K loops that retire the groups
        // issued ahead (C7514) wherever there are more than two offsets.
        if constexpr (Traits::kPipelinedWaves) {
            dispatch_index_exhaustive<0, Traits::kNumTileOffsets>(
                tile_offset_idx, [&](auto offset_idx) { accumulate_tile(tile, offset_idx, first); });
            return;
        }
        dispatch_index(
            tile_offset_idx, [&](auto offset_idx) { accumulate_tile(tile, offset_idx, first); },
            std::make_integer_sequence<uint32_t, Traits::kNumTileOffsets>{});
    }

    // Lockstep partner of a valid tile (never with split-K): consume the stages so the cluster's barriers stay in
    // step.
    DK_DEVICE void skip_tile(const TileInfo& tile) {
        const uint32_t num_k_blocks = Traits::kIsKGrouped ? tile.num_k_blocks : kNumKBlocks;
        for (uint32_t k_block = 0; k_block < num_k_blocks; ++k_block) {
            ring.consumer_wait(state);
            ring.consumer_release(state, lane_idx());
            state.advance();
        }
    }

private:
    // Lane 0's pipeline state in every lane (kUniformTileState), else the state.
    DK_DEVICE static State warp_uniform(State s) {
        if constexpr (kUniformTileState) {
            s.stage = __shfl_sync(0xffffffffu, s.stage, 0);
            s.phase = __shfl_sync(0xffffffffu, s.phase, 0);
        }
        return s;
    }

    // The K loop of one tile whose first column sits kTileOffset columns into its sfb block.
    template <typename TileOffsetIdx, typename First>
    DK_DEVICE void accumulate_tile(const TileInfo& tile, TileOffsetIdx, First first) {
        constexpr bool kIssuedAhead = !std::is_same_v<First, std::false_type>;
        constexpr uint32_t kTileOffset = TileOffsetIdx::value * Traits::kTileOffsetStep;
        constexpr uint32_t kSecondGroup = (kScaleBlock - kTileOffset < BLOCK_N ? kScaleBlock - kTileOffset : BLOCK_N) / 8;
        constexpr std::integral_constant<bool, (kSecondGroup < BLOCK_N / 8)> kStraddles;
        constexpr std::integral_constant<int, 0> kNoneInFlight;
        constexpr std::integral_constant<int, 1> kOneInFlight;
        const SfbBlocks sfb_rows = sfb_blocks(tile);
        // A tile whose first K block was issued ahead: the pipeline state from lane 0 (kUniformTileState).
        constexpr std::bool_constant<kIssuedAhead && kUniformTileState> kStateUniform;
        if constexpr (kStateUniform) {
            state = warp_uniform(state);
            first.state = warp_uniform(first.state);
        }
        auto issue = [&](float(&acc)[BLOCK_N / 2], uint32_t k_block) {
            return issue_k_block(kStraddles, sfb_rows, acc, k_block, state, 0, kStateUniform);
        };
        auto retire = [&](auto num_pending, float(&acc)[BLOCK_N / 2], const PromotionScales& scales,
                          const State& k_state, uint32_t wave = 0) {
            retire_k_block<kSecondGroup>(num_pending, acc, scales, k_state, wave);
        };

#pragma unroll
        for (uint32_t wave = 0; wave < kNumMWaves; ++wave) {
#pragma unroll
            for (uint32_t i = 0; i < BLOCK_N / 2; ++i)
                final_acc[wave][i] = 0.0f;
        }
        const uint32_t k_block_begin = tile_k_block_begin<Traits>(tile);
        const uint32_t k_block_end = tile_k_block_end<Traits>(tile);
        // Own tiles: the turn passes to the other warpgroup once the tile's last wgmma group is issued.
        auto pass_turn_after = [&](uint32_t issued_k_block) {
            if constexpr (kOwnTiles) {
                if (issued_k_block + 1 == k_block_end)
                    MathTurns(wg_idx()).pass();
            }
        };
        // KGrouped: an empty group's tile has no K block (its D is zeros, or C). A tile whose first K block was issued
        // ahead has one (the kernel issues ahead only then): no exit test, which would leave its group in flight on a
        // path of its own, where ptxas waits for every group (C7517, C7518).
        if constexpr (Traits::kIsKGrouped && !kIssuedAhead) {
            if (k_block_begin == k_block_end)
                return;
        }
        if constexpr (Traits::kPipelinedHalves) {
            accumulate_halves(k_block_begin, k_block_end, first);
        } else if constexpr (Traits::kPipelinedWaves) {
            accumulate_waves<kSecondGroup>(kStraddles, sfb_rows, k_block_begin, k_block_end, first);
        } else if constexpr (!Traits::kPipelined) {
            uint32_t k_block = k_block_begin;
            if constexpr (kIssuedAhead) {
                retire(kNoneInFlight, partial, first.scales, first.state);
                // 256-row tiles: the block issued ahead was its first wave's; the other follows here.
#pragma unroll
                for (uint32_t wave = 1; wave < kNumMWaves; ++wave) {
                    const PromotionScales scales =
                        issue_k_block(kStraddles, sfb_rows, partial, k_block, first.state, wave, kStateUniform);
                    retire(kNoneInFlight, partial, scales, first.state, wave);
                }
                ++k_block;
            }
            for (; k_block < k_block_end; ++k_block) {
                // NOTE: the waves share the stage's B; each wave's promotion overlaps the other warpgroup's wgmma.
#pragma unroll
                for (uint32_t wave = 0; wave < kNumMWaves; ++wave) {
                    const PromotionScales scales =
                        issue_k_block(kStraddles, sfb_rows, partial, k_block, state, wave, kStateUniform);
                    if (wave == kNumMWaves - 1)
                        pass_turn_after(k_block);
                    retire(kNoneInFlight, partial, scales, state, wave);
                }
                state.advance();
            }
        } else {
            // Two accumulator sets: K block i + 1's wgmma group runs on the tensor cores while block i is
            // promoted. The loop is unrolled by two so that each set is named at compile time. The first block's
            // group goes to `partial` (unless it was issued ahead).
            State retiring = state;
            PromotionScales scales;
            if constexpr (kIssuedAhead) {
                retiring = first.state;
                scales = first.scales;
            } else {
                scales = issue(partial, k_block_begin);
                pass_turn_after(k_block_begin);
                state.advance();
            }
            for (uint32_t k_block = k_block_begin + 1;; k_block += 2) {
                if (k_block == k_block_end) {
                    retire(kNoneInFlight, partial, scales, retiring);
                    break;
                }
                const PromotionScales next_scales = issue(partial_next, k_block);
                pass_turn_after(k_block);
                retire(kOneInFlight, partial, scales, retiring);
                retiring = state;
                state.advance();
                if (k_block + 1 == k_block_end) {
                    retire(kNoneInFlight, partial_next, next_scales, retiring);
                    break;
                }
                scales = issue(partial, k_block + 1);
                pass_turn_after(k_block + 1);
                retire(kOneInFlight, partial_next, next_scales, retiring);
                retiring = state;
                state.advance();
            }
        }
    }

    // The pipelined two-wave K loop (Traits::kPipelinedWaves, 256-row tiles): the warpgroup's groups run in the order
    // (k, wave 0), (k, wave 1), (k + 1, wave 0), ..., wave 0's into `partial` and wave 1's into `partial_next`; each
    // is promoted while the next one runs, so the tensor cores keep working through the promotion. Each wave's
    // promotions are those of the plain loop, in the same order. A K block's two groups are issued together (the
    // first block's ahead of the loop, or during the previous tile's store), then wave 0's is promoted under wave 1's,
    // and each wave's next group is issued as soon as its partial sums are promoted.
    template <uint32_t kSecondGroup, typename Straddles, typename First>
    DK_DEVICE void accumulate_waves(Straddles, const SfbBlocks& sfb_rows, uint32_t k_block_begin, uint32_t k_block_end,
                                    First first) {
        constexpr std::integral_constant<int, 0> kNoneInFlight;
        constexpr std::integral_constant<int, 1> kOneInFlight;
        // The K block being retired: its stage and its waves' promotion scales (both its groups in flight).
        uint32_t k_block = k_block_begin;
        State retiring = state;
        PromotionScales scales, wave1_scales;
        if constexpr (!std::is_same_v<First, std::false_type>) {
            retiring = first.state;
            scales = first.scales;
            wave1_scales = first.second_wave_scales;
        } else {
            scales = issue_k_block(Straddles{}, sfb_rows, partial, k_block, state);
            wave1_scales = issue_k_block(Straddles{}, sfb_rows, partial_next, k_block, state, 1);
            state.advance();
        }
        // The last K block: both waves promoted, its stage freed.
        auto finish = [&]() {
            retire_k_block<kSecondGroup>(kOneInFlight, partial, scales, retiring, 0);
            retire_k_block<kSecondGroup>(kNoneInFlight, partial_next, wave1_scales, retiring, 1);
        };
        // A K block with a next one: each wave promoted, then its group of the next block issued; the stage freed.
        auto step = [&]() {
            retire_k_block<kSecondGroup>(kOneInFlight, partial, scales, retiring, 0);
            scales = issue_k_block(Straddles{}, sfb_rows, partial, k_block + 1, state);
            retire_k_block<kSecondGroup>(kOneInFlight, partial_next, wave1_scales, retiring, 1);
            wave1_scales = issue_k_block(Straddles{}, sfb_rows, partial_next, k_block + 1, state, 1);
            retiring = state;
            state.advance();
            ++k_block;
        };
        // NOTE: unrolled by two K blocks, each step after its own exit test, as the pipelined halves (one exit, or
        // an issue at the loop's head, lets ptxas serialize every wgmma).
        for (uint32_t next = k_block_begin + 1;; next += 2) {
            if (next == k_block_end) {
                finish();
                break;
            }
            step();
            if (next + 1 == k_block_end) {
                finish();
                break;
            }
            step();
        }
    }

    // The pipelined halves (per-channel B scales, Traits::kPipelinedHalves): half h of a K block is the wgmma group of
    // its columns [h * BLOCK_N / 2, (h + 1) * BLOCK_N / 2) into partial_half<h>. The groups run in the order (k, 0),
    // (k, 1), (k + 1, 0), ...; each half is promoted while the next group runs (one group in flight), so the tensor
    // cores keep working through the per-column promotion.
    template <uint32_t kHalf>
    DK_DEVICE float (&half_acc())[BLOCK_N / 4] {
        if constexpr (kHalf == 0)
            return partial_half0;
        else
            return partial_half1;
    }

    template <uint32_t kHalf>
    DK_DEVICE void issue_half(uint32_t stage) {
        constexpr uint32_t kHalfN = BLOCK_N / 2;
        const uint64_t desc_a = ptx::make_smem_desc_k_major_sw128(stages.a_stage(stage) + a_row_offset * Traits::BLOCK_K);
        const uint64_t desc_b = ptx::make_smem_desc_k_major_sw128(stages.b_stage(stage) + kHalf * kHalfN * Traits::BLOCK_K);
        ptx::wgmma_fence();
#pragma unroll
        for (uint32_t k = 0; k < Traits::BLOCK_K / kWgmmaK; ++k) {
            const uint64_t k_offset = k * kWgmmaK / 16;
            ptx::Fp8Wgmma<kHalfN>::mma(desc_a + k_offset, desc_b + k_offset, half_acc<kHalf>(), k > 0 ? 1u : 0u);
        }
        ptx::wgmma_commit_group();
    }

    // Waits for the K block's stage and issues its first half; returns its sfa (lo, hi).
    DK_DEVICE PromotionScales issue_first_half(const State& k_state) {
        ring.consumer_wait(k_state);
        const float* smem_sfa = stages.sfa_stage(k_state.stage);
        const PromotionScales scales = {smem_sfa[row_lo()], smem_sfa[row_lo() + 8], 0.0f, 0.0f};
        issue_half<0>(k_state.stage);
        return scales;
    }

    // A half is BLOCK_N / 16 8-column groups (an even count: BLOCK_N is a multiple of 32, 160 or 192). The sfb pairs of
    // its first kAheadSfbPairs groups are loaded one step ahead, the others at the promotion (an even count:
    // thread-major, whole float4s). On the H200 (2026-12-03, weight gradients at 4096 x 7168, 128 x 160, timed in turns,
    // bitwise equal) all 10 ran 0.95x and 0.90x as fast as 8; at 192 columns 10 spill, and with BF16 D 8 (ptxas).
    static constexpr uint32_t kHalfSfbPairs = BLOCK_N / 16;
    static constexpr uint32_t kMaxAheadSfbPairs = BLOCK_N == 192 && sizeof(typename Traits::OutputType) == 2 ? 6 : 8;
    static constexpr uint32_t kAheadSfbPairs =
        kHalfSfbPairs < kMaxAheadSfbPairs ? kHalfSfbPairs : kMaxAheadSfbPairs;
    using AheadSfb = float2[kAheadSfbPairs];

    template <uint32_t kHalf>
    DK_DEVICE void load_half_sfb(uint32_t stage, AheadSfb& pairs) const {
        SfbPairs<kThreadMajorSfb> sfb_pairs(stages.sfb_stage(stage), lane_idx());
#pragma unroll
        for (uint32_t j = 0; j < kAheadSfbPairs; ++j)
            pairs[j] = sfb_pairs(kHalf * kHalfSfbPairs + j);
    }

    // Once at most kNumPending later groups are in flight, half kHalf of the K block is done: adds it into its columns
    // of the final accumulators (the same products, in the same order, as promote_per_column).
    template <uint32_t kHalf, int kNumPending>
    DK_DEVICE void retire_half(const PromotionScales& scales, const AheadSfb& ahead, uint32_t stage) {
        SfbPairs<kThreadMajorSfb> sfb_pairs(stages.sfb_stage(stage), lane_idx());
        ptx::wgmma_wait_group<kNumPending>();
        float(&acc)[BLOCK_N / 4] = half_acc<kHalf>();
        ptx::fence_operands(acc);
#pragma unroll
        for (uint32_t j = 0; j < kHalfSfbPairs; ++j) {
            constexpr uint32_t kOut = kHalf * (BLOCK_N / 4);
            const float2 sfb =
                j < kAheadSfbPairs ? ahead[j < kAheadSfbPairs ? j : 0] : sfb_pairs(kHalf * kHalfSfbPairs + j);
            final_acc[0][kOut + j * 4 + 0] += scales.lo * sfb.x * acc[j * 4 + 0];
            final_acc[0][kOut + j * 4 + 1] += scales.lo * sfb.y * acc[j * 4 + 1];
            final_acc[0][kOut + j * 4 + 2] += scales.hi * sfb.x * acc[j * 4 + 2];
            final_acc[0][kOut + j * 4 + 3] += scales.hi * sfb.y * acc[j * 4 + 3];
        }
    }

    // The tile's K loop (kPipelinedHalves); `first` as for accumulate (its first half issued ahead).
    template <typename First>
    DK_DEVICE void accumulate_halves(uint32_t k_block_begin, uint32_t k_block_end, First first) {
        State retiring = state;
        PromotionScales scales;
        if constexpr (!std::is_same_v<First, std::false_type>) {
            retiring = first.state;
            scales = first.scales;
        } else {
            scales = issue_first_half(state);
            state.advance();
        }
        // NOTE: the sfb pairs of the half promoted next are loaded one step ahead, before the wgmma issue and wait
        // that precede their use: loaded next to their use, their latency (long while the wgmma groups read the
        // stages) stalled the promotion.
        AheadSfb sfb;
        load_half_sfb<0>(retiring.stage, sfb);
        // The last K block: its second half issued, both halves promoted, its stage freed.
        auto finish = [&]() {
            issue_half<1>(retiring.stage);
            retire_half<0, 1>(scales, sfb, retiring.stage);
            load_half_sfb<1>(retiring.stage, sfb);
            retire_half<1, 0>(scales, sfb, retiring.stage);
            ring.consumer_release(retiring, lane_idx());
        };
        // A K block with a next one: its second half issued, its first half promoted, the next block's first half
        // issued, its second half promoted, its stage freed.
        auto step = [&]() {
            issue_half<1>(retiring.stage);
            retire_half<0, 1>(scales, sfb, retiring.stage);
            load_half_sfb<1>(retiring.stage, sfb);
            const PromotionScales next_scales = issue_first_half(state);
            retire_half<1, 1>(scales, sfb, retiring.stage);
            ring.consumer_release(retiring, lane_idx());
            retiring = state;
            scales = next_scales;
            state.advance();
            load_half_sfb<0>(retiring.stage, sfb);
        };
        // NOTE: unrolled by two K blocks, each step after its own exit test: in the shapes that issue the second half
        // right at the loop's head, or exit only once, ptxas serializes every wgmma (C7514) or spills.
        for (uint32_t k_block = k_block_begin + 1;; k_block += 2) {
            if (k_block == k_block_end) {
                finish();
                break;
            }
            step();
            if (k_block + 1 == k_block_end) {
                finish();
                break;
            }
            step();
        }
    }
};

}  // namespace sm90_fp8_gemm_detail

}  // namespace deep_kernels
