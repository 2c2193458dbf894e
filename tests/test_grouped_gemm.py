"""Grouped (MoE) FP8 GEMMs, contiguous and masked: input validation, references and heuristics (CPU), and
the kernels against the per-expert float64 reference (GPU).

The check of a layout (_check_contiguous, _check_masked): the valid rows against the reference by
deep_kernels.testing.gemm.assert_gemm_close (calc_diff below 1e-5 on the whole, every 128 x 128 tile and every
row; NaN and inf where the reference has them), and the rows the kernel must not write (contiguous padding,
masked rows at or past masked_m) keep their poison bit for bit: every element of d is checked. Weights give each
expert's 128 x 128 blocks their own power-of-two magnitudes. The planted-bug tests run the real kernels with a
group shifted at a segment boundary, a row claimed or dropped at a segment's end, and masked_m off by one, and
show that the same checks reject each result."""

import random

import pytest
import torch

import deep_kernels
from deep_kernels import grouped_gemm
from deep_kernels.contiguous_layout import m_indices_from_offsets, m_indices_from_psum
from deep_kernels.heuristics import fp8_gemm as dense_heuristics
from deep_kernels.heuristics import grouped_fp8_gemm as heuristics
from deep_kernels.moe.layout import CONTIGUOUS_ALIGNMENT
from deep_kernels.reference import gemm as reference
from deep_kernels.reference.quant import unpack_scales
from deep_kernels.testing import assert_bitwise_equal, calc_diff, poison_
from deep_kernels.testing.gemm import assert_gemm_close, cast_activations, gemm_activations
from deep_kernels.testing.grouped import (
    SCALE_FORMATS, contiguous_layout, expert_sizes, make_contiguous_inputs, make_masked_inputs, make_weights, psum_ends,
)

from conftest import FULL

GROUPS = (1, 4, 8, 32, 256)
NUM_SMS = 132
# Small (N, K) with a partial last N-block (576 = 4.5 x 128) and a sfb block straddled by most tiles.
N, K = 576, 512


# ---- validation (CPU) ----

