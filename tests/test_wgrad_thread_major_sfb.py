"""Thread-major sfb (Fp8GemmConfig.thread_major_sfb, the kernel's kThreadMajorSfb): a producer warp copies each stage's
per-channel B scales so that a thread's sfb of two 8-column groups are one 16-byte load. The promotion multiplies the
same factors in the same order as with the TMA-loaded stage, so D must be the same bytes; each case is also checked
against the float64 reference (testing.gemm.assert_gemm_close on D and D^T, outputs poisoned first). The layout itself
is checked on the CPU against the wgmma accumulator layout it serves.
"""

import random

import pytest
import torch

import deep_kernels
from deep_kernels import gemm, k_grouped_gemm
from deep_kernels.heuristics import fp8_gemm as heuristics
from deep_kernels.reference import gemm as reference
from deep_kernels.reference import k_grouped_gemm as k_grouped_reference
from deep_kernels.testing import assert_bitwise_equal, empty_like_strided, poison_
from deep_kernels.testing.gemm import accumulator_like, assert_gemm_close, untaken_override_fields
from deep_kernels.testing.wgrad import group_sizes, make_k_grouped_inputs, make_wgrad_inputs

RECIPE = (1, 1, 128)


# ---- configs (CPU) ----

def test_only_per_channel_scales_take_it():
    config = heuristics.make_config(128, 192, 1, False, 4, overlap_epilogue=True, operands=gemm.CHANNEL_SCALED,
                                    thread_major_sfb=True)
    assert config.thread_major_sfb and heuristics.config_label(config) == "128x192/1os"
    assert heuristics.template_args(config, 7168, 4096, "float32", True, operands=gemm.CHANNEL_SCALED)[-1] == "true"
    assert heuristics.config_fields(config)["thread_major_sfb"]
    plain = heuristics.make_config(128, 192, 1, False, 4, overlap_epilogue=True, operands=gemm.CHANNEL_SCALED)
    assert heuristics.template_args(plain, 7168, 4096, "float32", True, operands=gemm.CHANNEL_SCALED)[-1] == "false"
    # The stage holds the same BLOCK_N floats, in another order.
    assert config.smem_bytes == plain.smem_bytes and config.num_stages == plain.num_stages
    with pytest.raises(ValueError, match="thread-major sfb needs per-channel B scales"):
        heuristics.make_config(128, 128, 1, False, 2, thread_major_sfb=True)
    override = gemm.parse_config_override("thread_major_sfb=1")
    assert gemm.apply_config_override(plain, override, 4, 4096, operands=gemm.CHANNEL_SCALED).thread_major_sfb


def test_k_grouped_picks_take_it_at_128_rows():
    from deep_kernels.heuristics import k_grouped_fp8_gemm as k_heuristics

    for g, m, n, k in k_heuristics.REPRESENTATIVE_PROBLEMS:
        config = k_heuristics.get_k_grouped_fp8_gemm_config(m, n, g * k, g, 132, True)
        assert config.thread_major_sfb == (config.block_m == 128 and not config.pipelined), config
    # The dense weight-gradient picks keep the TMA-loaded stage.
    for m, n, k in ((2112, 7168, 16384), (24576, 1536, 4096), (7168, 2048, 16384), (4096, 7168, 4096)):
        assert not gemm._choose_config(m, n, k, 132, 4, True, gemm.CHANNEL_SCALED).thread_major_sfb
    # An override of the tile or the K loop drops it; one of other fields keeps it.
    pick = k_heuristics.get_k_grouped_fp8_gemm_config(4096, 7168, 8 * 4096, 8, 132, True)
    assert gemm.apply_config_override(pick, {"block_n": 128}, 4, 4096, operands=gemm.CHANNEL_SCALED).thread_major_sfb \
        is False
    assert gemm.apply_config_override(pick, {"stages": 3}, 4, 4096, operands=gemm.CHANNEL_SCALED).thread_major_sfb


