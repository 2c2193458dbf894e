"""Split-K with a tile's splits as one cluster (Fp8GemmConfig.splits_in_cluster, the kernel's kSplitsInCluster): the
leader CTA sums the other splits' partial sums from their shared memory, in split order, so D is bitwise the
workspace split-K's of the same tiles; checked against float64 of the dequantized inputs with outputs poisoned, run to
run, and with a planted bug (one split's partial sums dropped) that the same check rejects."""

import pytest
import torch

from deep_kernels import gemm
from deep_kernels.heuristics import fp8_gemm as heuristics
from deep_kernels.reference import gemm as reference
from deep_kernels.testing import assert_bitwise_equal
from deep_kernels.testing.gemm import accumulator_like, assert_gemm_close, forced_config_product, make_gemm_inputs

NUM_SMS = 132


def _config(block_m: int, block_n: int, splits: int, out_bytes: int, in_cluster: bool = True):
    return heuristics.make_config(block_m, block_n, 1, False, out_bytes, num_splits=splits, splits_in_cluster=in_cluster)


# ---- host rules (CPU) ----

def test_grid_is_every_tile_times_its_splits():
    config = _config(64, 64, 2, 2)
    assert heuristics.grid_size(config, 64, 4096, NUM_SMS) == 64 * 2
    assert heuristics.split_workspace_sizes(config, 64, 4096, NUM_SMS) == (0, 0)
    assert heuristics.config_label(config) == "64x64/2pc"


def test_rejects_more_jobs_than_sms():
    # 2 x 64 tiles of 64 x 64, 3 splits each: 384 CTAs, not one job each.
    with pytest.raises(ValueError, match="tiles x splits"):
        gemm._plan_of(_config(64, 64, 3, 2), 128, 4096, 7168, torch.bfloat16, False, NUM_SMS)


def test_rejects_illegal_configs():
    with pytest.raises(ValueError, match="splits in a cluster"):
        _config(64, 64, 1, 2)
    with pytest.raises(ValueError, match="split-K needs"):
        heuristics.make_config(256, 64, 1, False, 2, num_splits=2, splits_in_cluster=True)
    with pytest.raises(ValueError, match="split-K needs"):
        heuristics.make_config(64, 64, 2, True, 2, num_splits=2, splits_in_cluster=True)
    with pytest.raises(ValueError, match="splits in a cluster need 2..8 splits"):
        heuristics.make_config(64, 64, 1, False, 2, num_splits=9, splits_in_cluster=True)
    with pytest.raises(ValueError, match="splits in a cluster need 2..8 splits and block-scaled operands"):
        heuristics.make_config(64, 64, 1, False, 4, num_splits=2, splits_in_cluster=True, operands="fp8_channel_scaled")


def test_candidates_offer_two_splits_in_a_cluster_where_they_fit():
    for m, n, k in ((64, 4096, 7168), (128, 2112, 7168), (128, 7168, 16384)):
        clustered = [c for c in heuristics.candidate_configs(m, n, NUM_SMS, k=k) if c.splits_in_cluster]
        assert clustered
        for config in clustered:
            assert config.num_splits == 2 and config.num_tma_multicast == 1
            assert heuristics.has_splits_in_cluster(config, m, n, NUM_SMS)
    # Not for the grouped kinds (no k), nor without split-K.
    assert not any(c.splits_in_cluster for c in heuristics.candidate_configs(64, 4096, NUM_SMS))


def test_decode_rules_leave_large_m_alone():
    # The epilogue overlap only with at least MIN_TILES_PER_CTA_FOR_OVERLAP tiles per CTA; 64-row tiles of one M block
    # take at most MAX_DENSE_STAGES_64_ROWS stages.
    assert not heuristics.get_fp8_gemm_config(128, 24576, 1536, NUM_SMS, allow_split_k=True).overlap_epilogue
    assert heuristics.get_fp8_gemm_config(4096, 24576, 1536, NUM_SMS, allow_split_k=True).overlap_epilogue
    small = heuristics.get_fp8_gemm_config(64, 7168, 2048, NUM_SMS, allow_split_k=True)
    assert small.block_m == 64 and small.num_stages == heuristics.MAX_DENSE_STAGES_64_ROWS
    assert heuristics.dense_stages_64_rows(13, 512, 1) == 4  # no more than a job's K blocks


# ---- the kernel (GPU) ----

@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,block_m,block_n,splits,accumulate", [
    (64, 4096, 7168, 64, 64, 2, False),     # 64 tiles x 2
    (128, 4096, 7168, 64, 64, 2, False),    # two M blocks: 128 tiles x 2 CTAs > 132 SMs: rejected
    (128, 2112, 7168, 128, 64, 4, True),    # 33 tiles x 4, two math warpgroups, FP32 D accumulated
    (17, 7168, 16384, 64, 112, 2, True),    # partial M tile, tiles straddling sfb blocks
    (64, 2112, 7168, 64, 96, 3, False),     # 56 K blocks in 3 splits; straddling tiles
    (1, 576, 640, 64, 48, 5, False),        # 5 K blocks in 5 splits, a cluster of 5
    (64, 2112, 7040, 64, 64, 4, False),     # K not a multiple of 128: the last K block zero-filled
])
def test_matches_reference_and_workspace_split(m, n, k, block_m, block_n, splits, accumulate):
    out_bytes = 4 if accumulate else 2
    config = _config(block_m, block_n, splits, out_bytes)
    if not heuristics.has_splits_in_cluster(config, m, n, NUM_SMS):
        with pytest.raises(ValueError, match="tiles x splits"):
            gemm._plan_of(config, m, n, k, torch.bfloat16, accumulate, NUM_SMS)
        return
    a, b = make_gemm_inputs(m, n, k)
    expected = reference.fp8_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64))
    c = accumulator_like(expected) if accumulate else None
    if accumulate:
        expected += c.double()
    runs = [forced_config_product(config, a, b, c) for _ in range(3)]
    assert_gemm_close(runs[0], expected)
    for i, again in enumerate(runs[1:], 1):
        assert_bitwise_equal(again, runs[0], f"d (run {i + 1})")
    workspace_split = forced_config_product(_config(block_m, block_n, splits, out_bytes, in_cluster=False), a, b, c)
    assert_bitwise_equal(runs[0], workspace_split, "d against the workspace split-K")


@pytest.mark.gpu
def test_check_rejects_a_dropped_split():
    # The kernel's result without split 1's partial sums (its K range of A zeroed) fails the check against the
    # product of the whole K.
    m, n, k, splits = 64, 2112, 7168, 4
    config = _config(64, 64, splits, 2)
    a, b = make_gemm_inputs(m, n, k)
    expected = reference.fp8_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64))
    k_blocks = k // 128
    dropped = slice(1 * k_blocks // splits * 128, 2 * k_blocks // splits * 128)
    planted_a = (a[0].clone(), a[1])
    planted_a[0][:, dropped] = 0
    planted = forced_config_product(config, planted_a, b)
    assert torch.isfinite(planted).all()
    with pytest.raises(AssertionError, match="calc_diff"):
        assert_gemm_close(planted, expected)

