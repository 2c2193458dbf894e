"""The k-grouped FP8 and BF16 GEMMs (MoE weight gradients): validation (CPU) and the kernel against a float64 reference of the
dequantized inputs, group by group (GPU).

Inputs are cast as training casts them (per_channel_cast_transpose_to_fp8 of token-major tensors, testing.wgrad),
with uneven groups and empty ones. Each group's D is checked with testing.gemm.assert_gemm_close (calc_diff below
2e-7 on the whole matrix, every 128 x 128 tile and every row) and so is its transpose (every column); D is poisoned
(NaN) before each launch, or holds C when C is D. The planted-bug tests run the real kernel with a group boundary
moved by one K block in ks_tensor (both kinds) and with one doubled B scale (FP8) or token (BF16), and show the
check rejects each where the unplanted run passes it.
"""

import random

import pytest
import torch

import deep_kernels
from deep_kernels import call_cache, gemm, k_grouped_bf16_gemm, k_grouped_gemm
from deep_kernels.heuristics import fp8_gemm
from deep_kernels.heuristics import k_grouped_bf16_gemm as heuristics_bf16
from deep_kernels.heuristics import k_grouped_fp8_gemm as heuristics
from deep_kernels.reference import k_grouped_gemm as reference
from deep_kernels.testing import assert_bitwise_equal, poison_
from deep_kernels.testing.gemm import accumulator_like, assert_gemm_close, untaken_override_fields
from deep_kernels.testing.wgrad import group_sizes, make_k_grouped_bf16_inputs, make_k_grouped_inputs


def _reference(a, b, ks, c=None) -> torch.Tensor:
    m, n = a[0].shape[0], b[0].shape[0]
    d = torch.empty((len(ks), m, n), dtype=torch.float64, device=a[0].device)
    return reference.k_grouped_fp8_gemm_nt_contiguous(a, b, d, ks, c=c)


def _assert_close(d: torch.Tensor, expected: torch.Tensor) -> None:
    for g in range(d.shape[0]):
        assert_gemm_close(d[g], expected[g], name=f"d[{g}]")
        assert_gemm_close(d[g].T, expected[g].T, name=f"d[{g}]^T")


# ---- validation and reference (CPU) ----

def _cpu_call(ks=(128, 0, 256), m=8, n=32):
    a, b, ks_tensor = make_k_grouped_inputs(list(ks), m, n, device="cpu")
    d = torch.empty(len(ks), m, n)
    return a, b, d, list(ks), ks_tensor


@pytest.mark.parametrize("mutate,error,match", [
    (lambda a, b, d, ks, t: (a, b, d, [128, 0, 200], t), ValueError, r"ks\[2\] = 200: every group's K must be a "
                                                                      "non-negative multiple of 128"),
    (lambda a, b, d, ks, t: (a, b, d, [128, -128, 384], t), ValueError, "non-negative multiple of 128"),
    (lambda a, b, d, ks, t: (a, b, d, [128, 128, 256], t), ValueError, "ks sums to 512 but a and b hold sum k = 384"),
    (lambda a, b, d, ks, t: (a, b, d, [], t), TypeError, "ks must be a non-empty list"),
    (lambda a, b, d, ks, t: (a, b, d, ks, t.long()), TypeError, "ks_tensor must be torch.int32"),
    (lambda a, b, d, ks, t: (a, b, d, ks, t[:2]), ValueError, r"ks_tensor must be a contiguous int32 tensor of shape "
                                                              r"\(3,\)"),
    (lambda a, b, d, ks, t: ((a[0][:, :256], a[1][:, :2]), b, d, ks, t), ValueError, "sum k differs"),
    (lambda a, b, d, ks, t: ((a[0].view(torch.uint8), a[1]), b, d, ks, t), TypeError, "a must be torch.float8_e4m3fn"),
    (lambda a, b, d, ks, t: ((a[0], a[1][:, :2]), b, d, ks, t), ValueError, "sfa must have shape"),
    (lambda a, b, d, ks, t: (a, (b[0], b[1].T), d, ks, t), ValueError, "sfb must have shape"),
    (lambda a, b, d, ks, t: (a, (b[0], b[1].half()), d, ks, t), TypeError, "sfb must be"),
    (lambda a, b, d, ks, t: (a, b, d.bfloat16(), ks, t), TypeError, "d must be torch.float32"),
    (lambda a, b, d, ks, t: (a, b, d[:2], ks, t), ValueError, r"d must be a contiguous FP32 \[G, M, N\]"),
    (lambda a, b, d, ks, t: (a, (b[0][:24], b[1][:24]), d[..., :24], ks, t), ValueError, "multiple of 16"),
    (lambda a, b, d, ks, t: ((a[0][:, :320], a[1]), b, d, ks, t), ValueError, "must be a multiple of 128"),
    (lambda a, b, d, ks, t: (a[0], b, d, ks, t), TypeError, "pairs"),
    (lambda a, b, d, ks, t: (a, b, d, ks, t), ValueError, "must be a CUDA tensor"),
])
def test_rejects_bad_input(mutate, error, match):
    with pytest.raises(error, match=match):
        deep_kernels.k_grouped_fp8_gemm_nt_contiguous(*mutate(*_cpu_call()))