def _thread_major_offset(j: int, t: int) -> int:
    """The float offset of lane class t's pair of 8-column group j (gemm/sm90_sfb_thread_major.cuh)."""
    return (j // 2 * 4 + t) * 4 + j % 2 * 2


@pytest.mark.parametrize("block_n", [128, 160, 192])
def test_layout_puts_each_threads_pairs_in_16_byte_runs(block_n):
    # Every column lands once; a thread's groups 2c and 2c + 1 fill one aligned float4; a warp's four lane classes
    # read 64 consecutive bytes (16 distinct banks).
    seen = {}
    for column in range(block_n):
        j, t, e = column // 8, column % 8 // 2, column % 2
        seen[_thread_major_offset(j, t) + e] = column
    assert sorted(seen) == list(range(block_n))
    for c in range(block_n // 16):
        for t in range(4):
            base = _thread_major_offset(2 * c, t)
            assert base % 4 == 0
            assert [seen[base + i] for i in range(4)] == [16 * c + 2 * t, 16 * c + 2 * t + 1,
                                                         16 * c + 8 + 2 * t, 16 * c + 8 + 2 * t + 1]
        assert sorted(_thread_major_offset(2 * c, t) for t in range(4)) == [16 * c + 4 * t for t in range(4)]


# ---- kernel (GPU) ----

# (fields, m, n, k, accumulate) of the dense cases, and (fields, G, m, n, mean k) of the k-grouped ones.
_HALVES_192 = {"block_m": 128, "block_n": 192, "multicast": 1, "pipelined": 1, "overlap_epilogue": 1}
_PRELOADED_160 = {"block_m": 128, "block_n": 160, "multicast": 1, "pipelined": 0, "overlap_epilogue": 1}
DENSE_CASES = {
    # 128 x 192 pipelined halves, epilogue overlap, several tiles per CTA (the 2112 x 7168 and 24576 x 1536 picks)
    "dense_halves": (_HALVES_192, 2112, 7168, 1024, True),
    # 128 x 160, plain K loop with preloaded pairs, tiles straddling 128-column blocks, a partial last N tile
    "dense_preloaded": (_PRELOADED_160, 777, 2112, 2048, True),
    # 128 x 128 pipelined, a partial last M tile
    "dense_pipelined": ({"block_m": 128, "block_n": 128, "multicast": 1, "pipelined": 1, "overlap_epilogue": 1},
                        1000, 2048, 1152, True),
    # 256 x 128, two waves per warpgroup in a 2-CTA cluster sharing A
    "dense_two_waves": ({"block_m": 256, "block_n": 128, "multicast": 2, "multicast_on_a": 1, "pipelined": 0},
                        1000, 1536, 640, True),
    # bf16 D, a partial last K block (zero-filled A and B, sfb rows of the 9 K blocks)
    "dense_bf16": (_HALVES_192, 300, 1536, 1040, False),
}
K_GROUPED_CASES = {
    # the pick's 128 x 192 with B multicast and the overlap
    "b_multicast": ({"block_m": 128, "block_n": 192, "multicast": 2, "multicast_on_a": 0, "pipelined": 0,
                     "overlap_epilogue": 1}, 6, 1000, 2096, 640),
    # the pipelined halves
    "halves": ({"block_m": 128, "block_n": 160, "multicast": 1, "pipelined": 1, "overlap_epilogue": 0}, 6, 1000, 2096,
               640),
}


def _k_grouped_sizes(num_groups: int, mean_k: int) -> list:
    return group_sizes(num_groups, mean_k, random.Random(5), empty=2)


def test_forced_schedules_are_planned(monkeypatch):
    # Each GPU test below compares the thread-major sfb copy with the TMA-loaded stage under a forced schedule: the
    # plan must take every field it forces, or the comparison is of a kernel with itself.
    for fields, m, n, k, accumulate in DENSE_CASES.values():
        for thread_major in (1, 0):
            override = {**fields, "splits": 1, "thread_major_sfb": thread_major}
            monkeypatch.setattr(gemm, "_config_override", lambda override=override: override)
            config = gemm._choose_config(m, n, k, 132, 4 if accumulate else 2, accumulate, gemm.CHANNEL_SCALED)
            assert untaken_override_fields(config, override) == {}, (override, m, n, k)
    for fields, g, m, n, mean in K_GROUPED_CASES.values():
        for thread_major in (1, 0):
            override = {**fields, "splits": 1, "thread_major_sfb": thread_major}
            monkeypatch.setattr(gemm, "_config_override", lambda override=override: override)
            config = k_grouped_gemm.chosen_config(m, n, sum(_k_grouped_sizes(g, mean)), g, True, 132)
            assert untaken_override_fields(config, override) == {}, (override, m, n)


def _override(monkeypatch, module, fields: dict) -> None:
    monkeypatch.setattr(gemm, "_config_override", lambda: fields)
    monkeypatch.setattr(module, "_plans", {})
    if module is gemm:
        monkeypatch.setattr(gemm, "_prepared_calls", {})


def _dense(a, b, c) -> torch.Tensor:
    d = poison_(torch.empty((a[0].shape[0], b[0].shape[0]), device="cuda", dtype=torch.float32 if c is not None
                            else torch.bfloat16))
    return deep_kernels.fp8_gemm_nt(a, b, d, c=c, recipe=RECIPE)


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(DENSE_CASES))
def test_matches_the_tma_loaded_stage(monkeypatch, case):
    fields, m, n, k, accumulate = DENSE_CASES[case]
    a, b = make_wgrad_inputs(m, n, k)
    expected = reference.fp8_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64), recipe=RECIPE)
    c = accumulator_like(expected) if accumulate else None
    outputs = []
    for thread_major in (1, 1, 0):
        _override(monkeypatch, gemm, {**fields, "splits": 1, "thread_major_sfb": thread_major})
        outputs.append(_dense(a, b, c))
    if c is not None:
        expected = expected + c.double()
    assert_gemm_close(outputs[0], expected)
    assert_gemm_close(outputs[0].T, expected.T, name="d^T")
    assert_bitwise_equal(outputs[1], outputs[0], "d (thread-major sfb, second run)")
    assert_bitwise_equal(outputs[2], outputs[0], "d (TMA-loaded sfb)")


