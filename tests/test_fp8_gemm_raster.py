"""The scheduler's rasterisation band (Fp8GemmConfig.raster_band_n_units, the kernel's kRasterBandNUnits): it changes
which tiles a wave's CTAs run together and nothing a tile computes, so D is bitwise the twin config's with the default
band (with a tail split, the band also picks which tiles are split, whose sums then differ in order: there only the
float64 check and run to run); checked against float64 of the dequantized inputs with outputs poisoned, run to run, and with a planted bug (one
tile's B rows negated) that the same check rejects. Also the multi-wave tail split at 4096 x 2112 x 7168 (128 x 192
tiles, three splits of the last partial wave's tiles: two waves of jobs).

CPU: the label, the template argument, what make_config and the config override take.
"""

import dataclasses

import pytest
import torch

from deep_kernels import gemm
from deep_kernels.heuristics import fp8_gemm as heuristics
from deep_kernels.reference import gemm as reference
from deep_kernels.testing import assert_bitwise_equal, poison_
from deep_kernels.testing.gemm import assert_gemm_close, make_gemm_inputs

# (block_m, block_n, multicast, multicast_on_a, overlap, splits, band, m, n, k)
BAND_CASES = [
    (128, 192, 1, False, True, 1, 11, 4096, 2112, 7168),  # the whole N per band; 2112 = 11 x 192
    (256, 128, 2, True, True, 1, 4, 1000, 7168, 2048),    # pairs multicasting A; a partial last M tile; 7 bands of 4
    (128, 128, 1, False, False, 1, 1, 777, 1040, 512),    # one N-unit per band; partial M and N tiles
    (128, 192, 1, False, False, 3, 11, 4096, 2112, 7168),  # the tail split (3 splits of the last wave's 88 tiles)
]


def band_config(block_m, block_n, multicast, on_a, overlap, splits, band=None):
    return heuristics.make_config(block_m, block_n, multicast, on_a, 2, num_splits=splits, overlap_epilogue=overlap,
                                  raster_band_n_units=band)


def case_specs() -> list:
    """The kernel specs the GPU tests below launch (for a parallel precompile before them)."""
    specs = []
    for block_m, block_n, multicast, on_a, overlap, splits, band, m, n, k in BAND_CASES:
        for b in (band, None):
            specs.append(gemm.kernel_spec(band_config(block_m, block_n, multicast, on_a, overlap, splits, b), n, k,
                                          torch.bfloat16, False))
    return specs


# ---- host rules (CPU) ----

def test_config_label_and_template_argument():
    config = band_config(128, 192, 1, False, True, 1, 11)
    assert heuristics.config_label(config) == "128x192/1or11"
    assert heuristics.config_label(band_config(128, 192, 1, False, True, 1)) == "128x192/1o"

    def argument(config) -> str:
        args = heuristics.template_args(config, 2112, 7168, "bfloat16", False)
        return dict(zip(gemm.FP8_GEMM.template, args))["kRasterBandNUnits"]

    assert argument(config) == "11"
    assert argument(band_config(128, 192, 1, False, True, 1)) == str(heuristics.DEFAULT_RASTER_BAND_N_UNITS) == "8"
    assert heuristics.make_config(**heuristics.config_fields(config), out_dtype_bytes=2) == config
    with pytest.raises(ValueError, match="raster_band_n_units"):
        heuristics.make_config(128, 192, 1, False, 2, raster_band_n_units=0)


def test_override_sets_it_and_keeps_it():
    pick = heuristics.get_fp8_gemm_config(4096, 2112, 7168, 132, allow_split_k=True)
    assert pick.raster_band_n_units == heuristics.DEFAULT_RASTER_BAND_N_UNITS
    banded = gemm.apply_config_override(pick, gemm.parse_config_override("raster_band=11"), 2, 7168)
    assert banded.raster_band_n_units == 11
    assert banded == dataclasses.replace(pick, raster_band_n_units=11)
    assert gemm.apply_config_override(banded, {"block_n": 160}, 2, 7168).raster_band_n_units == 11


def test_model_keeps_the_default_band():
    # Forced only: no candidate takes another band.
    for m in (64, 128, 4096):
        for n, k in ((2112, 7168), (24576, 1536), (7168, 16384)):
            assert all(c.raster_band_n_units == heuristics.DEFAULT_RASTER_BAND_N_UNITS
                       for c in heuristics.candidate_configs(m, n, 132, k=k))


# ---- the kernel (GPU) ----

def _product(config, a, b, m: int, n: int) -> torch.Tensor:
    d = poison_(torch.empty((m, n), device="cuda", dtype=torch.bfloat16))
    gemm.forced_config_call(config, a, b, d)()
    return d


@pytest.mark.gpu
@pytest.mark.parametrize("block_m,block_n,multicast,on_a,overlap,splits,band,m,n,k", BAND_CASES)
def test_matches_reference_and_twin(block_m, block_n, multicast, on_a, overlap, splits, band, m, n, k):
    config = band_config(block_m, block_n, multicast, on_a, overlap, splits, band)
    twin = band_config(block_m, block_n, multicast, on_a, overlap, splits)
    a, b = make_gemm_inputs(m, n, k)
    expected = reference.fp8_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64))
    runs = [_product(config, a, b, m, n) for _ in range(2)]
    assert_gemm_close(runs[0], expected)
    assert_bitwise_equal(runs[1], runs[0], "d (run 2)")
    if splits == 1:
        assert_bitwise_equal(runs[0], _product(twin, a, b, m, n), "d against the twin with the default band")


@pytest.mark.gpu
def test_check_rejects_a_wrong_tile():
    # The kernel's result with one 128-row tile of B negated fails the check against the product of the true B.
    m, n, k = 777, 1040, 512
    config = band_config(128, 128, 1, False, False, 1, 1)
    a, b = make_gemm_inputs(m, n, k)
    expected = reference.fp8_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64))
    planted_b = (b[0].clone(), b[1])
    planted_b[0][256:384] = (-planted_b[0][256:384].float()).to(planted_b[0].dtype)
    planted = _product(config, a, planted_b, m, n)
    assert torch.isfinite(planted).all()
    with pytest.raises(AssertionError):
        assert_gemm_close(planted, expected)
