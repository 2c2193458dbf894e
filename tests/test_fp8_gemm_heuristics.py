"""CPU tests of the SM90 FP8 GEMM heuristics (deep_kernels/heuristics/fp8_gemm.py): no GPU, no torch."""

import math
import os
import subprocess
import sys

from dataclasses import replace

import pytest

from deep_kernels.heuristics import fp8_gemm as heur

NUM_SMS = 132
NKS = heur.REPRESENTATIVE_NKS
MS = (1, 64, 128, 4001, 4096, 8192)
OUTPUTS = ((2, False), (4, True))


def all_problems():
    for out_bytes, accumulate in OUTPUTS:
        for n, k in NKS:
            for m in MS:
                yield m, n, k, out_bytes, accumulate


def pick(m, n, k, out_bytes=2, accumulate=False, num_sms=NUM_SMS):
    """The Normal GEMM's choice (split-K allowed), as fp8_gemm_nt makes it."""
    return heur.get_fp8_gemm_config(m, n, k, num_sms, out_dtype_bytes=out_bytes, with_accumulation=accumulate,
                                    allow_split_k=True)


# The FP8 (dense and grouped) and BF16 picks of a fresh process, printed one repr a line.
_PICKS_SCRIPT = """
import ast
import sys
from deep_kernels.heuristics import bf16_gemm, fp8_gemm, grouped_fp8_gemm
dense, grouped = ast.literal_eval(sys.argv[1]), ast.literal_eval(sys.argv[2])
for m, n, k, out_bytes, accumulate in dense:
    print(repr(fp8_gemm.get_fp8_gemm_config(m, n, k, 132, out_dtype_bytes=out_bytes, with_accumulation=accumulate,
                                            allow_split_k=True)))
    print(repr(bf16_gemm.get_bf16_gemm_config(m, n, k, 132, out_dtype_bytes=out_bytes, with_accumulation=accumulate)))
for gemm_type, m, n, k, g in grouped:
    print(repr(grouped_fp8_gemm.get_grouped_fp8_gemm_config(gemm_type, m, n, k, g, 132)))
"""