def test_rejects_other_recipes_and_bad_c():
    a, b, d, ks, t = _cpu_call()
    for recipe in ((1, 128, 128), None):
        with pytest.raises(ValueError, match=r"takes recipe \(1, 1, 128\)"):
            deep_kernels.k_grouped_fp8_gemm_nt_contiguous(a, b, d, ks, t, recipe=recipe)
    with pytest.raises(ValueError, match=r"c must have shape \[G, M, N\]"):
        deep_kernels.k_grouped_fp8_gemm_nt_contiguous(a, b, d, ks, t, c=d[:, :4])
    with pytest.raises(TypeError, match="c must be torch.float32"):
        deep_kernels.k_grouped_fp8_gemm_nt_contiguous(a, b, d, ks, t, c=d.double())


def test_tn_takes_transposed_views_and_refuses_m_major_operands():
    a, b, d, ks, t = _cpu_call()
    # The views reach the nt checks (which stop at the device).
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        deep_kernels.k_grouped_fp8_gemm_tn_contiguous((a[0].T, a[1].T), (b[0].T, b[1].T), d, ks, t)
    with pytest.raises(ValueError, match="per_channel_cast_transpose_to_fp8"):
        deep_kernels.k_grouped_fp8_gemm_tn_contiguous((a[0].T.contiguous(), a[1].T), (b[0].T, b[1].T), d, ks, t)


def test_reference_is_the_per_group_product():
    ks = [256, 0, 128]
    a, b, _ = make_k_grouped_inputs(ks, 8, 32, device="cpu")
    c = torch.rand(3, 8, 32)
    d = _reference(a, b, ks, c)
    values_a = gemm_values(a)
    values_b = gemm_values(b)
    assert torch.equal(d[0], values_a[:, :256] @ values_b[:, :256].T + c[0].double())
    assert torch.equal(d[1], c[1].double())
    assert torch.equal(d[2], values_a[:, 256:] @ values_b[:, 256:].T + c[2].double())
    tn = reference.k_grouped_fp8_gemm_tn_contiguous((a[0].T, a[1].T), (b[0].T, b[1].T), torch.empty_like(d), ks, c=c)
    assert torch.equal(tn, d)


def gemm_values(operand) -> torch.Tensor:
    """An operand [rows, sum k] dequantized in float64 by its 1 x 128 scales, written out here."""
    q, scales = operand
    return q.double() * scales.double().repeat_interleave(128, dim=1)


def test_inputs_take_the_cast_transpose_layout():
    a, b, ks_tensor = make_k_grouped_inputs([128, 256], 24, 32, device="cpu")
    assert a[0].shape == (24, 384) and a[0].is_contiguous()
    assert a[1].shape == (24, 3) and a[1].stride() == (1, 24)  # MN-major, M rounded up to 4
    assert b[1].shape == (32, 3) and ks_tensor.tolist() == [128, 256]


def test_configs():
    for g, m, n, k in heuristics.REPRESENTATIVE_PROBLEMS:
        config = heuristics.get_k_grouped_fp8_gemm_config(m, n, g * k, g, 132, with_accumulation=True)
        assert config.num_splits == 1
        assert not config.overlap_epilogue or config.block_m == 128
        assert config.smem_bytes == fp8_gemm.smem_bytes(config.block_m, config.block_n, config.num_stages, 4,
                                                        heuristics.OPERANDS) <= fp8_gemm.SMEM_CAPACITY_BYTES
        assert 0 < heuristics.grid_size(config, m, n, g, 132) <= 132
    # Per-channel B scales have no sfb offsets for the overlap to meet in the K loop: 128-row tiles of every width
    # take it (the M-grouped kinds' only at multiples of 64 columns).
    candidates = list(heuristics.candidate_configs(4096, 7168, 132))
    assert all(config.overlap_epilogue == (config.block_m == 128) for config in candidates)
    assert {96, 144, 160} <= {config.block_n for config in candidates if config.overlap_epilogue}
    # Every group empty: still a config (the call itself returns before any launch).
    assert heuristics.get_k_grouped_fp8_gemm_config(64, 128, 0, 4, 132).block_m in fp8_gemm.BLOCK_MS
    with pytest.raises(ValueError, match="total_k"):
        heuristics.get_k_grouped_fp8_gemm_config(64, 128, 100, 4, 132)
    kernels = heuristics.all_candidate_kernels()
    assert kernels and all(kernel.k == 0 and kernel.gemm_type == "k_grouped" for kernel in kernels)


