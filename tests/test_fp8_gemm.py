"""FP8 GEMM with fine-grained scaling: input validation (CPU) and the kernel against a float64 reference of the
dequantized inputs (GPU).

The check is deep_kernels.testing.gemm.assert_gemm_close: calc_diff below 1e-5 for bf16 D (bf16 rounding alone
gives at most 7.6e-6, 1.4e-6 typically) and 2e-7 for FP32 D, on the whole matrix, every 128 x 128 tile and every
row, with NaN and inf where the reference has them. Outputs are poisoned (NaN) before each launch, so every
element is checked. Inputs give each 128 x 128 weight block and each activation row its own power-of-two
magnitude (2^-8 .. 2^8), so a wrong scale choice moves the result far past the bound; the planted-bug tests run
the real kernel with one wrong weight-scale block (where a tile straddles two blocks) and one wrong activation
scale row, and show that the same check rejects each result.

Each property is tested once on the shapes that exercise it (not the cross product of every option): the
heuristics' picks over DeepSeek-V3 and odd shapes, split-K (decode sizes, forced splits, fewer SMs, the last
wave's tiles), the pipelined K loop and the epilogue overlap against the plain kernel, tiles straddling sfb
blocks at every tile height, the scale formats and CUDA graphs.
"""

import json
import os
import random
import subprocess
import sys

import pytest
import torch

import deep_kernels
from deep_kernels import gemm
from deep_kernels.heuristics import fp8_gemm as heuristics
from deep_kernels.reference import gemm as reference
from deep_kernels.reference.quant import unpack_scales
from deep_kernels.testing import assert_bitwise_equal, calc_diff, empty_like_strided, one_row_of_wider_rows, poison_
from deep_kernels.testing import gemm as testing_gemm
from deep_kernels.testing.gemm import (
    BF16_BOUND, FP32_BOUND, accumulator_like, assert_gemm_close, cast_activations, cast_weights, gemm_activations,
    gemm_errors, gemm_weights, make_gemm_inputs,
)
from deep_kernels.testing.wgrad import make_wgrad_inputs

from conftest import FULL

DEEPSEEK_NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]


def _reference(a, b, c: torch.Tensor = None, recipe=None) -> torch.Tensor:
    """The float64 product (+ c) of the dequantized inputs, on a's device."""
    m, n = a[0].shape[0], b[0].shape[0]
    return reference.fp8_gemm_nt(a, b, torch.empty((m, n), device=a[0].device, dtype=torch.float64), c=c,
                                 recipe=recipe)


def _run(a, b) -> torch.Tensor:
    """fp8_gemm_nt into a poisoned bf16 d."""
    m, n = a[0].shape[0], b[0].shape[0]
    return deep_kernels.fp8_gemm_nt(a, b, poison_(torch.empty((m, n), device="cuda", dtype=torch.bfloat16)))


# ---- validation (CPU) ----