def _contiguous_operands(m=256, g=4, n=256, k=256):
    a = (torch.zeros(m, k, dtype=torch.float8_e4m3fn), torch.ones(m, k // 128))
    b = (torch.zeros(g, n, k, dtype=torch.float8_e4m3fn), torch.ones(g, (n + 127) // 128, k // 128))
    return a, b, torch.empty(m, n, dtype=torch.bfloat16), torch.zeros(m, dtype=torch.int32)


def _masked_operands(g=4, m_max=96, n=256, k=256):
    a = (torch.zeros(g, m_max, k, dtype=torch.float8_e4m3fn), torch.ones(g, m_max, k // 128))
    b = (torch.zeros(g, n, k, dtype=torch.float8_e4m3fn), torch.ones(g, (n + 127) // 128, k // 128))
    return a, b, torch.empty(g, m_max, n, dtype=torch.bfloat16), torch.zeros(g, dtype=torch.int32), 32


@pytest.mark.parametrize("mutate,error,match", [
    (lambda a, b, d, i: ((a[0].view(torch.uint8), a[1]), b, d, i), TypeError, "a must be torch.float8_e4m3fn"),
    (lambda a, b, d, i: (a, (b[0][0], b[1]), d, i), ValueError, "b must be 3-D"),
    (lambda a, b, d, i: (a, (b[0][:, :, :128], b[1]), d, i), ValueError, "K differs"),
    (lambda a, b, d, i: (a, (b[0][:, :200], b[1]), d[:, :200], i), ValueError, "multiple of 16"),
    (lambda a, b, d, i: ((a[0][:200], a[1][:200]), b, d[:200], i[:200]), ValueError, "multiple of .*= 128"),
    (lambda a, b, d, i: (a, b, d, i[:128]), ValueError, r"m_indices must be a contiguous int32 tensor of shape \(256,\)"),
    (lambda a, b, d, i: (a, b, d, i.long()), TypeError, "m_indices must be torch.int32"),
    (lambda a, b, d, i: (a, b, d.float(), i), TypeError, "d must be torch.bfloat16"),
    (lambda a, b, d, i: (a, b, d[:, :128], i), ValueError, "d must be a contiguous"),
    (lambda a, b, d, i: ((a[0], a[1][:, :1]), b, d, i), ValueError, "sfa must have shape"),
    (lambda a, b, d, i: (a, (b[0], b[1][:3]), d, i), ValueError,
     r"sfb must have shape \[G, ceil\(N / 128\), (ceil\()?K / 128\)?\]"),
    (lambda a, b, d, i: (a, (b[0], b[1][:3].int()), d, i), ValueError, "packed UE8M0 sfb must have shape"),
    (lambda a, b, d, i: (a, (torch.zeros(256, 4, 256, dtype=torch.float8_e4m3fn).transpose(0, 1), b[1]), d, i),
     ValueError, "b's groups must follow each other"),
    (lambda a, b, d, i: (a[0], b, d, i), TypeError, "pairs"),
    (lambda a, b, d, i: (a, b, d, i), ValueError, "must be a CUDA tensor"),
])
def test_contiguous_rejects_bad_input(mutate, error, match):
    with pytest.raises(error, match=match):
        deep_kernels.m_grouped_fp8_gemm_nt_contiguous(*mutate(*_contiguous_operands()))


def test_contiguous_layout_arguments():
    a, b, d, m_indices = _contiguous_operands()
    with pytest.raises(TypeError, match=r"exactly one of m_indices \(DeepGEMM.s grouped_layout\) and offsets"):
        deep_kernels.m_grouped_fp8_gemm_nt_contiguous(a, b, d)
    with pytest.raises(TypeError, match=r"exactly one of m_indices \(DeepGEMM.s grouped_layout\) and offsets"):
        deep_kernels.m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices, offsets=torch.zeros(5, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"offsets must be a contiguous int32 tensor of shape \(5,\)"):
        deep_kernels.m_grouped_fp8_gemm_nt_contiguous(a, b, d, offsets=torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        deep_kernels.m_grouped_fp8_gemm_nt_contiguous(a, b, d, offsets=torch.zeros(5, dtype=torch.int32))


@pytest.mark.parametrize("mutate,error,match", [
    (lambda a, b, d, mm, e: ((a[0][0], a[1]), b, d, mm, e), ValueError, "a must be 3-D"),
    (lambda a, b, d, mm, e: ((a[0][:3], a[1][:3]), b, d[:3], mm[:3], e), ValueError, "a has G = 3 groups but b has 4"),
    (lambda a, b, d, mm, e: (a, (b[0][:, :, :128], b[1]), d, mm, e), ValueError, "K differs"),
    (lambda a, b, d, mm, e: (a, b, d, mm[:3], e), ValueError, r"masked_m must be a contiguous int32 tensor of shape \(4,\)"),
    (lambda a, b, d, mm, e: (a, b, d, mm.long(), e), TypeError, "masked_m must be torch.int32"),
    (lambda a, b, d, mm, e: (a, b, d, mm.view(2, 2), e), ValueError, "masked_m must be a contiguous"),
    (lambda a, b, d, mm, e: (a, b, d[:3], mm, e), ValueError, r"d must be a contiguous bf16 tensor of shape \(4, 96, 256\)"),
    (lambda a, b, d, mm, e: ((a[0], a[1][:3]), b, d, mm, e), ValueError,
     r"sfa must have shape \[G, M_max, (ceil\()?K / 128\)?\]"),
    (lambda a, b, d, mm, e: ((a[0], a[1][0]), b, d, mm, e), ValueError, "sfa must be 3-D"),
    (lambda a, b, d, mm, e: (a, (b[0], b[1][:3]), d, mm, e), ValueError, "sfb must have shape"),
    (lambda a, b, d, mm, e: ((a[0], a[1][:3].int()), b, d, mm, e), ValueError, "packed UE8M0 sfa must have shape"),
    (lambda a, b, d, mm, e: (a, b, d, mm, 0), ValueError, r"expected_m must be an integer in \[1, 96\]"),
    (lambda a, b, d, mm, e: (a, b, d, mm, 97), ValueError, "expected_m"),
    (lambda a, b, d, mm, e: (a, b, d, mm, 32.0), ValueError, "expected_m"),
    (lambda a, b, d, mm, e: (a, b, d, mm, e), ValueError, "must be a CUDA tensor"),
])
def test_masked_rejects_bad_input(mutate, error, match):
    with pytest.raises(error, match=match):
        deep_kernels.m_grouped_fp8_gemm_nt_masked(*mutate(*_masked_operands()))


def test_alignment_is_the_routing_layouts():
    assert deep_kernels.get_m_alignment_for_contiguous_layout() == CONTIGUOUS_ALIGNMENT == 128
    assert deep_kernels.get_mk_alignment_for_contiguous_layout() == CONTIGUOUS_ALIGNMENT
    # The k-grouped GEMMs take groups of any multiple of it.
    assert deep_kernels.get_k_alignment_for_contiguous_layout() == CONTIGUOUS_ALIGNMENT
    for expected_m, num_groups in ((None, None), (1, None), (64, 8), (100000, 256)):
        assert deep_kernels.get_theoretical_mk_alignment_for_contiguous_layout(expected_m, num_groups) == 128
    with pytest.raises(ValueError, match="num_groups must be an integer in"):
        deep_kernels.get_theoretical_mk_alignment_for_contiguous_layout(64, 0)
    deep_kernels.set_mk_alignment_for_contiguous_layout(128)
    for alignment in (64, 256, 128.5, True):
        with pytest.raises(ValueError, match="read expert segments padded to 128 rows only"):
            deep_kernels.set_mk_alignment_for_contiguous_layout(alignment)
    assert deep_kernels.fp8_m_grouped_gemm_nt_masked is deep_kernels.m_grouped_fp8_gemm_nt_masked
    # The grouped kinds' tiles divide 128 rows, or are 256 rows starting on 128-row halves (scheduler.cuh) and
    # multicast A only (B pairs would not line up with the segments).
    for m in (128, 4096):
        for config in dense_heuristics.candidate_configs(m, 4096, NUM_SMS, grouped=True):
            assert CONTIGUOUS_ALIGNMENT % config.block_m == 0 or config.block_m == 2 * CONTIGUOUS_ALIGNMENT
            if config.block_m == 256:
                assert config.num_tma_multicast == 1 or config.multicast_on_a


def test_batched_mn_major_scales():
    scales = torch.arange(2 * 5 * 3, dtype=torch.float32).view(2, 5, 3)
    out = deep_kernels.get_mn_major_tma_aligned_tensor(scales)
    assert out.stride() == (24, 1, 8) and torch.equal(out, scales)
    assert deep_kernels.get_mn_major_tma_aligned_tensor(out) is out


# ---- references and the offsets form (CPU) ----

def test_offsets_to_m_indices_matches_the_layout():
    rng = random.Random(1)
    random_sizes = [expert_sizes(g, 700, rng, mode) for g in (1, 4, 32) for mode in ("random", "one")]
    # segments ending on, just before and just after the alignment; empty experts first, last and alone
    boundary_sizes = [[0, 1, 127, 128, 129, 0, 256, 0], [0], [5, 0, 0], [0, 0, 300]]
    for sizes in random_sizes + boundary_sizes:
        m_indices, offsets = contiguous_layout(sizes, device="cpu")
        # rows past the layout are padding too
        m_total = m_indices.numel() + 128
        expected = torch.cat([m_indices, torch.full((128,), -1, dtype=torch.int32)])
        assert_bitwise_equal(m_indices_from_offsets(offsets, m_total), expected, "m_indices from offsets")
        from_psum = m_indices_from_psum(psum_ends(sizes, "cpu"), m_total)
        assert_bitwise_equal(from_psum, expected, "m_indices from the psum layout")
        groups = reference.contiguous_row_groups(m_indices.numel(), offsets=offsets)
        assert torch.equal(groups, m_indices.long())


@pytest.mark.parametrize("scale_format", SCALE_FORMATS)
def test_contiguous_reference_is_the_dense_one_per_expert(scale_format):
    sizes, n, k = [100, 0, 3, 130], 256, 256
    a, b, m_indices, _ = make_contiguous_inputs(sizes, n, k, scale_format, device="cpu")
    d = torch.full((m_indices.numel(), n), 7.0, dtype=torch.float64)
    reference.m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices)
    packed = scale_format == "ue8m0"
    sfa = unpack_scales(a[1], m_indices.numel(), k // 128) if packed else a[1]
    for g, size in enumerate(sizes):
        rows = (m_indices == g).nonzero().flatten()
        assert rows.numel() == size
        if size == 0:
            continue
        sfb = unpack_scales(b[1][g], n // 128, k // 128) if packed else b[1][g]
        expected = reference.fp8_gemm_nt((a[0][rows], sfa[rows]), (b[0][g], sfb),
                                         torch.empty((size, n), dtype=torch.float64))
        assert calc_diff(d[rows], expected) < 1e-12
    assert (d[m_indices < 0] == 7.0).all()


def test_masked_reference_is_the_dense_one_per_expert():
    masked_m = [5, 0, 64]
    a, b, mm = make_masked_inputs(masked_m, 64, 256, 256, device="cpu")
    d = torch.full((3, 64, 256), 7.0, dtype=torch.float64)
    reference.m_grouped_fp8_gemm_nt_masked(a, b, d, mm, 32)
    for g, rows in enumerate(masked_m):
        if rows:
            dense = torch.empty((64, 256), dtype=torch.float64)
            reference.fp8_gemm_nt((a[0][g], a[1][g].contiguous()), (b[0][g], b[1][g]), dense)
            assert calc_diff(d[g, :rows], dense[:rows]) < 1e-12
        assert (d[g, rows:] == 7.0).all()


# ---- heuristics (CPU) ----

def _problems():
    for n, k in dense_heuristics.REPRESENTATIVE_NKS:
        for g in GROUPS:
            for rows in (1, 32, 64, 256, 1024):
                yield "m_grouped_masked", rows, n, k, g
                yield "m_grouped_contiguous", g * ((rows + 127) // 128 * 128), n, k, g


def test_grouped_heuristics_are_legal():
    # (Their determinism across processes: test_fp8_gemm_heuristics.py.)
    for gemm_type, m, n, k, g in _problems():
        config = heuristics.get_grouped_fp8_gemm_config(gemm_type, m, n, k, g, NUM_SMS)
        rows = heuristics.modelled_rows(gemm_type, m, g, 0)
        assert config in list(dense_heuristics.candidate_configs(rows, n, NUM_SMS, grouped=True))
        grid = heuristics.grid_size(gemm_type, config, m, n, NUM_SMS)
        assert 0 < grid <= NUM_SMS and grid % config.num_tma_multicast == 0
        if gemm_type == "m_grouped_masked":
            assert grid == NUM_SMS // config.num_tma_multicast * config.num_tma_multicast


def test_masked_tiles_follow_expected_m():
    for n, k in ((4096, 7168), (7168, 2048)):
        for g in (32, 256):
            assert heuristics.get_grouped_fp8_gemm_config("m_grouped_masked", 32, n, k, g, NUM_SMS).block_m == 64
        assert heuristics.get_grouped_fp8_gemm_config("m_grouped_masked", 1024, n, k, 1, NUM_SMS).block_m == 128


def test_masked_model_counts_the_blocks_of_expected_m():
    # The FP8 model counts ceil(expected_m / BLOCK_M) blocks per group; the BF16 and FP4 models keep half a block more.
    assert heuristics.modelled_rows("m_grouped_masked", 256, 4, 128, half_block_spread=False) == 256
    assert heuristics.modelled_rows("m_grouped_masked", 256, 4, 128) == 320
    assert heuristics.modelled_rows("m_grouped_masked", 0, 4, 64) == 33
    assert heuristics.modelled_rows("m_grouped_contiguous", 1000, 4, 128) == 250
    # Several groups: their expected blocks; one group: the hint's.
    def estimate(config, g):
        blocks = heuristics.expected_masked_blocks(256, config.block_m) if g > 1 else None
        return dense_heuristics.estimate_seconds(config, 256, 4096, 7168, NUM_SMS, num_groups=g, num_m_blocks=blocks)

    for g in (1, 4):
        config = heuristics.get_grouped_fp8_gemm_config("m_grouped_masked", 256, 4096, 7168, g, NUM_SMS)
        for other in dense_heuristics.candidate_configs(256, 4096, NUM_SMS, grouped=True, block_ms=(64, 128)):
            assert estimate(other, g) >= estimate(config, g)
    # Measured on the H200 (grouped_gemm suite shapes, hint 1.2 x expected_m): 16 groups of about 64 rows ran fastest
    # on 128-row tiles (one block a group), 32 groups of about 32 rows on 64-row ones; 256-row tiles never won.
    for n, k in ((4096, 7168), (7168, 2048)):
        assert heuristics.get_grouped_fp8_gemm_config("m_grouped_masked", 76, n, k, 16, NUM_SMS).block_m == 128
        assert heuristics.get_grouped_fp8_gemm_config("m_grouped_masked", 38, n, k, 32, NUM_SMS).block_m == 64
    assert all(heuristics.get_grouped_fp8_gemm_config(gemm_type, m, n, k, g, NUM_SMS).block_m != 256
               for gemm_type, m, n, k, g in heuristics.representative_problems())


def test_expected_masked_blocks():
    # Rows uniform over hint x [0.7 / 1.2, 1.3 / 1.2]: 614 -> [358.2, 665.2], blocks of 128 rows 3 (358.2-384), 4, 5,
    # 6 (640-665.2); all in one block; more blocks for taller hints and fewer for taller tiles.
    low, high = 614 * 0.7 / 1.2, 614 * 1.3 / 1.2
    expected = (3 * (384 - low) + 4 * 128 + 5 * 128 + 6 * (high - 640)) / (high - low)
    assert heuristics.expected_masked_blocks(614, 128) == pytest.approx(expected)
    assert heuristics.expected_masked_blocks(76, 128) == pytest.approx(1.0)
    assert heuristics.expected_masked_blocks(1, 64) == pytest.approx(1.0)
    assert heuristics.expected_masked_blocks(307, 128) < heuristics.expected_masked_blocks(614, 128)
    assert heuristics.expected_masked_blocks(614, 64) > heuristics.expected_masked_blocks(614, 128)
    # The picks this changed, each measured faster on the H200 (grouped_gemm suite draws, two runs): 2 x ~512 rows and
    # 4 x ~256 rows at N = 4096, K = 7168; 2 x ~512 rows at N = 7168, K = 2048. One group keeps the hint's blocks.
    labels = {(g, hint, n, k): dense_heuristics.config_label(
        heuristics.get_grouped_fp8_gemm_config("m_grouped_masked", hint, n, k, g, NUM_SMS))
        for g, hint, n, k in ((2, 614, 4096, 7168), (4, 307, 4096, 7168), (2, 614, 7168, 2048), (1, 1228, 7168, 2048))}
    assert labels == {(2, 614, 4096, 7168): "128x144/1", (4, 307, 4096, 7168): "128x160/1",
                      (2, 614, 7168, 2048): "128x128/1po", (1, 1228, 7168, 2048): "128x192/1o"}


def test_group_count_enters_the_model():
    # The same total rows over more groups read B more times: the estimate grows with G.
    config = heuristics.get_grouped_fp8_gemm_config("m_grouped_contiguous", 8192, 4096, 7168, 4, NUM_SMS)
    times = [dense_heuristics.estimate_seconds(config, 8192 // g, 4096, 7168, NUM_SMS, num_groups=g) for g in (1, 8, 64)]
    assert times[0] < times[1] < times[2]


def test_contiguous_picks_the_dense_config_at_equal_total_m():
    # Among the tiles the grouped kinds take (no 256-row tiles).
    for g, rows, n, k in heuristics.REPRESENTATIVE_CONTIGUOUS[:4]:
        assert (heuristics.get_grouped_fp8_gemm_config("m_grouped_contiguous", g * rows, n, k, g, NUM_SMS) ==
                dense_heuristics.ranked_configs(g * rows, n, k, NUM_SMS, block_ms=(64, 128))[0][1])


def test_grouped_heuristics_reject_bad_arguments():
    with pytest.raises(ValueError, match="gemm_type"):
        heuristics.get_grouped_fp8_gemm_config("normal", 64, 4096, 7168, 4, NUM_SMS)
    with pytest.raises(ValueError, match="num_groups"):
        heuristics.get_grouped_fp8_gemm_config("m_grouped_masked", 64, 4096, 7168, 0, NUM_SMS)
    with pytest.raises(ValueError, match="k must be"):
        heuristics.get_grouped_fp8_gemm_config("m_grouped_masked", 64, 4096, 7000, 4, NUM_SMS)


def test_every_representative_pick_is_precompiled():
    specs = set(grouped_gemm.precompile_specs())
    for gemm_type, m, n, k, g in heuristics.representative_problems():
        config = heuristics.get_grouped_fp8_gemm_config(gemm_type, m, n, k, g, NUM_SMS)
        assert grouped_gemm.kernel_spec(config, n, k, torch.bfloat16, False, gemm_type) in specs


def test_masked_problem_fits_its_bound():
    from deep_kernels.benchmarks import grouped_gemm as bench
    from deep_kernels.testing.grouped import masked_problem

    rng = random.Random(0)
    for g, expected_m in bench.MASKED_GROUPS:
        masked_m, m_max, hint = masked_problem(g, expected_m, rng)
        assert len(masked_m) == g and m_max % 128 == 0 and 1 <= hint <= m_max
        assert all(0.7 * expected_m - 0.5 <= rows <= 1.3 * expected_m + 0.5 and rows <= m_max for rows in masked_m)
        # cuBLAS's padded rows stay inside a[g].
        assert all(-(-rows // bench.CUBLAS_ROW_MULTIPLE) * bench.CUBLAS_ROW_MULTIPLE <= m_max for rows in masked_m)


# ---- the checks, and the bugs they must catch ----

def _expected_contiguous(a, b, m_indices) -> torch.Tensor:
    d = torch.zeros((m_indices.numel(), b[0].shape[1]), device=a[0].device, dtype=torch.float64)
    return reference.m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices)


def _check_contiguous(d, expected, m_indices, poisoned):
    """Rows of an expert (m_indices >= 0) against the reference, padding rows still poisoned."""
    valid = m_indices >= 0
    assert_gemm_close(d[valid], expected[valid], name="expert rows of d")
    assert_bitwise_equal(d[~valid], poisoned[~valid], "padding rows of d")


def _expected_masked(a, b, masked_m) -> torch.Tensor:
    num_groups, m_max = a[0].shape[:2]
    d = torch.zeros((num_groups, m_max, b[0].shape[1]), device=a[0].device, dtype=torch.float64)
    return reference.m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m, 1)


def _check_masked(d, expected, masked_m, poisoned):
    """Rows below masked_m (clamped to [0, M_max]) against the reference, the others still poisoned."""
    rows = torch.arange(d.shape[1], device=d.device)
    valid = rows[None, :] < masked_m.to(d.device).clamp(min=0)[:, None]
    assert_gemm_close(d[valid], expected[valid], name="rows of d below masked_m")
    assert_bitwise_equal(d[~valid], poisoned[~valid], "rows of d at or past masked_m")


def _poisoned(shape, device="cuda") -> tuple:
    d = poison_(torch.empty(shape, device=device, dtype=torch.bfloat16))
    return d, d.clone()


# Expert sizes of the planted contiguous bugs: an empty expert, segments ending mid-block (300, 200, 77).
PLANT_SIZES = [300, 0, 200, 77]
PLANTS = ("group_shift", "extra_row", "missing_row")
# The check each plant must trip: the shifted block's rows computed with the wrong expert, the extra row written over
# padding, the missing row left poisoned.
PLANT_FAILURES = {"group_shift": "expert rows of d: calc_diff", "extra_row": "padding rows of d: .* bytes differ",
                  "missing_row": "expert rows of d: .* differ in being NaN"}
# masked_m one too high writes a row past masked_m; one too low leaves a row below it poisoned.
MASKED_STEP_FAILURES = {1: "rows of d at or past masked_m: .* bytes differ", -1: "rows of d below masked_m: .* differ in being NaN"}


def _planted_m_indices(m_indices: torch.Tensor, sizes: list, plant: str) -> torch.Tensor:
    """m_indices with one bug at the segment of the last expert g with rows (its start s, its size r):
    "group_shift": the segment's first 128-row block labelled g - 1 (the layout read one group off at a boundary);
    "extra_row": the padding row after the segment labelled g (a segment one row too long);
    "missing_row": the segment's last row labelled -1 (one row too short)."""
    wrong = m_indices.clone()
    g = max(i for i, size in enumerate(sizes) if size)
    start = sum(-(-size // CONTIGUOUS_ALIGNMENT) * CONTIGUOUS_ALIGNMENT for size in sizes[:g])
    rows = sizes[g]
    assert g > 0 and rows % CONTIGUOUS_ALIGNMENT, "needs an earlier expert and a segment ending mid-block"
    if plant == "group_shift":
        wrong[start:start + min(rows, CONTIGUOUS_ALIGNMENT)] = g - 1
    elif plant == "extra_row":
        wrong[start + rows] = g
    else:
        wrong[start + rows - 1] = -1
    return wrong


@pytest.mark.parametrize("plant", PLANTS)
def test_contiguous_check_rejects_planted_layouts_on_cpu(plant):
    # The checks on their own, the reference standing in for the kernel (it writes only the rows it is given):
    # the GPU test below runs the kernel.
    a, b, m_indices, _ = make_contiguous_inputs(PLANT_SIZES, 256, 256, device="cpu")
    expected = _expected_contiguous(a, b, m_indices)
    d, poisoned = _poisoned(expected.shape, "cpu")
    reference.m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices)
    _check_contiguous(d, expected, m_indices, poisoned)
    d, _ = _poisoned(expected.shape, "cpu")
    reference.m_grouped_fp8_gemm_nt_contiguous(a, b, d, _planted_m_indices(m_indices, PLANT_SIZES, plant))
    with pytest.raises(AssertionError, match=PLANT_FAILURES[plant]):
        _check_contiguous(d, expected, m_indices, poisoned)


@pytest.mark.parametrize("step", [1, -1])
def test_masked_check_rejects_masked_m_off_by_one_on_cpu(step):
    a, b, masked_m = make_masked_inputs([64, 13, 0, 100], 128, 256, 256, device="cpu")
    expected = _expected_masked(a, b, masked_m)
    d, poisoned = _poisoned(expected.shape, "cpu")
    wrong = masked_m.clone()
    wrong[1] += step
    reference.m_grouped_fp8_gemm_nt_masked(a, b, d, wrong, 32)
    with pytest.raises(AssertionError, match=MASKED_STEP_FAILURES[step]):
        _check_masked(d, expected, masked_m, poisoned)


# ---- kernels against the reference (GPU) ----

def _run_contiguous(a, b, m_indices=None, offsets=None) -> tuple:
    """(d, its poisoned copy from before the launch)."""
    d, poisoned = _poisoned((a[0].shape[0], b[0].shape[1]))
    if offsets is None:
        deep_kernels.m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices)
    else:
        deep_kernels.m_grouped_fp8_gemm_nt_contiguous(a, b, d, offsets=offsets)
    return d, poisoned


def _run_masked(a, b, masked_m, expected_m) -> tuple:
    d, poisoned = _poisoned((*a[0].shape[:2], b[0].shape[1]))
    deep_kernels.m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m, expected_m)
    return d, poisoned


@pytest.mark.gpu
@pytest.mark.parametrize("num_groups,mode", [(1, "one"), (4, "random"), (8, "one"), (32, "random"), (256, "random")])
def test_contiguous_matches_reference(num_groups, mode):
    # One expert; experts with and without rows; everything in one of many experts; many experts of few rows.
    rng = random.Random(num_groups * 2 + (mode == "one"))
    sizes = expert_sizes(num_groups, rng.randint(300, 2500), rng, mode)
    a, b, m_indices, offsets = make_contiguous_inputs(sizes, N, K, seed=num_groups)
    d, poisoned = _run_contiguous(a, b, m_indices)
    _check_contiguous(d, _expected_contiguous(a, b, m_indices), m_indices, poisoned)
    assert_bitwise_equal(_run_contiguous(a, b, m_indices)[0], d, "d (second run)")
    assert_bitwise_equal(_run_contiguous(a, b, offsets=offsets)[0], d, "d (offsets form)")


@pytest.mark.gpu
def test_contiguous_from_moe_layout_with_foreign_ids():
    # moe_layout's m_indices directly; ids outside [0, G) count as padding (never written).
    num_groups, topk = 8, 2
    topk_idx = torch.randint(0, num_groups, (777, topk), device="cuda", dtype=torch.int32,
                             generator=torch.Generator(device="cuda").manual_seed(0))
    layout = deep_kernels.moe_layout(topk_idx, num_groups)
    m_indices = layout.m_indices.clone()
    m_indices[m_indices == 3] = num_groups + 5
    a = cast_activations(gemm_activations(m_indices.numel(), K))
    b = make_weights(num_groups, N, K)
    d, poisoned = _run_contiguous(a, b, m_indices)
    m_indices[m_indices >= num_groups] = -1
    _check_contiguous(d, _expected_contiguous(a, b, m_indices), m_indices, poisoned)


def _random_masked_m(num_groups: int, m_max: int, rng: random.Random) -> list:
    values = [rng.randint(0, m_max) for _ in range(num_groups)]
    values[0] = m_max
    if num_groups > 1:
        values[-1] = 0
    return values


@pytest.mark.gpu
@pytest.mark.parametrize("num_groups", [1, 8, 256])
def test_masked_matches_reference(num_groups):
    rng = random.Random(100 + num_groups)
    m_max = 200 if num_groups <= 32 else 40
    a, b, masked_m = make_masked_inputs(_random_masked_m(num_groups, m_max, rng), m_max, N, K, seed=num_groups)
    expected_m = max(1, sum(masked_m.tolist()) // num_groups)
    d, poisoned = _run_masked(a, b, masked_m, expected_m)
    _check_masked(d, _expected_masked(a, b, masked_m), masked_m, poisoned)
    assert_bitwise_equal(_run_masked(a, b, masked_m, expected_m)[0], d, "d (second run)")


@pytest.mark.gpu
@pytest.mark.parametrize("expected_m", [1, 64, 200])
def test_masked_expected_m_only_steers_tiles(expected_m):
    # Configs picked from very different hints give the same correct rows; out-of-range masked_m is clamped.
    a, b, masked_m = make_masked_inputs([200, 13, 0, 64, 129, 1], 200, N, K)
    masked_m[2] = -5
    masked_m[0] = 1000
    d, poisoned = _run_masked(a, b, masked_m, expected_m)
    _check_masked(d, _expected_masked(a, b, masked_m), masked_m, poisoned)


@pytest.mark.gpu
@pytest.mark.parametrize("scale_format", SCALE_FORMATS)
def test_scale_formats(scale_format):
    rng = random.Random(7)
    a, b, m_indices, _ = make_contiguous_inputs(expert_sizes(4, 1000, rng), N, K, scale_format)
    d, poisoned = _run_contiguous(a, b, m_indices)
    _check_contiguous(d, _expected_contiguous(a, b, m_indices), m_indices, poisoned)

    a, b, masked_m = make_masked_inputs(_random_masked_m(4, 150, rng), 150, N, K, scale_format)
    d, poisoned = _run_masked(a, b, masked_m, 64)
    _check_masked(d, _expected_masked(a, b, masked_m), masked_m, poisoned)


@pytest.mark.gpu
def test_masked_cuda_graph_replay_with_new_masked_m_and_a():
    num_groups, m_max = 8, 128
    rng = random.Random(3)
    a, b, masked_m = make_masked_inputs(_random_masked_m(num_groups, m_max, rng), m_max, N, K)
    d = torch.empty((num_groups, m_max, N), device="cuda", dtype=torch.bfloat16)
    deep_kernels.m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m, 64)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        deep_kernels.m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m, 64)
    for step in range(3):
        new_a, _, new_masked_m = make_masked_inputs(_random_masked_m(num_groups, m_max, rng), m_max, N, K,
                                                    seed=10 + step)
        a[0].copy_(new_a[0])
        a[1].copy_(new_a[1])
        masked_m.copy_(new_masked_m)
        poison_(d)
        poisoned = d.clone()
        graph.replay()
        _check_masked(d, _expected_masked(a, b, masked_m), masked_m, poisoned)


@pytest.mark.gpu
def test_empty_and_limited_sms():
    a, b, m_indices, _ = make_contiguous_inputs([0, 0], N, K)
    d = torch.empty((0, N), device="cuda", dtype=torch.bfloat16)
    assert deep_kernels.m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices) is d
    # Nothing valid: every CTA exits at once and d is untouched.
    a, b, masked_m = make_masked_inputs([0, 0, 0], 64, N, K)
    d, poisoned = _run_masked(a, b, masked_m, 16)
    assert_bitwise_equal(d, poisoned, "d with masked_m = 0")

    rng = random.Random(11)
    a, b, masked_m = make_masked_inputs(_random_masked_m(16, 96, rng), 96, N, K)
    previous = deep_kernels.get_num_sms()
    deep_kernels.set_num_sms(7 if FULL else 9)
    try:
        d, poisoned = _run_masked(a, b, masked_m, 48)
    finally:
        deep_kernels.set_num_sms(previous)
    _check_masked(d, _expected_masked(a, b, masked_m), masked_m, poisoned)


@pytest.mark.gpu
@pytest.mark.parametrize("block_m,block_n,multicast_on_a", [(128, 144, False), (64, 96, True)])
def test_multicast_pairs(monkeypatch, block_m, block_n, multicast_on_a):
    # 2-CTA clusters (rarely picked on the H200): pairs straddling two experts, padding or a masked tail; tiles
    # straddling two sfb blocks (144, 96 columns).
    config = dense_heuristics.make_config(block_m, block_n, 2, multicast_on_a, 2)
    monkeypatch.setattr(grouped_gemm, "_plans", {})
    monkeypatch.setattr(heuristics, "get_grouped_fp8_gemm_config", lambda *args, **kwargs: config)
    rng = random.Random(5)
    a, b, m_indices, _ = make_contiguous_inputs(expert_sizes(8, 1500, rng), N, K)
    d, poisoned = _run_contiguous(a, b, m_indices)
    _check_contiguous(d, _expected_contiguous(a, b, m_indices), m_indices, poisoned)

    a, b, masked_m = make_masked_inputs(_random_masked_m(8, 300, rng), 300, N, K)
    d, poisoned = _run_masked(a, b, masked_m, 150)
    _check_masked(d, _expected_masked(a, b, masked_m), masked_m, poisoned)


@pytest.mark.gpu
@pytest.mark.parametrize("block_n,overlap,multicast", [(192, True, 1), (160, False, 1), (128, True, 2)])
def test_masked_tails_in_one_warpgroup(monkeypatch, block_n, overlap, multicast):
    # 128-row tiles whose rows below masked_m all lie in the first math warpgroup's 64 (a group's last M-block, 1 to
    # 64 rows into it): the second warpgroup steps over the tile while the first computes and stores it. Tails of 1,
    # 63, 64 and 65 rows (one in the second warpgroup), full blocks and empty groups in turn, so that the warpgroups
    # switch between stepping over and computing, also next to a tile issued ahead (the epilogue overlap) and with
    # A multicast; bitwise equal across runs.
    config = dense_heuristics.make_config(128, block_n, multicast, True, 2, overlap_epilogue=overlap)
    monkeypatch.setattr(grouped_gemm, "_plans", {})
    monkeypatch.setattr(heuristics, "get_grouped_fp8_gemm_config", lambda *args, **kwargs: config)
    a, b, masked_m = make_masked_inputs([64, 1, 65, 0, 256, 63, 128, 129, 192, 200, 255, 0, 320], 320, N, K)
    d, poisoned = _run_masked(a, b, masked_m, 150)
    _check_masked(d, _expected_masked(a, b, masked_m), masked_m, poisoned)
    assert_bitwise_equal(_run_masked(a, b, masked_m, 150)[0], d, "d (second run)")


@pytest.mark.gpu
@pytest.mark.parametrize("multicast,on_a,overlap", [(2, True, True), (1, True, False), (2, False, True)])
def test_256_row_tiles(monkeypatch, multicast, on_a, overlap):
    # 256-row tiles: contiguous segments starting on odd 128-row halves (that tile writes only its first 128 rows),
    # one-half segments, an empty expert, tiles holding two experts' rows and padding; masked tails inside either
    # warpgroup's 128 rows; with A multicast an odd N-block count (a pair's second tile past N); with B multicast
    # (contiguous only) pairs of tiles of two experts, of an even and an odd half, and members that start no tile.
    # Deterministic.
    config = dense_heuristics.make_config(256, 128, multicast, on_a, 2, overlap_epilogue=overlap)
    monkeypatch.setattr(grouped_gemm, "_plans", {})
    monkeypatch.setattr(heuristics, "get_grouped_fp8_gemm_config", lambda *args, **kwargs: config)
    for sizes in ([300, 0, 100, 128, 257, 40, 600, 1], [1024, 384, 512, 256, 128, 129, 1000, 0]):
        a, b, m_indices, offsets = make_contiguous_inputs(sizes, N, K)
        d, poisoned = _run_contiguous(a, b, m_indices)
        _check_contiguous(d, _expected_contiguous(a, b, m_indices), m_indices, poisoned)
        assert_bitwise_equal(_run_contiguous(a, b, offsets=offsets)[0], d, "d (second run, offsets form)")
    assert grouped_gemm._plan(grouped_gemm.CONTIGUOUS, m_indices.numel(), N, K, 8)[1].block_m == 256
    if not on_a:
        return

    a, b, masked_m = make_masked_inputs([300, 13, 0, 200, 129, 128, 256, 255], 300, N, K)
    d, poisoned = _run_masked(a, b, masked_m, 150)
    _check_masked(d, _expected_masked(a, b, masked_m), masked_m, poisoned)
    assert_bitwise_equal(_run_masked(a, b, masked_m, 150)[0], d, "d (masked, second run)")


@pytest.mark.gpu
@pytest.mark.parametrize("on_a", [True, False])
def test_256_row_tiles_past_the_odd_half_table(monkeypatch, on_a):
    # The scheduler keeps which odd 128-row halves start a tile for the first 2048 odd halves (rows below 512K) in
    # shared memory and looks later ones up in global memory: segments starting on odd halves on both sides of that
    # bound (half 4095, the table's last bit; 4097 and 4101 past it), an even start between and a one-row expert.
    config = dense_heuristics.make_config(256, 128, 2, on_a, 2, overlap_epilogue=True)
    monkeypatch.setattr(grouped_gemm, "_plans", {})
    monkeypatch.setattr(heuristics, "get_grouped_fp8_gemm_config", lambda *args, **kwargs: config)
    sizes = [4095 * CONTIGUOUS_ALIGNMENT, 256, 300, 128, 1, 129]
    a, b, m_indices, _ = make_contiguous_inputs(sizes, 128, 128)
    starts = [0] + [sum(-(-size // CONTIGUOUS_ALIGNMENT) for size in sizes[:g]) for g in range(1, len(sizes))]
    assert starts[1:] == [4095, 4097, 4100, 4101, 4102]
    d, poisoned = _run_contiguous(a, b, m_indices)
    _check_contiguous(d, _expected_contiguous(a, b, m_indices), m_indices, poisoned)


@pytest.mark.gpu
@pytest.mark.parametrize("block_n,overlap", [(192, True), (160, False)])
def test_ping_pong_matches_lockstep(monkeypatch, block_n, overlap):
    # The ping-pong schedule on both grouped kinds (padding and masked tails, row-predicated stores; with and without
    # the epilogue overlap; tiles straddling sfb blocks at 160 columns): right, deterministic, and the same bytes as
    # the lockstep schedule's.
    rng = random.Random(7)
    a, b, m_indices, _ = make_contiguous_inputs(expert_sizes(8, 1500, rng), N, K)
    masked_a, masked_b, masked_m = make_masked_inputs(_random_masked_m(8, 300, rng), 300, N, K)
    outputs = []
    for ping_pong in (True, True, False):
        config = dense_heuristics.make_config(128, block_n, 1, False, 2, pipelined=False, overlap_epilogue=overlap,
                                              ping_pong=ping_pong)
        monkeypatch.setattr(grouped_gemm, "_plans", {})
        monkeypatch.setattr(heuristics, "get_grouped_fp8_gemm_config", lambda *args, **kwargs: config)
        outputs.append((_run_contiguous(a, b, m_indices), _run_masked(masked_a, masked_b, masked_m, 150)))
        assert grouped_gemm._plan(grouped_gemm.CONTIGUOUS, m_indices.numel(), N, K, 8)[1].ping_pong == ping_pong
    (d, poisoned), (masked_d, masked_poisoned) = outputs[0]
    _check_contiguous(d, _expected_contiguous(a, b, m_indices), m_indices, poisoned)
    _check_masked(masked_d, _expected_masked(masked_a, masked_b, masked_m), masked_m, masked_poisoned)
    for (other, _), (other_masked, _) in outputs[1:]:
        assert_bitwise_equal(other, d, "d (contiguous: ping-pong again, then lockstep)")
        assert_bitwise_equal(other_masked, masked_d, "d (masked: ping-pong again, then lockstep)")


@pytest.mark.gpu
@pytest.mark.parametrize("plant", PLANTS)
def test_contiguous_check_rejects_a_wrong_layout(plant):
    # The real kernel given m_indices with one planted bug; the check that passes the right result rejects it
    # (compared with the reference of the right layout).
    a, b, m_indices, _ = make_contiguous_inputs(PLANT_SIZES, N, K)
    expected = _expected_contiguous(a, b, m_indices)
    d, poisoned = _run_contiguous(a, b, m_indices)
    _check_contiguous(d, expected, m_indices, poisoned)
    d, _ = _run_contiguous(a, b, _planted_m_indices(m_indices, PLANT_SIZES, plant))
    with pytest.raises(AssertionError, match=PLANT_FAILURES[plant]):
        _check_contiguous(d, expected, m_indices, poisoned)


@pytest.mark.gpu
@pytest.mark.parametrize("step", [1, -1])
def test_masked_check_rejects_masked_m_off_by_one(step):
    # One group's masked_m one too high (the kernel writes a row it must not) or too low (a row stays poisoned).
    a, b, masked_m = make_masked_inputs([200, 13, 0, 64, 129, 1], 200, N, K)
    expected = _expected_masked(a, b, masked_m)
    d, poisoned = _run_masked(a, b, masked_m, 64)
    _check_masked(d, expected, masked_m, poisoned)
    wrong = masked_m.clone()
    wrong[1] += step
    d, _ = _run_masked(a, b, wrong, 64)
    with pytest.raises(AssertionError, match=MASKED_STEP_FAILURES[step]):
        _check_masked(d, expected, masked_m, poisoned)