# ---- kernel against the reference (GPU) ----

def _run(a, b, ks, ks_tensor, c=None, alias=False, layout="nt"):
    m, n = a[0].shape[0], b[0].shape[0]
    d = c.clone() if alias else poison_(torch.empty((len(ks), m, n), device="cuda"))
    if layout == "tn":
        a, b = (a[0].T, a[1].T), (b[0].T, b[1].T)
    function = getattr(deep_kernels, f"k_grouped_fp8_gemm_{layout}_contiguous")
    return function(a, b, d, ks, ks_tensor, c=d if alias else c)


def _group_sizes(num_groups: int, mean_k: int, empty: int, seed: int) -> list:
    return group_sizes(num_groups, mean_k, random.Random(seed), empty=empty)


def _problem(num_groups: int, m: int, n: int, mean_k: int, empty: int, seed: int = 0) -> tuple:
    ks = _group_sizes(num_groups, mean_k, empty, seed)
    a, b, ks_tensor = make_k_grouped_inputs(ks, m, n, seed=seed)
    return a, b, ks, ks_tensor


# The schedules the GPU tests below force through DK_FP8_GEMM_CONFIG's fields, and their problems (_problem's
# arguments).
TWO_WAVE_OVERRIDE = {"block_m": 256, "block_n": 128, "multicast": 2, "multicast_on_a": 0, "splits": 1}
TWO_WAVE_PROBLEM = (4, 1024, 2048, 1024, 1, 2)
PING_PONG_TILES = [(128, 192, 1), (256, 128, 2)]
PING_PONG_PROBLEM = (6, 1000, 2048, 640, 2, 3)
B_MULTICAST_PROBLEM = (6, 1000, 2048, 640, 2, 6)
HALVES_PROBLEM = (6, 1000, 2096, 640, 2, 4)


def _ping_pong_override(block_m: int, block_n: int, multicast: int, ping_pong: int) -> dict:
    return {"block_m": block_m, "block_n": block_n, "multicast": multicast, "multicast_on_a": 0, "splits": 1,
            "pipelined": 0, "overlap_epilogue": int(block_m == 128), "ping_pong": ping_pong}


def _b_multicast_override(multicast: int) -> dict:
    return {"block_m": 128, "block_n": 192, "multicast": multicast, "multicast_on_a": 0, "splits": 1, "pipelined": 0,
            "overlap_epilogue": 1}


def _halves_override(pipelined: int) -> dict:
    return {"block_m": 128, "block_n": 160, "multicast": 1, "splits": 1, "pipelined": pipelined, "overlap_epilogue": 1}


def test_forced_schedules_are_planned(monkeypatch):
    # Each GPU test below compares a forced schedule with another (or with the reference): the plan must take every
    # field it forces, or the comparison is of a kernel with itself.
    forced = [(TWO_WAVE_OVERRIDE, TWO_WAVE_PROBLEM)]
    forced += [(_ping_pong_override(*tile, ping_pong), PING_PONG_PROBLEM) for tile in PING_PONG_TILES
               for ping_pong in (1, 0)]
    forced += [(_b_multicast_override(multicast), B_MULTICAST_PROBLEM) for multicast in (2, 1)]
    forced += [(_halves_override(pipelined), HALVES_PROBLEM) for pipelined in (1, 0)]
    for override, (num_groups, m, n, mean_k, empty, seed) in forced:
        ks = _group_sizes(num_groups, mean_k, empty, seed)
        monkeypatch.setattr(gemm, "_config_override", lambda override=override: override)
        config = k_grouped_gemm.chosen_config(m, n, sum(ks), num_groups, True, 132)
        assert untaken_override_fields(config, override) == {}, (override, m, n, ks)


@pytest.mark.gpu
@pytest.mark.parametrize("c_kind", ["separate", "alias", "none"])
def test_matches_reference(c_kind):
    a, b, ks, ks_tensor = _problem(4, 1000, 2048, 1024, empty=1)
    product = _reference(a, b, ks)
    c = None if c_kind == "none" else accumulator_like(product.flatten(0, 1)).view(product.shape)
    d = _run(a, b, ks, ks_tensor, c=c, alias=c_kind == "alias")
    _assert_close(d, product if c is None else product + c.double())
    assert_bitwise_equal(_run(a, b, ks, ks_tensor, c=c, alias=c_kind == "alias"), d, "d (second run)")


