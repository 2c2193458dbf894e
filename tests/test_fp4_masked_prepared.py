"""m_grouped_fp8_fp4_gemm_nt_masked on grouped prepared weights (the swapped decode kernel's masked layout).

CPU: grouped preparation is each expert's preparation stacked; the config model's picks are legal; bad input raises
before any launch.
GPU: against the float64 product of the dequantized operands (deep_kernels.reference), outputs poisoned and rows past
masked_m checked untouched (experts without rows, experts over several token blocks, N not a multiple of the tile,
each config kind); bitwise equal to the dense swapped kernel on each expert's rows (the same numerics); determinism;
CUDA-graph replay with masked_m changed between replays; a planted bug (one expert's sub-block shift) that the
check rejects.
"""

from dataclasses import replace

import pytest
import torch

import deep_kernels
from deep_kernels import fp4_gemm, fp4_weights
from deep_kernels.heuristics import fp8_fp4_swap_ab as swap_ab
from deep_kernels.reference import fp4_gemm as reference
from deep_kernels.testing import assert_bitwise_equal, poison_
from deep_kernels.testing.fp4_gemm import mxfp4_weights
from deep_kernels.testing.grouped import assert_masked_close, make_masked_inputs
from test_fp4_weights import with_undocumented_word_bits


def test_grouped_preparation_stacks_each_experts():
    codes, scales = mxfp4_weights(80, 256, device="cpu", num_groups=3, max_shift=14)
    prepared = deep_kernels.prepare_fp4_weights(codes, scales)
    assert prepared.data.shape == (3, 2, 2, fp4_weights.CHUNK_BYTES) and prepared.num_groups == 3
    assert (prepared.n, prepared.k) == (80, 256)
    for g in range(3):
        single = deep_kernels.prepare_fp4_weights(codes[g], scales[g])
        assert single.num_groups is None
        assert torch.equal(prepared.data[g], single.data)
    with pytest.raises(ValueError, match=r"= \(3, 80, 8\)"):
        deep_kernels.prepare_fp4_weights(codes, scales[:, :, :4])


def test_masked_configs_are_legal():
    for expected_m in (1, 16, 19, 32, 38, 64, 76, 100):
        for num_groups in (16, 64, 256):
            for n, k in ((4096, 7168), (7168, 2048)):
                config = swap_ab.get_masked_config(expected_m, n, k, num_groups, 132)
                assert config.num_splits == 1 and config.block_t >= min(expected_m, 128)
                assert config.smem_bytes <= swap_ab.smem_capacity(config.ctas_per_sm)
                swap_ab.template_args(config, "bfloat16", False, prepared=True, masked=True)
    with pytest.raises(ValueError, match="CTAs an SM"):
        swap_ab.make_config(64, 1, ctas_per_sm=4)
    assert swap_ab.make_config(32, 1, ctas_per_sm=3).num_threads == 160
    assert swap_ab.make_config(32, 1, ctas_per_sm=2).num_threads == 256
    assert swap_ab.make_config(96, 1, ctas_per_sm=2).num_threads == 160
    with pytest.raises(ValueError, match="CTAs an SM"):
        swap_ab.make_config(112, 1, ctas_per_sm=2)
    with pytest.raises(ValueError, match="masked layout"):
        swap_ab.template_args(swap_ab.make_config(16), "bfloat16", False, prepared=False, masked=True)
    with pytest.raises(ValueError, match="masked layout"):
        swap_ab.template_args(swap_ab.make_config(16, num_splits=2), "bfloat16", False, prepared=True, masked=True)


