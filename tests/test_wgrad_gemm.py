"""The weight-gradient recipe of fp8_gemm_nt (recipe (1, 1, 128): 1 x 128 scales on both operands): validation (CPU)
and the kernel against a float64 reference of the dequantized inputs (GPU).

The check is testing.gemm.assert_gemm_close (calc_diff below 2e-7 for FP32 D and 1e-5 for bf16 D on the whole
matrix, every 128 x 128 tile and every row) applied to D and to D^T, so every column is checked on its own too: a
per-column scale that goes wrong shows in its column. Outputs are poisoned (NaN) before each launch (or hold C when
C is D). Both operands' rows have their own power-of-two magnitudes (testing.wgrad), and the planted-bug tests run
the real kernel with a doubled sfb entry and with sfb's columns swapped in pairs, and show the check rejects each.
"""

import pytest
import torch

import deep_kernels
from deep_kernels import gemm
from deep_kernels.heuristics import fp8_gemm as heuristics
from deep_kernels.reference import gemm as reference
from deep_kernels.testing import assert_bitwise_equal, poison_
from deep_kernels.testing.gemm import FP32_BOUND, accumulator_like, assert_gemm_close, gemm_errors, \
    untaken_override_fields
from deep_kernels.testing.wgrad import make_wgrad_inputs

RECIPE = (1, 1, 128)


def _reference(a, b, c: torch.Tensor = None) -> torch.Tensor:
    m, n = a[0].shape[0], b[0].shape[0]
    return reference.fp8_gemm_nt(a, b, torch.empty((m, n), device=a[0].device, dtype=torch.float64), c=c,
                                 recipe=RECIPE)


def _assert_close(d: torch.Tensor, expected: torch.Tensor) -> None:
    """Rows, tiles and the whole matrix, then the columns (the rows of the transposes)."""
    assert_gemm_close(d, expected)
    assert_gemm_close(d.T, expected.T, name="d^T")


# ---- validation and reference (CPU) ----