@pytest.mark.gpu
def test_tn_views_and_many_groups():
    a, b, ks, ks_tensor = _problem(16, 256, 7168, 384, empty=3, seed=1)
    product = _reference(a, b, ks)
    c = accumulator_like(product.flatten(0, 1)).view(product.shape)
    _assert_close(_run(a, b, ks, ks_tensor, c=c, layout="tn"), product + c.double())


@pytest.mark.gpu
def test_two_wave_tiles(monkeypatch):
    monkeypatch.setattr(gemm, "_config_override", lambda: TWO_WAVE_OVERRIDE)
    monkeypatch.setattr(k_grouped_gemm, "_plans", {})
    a, b, ks, ks_tensor = _problem(*TWO_WAVE_PROBLEM)
    product = _reference(a, b, ks)
    c = accumulator_like(product.flatten(0, 1)).view(product.shape)
    _assert_close(_run(a, b, ks, ks_tensor, c=c), product + c.double())


@pytest.mark.gpu
@pytest.mark.parametrize("block_m,block_n,multicast", PING_PONG_TILES)
def test_ping_pong_matches_lockstep(monkeypatch, block_m, block_n, multicast):
    # The math warpgroups take turns (with the epilogue overlap at 128 rows, over empty groups too): the same bytes as
    # the lockstep schedule's.
    a, b, ks, ks_tensor = _problem(*PING_PONG_PROBLEM)
    product = _reference(a, b, ks)
    c = accumulator_like(product.flatten(0, 1)).view(product.shape)
    outputs = []
    for ping_pong in (1, 0):
        override = _ping_pong_override(block_m, block_n, multicast, ping_pong)
        monkeypatch.setattr(gemm, "_config_override", lambda override=override: override)
        monkeypatch.setattr(k_grouped_gemm, "_plans", {})
        outputs.append(_run(a, b, ks, ks_tensor, c=c))
    _assert_close(outputs[0], product + c.double())
    assert_bitwise_equal(outputs[1], outputs[0], "d (lockstep)")


@pytest.mark.gpu
def test_b_multicast_128_row_tiles_match_unclustered(monkeypatch):
    # 128 x 192 tiles in 2-CTA clusters sharing B (two M blocks of a group), with the epilogue overlap, over empty groups
    # too: the same bytes as the same tiles without the cluster.
    a, b, ks, ks_tensor = _problem(*B_MULTICAST_PROBLEM)
    product = _reference(a, b, ks)
    c = accumulator_like(product.flatten(0, 1)).view(product.shape)
    outputs = []
    for multicast in (2, 2, 1):
        override = _b_multicast_override(multicast)
        monkeypatch.setattr(gemm, "_config_override", lambda override=override: override)
        monkeypatch.setattr(k_grouped_gemm, "_plans", {})
        outputs.append(_run(a, b, ks, ks_tensor, c=c))
    _assert_close(outputs[0], product + c.double())
    assert_bitwise_equal(outputs[1], outputs[0], "d (B multicast, second run)")
    assert_bitwise_equal(outputs[2], outputs[0], "d (no cluster)")


@pytest.mark.gpu
def test_pipelined_halves_match_the_plain_k_loop(monkeypatch):
    # Each K block as two wgmma groups of half the columns, one promoted while the other runs (128 x 160: the kind's
    # widest, with the epilogue overlap), over empty groups too: the same bytes as the plain K loop's.
    a, b, ks, ks_tensor = _problem(*HALVES_PROBLEM)
    product = _reference(a, b, ks)
    c = accumulator_like(product.flatten(0, 1)).view(product.shape)
    outputs = []
    for pipelined in (1, 0):
        override = _halves_override(pipelined)
        monkeypatch.setattr(gemm, "_config_override", lambda override=override: override)
        monkeypatch.setattr(k_grouped_gemm, "_plans", {})
        outputs.append(_run(a, b, ks, ks_tensor, c=c))
    _assert_close(outputs[0], product + c.double())
    assert_bitwise_equal(outputs[1], outputs[0], "d (plain K loop)")


