"""The epilogue overlap with a workspace split-K (dense 128-row block-scaled tiles, the kernel's kOverlapEpilogue with
kNumSplits > 1): a whole tile's store runs with the next tile's first wgmma group in flight, a split job's store (its
partial sums, and the reduction by the last job) with none. It changes when the groups run, not what a job sums, so D
is bitwise the twin config's without the overlap; checked against float64 of the dequantized inputs with outputs
poisoned, run to run, and with a planted bug (one tile's B rows negated) that the same check rejects. The cases split
the last partial wave's tiles (tail split) into one wave of jobs and into two.

CPU: what make_config takes; the kernel is in the compile coverage (tests/test_compile.py: no stack frame, the store
with a group in flight).
"""

import pytest
import torch

from deep_kernels import gemm
from deep_kernels.heuristics import fp8_gemm as heuristics
from deep_kernels.reference import gemm as reference
from deep_kernels.testing import assert_bitwise_equal, poison_
from deep_kernels.testing.gemm import assert_gemm_close, make_gemm_inputs

NUM_SMS = 132
# (block_n, splits, m, n, k)
SPLIT_OVERLAP_CASES = [
    (192, 3, 4096, 2112, 7168),  # 352 tiles: 264 whole, the last 88 in 3 splits (two waves of jobs)
    (128, 2, 2304, 1040, 1024),  # 162 tiles: 132 whole, the last 30 in 2 splits; a partial last N tile
]


def split_configs(block_n: int, splits: int) -> tuple:
    """The config overlapping the epilogue and its twin without the overlap."""
    return tuple(heuristics.make_config(128, block_n, 1, False, 2, num_splits=splits, overlap_epilogue=overlap)
                 for overlap in (True, False))


def case_specs() -> list:
    """The kernel specs the GPU tests below launch (for a parallel precompile before them)."""
    return [gemm.kernel_spec(config, n, k, torch.bfloat16, False)
            for block_n, splits, m, n, k in SPLIT_OVERLAP_CASES for config in split_configs(block_n, splits)]


# ---- host rules (CPU) ----

def test_make_config_takes_it_for_workspace_splits_only():
    config, twin = split_configs(192, 3)
    assert config.overlap_epilogue and not twin.overlap_epilogue
    assert heuristics.config_label(config) == "128x192/3o"
    assert heuristics.make_config(**heuristics.config_fields(config), out_dtype_bytes=2) == config
    with pytest.raises(ValueError, match="epilogue overlap needs"):
        heuristics.make_config(128, 64, 1, False, 2, num_splits=2, splits_in_cluster=True, overlap_epilogue=True)
    with pytest.raises(ValueError, match="epilogue overlap needs"):
        heuristics.make_config(64, 64, 1, False, 2, num_splits=2, overlap_epilogue=True)
    assert gemm.apply_config_override(twin, gemm.parse_config_override("overlap_epilogue=1"), 2, 7168) == config
    # Two waves of jobs at 4096 x 2112 x 7168: 264 whole tiles, then 88 x 3 jobs.
    assert heuristics.num_unsplit_tiles(config, 4096, 2112, NUM_SMS) == 264
    assert heuristics.num_work_units(config, 4096, 2112, NUM_SMS) == 264 + 88 * 3


# ---- the kernel (GPU) ----

def _product(config, a, b, m: int, n: int) -> torch.Tensor:
    d = poison_(torch.empty((m, n), device="cuda", dtype=torch.bfloat16))
    gemm.forced_config_call(config, a, b, d)()
    return d


@pytest.mark.gpu
@pytest.mark.parametrize("block_n,splits,m,n,k", SPLIT_OVERLAP_CASES)
def test_matches_reference_and_twin(block_n, splits, m, n, k):
    config, twin = split_configs(block_n, splits)
    a, b = make_gemm_inputs(m, n, k)
    expected = reference.fp8_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64))
    runs = [_product(config, a, b, m, n) for _ in range(2)]
    assert_gemm_close(runs[0], expected)
    assert_bitwise_equal(runs[1], runs[0], "d (run 2)")
    assert_bitwise_equal(runs[0], _product(twin, a, b, m, n), "d against the twin without the overlap")


@pytest.mark.gpu
def test_check_rejects_a_wrong_tile():
    # One 128-row tile of B negated (N-block 8: the partial last tile, in the split tail) fails the check.
    block_n, splits, m, n, k = SPLIT_OVERLAP_CASES[1]
    config, _ = split_configs(block_n, splits)
    a, b = make_gemm_inputs(m, n, k)
    expected = reference.fp8_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64))
    planted_b = (b[0].clone(), b[1])
    planted_b[0][1024:1040] = (-planted_b[0][1024:1040].float()).to(planted_b[0].dtype)
    planted = _product(config, a, planted_b, m, n)
    assert torch.isfinite(planted).all()
    with pytest.raises(AssertionError):
        assert_gemm_close(planted, expected)
