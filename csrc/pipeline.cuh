// The full/empty mbarrier ring over kNumStages shared-memory stages, and the stage/phase state that
// walks it. This is the only place phase arithmetic lives.
//
// full_barriers[s]: one arrival (the local producer's arrive_expect_tx) plus the stage's TMA
// transaction bytes, which may come from this CTA's loads or from a cluster peer's multicast.
// empty_barriers[s]: one arrival per consumer warp of every CTA in the cluster, because a stage that a
// peer multicasts into must have been released by the consumers of all destination CTAs.
#pragma once

#include <cstdint>

#include "common/macros.cuh"
#include "ptx/mbarrier.cuh"
#include "ptx/sync.cuh"

namespace deep_kernels {

// Position in the ring: the k-th use of stage s waits for phase k of its barriers, i.e. parity k & 1.
template <uint32_t kNumStages>
struct PipelineState {
    uint32_t stage = 0;
    uint32_t phase = 0;

    DK_DEVICE void advance() {
        if (++stage == kNumStages) {
            stage = 0;
            phase ^= 1;
        }
    }

    // Past n uses at once (the stages of a tile another consumer takes).
    DK_DEVICE void advance_by(uint32_t n) {
        stage += n;
        phase ^= (stage / kNumStages) & 1;
        stage %= kNumStages;
    }
};

template <uint32_t kNumStages, uint32_t kNumConsumerWarps, uint32_t kNumClusterCTAs>
struct StageRing {
    uint64_t* full_barriers;
    uint64_t* empty_barriers;

    // One thread; must be followed by ptx::fence_mbarrier_init() and a CTA or cluster barrier. full_arrivals: the
    // producer's arrive_expect_tx plus any other producer-side arrivals a stage waits for.
    DK_DEVICE void init(uint32_t full_arrivals = 1) const {
#pragma unroll
        for (uint32_t s = 0; s < kNumStages; ++s) {
            ptx::mbarrier_init(full_barriers + s, full_arrivals);
            ptx::mbarrier_init(empty_barriers + s, kNumConsumerWarps * kNumClusterCTAs);
        }
    }

    // Producer: wait until the consumers released the stage's previous use (a fresh ring starts
    // released: waiting on the parity before phase 0 returns at once).
    DK_DEVICE void producer_acquire(const PipelineState<kNumStages>& state) const {
        ptx::mbarrier_wait(empty_barriers + state.stage, state.phase ^ 1);
    }

    // Producer: arm the stage's full barrier with the bytes every TMA into this CTA's stage will deliver,
    // and return it for the loads to complete on.
    DK_DEVICE uint64_t* producer_expect_bytes(const PipelineState<kNumStages>& state, uint32_t bytes) const {
        ptx::mbarrier_arrive_expect_tx(full_barriers + state.stage, bytes);
        return full_barriers + state.stage;
    }

    DK_DEVICE void consumer_wait(const PipelineState<kNumStages>& state) const {
        ptx::mbarrier_wait(full_barriers + state.stage, state.phase);
    }

    // Consumer, called by every lane of each consumer warp once it no longer reads the stage: lane i
    // arrives on cluster CTA i's empty barrier.
    DK_DEVICE void consumer_release(const PipelineState<kNumStages>& state, uint32_t lane_idx) const {
        if constexpr (kNumClusterCTAs == 1)
            ptx::mbarrier_arrive_if(empty_barriers + state.stage, lane_idx == 0);
        else
            ptx::mbarrier_arrive_cluster_if(empty_barriers + state.stage, lane_idx % kNumClusterCTAs,
                                            lane_idx < kNumClusterCTAs);
    }

    // consumer_release where `pred` holds (predicated, not a branch: it may sit between wgmma instructions in flight).
    DK_DEVICE void consumer_release_if(const PipelineState<kNumStages>& state, uint32_t lane_idx, bool pred) const {
        if constexpr (kNumClusterCTAs == 1)
            ptx::mbarrier_arrive_if(empty_barriers + state.stage, pred && lane_idx == 0);
        else
            ptx::mbarrier_arrive_cluster_if(empty_barriers + state.stage, lane_idx % kNumClusterCTAs,
                                            pred && lane_idx < kNumClusterCTAs);
    }

    // consumer_release for a warp whose last reads of the stage were plain shared-memory loads (ld.shared) whose
    // values it may not have used yet. NOTE: the arrive alone does not wait for them: ptxas issues it while such a
    // load is still in flight, and the producer's next TMA into the stage can land before the load reads it. Each
    // lane's fence waits for its loads; the warp then arrives.
    DK_DEVICE void consumer_release_after_loads(const PipelineState<kNumStages>& state, uint32_t lane_idx) const {
        ptx::fence_acq_rel_cta();
        __syncwarp();
        consumer_release(state, lane_idx);
    }
};

}  // namespace deep_kernels