@pytest.mark.gpu
def test_repeated_runs_are_bitwise_equal():
    # Long groups (32 K blocks on average, the producer far ahead of the math) with the model's pick, launched in
    # bursts back to back, each into its own poisoned output.
    a, b, ks, ks_tensor = _problem(4, 4096, 7168, 4096, empty=0)
    product = _reference(a, b, ks)
    c = accumulator_like(product.flatten(0, 1)).view(product.shape)
    first = _run(a, b, ks, ks_tensor, c=c)
    _assert_close(first, product + c.double())
    outputs = [torch.empty(product.shape, device="cuda") for _ in range(4)]
    differing = []
    for burst in range(16):
        for d in outputs:
            deep_kernels.k_grouped_fp8_gemm_nt_contiguous(a, b, poison_(d), ks, ks_tensor, c=c)
        differing += [burst * len(outputs) + i for i, d in enumerate(outputs)
                      if not torch.equal(d.view(torch.int32), first.view(torch.int32))]
    assert differing == []
    # The comparison sees one element's lowest bit flipped.
    planted = outputs[2].clone()
    planted.view(torch.int32)[-1, -1, -1] ^= 1
    assert not torch.equal(planted.view(torch.int32), first.view(torch.int32))


@pytest.mark.gpu
def test_check_rejects_a_doubled_b_scale():
    a, b, ks, ks_tensor = _problem(4, 1000, 2048, 1024, empty=1)
    product = _reference(a, b, ks)
    c = accumulator_like(product.flatten(0, 1)).view(product.shape)
    sfb = b[1].clone()
    row, kb = divmod(int(sfb.argmax()), sfb.shape[1])
    sfb[row, kb] *= 2
    with pytest.raises(AssertionError, match="calc_diff"):
        _assert_close(_run(a, (b[0], sfb), ks, ks_tensor, c=c), product + c.double())


def test_group_sizes_are_checked_on_every_call(monkeypatch):
    # A signature seen before skips the tensor checks, never the check of ks against the tensors' sum k.
    a, b, d, ks, t = _cpu_call()
    monkeypatch.setattr(k_grouped_gemm, "_checked_calls", {})
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        deep_kernels.k_grouped_fp8_gemm_nt_contiguous(a, b, d, ks, t)
    assert not k_grouped_gemm._checked_calls  # an invalid call is not kept
    key = (k_grouped_gemm.call_signature(a[0], a[1], b[0], b[1], d, t, None), len(ks))
    k_grouped_gemm._checked_calls[key] = ((8, 32, 384, 3, True), {})  # as a valid call on the GPU leaves it
    with pytest.raises(ValueError, match="ks sums to 512"):
        deep_kernels.k_grouped_fp8_gemm_nt_contiguous(a, b, d, [128, 128, 256], t)
    with pytest.raises(ValueError, match=r"ks\[1\] = 100"):
        deep_kernels.k_grouped_fp8_gemm_nt_contiguous(a, b, d, [128, 100, 156], t)


# ---- the k-grouped BF16 GEMM ----
# Inputs are the token-major bf16 tensors dy [sum k, M] and x [sum k, N] with testing.gemm's power-of-two magnitudes
# (testing.wgrad.make_k_grouped_bf16_inputs); the tn layout takes them as they are (both operands MN-major), the nt
# layout their K-major copies. Groups are multiples of 64 tokens (the kind's K block). FP32 D is checked as above
# (testing.gemm.FP32_BOUND on the whole matrix, every tile and row, and on the transpose), poisoned before each
# launch; the planted bugs move a group boundary by one K block on the device and double one token of b.

def _bf16_reference(dy, x, ks, c=None) -> torch.Tensor:
    d = torch.empty((len(ks), dy.shape[1], x.shape[1]), dtype=torch.float64, device=dy.device)
    return reference.k_grouped_bf16_gemm_tn_contiguous(dy, x, d, ks, c=c)


def _bf16_problem(num_groups: int, m: int, n: int, mean_k: int, empty: int, seed: int = 0) -> tuple:
    ks = group_sizes(num_groups, mean_k, random.Random(seed), empty=empty, alignment=64)
    dy, x, ks_tensor = make_k_grouped_bf16_inputs(ks, m, n, seed=seed)
    return dy, x, ks, ks_tensor


def _bf16_run(dy, x, ks, ks_tensor, c=None, alias=False, layout="tn"):
    """The kernel on poisoned d (or d = c when alias); tn: the token-major tensors, nt: their K-major copies."""
    d = c.clone() if alias else poison_(torch.empty((len(ks), dy.shape[1], x.shape[1]), device="cuda"))
    c = d if alias else c
    if layout == "tn":
        return deep_kernels.k_grouped_bf16_gemm_tn_contiguous(dy, x, d, ks, ks_tensor, c=c)
    return deep_kernels.k_grouped_bf16_gemm_nt_contiguous(dy.T.contiguous(), x.T.contiguous(), d, ks, ks_tensor, c=c)


