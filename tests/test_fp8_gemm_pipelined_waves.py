"""The FP8 GEMM's pipelined 256-row tiles (the kernel's kPipelinedWaves): each math warpgroup runs its two 64-row waves'
wgmma groups in turn, one promoted while the other runs (block-scaled operands, the Normal kind, BLOCK_N at most 96);
and 256-row tiles with more stages than fit beside the whole tile's D staging, which stage D in parts (one 64-row wave
or one chunk of it per math warpgroup at a time: the kernel's kStagedPartBytes).

CPU: the heuristics' side (legality, what make_config and the config override take, no candidate until measured).
GPU: the kernel against the float64 reference with poisoned outputs (deep_kernels.testing.gemm.assert_gemm_close),
bitwise against its plain twin (the same tile without the pipelining: each wave's promotions are the same, in the same
order) and against a second run, and a planted bug the check must reject. The cases cover one, three (a 32-column
tail) and many K blocks, partial M and N tiles, tiles straddling sfb blocks, both multicast operands, the epilogue
overlap (the next tile's two groups issued before the store) and accumulation into FP32 D.
"""

import pytest
import torch

from deep_kernels import gemm
from deep_kernels.heuristics import fp8_gemm as heuristics
from deep_kernels.reference import gemm as reference
from deep_kernels.testing import assert_bitwise_equal, calc_diff
from deep_kernels.testing.gemm import accumulator_like, assert_gemm_close, forced_config_product, make_gemm_inputs

# (block_n, multicast, multicast_on_a, overlap, accumulate, m, n, k)
PIPELINED_WAVE_CASES = [
    (96, 2, 1, True, False, 4001, 2112, 7168),   # multicast of A; partial last M tile; 56 K blocks; the overlap
    (96, 2, 0, True, False, 1000, 7168, 2048),   # multicast of B; partial last N tile; straddling tiles; the overlap
    (96, 1, 0, False, True, 300, 1040, 128),     # one K block; accumulation
    (96, 1, 0, False, True, 777, 1040, 288),     # three K blocks, the last of 32 columns; accumulation
    (64, 2, 1, True, False, 4001, 24576, 1536),  # 64 columns (two sfb offsets) with the overlap
]
# Stages of the cases (None: as many as fit, which stages D one 64-row wave at a time at 96 columns; 3: the whole tile
# staged), by case index.
CASE_STAGES = {1: 3}


def pipelined_config(block_n, multicast, multicast_on_a, overlap, out_bytes=2, pipelined=True, num_stages=None):
    return heuristics.make_config(256, block_n, multicast, bool(multicast_on_a), out_bytes, pipelined=pipelined,
                                  overlap_epilogue=overlap, num_stages=num_stages)


# 256-row tiles with D staged in parts (plain K loop): (block_n, stages, multicast, multicast_on_a, m, n, k), each against
# the same tiles with the whole tile staged (3 stages).
STAGED_IN_PARTS_CASES = [
    (128, 4, 2, 1, 4001, 7168, 2048),  # one chunk (64 columns) per warpgroup at a time; partial last M tile
    (112, 4, 2, 0, 1000, 2112, 640),   # one wave per warpgroup at a time; partial last N tile; straddling tiles
]


def staged_in_parts_configs(block_n, stages, multicast, multicast_on_a):
    """The config staging D in parts and its twin staging the whole tile (3 stages)."""
    return tuple(heuristics.make_config(256, block_n, multicast, bool(multicast_on_a), 2, num_stages=num_stages,
                                        overlap_epilogue=True) for num_stages in (stages, 3))


# ---- heuristics (CPU) ----

def test_pipelined_wave_configs():
    config = pipelined_config(96, 2, 1, False)
    assert (config.pipelined, config.num_math_warpgroups, config.num_stages) == (True, 2, 4)
    assert heuristics.config_label(config) == "256x96/1p+a"
    # Four stages leave room for one 64-row wave of D staging per math warpgroup; three for the whole tile's.
    assert config.smem_bytes == 2 * 64 * 96 * 2 + 4 * (heuristics.stage_bytes(256, 96) + 16) <= \
        heuristics.SMEM_CAPACITY_BYTES
    assert pipelined_config(96, 2, 1, False).smem_bytes < heuristics.smem_bytes(256, 96, 4, 2)
    three = heuristics.make_config(256, 96, 2, True, 2, num_stages=3, pipelined=True)
    assert three.smem_bytes == heuristics.smem_bytes(256, 96, 3, 2) == 256 * 96 * 2 + 3 * (
        heuristics.stage_bytes(256, 96) + 16)
    assert heuristics.template_args(config, 4096, 7168, "bfloat16", False)[14] == "true"
    assert heuristics.make_config(out_dtype_bytes=2, **heuristics.config_fields(config)) == config
    # 256-row tiles stay unpipelined unless asked.
    assert not heuristics.make_config(256, 96, 2, True, 2).pipelined
    assert pipelined_config(64, 2, 1, True).overlap_epilogue


def test_d_staged_in_parts_where_the_stages_leave_too_little():
    # Plain 256-row tiles keep the stages that fit beside the whole tile's staging unless asked for more; then one wave,
    # or where that does not fit either one 64-column chunk, per math warpgroup.
    assert heuristics.make_config(256, 128, 2, True, 2).num_stages == 3
    four = heuristics.make_config(256, 128, 2, True, 2, num_stages=4)
    assert four.smem_bytes == 2 * 64 * 128 + 4 * (heuristics.stage_bytes(256, 128) + 16) <= heuristics.SMEM_CAPACITY_BYTES
    assert heuristics.make_config(256, 112, 2, True, 2, num_stages=4).smem_bytes == 2 * 64 * 112 * 2 + 4 * (
        heuristics.stage_bytes(256, 112) + 16)
    assert not heuristics.may_stage_d_in_parts(256, grouped=True)
    assert not heuristics.may_stage_d_in_parts(256, "fp8_channel_scaled")
    with pytest.raises(ValueError, match="at most 3 stages"):
        gemm.apply_config_override(four, {"stages": 4}, 2, 7168, grouped=True)