def _cpu_operands(m=8, n=256, k=256):
    a = (torch.zeros(m, k, dtype=torch.float8_e4m3fn), torch.ones(m, k // 128))
    b = (torch.zeros(n, k, dtype=torch.float8_e4m3fn), torch.ones((n + 127) // 128, k // 128))
    return a, b, torch.empty(m, n, dtype=torch.bfloat16)


@pytest.mark.parametrize("mutate,error,match", [
    (lambda a, b, d: ((a[0].view(torch.uint8), a[1]), b, d), TypeError, "a must be torch.float8_e4m3fn"),
    (lambda a, b, d: (a, (b[0][:, :128], b[1]), d), ValueError, "K differs"),
    (lambda a, b, d: ((a[0][:, :200], a[1]), (b[0][:, :200], b[1]), d), ValueError, r"K \(the columns of a and b\)"),
    (lambda a, b, d: (a, (b[0][:200], b[1]), d[:, :200]), ValueError, "multiple of 16"),
    (lambda a, b, d: (a, b, d.float()), TypeError, "pass c"),
    (lambda a, b, d: (a, b, d[:, :128]), ValueError, "d must be a contiguous"),
    (lambda a, b, d: ((a[0], a[1][:, :1]), b, d), ValueError, "sfa must have shape"),
    (lambda a, b, d: (a, (b[0], b[1][:1]), d), ValueError, "sfb must have shape"),
    (lambda a, b, d: ((a[0], a[1].half()), b, d), TypeError, "sfa must be"),
    (lambda a, b, d: (a[0], b, d), TypeError, "pairs"),
    (lambda a, b, d: (a, b, d), ValueError, "must be a CUDA tensor"),
])
def test_rejects_bad_input(mutate, error, match):
    with pytest.raises(error, match=match):
        deep_kernels.fp8_gemm_nt(*mutate(*_cpu_operands()))


def test_accumulation_needs_fp32():
    a, b, d = _cpu_operands()
    with pytest.raises(TypeError, match="d must be torch.float32"):
        deep_kernels.fp8_gemm_nt(a, b, d, c=torch.zeros(8, 256))


def test_mn_major_helper_layout():
    scales = torch.arange(15.0).view(5, 3)
    out = deep_kernels.get_mn_major_tma_aligned_tensor(scales)
    assert out.stride() == (1, 8) and torch.equal(out, scales)
    assert deep_kernels.get_mn_major_tma_aligned_tensor(out) is out
    # DeepGEMM 1.x's name, which older callers import.
    assert torch.equal(deep_kernels.get_col_major_tma_aligned_tensor(scales), out)


@pytest.mark.parametrize("helper", ["get_mn_major_tma_aligned_tensor", "get_col_major_tma_aligned_tensor"])
def test_mn_major_helper_rejects_bad_scales(helper):
    with pytest.raises(TypeError, match="scales must be torch.float32, got torch.bfloat16"):
        getattr(deep_kernels, helper)(torch.ones(4, 2, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"scales must be 2-D \[M, G\] or 3-D \[B, M, G\], got shape \(8,\)"):
        getattr(deep_kernels, helper)(torch.ones(8))


def test_reference_matches_unquantized_product():
    a, b = make_gemm_inputs(64, 256, 512, device="cpu")
    d = torch.empty(64, 256)
    reference.fp8_gemm_nt(a, b, d)
    exact = reference.dequantize_a(*a) @ reference.dequantize_b(*b).T
    assert calc_diff(d, exact) < 1e-12


def test_inputs_spread_scales_over_powers_of_two():
    # Every weight block and activation row its own magnitude: neighbouring scales differ by 2x or more.
    w = gemm_weights(1024, 1024, device="cpu")
    block_exponents = w.float().abs().view(8, 128, 8, 128).amax(dim=(1, 3)).log2().round()
    assert block_exponents.max() - block_exponents.min() >= 12
    assert (block_exponents[:, 1:] != block_exponents[:, :-1]).float().mean() > 0.8
    row_exponents = gemm_activations(256, 512, device="cpu").float().abs().amax(dim=1).log2().round()
    assert row_exponents.max() - row_exponents.min() >= 12


def test_check_bounds_bf16_rounding_and_flags_nan_and_inf():
    a, b = make_gemm_inputs(200, 1040, 256, device="cpu")
    expected = _reference(a, b)
    errors = assert_gemm_close(expected.bfloat16(), expected)
    assert max(errors["whole"], errors["tile"][0], errors["row"][0]) < BF16_BOUND / 3
    assert_gemm_close(expected.float(), expected)
    for value, position in ((float("nan"), (3, 1039)), (float("inf"), (199, 0)), (-float("inf"), (0, 7))):
        d = expected.bfloat16()
        d[position] = value
        with pytest.raises(AssertionError, match="differ in being"):
            assert_gemm_close(d, expected)
        both = expected.clone()
        both[position] = value
        assert_gemm_close(both.bfloat16(), both)


def test_calc_diff_scores_non_finite_elements_as_infinitely_far():
    x = torch.randn(64, 32, dtype=torch.float64)
    assert calc_diff(x, x) == 0 and calc_diff(torch.zeros(3), torch.zeros(3)) == 0
    assert 0 < calc_diff(x, x * 1.001) < 1e-6
    for value in (float("nan"), float("inf"), -float("inf")):
        poisoned = x.clone()
        poisoned[5, 7] = value
        assert calc_diff(poisoned, x) == calc_diff(x, poisoned) == calc_diff(poisoned, poisoned) == float("inf")


@pytest.mark.parametrize("m,n,k", [(256, 512, 1024), (64, 2112, 512), (300, 16, 640)])
@pytest.mark.parametrize("recipe", [None, (1, 1, 128)])
def test_fp32_bound_rejects_a_c_read_as_bf16(m, n, k, recipe):
    # What FP32_BOUND must still catch over the whole matrix: the kernels' own error is about 2e-8 (its docstring).
    a, b = (make_wgrad_inputs if recipe else make_gemm_inputs)(m, n, k, device="cpu")
    c = accumulator_like(_reference(a, b, recipe=recipe))
    c_as_bf16 = _reference(a, b, c.bfloat16().float(), recipe=recipe).float()
    assert gemm_errors(c_as_bf16, _reference(a, b, c, recipe=recipe))["whole"] > 2.5 * FP32_BOUND
    with pytest.raises(AssertionError, match="over the whole matrix"):
        assert_gemm_close(c_as_bf16, _reference(a, b, c, recipe=recipe))


def test_check_records_its_errors_while_asked(monkeypatch):
    a, b = make_gemm_inputs(200, 256, 256, device="cpu")
    expected = _reference(a, b)
    assert_gemm_close(expected.float(), expected)  # nothing recorded
    monkeypatch.setattr(testing_gemm, "recorded_errors", [])
    close = assert_gemm_close(expected.bfloat16(), expected)
    with pytest.raises(AssertionError, match="over the whole matrix"):
        assert_gemm_close(expected.float() * 1.01, expected)  # failing checks are recorded too
    (dtype, bound, errors), (failed_dtype, failed_bound, failed) = testing_gemm.recorded_errors
    assert (dtype, bound, errors) == ("bfloat16", BF16_BOUND, close) and errors["whole"] > 0
    assert (failed_dtype, failed_bound) == ("float32", FP32_BOUND) and failed["whole"] > FP32_BOUND


@pytest.mark.host_only
def test_the_test_session_writes_the_recorded_errors(tmp_path):
    # DK_GEMM_ERRORS_OUT (tests/conftest.py): one line per check, written after each test.
    out = tmp_path / "errors.jsonl"
    env = dict(os.environ, DK_GEMM_ERRORS_OUT=str(out))
    test = f"{__file__}::test_check_bounds_bf16_rounding_and_flags_nan_and_inf"
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 5 and {r["dtype"] for r in records} == {"bfloat16", "float32"}
    assert all(r["test"].endswith("test_check_bounds_bf16_rounding_and_flags_nan_and_inf") for r in records)
    assert 0 < records[0]["whole"] < BF16_BOUND and records[0]["bound"] == BF16_BOUND


def _planted_sfb(sfb: torch.Tensor, n: int, block_n: int, plant: str) -> torch.Tensor:
    """sfb with one planted bug where a tile of block_n columns straddles two 128-column scale blocks:
    "straddle": the last tile's second block (lying wholly in that tile) takes its first block's scales, as a
    kernel applying one block's scales to the whole tile would;
    "double": block 1's largest scale (block 1 is straddled by tiles 0 and 1) times 2;
    "swap": blocks 1 and 2 swap their scales in the K block where they differ most."""
    wrong = sfb.clone()
    if plant == "straddle":
        start = (n - 1) // block_n * block_n
        first, second = start // 128, (n - 1) // 128
        assert second == first + 1 and second * 128 >= start, "the last tile must hold all of a second block"
        wrong[second] = sfb[first]
    elif plant == "double":
        assert 128 < block_n < 256, "tile 0 must end inside block 1"
        wrong[1, int(sfb[1].argmax())] *= 2
    else:
        kb = int((sfb[1] / sfb[2]).log2().abs().argmax())
        wrong[1, kb], wrong[2, kb] = sfb[2, kb], sfb[1, kb]
    # The plant moves some block's scale by a factor of 2 or more.
    assert float((wrong / sfb).log2().abs().max()) >= 1
    return wrong


@pytest.mark.parametrize("plant,block_n", [("straddle", 144), ("double", 160), ("swap", 160)])
def test_check_rejects_planted_weight_scales_on_cpu(plant, block_n):
    # The inputs and the check on their own (the reference computes the planted product): the GPU test below
    # does the same with the kernel.
    a, (b, sfb) = make_gemm_inputs(64, 1040, 512, device="cpu")
    planted = _reference(a, (b, _planted_sfb(sfb, 1040, block_n, plant))).bfloat16()
    errors = gemm_errors(planted, _reference(a, (b, sfb)))
    assert errors["tile"][0] > 100 * BF16_BOUND


def test_check_rejects_a_planted_activation_row_on_cpu():
    (q, sfa), b = make_gemm_inputs(64, 1040, 512, device="cpu")
    wrong = sfa.clone()
    row = int(sfa.amax(dim=1).argmin())
    wrong[row] *= 2
    errors = gemm_errors(_reference((q, wrong), b).bfloat16(), _reference((q, sfa), b))
    # Only the row check sees a wrong scale on the smallest row; it sees it at calc_diff 0.2 (a doubled row).
    assert errors["whole"] < BF16_BOUND and errors["tile"][0] < BF16_BOUND and errors["row"][0] > 0.1


# ---- config override (CPU) ----

def _override_config(monkeypatch, **fields):
    """fp8_gemm_nt with DK_FP8_GEMM_CONFIG's fields set as given, and no plan or prepared call kept from before."""
    monkeypatch.setattr(gemm, "_config_override", lambda: fields)
    monkeypatch.setattr(gemm, "_plans", {})
    monkeypatch.setattr(gemm, "_prepared_calls", {})


def _force_tiles(monkeypatch, block_m: int, block_n: int, **fields):
    """One unsplit kernel of the given tiles, no multicast and no epilogue overlap, unless fields say otherwise."""
    _override_config(monkeypatch, **{"block_m": block_m, "block_n": block_n, "multicast": 1, "multicast_on_a": 0,
                                     "splits": 1, "overlap_epilogue": 0, **fields})


def test_config_override_keeps_the_overlap_only_where_the_tiling_has_one(monkeypatch):
    # A pick that overlaps its epilogue; overriding its tiling to 64 rows or to split-K drops the overlap (the
    # kernel has none there) instead of failing, and overlap_epilogue=0 turns it off.
    pick = heuristics.make_config(128, 128, 1, False, 2, overlap_epilogue=True)
    monkeypatch.setattr(heuristics, "get_fp8_gemm_config", lambda *args, **kwargs: pick)
    for fields, overlap in (({"block_m": 64}, False), ({"splits": 2}, False), ({"block_n": 112}, True),
                            ({"overlap_epilogue": 0}, False)):
        monkeypatch.setattr(gemm, "_config_override", lambda: fields)
        assert gemm._choose_config(4096, 7168, 2048, 132, 2, False).overlap_epilogue == overlap, fields


def test_config_override_forces_and_keeps_the_ping_pong_schedule(monkeypatch):
    # ping_pong=1 forces the schedule (with the plain K loop); a pick's schedule carries over only to tilings that
    # take it.
    pick = heuristics.make_config(256, 128, 2, True, 2, ping_pong=True)
    monkeypatch.setattr(heuristics, "get_fp8_gemm_config", lambda *args, **kwargs: pick)
    for fields, ping_pong in (({}, True), ({"block_n": 96}, True), ({"block_m": 128}, True), ({"block_m": 64}, False),
                              ({"block_m": 128, "pipelined": 1}, False), ({"ping_pong": 0}, False)):
        monkeypatch.setattr(gemm, "_config_override", lambda: fields)
        config = gemm._choose_config(4096, 4096, 7168, 132, 2, False)
        assert config.ping_pong == ping_pong and not (config.ping_pong and config.pipelined), fields
    assert gemm.parse_config_override("block_m=128,ping_pong=1") == {"block_m": 128, "ping_pong": 1}
    plain = heuristics.make_config(128, 128, 1, False, 2)
    forced = gemm.apply_config_override(plain, {"ping_pong": 1}, 2, 7168)
    assert (forced.ping_pong, forced.pipelined) == (True, False)
    assert gemm.apply_config_override(plain, {"ping_pong": 1}, 2, 7168, grouped=True).ping_pong


def test_config_override_rejects_unknown_fields_and_values():
    assert gemm.parse_config_override("block_m=256, block_n=128,multicast=2") == {
        "block_m": 256, "block_n": 128, "multicast": 2}
    with pytest.raises(ValueError, match="'blockm=128' is not field=value"):
        gemm.parse_config_override("blockm=128")
    with pytest.raises(ValueError, match="'stages' is not field=value"):
        gemm.parse_config_override("block_m=128,stages")
    with pytest.raises(ValueError, match="block_n must be an integer, got 'x'"):
        gemm.parse_config_override("block_n=x")
    pick = heuristics.make_config(128, 128, 1, False, 2)
    assert gemm.apply_config_override(pick, {"stages": 5}, 2, 512).num_stages == 5
    with pytest.raises(ValueError, match="6 stages of 128x128 tiles need 232544 bytes of shared memory"):
        gemm.apply_config_override(pick, {"stages": 6}, 2, 512)


def test_config_override_applies_to_the_grouped_gemms(monkeypatch):
    from deep_kernels import grouped_gemm

    monkeypatch.setattr(grouped_gemm, "get_gemm_kernel", lambda config, *args: config)
    monkeypatch.setattr(grouped_gemm, "get_num_sms", lambda: 132)
    monkeypatch.setattr(grouped_gemm, "_plans", {})
    monkeypatch.setattr(gemm, "_config_override", lambda: {"block_n": 96, "multicast": 1})
    config = grouped_gemm._plan("m_grouped_masked", 256, 4096, 7168, 4)[1]
    assert (config.block_n, config.num_tma_multicast) == (96, 1)
    monkeypatch.setattr(grouped_gemm, "_plans", {})
    monkeypatch.setattr(gemm, "_config_override", lambda: {"block_m": 256, "block_n": 128, "multicast": 2,
                                                           "multicast_on_a": 1})
    config = grouped_gemm._plan("m_grouped_contiguous", 4096, 4096, 7168, 4)[1]
    assert (config.block_m, config.block_n, config.num_tma_multicast, config.multicast_on_a) == (256, 128, 2, True)
    for fields in ({"splits": 2}, {"block_m": 256, "block_n": 192},
                   {"block_m": 256, "block_n": 128, "multicast": 2, "multicast_on_a": 0}):
        monkeypatch.setattr(grouped_gemm, "_plans", {})
        monkeypatch.setattr(gemm, "_config_override", lambda: fields)
        with pytest.raises(ValueError, match="grouped GEMMs take no split-K, and 256-row tiles only"):
            grouped_gemm._plan("m_grouped_contiguous", 4096, 4096, 7168, 4)


# ---- kernel against the reference (GPU) ----

def _shapes():
    # Decode (split-K), one and two math warpgroups, large M, odd M, a partial last N block (576 = 4.5 x 128),
    # one 16-column N block (1040), one K block (128) and the longest K (16384).
    shapes = [(1, 2112, 7168), (64, 7168, 2048), (128, 4096, 7168), (4096, 24576, 1536), (4001, 32768, 512),
              (129, 576, 7168), (777, 7168, 16384), (8192, 4096, 7168), (3, 1040, 128)]
    if FULL:
        rng = random.Random(0)
        shapes += [(rng.randint(1, 8192), *rng.choice(DEEPSEEK_NK)) for _ in range(12)]
    return shapes


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", _shapes())
def test_matches_reference(m, n, k):
    a, b = make_gemm_inputs(m, n, k)
    d = _run(a, b)
    assert_gemm_close(d, _reference(a, b))
    assert_bitwise_equal(_run(a, b), d, "d (second run)")


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,alias", [(100, 2112, 7168, False), (4096, 7168, 2048, True)])
def test_accumulation(m, n, k, alias):
    a, b = make_gemm_inputs(m, n, k)
    product = _reference(a, b)
    c = accumulator_like(product)
    d = c.clone() if alias else poison_(torch.empty((m, n), device="cuda"))
    deep_kernels.fp8_gemm_nt(a, b, d, c=d if alias else c)
    assert_gemm_close(d, product + c.double())


@pytest.mark.gpu
def test_other_scale_layouts():
    # Power-of-two scales in the forms the kernel converts first: packed UE8M0 sfa and sfb, and the same values
    # as row-major FP32 sfa with FP32 sfb, which give the same bits.
    m, n, k = 300, 1024, 2048
    q, packed_sfa = cast_activations(gemm_activations(m, k), "ue8m0")
    b, packed_sfb = cast_weights(gemm_weights(n, k), "ue8m0")
    assert packed_sfa.dtype == packed_sfb.dtype == torch.int32
    row_major_sfa = unpack_scales(packed_sfa, m, k // 128)
    fp32_sfb = unpack_scales(packed_sfb, n // 128, k // 128)
    d = _run((q, packed_sfa), (b, packed_sfb))
    assert_gemm_close(d, _reference((q, row_major_sfa), (b, fp32_sfb)))
    assert_bitwise_equal(_run((q, row_major_sfa), (b, fp32_sfb)), d, "d (FP32 scales against packed ones)")


def _captured_call(m: int, n: int, k: int):
    """(a, b, d, graph): one eager call (compiles, plans, sizes buffers), then the same call captured."""
    a, b = make_gemm_inputs(m, n, k)
    d = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
    deep_kernels.fp8_gemm_nt(a, b, d)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        deep_kernels.fp8_gemm_nt(a, b, d)
    return a, b, d, graph


def _new_activations_(a, m: int, k: int, seed: int) -> None:
    new_a = cast_activations(gemm_activations(m, k, seed=seed))
    a[0].copy_(new_a[0])
    a[1].copy_(new_a[1])


@pytest.mark.gpu
def test_cuda_graph_replay_with_new_inputs():
    m, n, k = 128, 4096, 7168
    a, b, d, graph = _captured_call(m, n, k)
    _new_activations_(a, m, k, seed=10)
    poison_(d)
    graph.replay()
    assert_gemm_close(d, _reference(a, b))


@pytest.mark.gpu
def test_empty_m_and_limited_sms():
    a, b = make_gemm_inputs(0, 2112, 7168)
    d = torch.empty((0, 2112), device="cuda", dtype=torch.bfloat16)
    assert deep_kernels.fp8_gemm_nt(a, b, d) is d
    a, b = make_gemm_inputs(1000, 2112, 7168)
    full = _run(a, b)
    previous = deep_kernels.get_num_sms()
    deep_kernels.set_num_sms(60)
    try:
        d = _run(a, b)
    finally:
        deep_kernels.set_num_sms(previous)
    expected = _reference(a, b)
    assert_gemm_close(d, expected)
    assert_gemm_close(full, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [2112, 7168])
def test_one_row_views_of_wider_rows(n):
    # With one row the row stride is never stepped over: no alignment is asked of it (TMA's included).
    k = 7168
    (q, sfa), b = make_gemm_inputs(1, n, k)
    d = one_row_of_wider_rows(torch.empty((1, n), device="cuda", dtype=torch.bfloat16), 4, poisoned=True)
    deep_kernels.fp8_gemm_nt((one_row_of_wider_rows(q, 8), sfa), b, d)
    assert_gemm_close(d, _reference((q, sfa), b))


@pytest.mark.multi_gpu
def test_tensors_on_another_device_than_the_current_one():
    # The launch goes to the tensors' device, on its current stream, and leaves the caller's device current.
    assert torch.cuda.current_device() == 0
    m, n, k = 300, 2112, 7168
    a, b = make_gemm_inputs(m, n, k)
    a, b = tuple(t.to("cuda:1") for t in a), tuple(t.to("cuda:1") for t in b)
    d = poison_(torch.empty((m, n), device="cuda:1", dtype=torch.bfloat16))
    deep_kernels.fp8_gemm_nt(a, b, d)
    assert torch.cuda.current_device() == 0
    assert_gemm_close(d, _reference(a, b))


# ---- tiles straddling sfb blocks, and planted bugs (GPU) ----

# (M, N, K) of the straddling-tile and planted-bug tests: N = 1040 ends in a 16-column sfb block, which the last
# tile of 144 (or 112) columns straddles together with the block before.
STRADDLE_SHAPE = (300, 1040, 512)


@pytest.mark.gpu
@pytest.mark.parametrize("block_m,block_n",
                         [(bm, bn) for bm, bn in ((64, 144), (256, 112)) if bm in heuristics.BLOCK_MS])
def test_straddling_tiles_match_reference(monkeypatch, block_m, block_n):
    # Tiles covering parts of two sfb blocks at each tile height (128 rows: the planted-bug tests below, which
    # check the right result first, at 144 and 160 columns).
    _force_tiles(monkeypatch, block_m, block_n)
    a, b = make_gemm_inputs(*STRADDLE_SHAPE)
    config = _chosen_config(*STRADDLE_SHAPE, torch.bfloat16, False)
    assert (config.block_m, config.block_n) == (block_m, block_n)
    assert_gemm_close(_run(a, b), _reference(a, b))


@pytest.mark.gpu
@pytest.mark.parametrize("plant,block_n", [("straddle", 144), ("double", 160), ("swap", 160)])
def test_check_rejects_a_wrong_weight_scale_block(monkeypatch, plant, block_n):
    # The real kernel, with tiles straddling two sfb blocks, given one wrong block scale: the check that passes
    # the right result rejects the planted one (compared with the reference of the right inputs).
    m, n, k = STRADDLE_SHAPE
    _force_tiles(monkeypatch, 128, block_n)
    a, (b, sfb) = make_gemm_inputs(m, n, k)
    expected = _reference(a, (b, sfb))
    assert_gemm_close(_run(a, (b, sfb)), expected)
    planted = _run(a, (b, _planted_sfb(sfb, n, block_n, plant)))
    assert torch.isfinite(planted).all()
    with pytest.raises(AssertionError, match="calc_diff"):
        assert_gemm_close(planted, expected)


@pytest.mark.gpu
def test_check_rejects_a_wrong_activation_scale_row(monkeypatch):
    # The smallest row's scales doubled: invisible in its tile (the large rows dominate it), caught by the row check.
    _force_tiles(monkeypatch, 128, 144)
    (q, sfa), b = make_gemm_inputs(*STRADDLE_SHAPE)
    expected = _reference((q, sfa), b)
    assert_gemm_close(_run((q, sfa), b), expected)
    wrong = empty_like_strided(sfa).copy_(sfa)
    wrong[int(sfa.amax(dim=1).argmin())] *= 2
    planted = _run((q, wrong), b)
    assert torch.isfinite(planted).all()
    with pytest.raises(AssertionError, match="worst row"):
        assert_gemm_close(planted, expected)


# ---- split-K (GPU) ----

def _chosen_config(m, n, k, out_dtype, accumulate):
    return gemm._plan(m, n, k, out_dtype, accumulate)[1]


def _run_modes(a, b, m, n, mode, c=None):
    """One call of fp8_gemm_nt from a fresh output: "bf16" (no c), "c" (c separate from d), "c_alias" (c is d)."""
    if mode == "bf16":
        return _run(a, b)
    if mode == "c":
        d = poison_(torch.empty((m, n), device="cuda"))
        return deep_kernels.fp8_gemm_nt(a, b, d, c=c)
    d = c.clone()
    return deep_kernels.fp8_gemm_nt(a, b, d, c=d)


def _check_split_k(m, n, k, mode):
    """The product against the float64 reference, and three runs bitwise equal."""
    a, b = make_gemm_inputs(m, n, k)
    expected = _reference(a, b)
    c = None
    if mode != "bf16":
        c = accumulator_like(expected)
        expected += c.double()
    runs = [_run_modes(a, b, m, n, mode, c) for _ in range(3)]
    assert_gemm_close(runs[0], expected)
    for i, again in enumerate(runs[1:], 1):
        assert_bitwise_equal(again, runs[0], f"d (run {i + 1})")


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,mode", [
    (1, 2112, 7168, "bf16"), (17, 24576, 1536, "c"), (64, 32768, 512, "c_alias"), (128, 7168, 16384, "bf16"),
    (1, 4096, 7168, "c_alias"), (17, 7168, 2048, "bf16"), (64, 2112, 7168, "c"), (128, 4096, 7168, "c"),
    (64, 7168, 16384, "bf16"), (17, 7168, 16384, "c_alias"),
])
def test_decode_shapes_match_reference(m, n, k, mode):
    # The heuristics' own choice at decode sizes (every DeepSeek-V3 N, K; each output mode): split-K where the
    # tiles are few and K is long.
    _check_split_k(m, n, k, mode)
    if (n, k) in ((2112, 7168), (4096, 7168)):
        out_dtype = torch.bfloat16 if mode == "bf16" else torch.float32
        assert _chosen_config(m, n, k, out_dtype, mode != "bf16").num_splits > 1


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,block_m,mode", [
    (17, 2112, 7168, 64, "bf16"),      # 33 tiles x 3 splits
    (128, 32768, 512, 128, "c_alias"),  # 4 K blocks in 3 uneven splits; more jobs than CTAs
    (128, 24576, 1536, 128, "bf16"),    # more jobs than CTAs (several per CTA)
    (17, 7168, 16384, 64, "c_alias"),
])
def test_forced_split_k_matches_reference(monkeypatch, m, n, k, block_m, mode):
    # The split path on shapes the heuristics would not split: the heuristics' N tile, no multicast, 3 splits.
    out_dtype = torch.bfloat16 if mode == "bf16" else torch.float32
    _override_config(monkeypatch, block_m=block_m, multicast=1, multicast_on_a=0, splits=3)
    assert _chosen_config(m, n, k, out_dtype, mode != "bf16").num_splits == 3
    _check_split_k(m, n, k, mode)


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,num_sms", [(64, 2112, 7168, 60), (128, 4096, 7168, 33)])
def test_split_k_with_fewer_sms(m, n, k, num_sms):
    previous = deep_kernels.get_num_sms()
    deep_kernels.set_num_sms(num_sms)
    try:
        _check_split_k(m, n, k, "bf16")
        _check_split_k(m, n, k, "c")
        if n == 2112 and num_sms == 60:  # 33 tiles of 64 columns (unsplit with 33 SMs: one tile each)
            assert _chosen_config(m, n, k, torch.bfloat16, False).num_splits > 1
    finally:
        deep_kernels.set_num_sms(previous)


@pytest.mark.gpu
def test_split_k_cuda_graph_replay(monkeypatch):
    # A fresh workspace: the eager call sizes it, the capture allocates nothing, replays (twice: the tickets
    # must be back at zero) see new inputs, and a later eager call that grows the workspace leaves the
    # graph's buffer alive.
    monkeypatch.setattr(gemm, "_split_workspaces", {})
    m, n, k = 64, 2112, 7168
    assert _chosen_config(m, n, k, torch.bfloat16, False).num_splits > 1
    a, b, d, graph = _captured_call(m, n, k)
    for step in range(3):
        _new_activations_(a, m, k, seed=20 + step)
        poison_(d)
        if step == 2:
            big_a, big_b = make_gemm_inputs(128, 4096, 7168)
            assert _chosen_config(128, 4096, 7168, torch.bfloat16, False).num_splits > 1
            deep_kernels.fp8_gemm_nt(big_a, big_b, torch.empty((128, 4096), device="cuda", dtype=torch.bfloat16))
        graph.replay()
        assert_gemm_close(d, _reference(a, b), name=f"d (replay {step})")
        assert_bitwise_equal(d, _run(a, b), f"d (replay {step})")


@pytest.mark.gpu
def test_split_k_workspace_cannot_grow_during_capture(monkeypatch):
    m, n, k = 64, 2112, 7168
    a, b = make_gemm_inputs(m, n, k)
    d = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
    deep_kernels.fp8_gemm_nt(a, b, d)  # compiles and plans outside the capture
    monkeypatch.setattr(gemm, "_split_workspaces", {})
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="during CUDA-graph capture"):
        with torch.cuda.graph(graph):
            deep_kernels.fp8_gemm_nt(a, b, d)


@pytest.mark.gpu
@pytest.mark.parametrize("mode,m,n,k,block_m,block_n,splits", [
    ("bf16", 4096, 4096, 7168, 128, 192, 3),  # 704 tiles: 5 whole waves, 44 tiles split 3 ways
    ("c_alias", 4001, 2112, 1024, 128, 96, 3),  # 704 tiles again, 8 K blocks split 2 / 3 / 3
    ("bf16", 1000, 576, 640, 64, 48, 2),  # 192 tiles on 132 SMs: 60 split tiles
])
def test_tail_split_matches_reference(monkeypatch, mode, m, n, k, block_m, block_n, splits):
    _override_config(monkeypatch, block_m=block_m, block_n=block_n, multicast=1, multicast_on_a=0, splits=splits)
    out_dtype = torch.bfloat16 if mode == "bf16" else torch.float32
    config = _chosen_config(m, n, k, out_dtype, mode != "bf16")
    tiles = heuristics.num_tiles(config, m, n)
    assert 0 < heuristics.num_unsplit_tiles(config, m, n, deep_kernels.get_num_sms()) < tiles
    _check_split_k(m, n, k, mode)


# ---- K loop and epilogue variants against the plain kernel (GPU) ----

@pytest.mark.gpu
@pytest.mark.parametrize("block_n,multicast,accumulate,m,n,k", [
    (192, 1, False, 4001, 7168, 2048),  # several tiles per CTA: the overlap path, plain K loop
    (128, 1, False, 385, 2112, 128),    # the pipelined K loop; one K block: a tile's first block is its last
    (160, 1, True, 1031, 4096, 384),    # accumulation into FP32 D; tiles straddling sfb blocks
    (192, 2, False, 4001, 7168, 2048),  # multicast pairs (32 M blocks)
])
def test_epilogue_overlap_matches_plain(monkeypatch, block_n, multicast, accumulate, m, n, k):
    # Issuing the next tile's first K block before the store changes when, not what, is promoted: D is the
    # same bytes.
    a, b = make_gemm_inputs(m, n, k)
    out_dtype = torch.float32 if accumulate else torch.bfloat16
    expected = _reference(a, b)
    c = None
    if accumulate:
        c = accumulator_like(expected)
        expected += c.double()
    outputs = []
    for overlap in (True, False):
        _force_tiles(monkeypatch, 128, block_n, multicast=multicast, overlap_epilogue=int(overlap))
        assert _chosen_config(m, n, k, out_dtype, accumulate).overlap_epilogue == overlap
        d = c.clone() if accumulate else poison_(torch.empty((m, n), device="cuda", dtype=out_dtype))
        deep_kernels.fp8_gemm_nt(a, b, d, c=d if accumulate else None)
        outputs.append(d)
    assert_gemm_close(outputs[0], expected)
    assert_bitwise_equal(outputs[0], outputs[1], "d (epilogue overlap against plain)")


@pytest.mark.gpu
@pytest.mark.parametrize("block_m,block_n,splits,m,n,k", [
    (128, 128, 1, 4001, 2112, 7168),  # 56 K blocks (even)
    (128, 112, 1, 129, 576, 640),     # 5 K blocks (odd), tiles straddling sfb blocks
    (64, 96, 1, 77, 1040, 128),       # one K block, straddling tiles
    (64, 64, 3, 300, 7168, 384),      # split-K: one K block per split
])
def test_pipelined_k_loop_matches_plain(monkeypatch, block_m, block_n, splits, m, n, k):
    # The pipelined K loop promotes the same partial sums in the same order as the plain one, so D is the
    # same bytes.
    a, b = make_gemm_inputs(m, n, k)
    outputs = []
    for pipelined in (True, False):
        _force_tiles(monkeypatch, block_m, block_n, splits=splits, pipelined=int(pipelined))
        assert _chosen_config(m, n, k, torch.bfloat16, False).pipelined == pipelined
        outputs.append(_run(a, b))
    assert_gemm_close(outputs[0], _reference(a, b))
    assert_bitwise_equal(outputs[0], outputs[1], "d (pipelined against plain K loop)")


# ---- the ping-pong schedule (GPU) ----

@pytest.mark.gpu
@pytest.mark.parametrize("block_m,block_n,multicast,multicast_on_a,overlap,splits,accumulate,m,n,k", [
    (128, 160, 1, 0, 1, 1, False, 4001, 7168, 2048),   # epilogue overlap; tiles straddling sfb blocks
    (128, 192, 1, 0, 1, 1, False, 4001, 2112, 7168),   # a partial last N tile; 56 K blocks
    (256, 128, 2, 1, 0, 1, False, 4001, 4096, 7168),   # two waves per warpgroup; multicast of A; a partial last tile
    (256, 128, 2, 1, 1, 1, False, 4001, 4096, 7168),   # and the epilogue overlap (the first wave issued ahead)
    (256, 96, 1, 0, 1, 1, True, 777, 2112, 7200),      # accumulation; straddling tiles; a last K block of 32 columns
    (128, 128, 1, 0, 0, 1, True, 1031, 4096, 384),     # a pipelinable tile on the plain K loop; accumulation
    (128, 112, 1, 0, 0, 2, False, 129, 576, 640),      # split-K (5 K blocks in 2 splits), straddling tiles
])
def test_ping_pong_matches_lockstep(monkeypatch, block_m, block_n, multicast, multicast_on_a, overlap, splits,
                                    accumulate, m, n, k):
    # Taking turns changes when each warpgroup runs its wgmma groups, not what it promotes in which order: D is the
    # same bytes as the lockstep schedule's (with the same epilogue overlap, and without it), and the same again on
    # a second run.
    a, b = make_gemm_inputs(m, n, k)
    out_dtype = torch.float32 if accumulate else torch.bfloat16
    expected = _reference(a, b)
    c = None
    if accumulate:
        c = accumulator_like(expected)
        expected += c.double()
    outputs = []
    for ping_pong, overlap_epilogue in ((True, overlap), (True, overlap), (False, overlap), (False, 0)):
        _force_tiles(monkeypatch, block_m, block_n, multicast=multicast, multicast_on_a=multicast_on_a,
                     overlap_epilogue=overlap_epilogue, splits=splits, pipelined=0, ping_pong=int(ping_pong))
        config = _chosen_config(m, n, k, out_dtype, accumulate)
        assert (config.block_m, config.block_n, config.ping_pong, config.pipelined, config.overlap_epilogue) == (
            block_m, block_n, ping_pong, False, bool(overlap_epilogue))
        d = c.clone() if accumulate else poison_(torch.empty((m, n), device="cuda", dtype=out_dtype))
        deep_kernels.fp8_gemm_nt(a, b, d, c=d if accumulate else None)
        outputs.append(d)
    assert_gemm_close(outputs[0], expected)
    assert calc_diff(outputs[0], expected) <= 2e-6
    assert_bitwise_equal(outputs[1], outputs[0], "d (ping-pong, second run)")
    assert_bitwise_equal(outputs[2], outputs[0], "d (lockstep)")
    assert_bitwise_equal(outputs[3], outputs[0], "d (lockstep without the epilogue overlap)")


# ---- 256-row tiles and K not a multiple of 128 (GPU) ----

@pytest.mark.gpu
@pytest.mark.parametrize("block_n,multicast,multicast_on_a,accumulate,m,n,k", [
    (128, 1, 0, False, 4001, 2112, 7168),  # odd M (a partial last 256-row tile), a partial last N tile
    (128, 2, 1, False, 512, 4096, 1024),   # multicast of A (pairs of N blocks)
    (96, 2, 0, False, 1024, 7168, 512),    # multicast of B (pairs of M blocks); tiles straddling sfb blocks
    (128, 1, 0, True, 300, 1024, 2048),    # accumulation into FP32 D (two stages)
])
def test_two_wave_tiles_match_reference(monkeypatch, block_n, multicast, multicast_on_a, accumulate, m, n, k):
    # Each math warpgroup owns 128 of the 256 rows as two 64-row waves sharing every B stage.
    _force_tiles(monkeypatch, 256, block_n, multicast=multicast, multicast_on_a=multicast_on_a)
    out_dtype = torch.float32 if accumulate else torch.bfloat16
    config = _chosen_config(m, n, k, out_dtype, accumulate)
    assert (config.block_m, config.block_n, config.num_tma_multicast) == (256, block_n, multicast)
    a, b = make_gemm_inputs(m, n, k)
    expected = _reference(a, b)
    if accumulate:
        c = accumulator_like(expected)
        d = c.clone()
        deep_kernels.fp8_gemm_nt(a, b, d, c=d)
        expected += c.double()
    else:
        d = _run(a, b)
    assert_gemm_close(d, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(64, 2112, 7200), (4001, 576, 592), (129, 4096, 16), (1024, 1040, 2112)])
def test_k_not_a_multiple_of_128(m, n, k):
    # TMA zero-fills the last K block past K; its scale group covers the K % 128 columns left.
    a, b = make_gemm_inputs(m, n, k)
    assert tuple(a[1].shape) == (m, -(-k // 128))
    d = _run(a, b)
    assert_gemm_close(d, _reference(a, b))
    assert_bitwise_equal(_run(a, b), d, "d (second run)")


def test_inputs_with_k_not_a_multiple_of_128():
    # The last scale group covers the K % 128 columns left: the dequantized inputs are the cast of the
    # zero-padded ones, cut to K.
    (qa, sfa), (qb, sfb) = make_gemm_inputs(33, 576, 592, device="cpu")
    assert qa.shape == (33, 592) and qb.shape == (576, 592) and qa.is_contiguous() and qb.is_contiguous()
    assert tuple(sfa.shape) == (33, 5) and tuple(sfb.shape) == (5, 5)
    padded_q, padded_sfa = make_gemm_inputs(33, 576, 640, device="cpu")[0]  # the same draw, not cut
    assert torch.equal(qa[:, :512].view(torch.uint8), padded_q[:, :512].view(torch.uint8))
    # The last group's scale sees only its 80 columns, a subset of the padded draw's 128.
    assert (sfa[:, 4] <= padded_sfa[:, 4]).all() and (sfa[:, 4] < padded_sfa[:, 4]).any()


def test_k_must_be_a_multiple_of_16():
    a, b, d = _cpu_operands(k=256)
    a = (a[0][:, :200].contiguous(), a[1])
    b = (b[0][:, :200].contiguous(), b[1])
    with pytest.raises(ValueError, match=r"K \(the columns of a and b\) must be a positive multiple of 16"):
        deep_kernels.fp8_gemm_nt(a, b, d)