def _bf16_cpu_call(ks=(64, 0, 128), m=8, n=32):
    dy, x, ks_tensor = make_k_grouped_bf16_inputs(list(ks), m, n, device="cpu")
    return dy.T, x.T, torch.empty(len(ks), m, n), list(ks), ks_tensor


@pytest.mark.parametrize("mutate,error,match", [
    (lambda a, b, d, ks, t: (a, b, d, [64, 0, 100], t), ValueError, r"ks\[2\] = 100: every group's K must be a "
                                                                    "non-negative multiple of 64"),
    (lambda a, b, d, ks, t: (a, b, d, [64, -64, 192], t), ValueError, "non-negative multiple of 64"),
    (lambda a, b, d, ks, t: (a, b, d, [64, 64, 128], t), ValueError, "ks sums to 256 but a and b hold sum k = 192"),
    (lambda a, b, d, ks, t: (a, b, d, [], t), TypeError, "ks must be a non-empty list"),
    (lambda a, b, d, ks, t: (a, b, d, ks, t.long()), TypeError, "ks_tensor must be torch.int32"),
    (lambda a, b, d, ks, t: (a, b, d, ks, t[:2]), ValueError, r"ks_tensor must be a contiguous int32 tensor"),
    (lambda a, b, d, ks, t: (a.float(), b, d, ks, t), TypeError, "a must be torch.bfloat16"),
    (lambda a, b, d, ks, t: (a, b.half(), d, ks, t), TypeError, "b must be torch.bfloat16"),
    (lambda a, b, d, ks, t: (a[:, :128], b, d, ks, t), ValueError, "sum k differs"),
    (lambda a, b, d, ks, t: (a, b[:24], d[..., :24], ks, t), ValueError, "multiple of 16"),
    (lambda a, b, d, ks, t: (a.contiguous()[:, ::2], b, d, ks, t), ValueError, "must be K-major"),
    (lambda a, b, d, ks, t: (a.contiguous()[None], b, d, ks, t), ValueError, "a must be 2-D"),
    (lambda a, b, d, ks, t: (a, b, d.bfloat16(), ks, t), TypeError, "d must be torch.float32"),
    (lambda a, b, d, ks, t: (a, b, d[:2], ks, t), ValueError, r"d must be a contiguous FP32 \[G, M, N\]"),
    (lambda a, b, d, ks, t: (a, b, d, ks, t), ValueError, "must be a CUDA tensor"),
])
def test_bf16_rejects_bad_input(mutate, error, match):
    with pytest.raises(error, match=match):
        deep_kernels.k_grouped_bf16_gemm_nt_contiguous(*mutate(*_bf16_cpu_call()))


def test_bf16_rejects_bad_c_and_checks_group_sizes_on_every_call(monkeypatch):
    a, b, d, ks, t = _bf16_cpu_call()
    with pytest.raises(ValueError, match=r"c must have shape \[G, M, N\]"):
        deep_kernels.k_grouped_bf16_gemm_nt_contiguous(a, b, d, ks, t, c=d[:, :4])
    with pytest.raises(TypeError, match="c must be torch.float32"):
        deep_kernels.k_grouped_bf16_gemm_nt_contiguous(a, b, d, ks, t, c=d.double())
    # The tn form hands the transposes to the nt checks (which stop at the device).
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        deep_kernels.k_grouped_bf16_gemm_tn_contiguous(a.T, b.T, d, ks, t)
    monkeypatch.setattr(k_grouped_bf16_gemm, "_checked_calls", {})
    key = (call_cache.call_signature(a, b, d, t, None), len(ks))
    k_grouped_bf16_gemm._checked_calls[key] = ((8, 32, 192, 3, True, True), {})  # as a valid GPU call leaves it
    with pytest.raises(ValueError, match="ks sums to 256"):
        deep_kernels.k_grouped_bf16_gemm_nt_contiguous(a, b, d, [64, 64, 128], t)


def test_bf16_reference_is_the_per_group_product():
    ks = [128, 0, 64]
    dy, x, _ = make_k_grouped_bf16_inputs(ks, 8, 32, device="cpu")
    c = torch.rand(3, 8, 32)
    d = _bf16_reference(dy, x, ks, c)
    a, b = dy.double().T, x.double().T
    assert torch.equal(d[0], a[:, :128] @ b[:, :128].T + c[0].double())
    assert torch.equal(d[1], c[1].double())
    assert torch.equal(d[2], a[:, 128:] @ b[:, 128:].T + c[2].double())