@pytest.mark.parametrize("kwargs,match", [
    ({"block_n": 112, "pipelined": True}, "cannot be pipelined"),
    ({"block_n": 96, "pipelined": True, "operands": "fp8_channel_scaled"}, "cannot be pipelined"),
])
def test_pipelined_wave_configs_reject_what_the_kernel_does_not_take(kwargs, match):
    with pytest.raises(ValueError, match=match):
        heuristics.make_config(256, num_tma_multicast=1, multicast_on_a=False, out_dtype_bytes=2, **kwargs)


def test_pipelined_waves_are_not_candidates_until_measured():
    for n, k in ((2112, 7168), (4096, 7168), (7168, 2048)):
        assert not any(c.block_m == 256 and c.pipelined for c in heuristics.candidate_configs(4096, n, 132, k=k))


def test_config_override_pipelines_256_rows():
    pick = heuristics.make_config(256, 128, 2, True, 2, overlap_epilogue=True)
    forced = gemm.apply_config_override(pick, {"block_n": 96, "pipelined": 1}, 2, 7168)
    assert (forced.block_m, forced.block_n, forced.pipelined, forced.overlap_epilogue) == (256, 96, True, True)
    assert not gemm.apply_config_override(pick, {"block_n": 96}, 2, 7168).pipelined
    with pytest.raises(ValueError, match="cannot be pipelined"):
        gemm.apply_config_override(pick, {"pipelined": 1}, 2, 7168)


def test_compile_coverage_builds_pipelined_waves():
    kernels = [kernel for kernel in heuristics.compile_coverage_kernels()
               if kernel.config.block_m == 256 and kernel.config.pipelined]
    assert {(kernel.config.block_n, kernel.config.overlap_epilogue, kernel.with_accumulation) for kernel in kernels} == {
        (96, True, False), (80, False, True)}


# ---- the kernel (GPU) ----

def _reference(a, b) -> torch.Tensor:
    m, n = a[0].shape[0], b[0].shape[0]
    return reference.fp8_gemm_nt(a, b, torch.empty((m, n), device=a[0].device, dtype=torch.float64))


@pytest.mark.gpu
@pytest.mark.parametrize("case", range(len(PIPELINED_WAVE_CASES)))
def test_pipelined_waves_match_reference_and_plain_twin(case):
    block_n, multicast, multicast_on_a, overlap, accumulate, m, n, k = PIPELINED_WAVE_CASES[case]
    out_bytes = 4 if accumulate else 2
    stages = CASE_STAGES.get(case)
    config = pipelined_config(block_n, multicast, multicast_on_a, overlap, out_bytes, num_stages=stages)
    twin = pipelined_config(block_n, multicast, multicast_on_a, overlap, out_bytes, pipelined=False, num_stages=stages)
    a, b = make_gemm_inputs(m, n, k)
    expected = _reference(a, b)
    c = None
    if accumulate:
        c = accumulator_like(expected)
        expected += c.double()
    d = forced_config_product(config, a, b, c)
    assert_gemm_close(d, expected)
    assert calc_diff(d, expected) <= 2e-6
    assert_bitwise_equal(forced_config_product(config, a, b, c), d, "d (pipelined waves, second run)")
    assert_bitwise_equal(forced_config_product(twin, a, b, c), d, "d (plain twin)")


@pytest.mark.gpu
def test_check_rejects_swapped_waves_or_an_unwritten_wave():
    # The planted bugs the pipelined waves could make: a wave's rows promoted into the other wave's accumulators (rows
    # 64 apart swapped) and a wave left unwritten (still poisoned). The check that passes the kernel's D rejects both.
    m, n, k = 4001, 2112, 7168
    config = pipelined_config(96, 2, 1, False)
    a, b = make_gemm_inputs(m, n, k)
    expected = _reference(a, b)
    d = forced_config_product(config, a, b)
    assert_gemm_close(d, expected)
    swapped = d.clone()
    swapped[0:64, :96], swapped[64:128, :96] = d[64:128, :96], d[0:64, :96]
    with pytest.raises(AssertionError, match="calc_diff"):
        assert_gemm_close(swapped, expected)
    unwritten = d.clone()
    # NOTE: not poison_, which fills the whole storage of a view's base.
    unwritten[320:384, 96:192].view(torch.int16).fill_(-1)
    with pytest.raises(AssertionError, match="differ in being NaN"):
        assert_gemm_close(unwritten, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("block_n,stages,multicast,multicast_on_a,m,n,k", STAGED_IN_PARTS_CASES)
def test_d_staged_in_parts_matches_reference_and_whole_tile_staging(block_n, stages, multicast, multicast_on_a, m, n,
                                                                    k):
    config, twin = staged_in_parts_configs(block_n, stages, multicast, multicast_on_a)
    a, b = make_gemm_inputs(m, n, k)
    expected = _reference(a, b)
    d = forced_config_product(config, a, b)
    assert_gemm_close(d, expected)
    assert_bitwise_equal(forced_config_product(twin, a, b), d, "d (the whole tile staged)")