@pytest.mark.gpu
def test_check_rejects_swapped_pairs(monkeypatch):
    # A copier that swapped each thread's two columns would swap sfb's rows in pairs: the same check rejects that.
    _override(monkeypatch, gemm, {**_PRELOADED_160, "splits": 1, "thread_major_sfb": 1})
    a, (b, sfb) = make_wgrad_inputs(777, 2112, 2048)
    expected = reference.fp8_gemm_nt(a, (b, sfb), torch.empty((777, 2112), device="cuda", dtype=torch.float64),
                                     recipe=RECIPE)
    c = accumulator_like(expected)
    expected = expected + c.double()
    assert_gemm_close(_dense(a, (b, sfb), c).T, expected.T)
    # The same layout as sfb, so that only the pairs differ.
    swapped = empty_like_strided(sfb).copy_(sfb.view(-1, 2, sfb.shape[1]).flip(1).reshape(sfb.shape))
    d = _dense(a, (b, swapped), c)
    with pytest.raises(AssertionError, match="calc_diff"):
        assert_gemm_close(d.T, expected.T)


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(K_GROUPED_CASES))
def test_k_grouped_matches_the_tma_loaded_stage(monkeypatch, case):
    # Uneven groups with empty ones.
    fields, g, m, n, mean = K_GROUPED_CASES[case]
    ks = _k_grouped_sizes(g, mean)
    a, b, ks_tensor = make_k_grouped_inputs(ks, m, n, seed=5)
    expected = k_grouped_reference.k_grouped_fp8_gemm_nt_contiguous(
        a, b, torch.empty((len(ks), m, n), dtype=torch.float64, device="cuda"), ks)
    c = accumulator_like(expected.flatten(0, 1)).view(expected.shape)
    outputs = []
    for thread_major in (1, 0):
        _override(monkeypatch, k_grouped_gemm, {**fields, "splits": 1, "thread_major_sfb": thread_major})
        d = poison_(torch.empty((len(ks), m, n), device="cuda"))
        outputs.append(deep_kernels.k_grouped_fp8_gemm_nt_contiguous(a, b, d, ks, ks_tensor, c=c))
    expected = expected + c.double()
    for g in range(len(ks)):
        assert_gemm_close(outputs[0][g], expected[g], name=f"d[{g}]")
        assert_gemm_close(outputs[0][g].T, expected[g].T, name=f"d[{g}]^T")
    assert_bitwise_equal(outputs[1], outputs[0], "d (TMA-loaded sfb)")