def test_bf16_configs():
    for g, m, n, k in heuristics_bf16.REPRESENTATIVE_PROBLEMS:
        for mn_major in (False, True):
            config = heuristics_bf16.get_k_grouped_bf16_gemm_config(m, n, g * k, g, 132, True, mn_major_b=mn_major)
            assert config.num_splits == 1 and config.block_k == 64 and not config.overlap_epilogue
            assert not mn_major or config.block_n % 64 == 0
            assert config.block_m != 256 or config.num_tma_multicast == 2
            assert config.smem_bytes == heuristics_bf16.bf16_gemm.smem_bytes(
                config.block_m, config.block_n, config.num_stages, 4, streamed_store=True) <= fp8_gemm.SMEM_CAPACITY_BYTES
            assert 0 < heuristics_bf16.grid_size(config, m, n, g, 132) <= 132
    with pytest.raises(ValueError, match="total_k"):
        heuristics_bf16.get_k_grouped_bf16_gemm_config(64, 128, 96, 4, 132)
    kernels = heuristics_bf16.all_candidate_kernels()
    assert kernels and all(kernel.k == 0 and kernel.gemm_type == "k_grouped" for kernel in kernels)


@pytest.mark.gpu
@pytest.mark.parametrize("c_kind,layout", [("separate", "tn"), ("alias", "tn"), ("none", "tn"), ("alias", "nt")])
def test_bf16_matches_reference(c_kind, layout):
    dy, x, ks, ks_tensor = _bf16_problem(4, 1000, 2048, 1024, empty=1)
    product = _bf16_reference(dy, x, ks)
    c = None if c_kind == "none" else accumulator_like(product.flatten(0, 1)).view(product.shape)
    d = _bf16_run(dy, x, ks, ks_tensor, c=c, alias=c_kind == "alias", layout=layout)
    _assert_close(d, product if c is None else product + c.double())
    assert_bitwise_equal(_bf16_run(dy, x, ks, ks_tensor, c=c, alias=c_kind == "alias", layout=layout), d,
                         "d (second run)")


@pytest.mark.gpu
def test_bf16_many_groups_and_128_row_tiles(monkeypatch):
    # 16 groups (3 empty) on 128 x 256 tiles (the benchmark shapes' pick; these shapes take 256 x 128 tiles).
    config = heuristics_bf16.bf16_gemm.make_config(128, 256, out_dtype_bytes=4, streamed_store=True)
    monkeypatch.setattr(heuristics_bf16, "get_k_grouped_bf16_gemm_config", lambda *args, **kwargs: config)
    monkeypatch.setattr(k_grouped_bf16_gemm, "_plans", {})
    dy, x, ks, ks_tensor = _bf16_problem(16, 256, 2048, 320, empty=3, seed=1)
    product = _bf16_reference(dy, x, ks)
    c = accumulator_like(product.flatten(0, 1)).view(product.shape)
    _assert_close(_bf16_run(dy, x, ks, ks_tensor, c=c, alias=True), product + c.double())


@pytest.mark.gpu
def test_bf16_check_rejects_a_doubled_token():
    dy, x, ks, ks_tensor = _bf16_problem(4, 1000, 2048, 1024, empty=1)
    product = _bf16_reference(dy, x, ks)
    c = accumulator_like(product.flatten(0, 1)).view(product.shape)
    doubled = x.clone()
    doubled[int(x.float().abs().sum(dim=1).argmax())] *= 2
    with pytest.raises(AssertionError, match="calc_diff"):
        _assert_close(_bf16_run(dy, doubled, ks, ks_tensor, c=c, alias=True), product + c.double())


# ---- what the two kinds share (GPU) ----

# Each kind's (problem, run on a fresh d, float64 reference, K block, the call on a given d).
KINDS = {
    "fp8": (_problem, _run, _reference, 128, deep_kernels.k_grouped_fp8_gemm_nt_contiguous),
    "bf16": (_bf16_problem, _bf16_run, _bf16_reference, 64, deep_kernels.k_grouped_bf16_gemm_tn_contiguous),
}


@pytest.mark.gpu
@pytest.mark.parametrize("kind", KINDS)
def test_every_group_empty(kind):
    problem, run = KINDS[kind][:2]
    lhs, rhs, ks, ks_tensor = problem(3, 64, 128, 0, empty=0)
    assert ks == [0, 0, 0]
    c = torch.randn(3, 64, 128, device="cuda")
    assert torch.equal(run(lhs, rhs, ks, ks_tensor, c=c), c)
    assert not run(lhs, rhs, ks, ks_tensor).any()