def test_picks_depend_on_the_problem_alone():
    # Two fresh processes with different hash seeds (set and str-keyed dict order) and this one, after whatever
    # ran before it, pick the same configs.
    from deep_kernels.heuristics import bf16_gemm, grouped_fp8_gemm

    dense = list(all_problems())
    grouped = [(t, g * -(-rows // 128) * 128 if t == "m_grouped_contiguous" else rows, n, k, g) for n, k in NKS
               for g in (1, 8, 32) for rows in (64, 1024) for t in ("m_grouped_masked", "m_grouped_contiguous")]
    here = []
    for m, n, k, out_bytes, accumulate in dense:
        here.append(repr(pick(m, n, k, out_bytes, accumulate)))
        here.append(repr(bf16_gemm.get_bf16_gemm_config(m, n, k, NUM_SMS, out_dtype_bytes=out_bytes,
                                                        with_accumulation=accumulate)))
    here += [repr(grouped_fp8_gemm.get_grouped_fp8_gemm_config(*p, NUM_SMS)) for p in grouped]
    for seed in ("1", "2"):
        result = subprocess.run([sys.executable, "-c", _PICKS_SCRIPT, repr(dense), repr(grouped)], check=True,
                                capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": seed})
        assert result.stdout.splitlines() == here, f"PYTHONHASHSEED={seed}"


@pytest.mark.parametrize("m,n,k,out_bytes,accumulate", list(all_problems()))
def test_config_is_legal(m, n, k, out_bytes, accumulate):
    config = pick(m, n, k, out_bytes, accumulate)
    assert config.block_m in (64, 128, 256)
    assert config.num_math_threads == (1 if config.block_m == 64 else 2) * 128
    if config.block_m == 256:  # two waves of 64 rows per math warpgroup: no split-K or pipelining
        assert config.block_n <= heur.MAX_TWO_WAVE_BLOCK_N
        assert config.num_splits == 1 and not config.pipelined
    assert config.num_threads == config.num_math_threads + 128
    assert config.block_k == 128
    assert config.block_n % 16 == 0 and 16 <= config.block_n <= 192
    assert config.block_n <= 128 + math.gcd(config.block_n, 128)  # at most two sfb blocks per tile
    assert heur.MIN_STAGES <= config.num_stages <= heur.MAX_STAGES
    assert config.smem_bytes == heur.smem_bytes(config.block_m, config.block_n, config.num_stages, out_bytes)
    assert config.smem_bytes <= heur.SMEM_CAPACITY_BYTES
    # As many stages as fit (one more would not), but for 64-row tiles those of dense_stages_64_rows.
    fitting = heur.max_stages(config.block_m, config.block_n, out_bytes)
    if config.block_m == 64 and m <= 64 and config.block_n >= 64:
        assert config.num_stages == heur.dense_stages_64_rows(fitting, k, config.num_splits)
        if config.num_splits > 1 or -(-k // heur.BLOCK_K) < heur.LONG_JOB_K_BLOCKS:
            assert config.num_stages <= heur.MAX_DENSE_STAGES_64_ROWS
    else:
        assert config.num_stages == fitting
        assert (config.num_stages == heur.MAX_STAGES or
                heur.smem_bytes(config.block_m, config.block_n, config.num_stages + 1, out_bytes) >
                heur.SMEM_CAPACITY_BYTES)
    assert (config.block_n * out_bytes) % config.swizzle_d_bytes == 0


@pytest.mark.parametrize("m,n,k,out_bytes,accumulate", list(all_problems()))
def test_multicast_legality_and_grid(m, n, k, out_bytes, accumulate):
    config = pick(m, n, k, out_bytes, accumulate)
    assert config.num_tma_multicast in (1, 2)
    if config.num_tma_multicast == 2:
        if config.multicast_on_a:
            assert math.ceil(n / config.block_n) % 2 == 0
        else:
            assert math.ceil(m / config.block_m) % 2 == 0
    else:
        assert not config.multicast_on_a
    grid = heur.grid_size(config, m, n, NUM_SMS)
    assert 0 < grid <= NUM_SMS
    assert grid % config.num_tma_multicast == 0
    assert grid <= heur.num_work_units(config, m, n, NUM_SMS) * config.num_tma_multicast


def test_multicast_candidates_only_when_pairs_are_whole():
    for config in heur.candidate_configs(m=300, n=2112, num_sms=NUM_SMS):
        if config.num_tma_multicast == 2 and not config.multicast_on_a:
            assert math.ceil(300 / config.block_m) % 2 == 0
        if config.num_tma_multicast == 2 and config.multicast_on_a:
            assert math.ceil(2112 / config.block_n) % 2 == 0
    assert not any(c.num_tma_multicast == 2 for c in heur.candidate_configs(m=64, n=2112, num_sms=1))


def test_smem_bytes_is_the_kernels_carve_up(tmp_path):
    # The dynamic shared memory the host launches with must be the kernel's own carve-up (the traits'
    # kSmemBytes): nvcc checks the two agree for every kernel the heuristics pick or the tests force.
    from deep_kernels.jit import compiler

    kernels = heur.compile_coverage_kernels() + [
        heur.CandidateKernel(heur.make_config(256, 128, 2, True, 2), 4096, 7168, "bfloat16", False),
        heur.CandidateKernel(heur.make_config(256, 96, 1, False, 4, num_stages=2), 2112, 7200, "float32", True)]
    checks = []
    for kernel in kernels:
        args = kernel.template_args()
        traits_args = ", ".join(args[:6] + args[8:])  # all but kNumTMAThreads and kNumMathThreads
        checks.append(f"static_assert(deep_kernels::sm90_fp8_gemm_detail::Sm90Fp8GemmTraits<{traits_args}>::kSmemBytes "
                      f"== {kernel.config.smem_bytes});")
    source = tmp_path / "smem_check.cu"
    source.write_text('#include "gemm/sm90_fp8_gemm_traits.cuh"\n' + "\n".join(checks) + "\n")
    command = compiler.compile_command(source, tmp_path / "smem_check.cubin", "90a")
    compiler.run_compile(command)
    # The check can fail: one byte off is a compile error.
    source.write_text(source.read_text().replace(f"== {kernels[0].config.smem_bytes});",
                                                 f"== {kernels[0].config.smem_bytes + 1});", 1))
    with pytest.raises(RuntimeError, match="static assertion failed"):
        compiler.run_compile(command)


def test_swizzle_of_d():
    assert heur.swizzle_d_bytes(128, 2) == 128
    assert heur.swizzle_d_bytes(96, 2) == 64
    assert heur.swizzle_d_bytes(112, 2) == 32
    assert heur.swizzle_d_bytes(48, 4) == 64
    assert heur.swizzle_d_bytes(160, 4) == 128


def test_small_m_uses_one_math_warpgroup():
    for n, k in NKS:
        for m in (1, 17, 64):
            assert pick(m, n, k).block_m == 64


def test_decode_spreads_weights_over_the_sms():
    # Memory-bound: B must stream through most SMs in a single wave.
    for m in (1, 64, 128):
        for n, k in ((7168, 16384), (24576, 1536), (32768, 512), (7168, 2048)):
            config = pick(m, n, k)
            units = heur.num_work_units(config, m, n, NUM_SMS)
            ctas = heur.grid_size(config, m, n, NUM_SMS)
            assert ctas >= NUM_SMS // 2, (m, n, k, config)
            assert math.ceil(units / (ctas // config.num_tma_multicast)) <= 2, (m, n, k, config)


def test_large_m_uses_large_tiles_and_fills_waves():
    for n, k in NKS:
        if n < 2048:
            continue
        config = pick(4096, n, k)
        assert config.block_m >= 128 and config.block_m * config.block_n >= 128 * 128
        clusters = heur.grid_size(config, 4096, n, NUM_SMS) // config.num_tma_multicast
        units = heur.num_work_units(config, 4096, n, NUM_SMS)
        waves = math.ceil(units / clusters)
        assert units / (waves * clusters) >= 0.85, (n, k, config)


def test_estimate_grows_with_work():
    config = pick(4096, 7168, 2048)
    small = heur.estimate_seconds(config, 4096, 7168, 2048, NUM_SMS)
    assert heur.estimate_seconds(config, 4096, 7168, 4096, NUM_SMS) > small
    assert heur.estimate_seconds(config, 8192, 7168, 2048, NUM_SMS) > small
    assert heur.estimate_seconds(config, 4096, 7168, 2048, NUM_SMS // 2) > small


def test_fewer_sms_give_a_legal_grid():
    for sms in (1, 2, 66, 78):
        for m, n, k in ((64, 7168, 16384), (4096, 2112, 7168), (300, 576, 7168)):
            config = heur.get_fp8_gemm_config(m, n, k, sms)
            grid = heur.grid_size(config, m, n, sms)
            assert 0 < grid <= sms and grid % config.num_tma_multicast == 0


def test_bad_problems_are_rejected():
    with pytest.raises(ValueError, match="k must be"):
        heur.get_fp8_gemm_config(64, 2112, 100, NUM_SMS)
    with pytest.raises(ValueError, match="n must be"):
        heur.get_fp8_gemm_config(64, 2110, 7168, NUM_SMS)
    with pytest.raises(ValueError, match="num_sms"):
        heur.get_fp8_gemm_config(64, 2112, 7168, 0)


def test_template_args_order():
    config = heur.Fp8GemmConfig(block_m=128, block_n=112, num_stages=6, num_tma_multicast=2, multicast_on_a=True,
                                swizzle_d_bytes=32, smem_bytes=heur.smem_bytes(128, 112, 6, 2))
    assert heur.template_args(config, 7168, 2048, "bfloat16", False) == [
        "7168", "2048", "128", "112", "128", "6", "128", "256", "2", "true",
        "deep_kernels::GemmType::Normal", "__nv_bfloat16", "false", "1", "false", "false",
        "deep_kernels::GemmOperands::Fp8BlockScaled", "false", "false", "deep_kernels::MathSchedule::Lockstep",
        "false", "false", "false"]
    args = heur.template_args(config, 7168, 2048, "torch.float32", True, "m_grouped_masked")
    assert args[-13:-2] == ["deep_kernels::GemmType::MGroupedMasked", "float", "true", "1", "false", "false",
                          "deep_kernels::GemmOperands::Fp8BlockScaled", "false", "false",
                          "deep_kernels::MathSchedule::Lockstep", "false"]
    clustered = heur.make_config(64, 64, 1, False, 2, num_splits=2, splits_in_cluster=True)
    assert heur.template_args(clustered, 4096, 7168, "bfloat16", False)[-3] == "true"
    with pytest.raises(ValueError, match="operands"):
        heur.template_args(config, 7168, 2048, "bfloat16", False, operands="fp4")
    assert heur.template_args(heur.make_config(64, 64, 1, False, 2, num_splits=4), 2112, 7168, "bfloat16",
                              False)[-10:-7] == ["4", "true", "false"]
    with pytest.raises(ValueError, match="float32"):
        heur.template_args(config, 7168, 2048, "bfloat16", True)
    with pytest.raises(ValueError, match="gemm_type"):
        heur.template_args(config, 7168, 2048, "bfloat16", False, "batched")
    with pytest.raises(ValueError, match="out_dtype"):
        heur.template_args(config, 7168, 2048, "float16", False)


def test_candidate_kernels_are_distinct_and_legal():
    kernels = heur.all_candidate_configs()
    args = [tuple(kernel.template_args()) for kernel in kernels]
    assert len(args) == len(set(args)) > 0
    picked = {tuple(heur.template_args(pick(m, n, k, ob, acc), n, k, "float32" if acc else "bfloat16", acc))
              for m, n, k, ob, acc in all_problems() if m in heur.REPRESENTATIVE_MS}
    assert picked == set(args)
    coverage = heur.compile_coverage_kernels()
    assert set(args) <= {tuple(kernel.template_args()) for kernel in coverage}
    kinds = {kernel.gemm_type for kernel in coverage}
    assert kinds == set(heur.GEMM_TYPES)
    assert {(k.config.num_tma_multicast, k.config.multicast_on_a) for k in coverage} >= {(2, True), (2, False), (1, False)}
    for kernel in coverage:
        assert kernel.config.smem_bytes <= heur.SMEM_CAPACITY_BYTES


# ---- split-K ----

DECODE_NKS = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048))


@pytest.mark.parametrize("m", (1, 17, 64, 128))
@pytest.mark.parametrize("n,k", DECODE_NKS)
def test_decode_shapes_fill_the_sms_in_one_wave(m, n, k):
    # Each SM gets a job: tiles x splits reach most of the 132 SMs, and split-K never needs a second wave.
    for out_bytes, accumulate in OUTPUTS:
        config = pick(m, n, k, out_bytes, accumulate)
        jobs = heur.num_work_units(config, m, n, NUM_SMS)
        assert jobs >= 0.8 * NUM_SMS, (m, n, k, config)
        if config.num_splits > 1:
            assert jobs <= NUM_SMS and heur.grid_size(config, m, n, NUM_SMS) == jobs


def test_long_k_full_64_row_block_runs_unsplit_tiles_with_every_stage():
    # K = 16384 at N = 7168, M = 64: 112 unsplit 64 x 64 tiles of 128 K blocks in one wave, every stage that fits.
    config = pick(64, 7168, 16384)
    assert (config.block_m, config.block_n, config.num_splits) == (64, 64, 1), config
    assert config.pipelined and config.evict_first_b
    assert config.num_stages == heur.max_stages(64, 64, 2) > heur.MAX_DENSE_STAGES_64_ROWS
    assert heur.is_long_job_64_rows(config, 64, 7168, 16384, NUM_SMS)
    # Not where M does not fill the tile, with two M blocks, at K = 7168 (56 K blocks) or with more tiles than SMs.
    assert not heur.is_long_job_64_rows(config, 32, 7168, 16384, NUM_SMS)
    assert pick(32, 7168, 16384).num_splits == 2
    assert pick(128, 7168, 16384).block_m == 128
    assert pick(64, 4096, 7168).num_splits > 1
    assert not heur.is_long_job_64_rows(heur.make_config(64, 64, 1, False, 2), 64, 24576, 16384, NUM_SMS)


@pytest.mark.parametrize("m", (1, 64, 128))
def test_long_k_with_few_tiles_splits(m):
    # 33 (64 x 64) tiles over 56 K blocks, or 64 over 56: one tile per CTA would leave most SMs idle.
    for n, k in ((2112, 7168), (4096, 7168)):
        config = pick(m, n, k)
        assert config.num_splits > 1, (m, n, k, config)


@pytest.mark.parametrize("m,n,k,out_bytes,accumulate", list(all_problems()))
def test_split_k_only_where_legal(m, n, k, out_bytes, accumulate):
    config = pick(m, n, k, out_bytes, accumulate)
    assert 1 <= config.num_splits <= k // heur.BLOCK_K
    if config.num_splits > 1:
        # Every tile split into one wave of jobs, or only the last partial wave's tiles.
        assert config.num_tma_multicast == 1
        tiles = heur.num_tiles(config, m, n)
        unsplit = heur.num_unsplit_tiles(config, m, n, NUM_SMS)
        assert unsplit == (0 if tiles < NUM_SMS else tiles // NUM_SMS * NUM_SMS)
        assert 0 < (tiles - unsplit) * config.num_splits <= NUM_SMS


def test_split_k_is_opt_in():
    # Grouped kinds (and any caller not asking) never get split-K configs.
    for n, k in DECODE_NKS:
        for m in (1, 64, 128):
            assert heur.get_fp8_gemm_config(m, n, k, NUM_SMS).num_splits == 1
    assert all(c.num_splits == 1 for c in heur.candidate_configs(64, 2112, NUM_SMS))
    assert any(c.num_splits > 1 for c in heur.candidate_configs(64, 2112, NUM_SMS, k=7168))


@pytest.mark.parametrize("num_sms", (1, 2, 33, 60, 78))
def test_split_k_follows_the_sm_count(num_sms):
    for m in (1, 64, 128):
        for n, k in DECODE_NKS:
            config = pick(m, n, k, num_sms=num_sms)
            if config.num_splits > 1:  # the split jobs fit one wave
                unsplit = heur.num_unsplit_tiles(config, m, n, num_sms)
                assert heur.num_work_units(config, m, n, num_sms) - unsplit <= num_sms
            assert 0 < heur.grid_size(config, m, n, num_sms) <= num_sms


def test_split_workspace_sizes():
    config = heur.make_config(128, 64, 1, False, 2, num_splits=4)
    tiles = 1 * 33  # m = 100 -> one M-block; n = 2112 -> 33 N-blocks
    assert heur.num_tiles(config, 100, 2112) == tiles
    assert heur.num_unsplit_tiles(config, 100, 2112, NUM_SMS) == 0
    assert heur.split_workspace_sizes(config, 100, 2112, NUM_SMS) == (tiles * 4 * 128 * 64, tiles * 2)
    assert heur.split_workspace_sizes(heur.make_config(128, 64, 1, False, 2), 100, 2112, NUM_SMS) == (0, 0)
    # Tail split: 4096 x 4096 in 128 x 192 tiles is 32 x 22 = 704 tiles = 5 waves of 132 and 44 split tiles.
    tail = heur.make_config(128, 192, 1, False, 2, num_splits=3)
    assert heur.num_unsplit_tiles(tail, 4096, 4096, NUM_SMS) == 660
    assert heur.num_work_units(tail, 4096, 4096, NUM_SMS) == 660 + 44 * 3
    assert heur.split_workspace_sizes(tail, 4096, 4096, NUM_SMS) == (44 * 3 * 128 * 192, 44 * 2)
    with pytest.raises(ValueError, match="multicast"):
        heur.make_config(128, 64, 2, True, 2, num_splits=2)


def test_picked_split_configs_are_compiled():
    kernels = heur.all_candidate_configs()
    assert any(kernel.config.num_splits > 1 and kernel.config.block_m == 128 for kernel in kernels)
    assert any(kernel.config.num_splits > 1 and kernel.with_accumulation for kernel in kernels)


def test_pipelined_k_loop_where_registers_allow():
    for config in heur.candidate_configs(4096, 7168, NUM_SMS, k=2048):
        assert config.pipelined == (config.block_m <= 128 and config.block_n <= heur.MAX_PIPELINED_BLOCK_N[128])
    assert heur.make_config(128, 128, 1, False, 2).pipelined
    assert not heur.make_config(128, 128, 1, False, 2, pipelined=False).pipelined
    assert not heur.make_config(128, 160, 1, False, 2).pipelined
    with pytest.raises(ValueError, match="cannot be pipelined"):
        heur.make_config(128, 144, 1, False, 2, pipelined=True)
    kernels = heur.compile_coverage_kernels()
    assert {kernel.config.pipelined for kernel in kernels if kernel.config.block_n <= 128} == {True, False}


def test_epilogue_overlap_on_every_128_and_256_row_unsplit_candidate():
    assert not heur.make_config(128, 192, 1, False, 2).overlap_epilogue
    assert heur.make_config(128, 192, 1, False, 2, overlap_epilogue=True).overlap_epilogue
    for block_m, splits in ((64, 1), (128, 2)):
        with pytest.raises(ValueError, match="epilogue overlap needs"):
            heur.make_config(block_m, 128, 1, False, 2, num_splits=splits, overlap_epilogue=True)
    dense = list(heur.candidate_configs(4096, 7168, NUM_SMS, k=2048))
    assert {c.overlap_epilogue for c in dense} == {True, False}
    for config in dense:
        assert config.overlap_epilogue == (config.block_m in (128, 256) and config.num_splits == 1)
    # Without split-K options the same; the grouped kinds only where BLOCK_N is a multiple of 64 (at the others
    # ptxas serializes the wgmma: tests/test_compile.py checks every picked kernel's group in flight).
    for config in heur.candidate_configs(4096, 7168, NUM_SMS):
        assert config.overlap_epilogue == (config.block_m in (128, 256))
    grouped = list(heur.candidate_configs(4096, 7168, NUM_SMS, grouped=True))
    assert {c.block_n for c in grouped if c.overlap_epilogue} == {64, 128, 192}
    for config in grouped:
        assert config.overlap_epilogue == (config.block_m in (128, 256) and config.block_n % 64 == 0)
    overlapped = heur.make_config(128, 192, 1, False, 2, overlap_epilogue=True)
    plain = heur.make_config(128, 192, 1, False, 2)
    assert heur.estimate_seconds(overlapped, 4096, 7168, 2048, NUM_SMS) < heur.estimate_seconds(plain, 4096, 7168,
                                                                                                  2048, NUM_SMS)
    assert heur.get_fp8_gemm_config(4096, 32768, 512, NUM_SMS, allow_split_k=True).overlap_epilogue
    # 256-row tiles: measured to win at M = 4096 where the 256-row tiles do (H200, 2026-12-02).
    two_wave = heur.get_fp8_gemm_config(4096, 4096, 7168, NUM_SMS, allow_split_k=True)
    assert (two_wave.block_m, two_wave.overlap_epilogue) == (256, True)
    assert not heur.get_fp8_gemm_config(64, 2112, 7168, NUM_SMS, allow_split_k=True).overlap_epilogue
    assert heur.template_args(overlapped, 7168, 2048, "bfloat16", False)[15] == "true"


def test_config_label():
    assert heur.config_label(heur.make_config(128, 192, 1, False, 2, overlap_epilogue=True)) == "128x192/1o"
    assert heur.config_label(heur.make_config(64, 64, 1, False, 2, num_splits=4)) == "64x64/4p"
    assert heur.config_label(heur.make_config(256, 128, 2, True, 2)) == "256x128/1+a"


def test_ping_pong_configs():
    # The schedule is a template argument of its own; it takes two math warpgroups and the plain K loop, which it
    # selects by default; the label shows it.
    config = heur.make_config(256, 128, 2, True, 2, ping_pong=True)
    assert (config.ping_pong, config.pipelined) == (True, False)
    assert heur.template_args(config, 4096, 7168, "bfloat16", False)[-4] == "deep_kernels::MathSchedule::PingPong"
    assert heur.config_label(config) == "256x128/1t+a"
    assert heur.make_config(128, 128, 1, False, 2, ping_pong=True).pipelined is False
    assert heur.make_config(128, 128, 1, False, 2).pipelined is True
    for kwargs in ({"block_m": 64, "block_n": 64}, {"block_m": 128, "block_n": 128, "pipelined": True}):
        with pytest.raises(ValueError, match="ping-pong schedule needs"):
            heur.make_config(num_tma_multicast=1, multicast_on_a=False, out_dtype_bytes=2, ping_pong=True, **kwargs)
    assert heur.config_fields(config)["ping_pong"] is True
    assert heur.make_config(out_dtype_bytes=2, **heur.config_fields(config)) == config


def test_ping_pong_is_offered_only_where_its_factor_is_measured(monkeypatch):
    # Candidates offer the schedule at the tile heights PING_PONG_MATH_FACTOR lists, right after the lockstep twin
    # (ties keep lockstep), never for the grouped kinds; a factor below 1 makes the model prefer it.
    monkeypatch.setattr(heur, "PING_PONG_MATH_FACTOR", {})
    assert not any(c.ping_pong for c in heur.candidate_configs(4096, 7168, 132, k=16384))
    monkeypatch.setattr(heur, "PING_PONG_MATH_FACTOR", {128: 0.9})
    candidates = list(heur.candidate_configs(4096, 7168, 132, k=16384))
    ping_pong = [c for c in candidates if c.ping_pong]
    assert ping_pong and all(c.block_m == 128 and not c.pipelined for c in ping_pong)
    for i, c in enumerate(candidates):
        if c.ping_pong:
            twin = candidates[i - 1]
            assert (twin.block_m, twin.block_n, twin.num_splits, twin.ping_pong) == (c.block_m, c.block_n,
                                                                                      c.num_splits, False)
            assert heur.estimate_seconds(c, 4096, 7168, 16384, 132) < heur.estimate_seconds(
                replace(c, ping_pong=False), 4096, 7168, 16384, 132)
    assert not any(c.ping_pong for c in heur.candidate_configs(4096, 7168, 132, grouped=True))


def test_dense_two_wave_tiles_run_without_a_cluster_where_measured():
    # At M = 4096 and up to 56 K blocks the 256x128 picks run unicast (measured faster than their pairs multicasting A or
    # B); the multicast twins stay candidates, rated above them; 128 x 192 keeps N = 2112, 24576 and 32768, and the pairs
    # multicasting A keep K = 16384.
    assert heur.config_label(heur.get_fp8_gemm_config(4096, 7168, 16384, NUM_SMS, allow_split_k=True)) == "256x128/1o+a"
    for n, k in ((4096, 7168), (7168, 2048)):
        ranked = heur.ranked_configs(4096, n, k, NUM_SMS, allow_split_k=True)
        pick = ranked[0][1]
        assert heur.config_label(pick) == "256x128/1o" and pick.num_stages == 3
        twins = [s for s, c in ranked if c == heur.replace(pick, num_tma_multicast=2, multicast_on_a=True)]
        assert twins and ranked[0][0] == pytest.approx(twins[0] * heur.DENSE_TWO_WAVE_UNICAST_OVER_MULTICAST)
    for n, k in ((2112, 7168), (24576, 1536), (32768, 512)):
        assert heur.config_label(heur.get_fp8_gemm_config(4096, n, k, NUM_SMS, allow_split_k=True)) == "128x192/1o"
    # Not with per-channel B scales (their own kinds' model), nor at decode sizes.
    assert all(c.block_m < 256 for m in (64, 128) for n, k in ((7168, 16384), (4096, 7168))
               for c in [heur.get_fp8_gemm_config(m, n, k, NUM_SMS, allow_split_k=True)])