def _cpu_call(num_groups=2, m_max=64, n=256, k=256):
    a = (torch.zeros(num_groups, m_max, k, dtype=torch.float8_e4m3fn), torch.ones(num_groups, m_max, k // 128))
    codes = torch.zeros(num_groups, n, k // 2, dtype=torch.uint8)
    scales = torch.full((num_groups, n, k // 32), 127, dtype=torch.uint8)
    d = torch.empty(num_groups, m_max, n, dtype=torch.bfloat16)
    return a, deep_kernels.prepare_fp4_weights(codes, scales), d, torch.zeros(num_groups, dtype=torch.int32), 16


def _dense_prepared(p):
    return deep_kernels.prepare_fp4_weights(torch.zeros(256, 128, dtype=torch.uint8),
                                            torch.full((256, 8), 127, dtype=torch.uint8))


@pytest.mark.parametrize("mutate,error,match", [
    (lambda a, p, d, mm, e: (a, _dense_prepared(p), d, mm, e), ValueError, "grouped prepared weights"),
    (lambda a, p, d, mm, e: (a, replace(p, data=p.data[:1]), d, mm, e), ValueError, "G = 2 groups but the prepared"),
    (lambda a, p, d, mm, e: (a, replace(p, k=384), d, mm, e), ValueError, "K = 256 columns but the prepared weights"),
    (lambda a, p, d, mm, e: (a, replace(p, data=p.data[:, :1]), d, mm, e), ValueError, "must be contiguous of shape"),
    (lambda a, p, d, mm, e: (a, p, d[:, :, :128], mm, e), ValueError, "d must be a contiguous"),
    (lambda a, p, d, mm, e: (a, p, d, mm.long(), e), TypeError, "masked_m"),
    (lambda a, p, d, mm, e: (a, p, d, mm[:1], e), ValueError, "masked_m must be"),
    (lambda a, p, d, mm, e: (a, p, d, mm, 0), ValueError, "expected_m"),
    (lambda a, p, d, mm, e: ((a[0], a[1][:, :, :1]), p, d, mm, e), ValueError, "sfa"),
    (lambda a, p, d, mm, e: (a[0], p, d, mm, e), TypeError, "pair"),
    (lambda a, p, d, mm, e: (a, p, d, mm, e), ValueError, "must be a CUDA tensor"),
])
def test_masked_rejects_bad_prepared_input(mutate, error, match):
    with pytest.raises(error, match=match):
        deep_kernels.m_grouped_fp8_fp4_gemm_nt_masked(*mutate(*_cpu_call()))


def test_masked_rejects_a_split_config():
    with pytest.raises(ValueError, match="without split-K"):
        fp4_gemm.m_grouped_fp8_fp4_gemm_nt_masked_with_config(swap_ab.make_config(16, num_splits=2), *_cpu_call()[:3],
                                                              torch.zeros(2, dtype=torch.int32), 16)


# ---- GPU ----

def _inputs(masked_m, m_max, n, k, seed=0):
    a, _, masked = make_masked_inputs(masked_m, m_max, n, k, seed=seed)
    b = mxfp4_weights(n, k, num_groups=len(masked_m), seed=seed + 7)
    return a, b, masked


def _run(a, prepared, masked, expected_m, config=None):
    num_groups, m_max, _ = a[0].shape
    d = poison_(torch.empty(num_groups, m_max, prepared.n, device="cuda", dtype=torch.bfloat16))
    return fp4_gemm.m_grouped_fp8_fp4_gemm_nt_masked_with_config(config, a, prepared, d, masked, expected_m)


def _reference(a, b, masked):
    num_groups, m_max, _ = a[0].shape
    out = torch.full((num_groups, m_max, b[0].shape[1]), float("nan"), device="cuda", dtype=torch.float64)
    return reference.m_grouped_fp8_fp4_gemm_nt_masked(a, b, out, masked, 1)


@pytest.mark.gpu
# (tokens a tile, math warpgroups, CTAs an SM); None: the model's pick
@pytest.mark.parametrize("masked_m,m_max,n,k,expected_m,config", [
    ([5, 0, 64, 33], 64, 4096, 1024, 32, None),
    ([1, 17, 3, 150, 0, 9], 160, 2048, 2048, 16, None),
    ([16, 0, 0, 7, 16, 12, 1, 0], 32, 4160, 512, 16, (16, 2, 1)),
    ([40, 64, 0, 2], 64, 1040, 1024, 64, (64, 1, 1)),
    ([33, 0, 31, 70], 96, 2112, 768, 32, (32, 1, 2)),
    ([0, 0, 0], 32, 1024, 256, 8, None),
    ([20, 3, 0, 32, 11], 40, 2048, 1024, 16, (32, 1, 3)),
    ([16, 9, 16, 0], 16, 1040, 512, 16, (16, 1, 4)),
    ([64, 50, 1], 64, 1024, 768, 64, (64, 1, 3)),
    ([45, 0, 48, 7, 30], 64, 2048, 1024, 40, None),
    ([80, 77, 0, 160], 160, 1024, 512, 76, None),
    ([96, 5, 95], 96, 1040, 512, 96, (96, 2, 1)),
    ([112, 60], 112, 1024, 512, 112, (112, 1, 1)),
    ([80, 0, 71, 33], 80, 2048, 1024, 80, (80, 1, 2)),
    ([96, 90, 2], 100, 1040, 768, 96, (96, 1, 2)),
])
def test_masked_matches_reference_and_keeps_rows_past_masked_m(masked_m, m_max, n, k, expected_m, config):
    a, b, masked = _inputs(masked_m, m_max, n, k)
    prepared = deep_kernels.prepare_fp4_weights(*b)
    if config is not None:
        block_t, warpgroups, ctas = config
        config = swap_ab.make_config(block_t, warpgroups, ctas_per_sm=ctas)
    actual = _run(a, prepared, masked, expected_m, config)
    assert_masked_close(actual, _reference(a, b, masked), masked_m)
    assert_bitwise_equal(_run(a, prepared, masked, expected_m, config), actual, "second run")


@pytest.mark.gpu
# (tokens a tile, math warpgroups, CTAs an SM): the pipelined promotion over several work items a CTA (the ring's
# position carried from item to item), one and three K blocks an item included
@pytest.mark.parametrize("masked_m,m_max,n,k,config", [
    ([16, 0, 0, 7, 16, 12, 1, 0], 32, 4160, 512, (16, 2, 1)),
    ([33, 0, 31, 70], 96, 2112, 768, (32, 1, 2)),
    ([20, 3, 0, 32, 11], 40, 2048, 128, (32, 1, 3)),
    ([16, 9, 16, 0], 16, 1040, 384, (16, 1, 4)),
    ([96, 5, 95], 96, 1040, 512, (96, 2, 1)),
    ([112, 60], 112, 1024, 640, (128, 1, 1)),
])
def test_masked_pipelined_promotion_is_bitwise_the_plain_loop(masked_m, m_max, n, k, config):
    a, b, masked = _inputs(masked_m, m_max, n, k, seed=5)
    prepared = deep_kernels.prepare_fp4_weights(*b)
    block_t, warpgroups, ctas = config
    pipelined = swap_ab.make_config(block_t, warpgroups, ctas_per_sm=ctas, pipelined=True)
    plain = replace(pipelined, pipelined=False)
    expected_m = min(block_t, m_max)
    actual = _run(a, prepared, masked, expected_m, pipelined)
    assert_masked_close(actual, _reference(a, b, masked), masked_m)
    assert_bitwise_equal(actual, _run(a, prepared, masked, expected_m, plain), "the plain K loop")


@pytest.mark.gpu
# (math warpgroups, CTAs an SM) of 32 tokens; with three CTAs an SM the masked items narrow: expert 3's 9 rows run
# 16 tokens wide (wgmma N = 16), the dense call's 32
@pytest.mark.parametrize("warpgroups,ctas", [(2, 1), (1, 3)])
def test_masked_is_bitwise_the_dense_kernel_per_expert(warpgroups, ctas):
    masked_m, m_max, n, k = [30, 0, 17, 9, 32], 32, 2112, 1536
    a, b, masked = _inputs(masked_m, m_max, n, k, seed=3)
    prepared = deep_kernels.prepare_fp4_weights(*b)
    config = swap_ab.make_config(32, warpgroups, ctas_per_sm=ctas)
    actual = _run(a, prepared, masked, 32, config)
    assert_masked_close(actual, _reference(a, b, masked), masked_m)  # rows past masked_m and expert 1 untouched
    for g, rows in enumerate(masked_m):
        if not rows:
            continue
        dense = deep_kernels.prepare_fp4_weights(b[0][g], b[1][g])
        d = poison_(torch.empty(rows, n, device="cuda", dtype=torch.bfloat16))
        sfa = a[1][g, :rows].contiguous()
        fp4_gemm.fp8_fp4_gemm_nt_with_config(config, (a[0][g, :rows], sfa), dense, d)
        assert_bitwise_equal(actual[g, :rows], d, f"d[{g}]")


@pytest.mark.gpu
@pytest.mark.parametrize("expected_m", [16, 38, 76])
def test_masked_tile_scaled_is_bitwise_the_row_scaled_layout(expected_m):
    masked_m, m_max, n, k = [expected_m, 0, expected_m // 2, expected_m + 5], 96, 2112, 1536
    a, (codes, _), masked = _inputs(masked_m, m_max, n, k, seed=7)
    generator = torch.Generator(device="cuda").manual_seed(7)
    # exponents 7 apart at most: every 64-row tile folds, its rows' own largest exponents differ
    scales = (127 - torch.randint(0, 8, (len(masked_m), n, k // 32), generator=generator, device="cuda"))
    b = (codes, scales.to(torch.uint8).view(torch.float8_e8m0fnu))
    prepared = deep_kernels.prepare_fp4_weights(*b)
    assert prepared.tile_scaled
    row_scaled = replace(prepared, tile_scaled=False, data=torch.stack(
        [fp4_weights._prepared_chunks(c, s, n, k, False) for c, s in zip(*b)]))
    assert not torch.equal(row_scaled.data, prepared.data)
    actual = _run(a, prepared, masked, expected_m, None)
    assert_masked_close(actual, _reference(a, b, masked), masked_m)
    assert_bitwise_equal(actual, _run(a, row_scaled, masked, expected_m, None), "row-scaled layout")
    # planted bug: row-scaled data read as tile-scaled (each thread's second row promoted with its first row's scale)
    with pytest.raises(AssertionError, match="calc_diff"):
        assert_masked_close(_run(a, replace(row_scaled, tile_scaled=True), masked, expected_m, None), _reference(a, b, masked),
               masked_m)


@pytest.mark.gpu
def test_masked_tile_scaled_reads_only_the_words_documented_bits():
    # The failing run of test_masked_tile_scaled_is_bitwise_the_row_scaled_layout[16] before the pair-table offsets
    # were masked: row-scaled words read as tile-scaled put pair 1's offset (word >> 16) up to 64 KB past the tables.
    masked_m, m_max, n, k = [16, 0, 9, 21], 32, 2112, 1536
    a, (codes, _), masked = _inputs(masked_m, m_max, n, k, seed=11)
    generator = torch.Generator(device="cuda").manual_seed(11)
    scales = 127 - torch.randint(0, 8, (len(masked_m), n, k // 32), generator=generator, device="cuda")
    b = (codes, scales.to(torch.uint8))
    prepared = deep_kernels.prepare_fp4_weights(*b)
    assert prepared.tile_scaled
    config = swap_ab.make_config(16, 1, ctas_per_sm=4, num_chains=2)
    expected = _run(a, prepared, masked, 16, config)
    assert_masked_close(expected, _reference(a, b, masked), masked_m)
    actual = _run(a, replace(prepared, data=with_undocumented_word_bits(prepared.data)), masked, 16, config)
    torch.cuda.synchronize()
    assert_bitwise_equal(actual, expected)


@pytest.mark.gpu
def test_masked_graph_replay_follows_masked_m():
    masked_m, m_max, n, k = [9, 0, 32, 20], 48, 1024, 1024
    a, b, masked = _inputs(masked_m, m_max, n, k, seed=5)
    prepared = deep_kernels.prepare_fp4_weights(*b)
    d = torch.empty(len(masked_m), m_max, n, device="cuda", dtype=torch.bfloat16)
    deep_kernels.m_grouped_fp8_fp4_gemm_nt_masked(a, prepared, d, masked, 16)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        deep_kernels.m_grouped_fp8_fp4_gemm_nt_masked(a, prepared, d, masked, 16)
    expected = _reference(a, b, masked)
    for rows in (masked_m, [0, 48, 1, 17]):
        masked.copy_(torch.tensor(rows, dtype=torch.int32))
        expected = _reference(a, b, masked)
        poison_(d)
        graph.replay()
        torch.cuda.synchronize()
        assert_masked_close(d, expected, rows)


@pytest.mark.gpu
def test_masked_check_rejects_a_planted_bug():
    masked_m, m_max, n, k = [12, 30, 5], 32, 1024, 1024
    a, b, masked = _inputs(masked_m, m_max, n, k, seed=9)
    prepared = deep_kernels.prepare_fp4_weights(*b)
    expected = _reference(a, b, masked)
    assert_masked_close(_run(a, prepared, masked, 16), expected, masked_m)
    wrong = prepared.data.clone()
    wrong[1, 5, :, 4096 + 4 * 37 + 2] += 8  # expert 1, row 362's third sub-block one shift further, every K block
    with pytest.raises(AssertionError, match="calc_diff"):
        assert_masked_close(_run(a, replace(prepared, data=wrong), masked, 16), expected, masked_m)