@pytest.mark.gpu
@pytest.mark.parametrize("kind", KINDS)
def test_check_rejects_a_moved_group_boundary(kind):
    problem, run, reference_of, block_k, _ = KINDS[kind]
    lhs, rhs, ks, ks_tensor = problem(4, 1000, 2048, 1024, empty=1)
    product = reference_of(lhs, rhs, ks)
    c = accumulator_like(product.flatten(0, 1)).view(product.shape)
    _assert_close(run(lhs, rhs, ks, ks_tensor, c=c), product + c.double())
    # The first non-empty group ends one K block early on the device (the next one starts early).
    g = next(i for i, k in enumerate(ks) if k > block_k and i + 1 < len(ks))
    wrong = ks_tensor.clone()
    wrong[g] -= block_k
    wrong[g + 1] += block_k
    with pytest.raises(AssertionError, match="calc_diff"):
        _assert_close(run(lhs, rhs, ks, wrong, c=c), product + c.double())


@pytest.mark.gpu
@pytest.mark.parametrize("kind", KINDS)
def test_cuda_graph_replay_reads_the_group_sizes_on_the_device(kind):
    # Captured once (no host synchronisation inside), replayed with other group sizes of the same total in ks_tensor:
    # the kernel places the segments from the device's values.
    problem, _, reference_of, block_k, call = KINDS[kind]
    lhs, rhs, ks, ks_tensor = problem(4, 512, 2048, 512, empty=0, seed=3)
    d = torch.zeros((4, 512, 2048), device="cuda")
    call(lhs, rhs, d, ks, ks_tensor)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(lhs, rhs, d, ks, ks_tensor)
    new_ks = [ks[0] + ks[1], 0, ks[2] - block_k, ks[3] + block_k]
    ks_tensor.copy_(torch.tensor(new_ks, dtype=torch.int32))
    poison_(d)
    graph.replay()
    _assert_close(d, reference_of(lhs, rhs, new_ks))


# ---- sizes on the device only ----

def test_sizes_on_the_device_only_check_the_tensor():
    a, b, d, _, t = _cpu_call()
    with pytest.raises(TypeError, match="ks_tensor must be torch.int32"):
        deep_kernels.k_grouped_fp8_gemm_nt_contiguous(a, b, d, None, t.long())
    with pytest.raises(ValueError, match=r"ks_tensor must be a non-empty contiguous int32 tensor \[G\]"):
        deep_kernels.k_grouped_fp8_gemm_nt_contiguous(a, b, d, None, t.view(3, 1))
    with pytest.raises(ValueError, match=r"d must be a contiguous FP32 \[G, M, N\]"):
        deep_kernels.k_grouped_fp8_gemm_nt_contiguous(a, b, d, None, t[:2])
    with pytest.raises(ValueError, match="must be a CUDA tensor"):  # valid up to the device
        deep_kernels.k_grouped_fp8_gemm_nt_contiguous(a, b, d, None, t)


def test_reference_with_sizes_on_the_device_reads_their_segments_only():
    a, b, ks_tensor = make_k_grouped_inputs([128, 0, 256, 128], 8, 32, device="cpu")
    a[0][:, 384:] = float("nan")  # the columns after the segments of [128, 0, 256]
    d = reference.k_grouped_fp8_gemm_nt_contiguous(a, b, torch.empty(3, 8, 32, dtype=torch.float64), None,
                                                   ks_tensor[:3])
    assert torch.equal(d, _reference(a, b, [128, 0, 256, 128])[:3])


@pytest.mark.gpu
def test_sizes_on_the_device_only_with_columns_to_spare():
    # ks=None: sum k of a and b is a bound; the columns after the groups' segments (NaN here) are never read.
    a, b, ks, ks_tensor = _problem(4, 1000, 2048, 1024, empty=1, seed=4)
    spare = 384
    (qa, sa), (qb, sb) = a, b
    a = _with_nan_columns(qa, sa, spare)
    b = _with_nan_columns(qb, sb, spare)
    product = _reference(a, b, ks + [spare])[:len(ks)]
    d = poison_(torch.empty((len(ks), 1000, 2048), device="cuda"))
    deep_kernels.k_grouped_fp8_gemm_nt_contiguous(a, b, d, None, ks_tensor)
    _assert_close(d, product)


def _with_nan_columns(q, scales, spare: int) -> tuple:
    """The operand with `spare` more columns of NaN codes (scales 1) after its own."""
    rows, total_k = q.shape
    wider = torch.full((rows, total_k + spare), float("nan"), device=q.device).to(q.dtype)
    wider[:, :total_k] = q
    wider_scales = torch.ones((scales.shape[1] + spare // 128, scales.shape[0]), device=q.device).T
    wider_scales[:, :scales.shape[1]] = scales
    return wider, wider_scales