def _cpu_operands(m=8, n=256, k=256):
    a = (torch.zeros(m, k, dtype=torch.float8_e4m3fn), torch.ones(m, k // 128))
    b = (torch.zeros(n, k, dtype=torch.float8_e4m3fn), torch.ones(n, k // 128))
    return a, b, torch.empty(m, n)


@pytest.mark.parametrize("mutate,error,match", [
    (lambda a, b, d, c: (a, (b[0], torch.ones(2, 2)), d, c), ValueError, r"sfb must have shape \[N, ceil\(K / 128\)\]"),
    (lambda a, b, d, c: (a, (b[0], b[1].double()), d, c), TypeError, "sfb must be"),
    (lambda a, b, d, c: (a, (b[0], torch.ones(256, 2, dtype=torch.int32)), d, c), ValueError,
     "packed UE8M0 sfb must have shape"),
    (lambda a, b, d, c: ((a[0], a[1][:, :1]), b, d, c), ValueError, "sfa must have shape"),
    (lambda a, b, d, c: (a, (b[0].view(torch.uint8), b[1]), d, c), TypeError, "b must be torch.float8_e4m3fn"),
    (lambda a, b, d, c: (a, b, d, c[:, :128]), ValueError, "c must have shape"),
    (lambda a, b, d, c: (a, b, d.bfloat16(), c), TypeError, "d must be torch.float32"),
    (lambda a, b, d, c: (a, b, d, None), TypeError, "pass c"),
    (lambda a, b, d, c: (a, b, d, c), ValueError, "must be a CUDA tensor"),
])
def test_rejects_bad_input(mutate, error, match):
    a, b, d = _cpu_operands()
    with pytest.raises(error, match=match):
        deep_kernels.fp8_gemm_nt(*mutate(a, b, d, torch.zeros(8, 256)), recipe=RECIPE)


@pytest.mark.parametrize("recipe", [(1, 128, 1), (128, 128, 128), "1x1x128", (1, 1)])
def test_rejects_unknown_recipes(recipe):
    a, b, d = _cpu_operands()
    with pytest.raises(ValueError, match="recipe must be None, \\(1, 128, 128\\) or \\(1, 1, 128\\)"):
        deep_kernels.fp8_gemm_nt(a, b, d, c=d, recipe=recipe)


def test_block_recipe_is_the_default():
    # (1, 128, 128) and None both take 128 x 128 block scales: per-channel sfb [N, K / 128] is refused by them.
    a, b, d = _cpu_operands()
    for recipe in (None, (1, 128, 128)):
        with pytest.raises(ValueError, match=r"sfb must have shape \[ceil\(N / 128\), ceil\(K / 128\)\]"):
            deep_kernels.fp8_gemm_nt(a, b, d, c=d, recipe=recipe)


def _dequantized_by_blocks(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Each row's 128-column blocks times their own scale, block by block (written apart from the reference's)."""
    values = codes.double()
    for block in range(scales.shape[1]):
        values[:, block * 128:(block + 1) * 128] *= scales[:, block:block + 1].double()
    return values


def test_reference_matches_the_dequantized_product():
    a, b = make_wgrad_inputs(64, 256, 520, device="cpu")
    exact = _dequantized_by_blocks(*a) @ _dequantized_by_blocks(*b).T
    assert torch.equal(_reference(a, b), exact)
    # Each column of B has its own scale: the block-scaled dequantization of the same codes (each 128-row block
    # scaled by its first row's scales) differs.
    codes, sfb = b
    assert not torch.equal(reference.dequantize_b(codes, sfb[::128].contiguous()), reference.dequantize_a(codes, sfb))


def test_check_rejects_planted_column_scales_on_cpu():
    a, (b, sfb) = make_wgrad_inputs(128, 256, 512, device="cpu")
    expected = _reference(a, (b, sfb))
    for wrong in (_doubled_channel(sfb), _swapped_pairs(sfb)):
        errors = gemm_errors(_reference(a, (b, wrong)).T, expected.T)
        assert errors["row"][0] > 100 * FP32_BOUND


def test_configs_fit_the_kernel():
    # Per-channel B scales add BLOCK_N FP32 per stage (and FP32 D streams its store through two chunks per math
    # warpgroup): the picks fit, with as many stages as fit.
    for m, n, k in ((2112, 7168, 4096), (24576, 1536, 16384), (7168, 2048, 4096), (4096, 7168, 16384), (64, 576, 128)):
        for out_bytes, accumulate in ((4, True), (2, False)):
            config = heuristics.get_fp8_gemm_config(m, n, k, 132, out_dtype_bytes=out_bytes,
                                                    with_accumulation=accumulate, allow_split_k=True,
                                                    operands=gemm.CHANNEL_SCALED)
            used = heuristics.smem_bytes(config.block_m, config.block_n, config.num_stages, out_bytes,
                                         gemm.CHANNEL_SCALED)
            assert config.smem_bytes == used <= heuristics.SMEM_CAPACITY_BYTES
            # Each stage holds BLOCK_N FP32 sfb more (padded to 128 bytes).
            assert (heuristics.stage_bytes(config.block_m, config.block_n, gemm.CHANNEL_SCALED) ==
                    heuristics.stage_bytes(config.block_m, config.block_n) + -(-config.block_n * 4 // 128) * 128)
            assert heuristics.smem_bytes(config.block_m, config.block_n, config.num_stages + 1, out_bytes,
                                         gemm.CHANNEL_SCALED) > heuristics.SMEM_CAPACITY_BYTES or \
                config.num_stages == heuristics.MAX_STAGES


def _doubled_channel(sfb: torch.Tensor) -> torch.Tensor:
    """sfb with the largest scale doubled (one column of D, one K block)."""
    wrong = sfb.clone()
    row, kb = divmod(int(sfb.argmax()), sfb.shape[1])
    wrong[row, kb] *= 2
    return wrong


def _swapped_pairs(sfb: torch.Tensor) -> torch.Tensor:
    """sfb with rows 2j and 2j + 1 swapped: a kernel mixing up the two columns a thread holds."""
    n = sfb.shape[0] // 2 * 2
    wrong = sfb.clone()
    wrong[:n] = sfb[:n].view(n // 2, 2, -1).flip(1).reshape(n, -1)
    return wrong


# The schedules the GPU tests below force through DK_FP8_GEMM_CONFIG's fields.
TWO_WAVE_OVERRIDE = {"block_m": 256, "block_n": 128, "multicast": 2, "multicast_on_a": 1, "splits": 1}
PING_PONG_CASES = [  # (block_m, block_n, multicast, overlap, m, n, k)
    (128, 192, 1, 1, 2112, 7168, 1024),  # epilogue overlap, several tiles per CTA, a partial last M tile
    (128, 160, 1, 1, 777, 2112, 2048),   # tiles straddling 128-column blocks, a partial last N tile
    (256, 128, 2, 0, 1000, 1536, 640),   # two waves per warpgroup, 2-CTA cluster sharing A
]
PIPELINED_HALVES_CASES = [  # (block_n, overlap, m, n, k)
    (192, 1, 2112, 7168, 1024),  # epilogue overlap (the first half issued ahead), several tiles per CTA
    (160, 1, 777, 2112, 2048),   # tiles straddling 128-column blocks, a partial last N tile
    (192, 0, 300, 1536, 1040),   # one K block and a partial one per tile (the loop's other exit), no overlap
]
BF16_HALVES_BLOCK_NS = (192, 160)


def _ping_pong_override(block_m: int, block_n: int, multicast: int, overlap: int, ping_pong: int) -> dict:
    return {"block_m": block_m, "block_n": block_n, "multicast": multicast, "multicast_on_a": 1, "splits": 1,
            "pipelined": 0, "overlap_epilogue": overlap, "ping_pong": ping_pong}


def _halves_override(block_n: int, pipelined: int, overlap: int) -> dict:
    return {"block_m": 128, "block_n": block_n, "multicast": 1, "splits": 1, "pipelined": pipelined,
            "overlap_epilogue": overlap}


def test_forced_schedules_are_planned(monkeypatch):
    # Each GPU test below compares a forced schedule with another (or with the reference): the plan must take every
    # field it forces, or the comparison is of a kernel with itself.
    forced = [(TWO_WAVE_OVERRIDE, 1000, 2048, 1024, 4, True)]
    forced += [(_ping_pong_override(block_m, block_n, multicast, overlap, ping_pong), m, n, k, 4, True)
               for block_m, block_n, multicast, overlap, m, n, k in PING_PONG_CASES for ping_pong in (1, 0)]
    forced += [(_halves_override(block_n, pipelined, overlap), m, n, k, 4, True)
               for block_n, overlap, m, n, k in PIPELINED_HALVES_CASES for pipelined in (1, 0)]
    forced += [(_halves_override(block_n, 1, 1), 2112, 1536, 1024, 2, False) for block_n in BF16_HALVES_BLOCK_NS]
    for override, m, n, k, out_bytes, accumulate in forced:
        monkeypatch.setattr(gemm, "_config_override", lambda override=override: override)
        config = gemm._choose_config(m, n, k, 132, out_bytes, accumulate, gemm.CHANNEL_SCALED)
        assert untaken_override_fields(config, override) == {}, (override, m, n, k)


# ---- kernel against the reference (GPU) ----

def _run(a, b, out_dtype=torch.float32, c=None, alias=False):
    m, n = a[0].shape[0], b[0].shape[0]
    if alias:
        d = c.clone()
        return deep_kernels.fp8_gemm_nt(a, b, d, c=d, recipe=RECIPE)
    d = poison_(torch.empty((m, n), device="cuda", dtype=out_dtype))
    return deep_kernels.fp8_gemm_nt(a, b, d, c=c, recipe=RECIPE)


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,alias", [(777, 2112, 4096, False), (4096, 7168, 2048, True)])
def test_accumulates_into_fp32(m, n, k, alias):
    a, b = make_wgrad_inputs(m, n, k)
    product = _reference(a, b)
    c = accumulator_like(product)
    d = _run(a, b, c=c, alias=alias)
    _assert_close(d, product + c.double())
    assert_bitwise_equal(_run(a, b, c=c, alias=alias), d, "d (second run)")


@pytest.mark.gpu
def test_bf16_output_and_partial_k_block():
    a, b = make_wgrad_inputs(300, 1536, 1040)
    d = _run(a, b, torch.bfloat16)
    _assert_close(d, _reference(a, b))


@pytest.mark.gpu
def test_two_wave_tiles_with_multicast(monkeypatch):
    # 256-row tiles (two 64-row waves per math warpgroup, one B stage each) and a 2-CTA cluster sharing A.
    monkeypatch.setattr(gemm, "_config_override", lambda: TWO_WAVE_OVERRIDE)
    monkeypatch.setattr(gemm, "_plans", {})
    monkeypatch.setattr(gemm, "_prepared_calls", {})
    a, b = make_wgrad_inputs(1000, 2048, 1024)
    product = _reference(a, b)
    c = accumulator_like(product)
    _assert_close(_run(a, b, c=c), product + c.double())


@pytest.mark.gpu
@pytest.mark.parametrize("block_m,block_n,multicast,overlap,m,n,k", PING_PONG_CASES)
def test_ping_pong_matches_lockstep(monkeypatch, block_m, block_n, multicast, overlap, m, n, k):
    # Taking turns changes when each warpgroup runs its wgmma groups, not what it promotes in which order: D is the
    # same bytes as the lockstep schedule's, and the same again on a second run.
    a, b = make_wgrad_inputs(m, n, k)
    product = _reference(a, b)
    c = accumulator_like(product)
    outputs = []
    for ping_pong in (1, 1, 0):
        override = _ping_pong_override(block_m, block_n, multicast, overlap, ping_pong)
        monkeypatch.setattr(gemm, "_config_override", lambda override=override: override)
        monkeypatch.setattr(gemm, "_plans", {})
        monkeypatch.setattr(gemm, "_prepared_calls", {})
        outputs.append(_run(a, b, c=c))
    _assert_close(outputs[0], product + c.double())
    assert_bitwise_equal(outputs[1], outputs[0], "d (ping-pong, second run)")
    assert_bitwise_equal(outputs[2], outputs[0], "d (lockstep)")


@pytest.mark.gpu
@pytest.mark.parametrize("block_n,overlap,m,n,k", PIPELINED_HALVES_CASES)
def test_pipelined_halves_match_the_plain_k_loop(monkeypatch, block_n, overlap, m, n, k):
    # Each K block as two wgmma groups of half the columns, one promoted while the other runs: the same products
    # added in the same order as the plain K loop's, so the same bytes.
    a, b = make_wgrad_inputs(m, n, k)
    product = _reference(a, b)
    c = accumulator_like(product)
    outputs = []
    for pipelined in (1, 1, 0):
        override = _halves_override(block_n, pipelined, overlap)
        monkeypatch.setattr(gemm, "_config_override", lambda override=override: override)
        monkeypatch.setattr(gemm, "_plans", {})
        monkeypatch.setattr(gemm, "_prepared_calls", {})
        outputs.append(_run(a, b, c=c))
    _assert_close(outputs[0], product + c.double())
    assert_bitwise_equal(outputs[1], outputs[0], "d (pipelined halves, second run)")
    assert_bitwise_equal(outputs[2], outputs[0], "d (plain K loop)")


@pytest.mark.gpu
@pytest.mark.parametrize("block_n", BF16_HALVES_BLOCK_NS)
def test_pipelined_halves_with_bf16_output(monkeypatch, block_n):
    # The halves with the whole-tile bf16 store (the model's 128 x 192 and 128 x 160 picks for bf16 D too), with the
    # epilogue overlap.
    monkeypatch.setattr(gemm, "_config_override", lambda: _halves_override(block_n, 1, 1))
    monkeypatch.setattr(gemm, "_plans", {})
    monkeypatch.setattr(gemm, "_prepared_calls", {})
    a, b = make_wgrad_inputs(2112, 1536, 1024)
    _assert_close(_run(a, b, torch.bfloat16), _reference(a, b))


def _differing_runs(outputs: list, first: torch.Tensor) -> list:
    """Indices of the outputs whose bytes differ from first's."""
    return [i for i, out in enumerate(outputs) if not torch.equal(out.view(torch.int32), first.view(torch.int32))]


# Long-K problems (128 K blocks a tile, the producer far ahead of the math), whose picks cover the K loops that free a
# stage after reading its sfb: the pipelined halves (2112 x 7168 at 128 x 192, 4096 x 7168 at 128 x 160), the plain
# loop (2048 x 2112, split-K: about 43 K blocks a job) and the pipelined loop (1024 x 2048).
REPEATED_RUN_SHAPES = [(2112, 7168, 16384), (4096, 7168, 16384), (2048, 2112, 16384), (1024, 2048, 16384)]


def test_repeated_run_shapes_cover_every_k_loop():
    # The halves at both widths, the plain loop and the pipelined loop, as the comment above says.
    labels = [heuristics.config_label(heuristics.get_fp8_gemm_config(
        m, n, k, 132, out_dtype_bytes=4, with_accumulation=True, allow_split_k=True, operands=gemm.CHANNEL_SCALED))
        for m, n, k in REPEATED_RUN_SHAPES]
    assert labels == ["128x192/1po", "128x160/1po", "128x192/3", "128x128/1po"]


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", REPEATED_RUN_SHAPES)
def test_repeated_runs_are_bitwise_equal(m, n, k):
    a, b = make_wgrad_inputs(m, n, k)
    product = _reference(a, b)
    c = accumulator_like(product)
    first = _run(a, b, c=c)
    _assert_close(first, product + c.double())
    # Bursts of launches back to back, each into its own poisoned output.
    outputs = [torch.empty(m, n, device="cuda") for _ in range(8)]
    differing = []
    for burst in range(16):
        for d in outputs:
            deep_kernels.fp8_gemm_nt(a, b, poison_(d), c=c, recipe=RECIPE)
        differing += [burst * len(outputs) + i for i in _differing_runs(outputs, first)]
    assert differing == []
    # The comparison sees one element's lowest bit flipped.
    planted = outputs[5].clone()
    planted.view(torch.int32)[m - 1, n - 1] ^= 1
    assert _differing_runs(outputs[:5] + [planted], first) == [5]


@pytest.mark.gpu
@pytest.mark.parametrize("plant", [_doubled_channel, _swapped_pairs])
def test_check_rejects_planted_column_scales(plant):
    a, (b, sfb) = make_wgrad_inputs(777, 2112, 4096)
    product = _reference(a, (b, sfb))
    c = accumulator_like(product)
    d = _run(a, (b, plant(sfb)), c=c)
    with pytest.raises(AssertionError, match="calc_diff"):
        _assert_close(d, product + c.double())
