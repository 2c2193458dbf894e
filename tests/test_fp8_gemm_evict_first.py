"""Evict-first B loads (Fp8GemmConfig.evict_first_b, the kernel's kEvictFirstB): B's boxes load with an L2 evict-first
policy, which changes where lines sit in L2 and nothing else, so D is bitwise the twin config's without it; checked
against float64 of the dequantized inputs with outputs poisoned, run to run, and with a planted bug (one tile's B rows
negated) that the same check rejects."""

import pytest
import torch

from deep_kernels import gemm
from deep_kernels.heuristics import fp8_gemm as heuristics
from deep_kernels.reference import gemm as reference
from deep_kernels.testing import assert_bitwise_equal
from deep_kernels.testing.gemm import accumulator_like, assert_gemm_close, forced_config_product, make_gemm_inputs

NUM_SMS = 132


# ---- host rules (CPU) ----

def test_config_label_and_template_argument():
    config = heuristics.make_config(64, 96, 1, False, 2, evict_first_b=True)
    assert heuristics.config_label(config) == "64x96/1pe"
    def argument(config) -> str:
        args = heuristics.template_args(config, 24576, 1536, "bfloat16", False)
        return dict(zip(gemm.FP8_GEMM.template, args))["kEvictFirstB"]

    assert argument(config) == "true"
    assert argument(heuristics.make_config(64, 96, 1, False, 2)) == "false"
    assert heuristics.make_config(**heuristics.config_fields(config), out_dtype_bytes=2) == config


def test_rejects_illegal_configs():
    with pytest.raises(ValueError, match="evict-first B"):
        heuristics.make_config(128, 128, 2, True, 2, evict_first_b=True)
    assert heuristics.make_config(64, 64, 2, False, 2, evict_first_b=True).evict_first_b  # multicast on B
    with pytest.raises(ValueError, match="evict-first B"):
        heuristics.make_config(128, 128, 1, False, 4, evict_first_b=True, operands="fp8_channel_scaled")


def test_override_sets_it_and_multicast_drops_it():
    pick = heuristics.make_config(64, 64, 1, False, 2, evict_first_b=True)
    assert gemm.apply_config_override(pick, {"block_n": 96}, 2, 7168).evict_first_b
    assert not gemm.apply_config_override(pick, {"evict_first_b": 0}, 2, 7168).evict_first_b
    assert not gemm.apply_config_override(pick, {"block_m": 128, "multicast": 2, "multicast_on_a": 1}, 2,
                                          7168).evict_first_b
    assert gemm.apply_config_override(pick, {"multicast": 2}, 2, 7168).evict_first_b  # on B
    plain = heuristics.make_config(64, 64, 1, False, 2)
    assert gemm.apply_config_override(plain, gemm.parse_config_override("evict_first_b=1"), 2, 7168).evict_first_b


# ---- the kernel (GPU) ----

@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,block_m,block_n,splits,in_cluster,accumulate", [
    (64, 24576, 1536, 64, 96, 1, False, False),     # two tiles a CTA, tiles straddling sfb blocks
    (128, 24576, 1536, 128, 192, 1, False, False),  # two math warpgroups, plain K loop
    (17, 7168, 16384, 64, 112, 2, True, True),      # partial M tile, splits in a cluster, FP32 D accumulated
    (128, 4096, 7168, 64, 64, 1, False, False),     # two M blocks read every B line
    (64, 2112, 7040, 64, 64, 4, False, False),      # workspace split-K, the last K block zero-filled
    (128, 4096, 7168, 64, 64, 1, False, "multicast"),  # pairs of M blocks multicasting B
    (192, 4096, 7168, 64, 64, 1, False, "multicast"),  # an odd M block: its tiles load B alone
])
def test_matches_reference_and_twin(m, n, k, block_m, block_n, splits, in_cluster, accumulate):
    multicast = 2 if accumulate == "multicast" else 1
    accumulate = accumulate is True
    out_bytes = 4 if accumulate else 2
    twin = heuristics.make_config(block_m, block_n, multicast, False, out_bytes, num_splits=splits,
                                  splits_in_cluster=in_cluster)
    config = heuristics.make_config(block_m, block_n, multicast, False, out_bytes, num_splits=splits,
                                    splits_in_cluster=in_cluster, evict_first_b=True)
    a, b = make_gemm_inputs(m, n, k)
    expected = reference.fp8_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64))
    c = accumulator_like(expected) if accumulate else None
    if accumulate:
        expected += c.double()
    runs = [forced_config_product(config, a, b, c) for _ in range(2)]
    assert_gemm_close(runs[0], expected)
    assert_bitwise_equal(runs[1], runs[0], "d (run 2)")
    assert_bitwise_equal(runs[0], forced_config_product(twin, a, b, c), "d against the twin without evict-first B")


@pytest.mark.gpu
def test_check_rejects_a_wrong_tile():
    # The kernel's result with one 96-row tile of B negated fails the check against the product of the true B.
    m, n, k = 64, 24576, 1536
    config = heuristics.make_config(64, 96, 1, False, 2, evict_first_b=True)
    a, b = make_gemm_inputs(m, n, k)
    expected = reference.fp8_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64))
    planted_b = (b[0].clone(), b[1])
    planted_b[0][960:1056] = (-planted_b[0][960:1056].float()).to(planted_b[0].dtype)
    planted = forced_config_product(config, a, planted_b)
    assert torch.isfinite(planted).all()
    with pytest.raises(AssertionError, match="calc_diff"):
        assert_gemm_close(planted, expected)


def test_model_takes_it_at_decode_only():
    # Decode picks of one M block (or two with every job in one wave) load B evict-first; M = 4096 picks and multicast
    # configs never do.
    for m, n, k in ((64, 24576, 1536), (128, 24576, 1536), (64, 7168, 16384), (128, 4096, 7168), (128, 2112, 7168)):
        assert heuristics.get_fp8_gemm_config(m, n, k, NUM_SMS, allow_split_k=True).evict_first_b
    for n, k in ((2112, 7168), (24576, 1536), (7168, 16384)):
        assert not heuristics.get_fp8_gemm_config(4096, n, k, NUM_SMS, allow_split_k=True).evict_first_b
    assert not any(c.evict_first_b for c in heuristics.candidate_configs(128, 4096, NUM_SMS, k=7168)
                   if c.num_tma_multicast == 2)
    # Two M blocks: only where every job runs in the first wave (the two readers of a B line at once).
    one_wave = heuristics.make_config(64, 64, 1, False, 2)
    assert heuristics.takes_evict_first_b(one_wave, 128, 4096, 7168, NUM_SMS)
    assert not heuristics.takes_evict_first_b(one_wave, 128, 32768, 7168, NUM_SMS)
    assert not heuristics.takes_evict_first_b(one_wave, 192, 4096, 7168, NUM_SMS)
    # B at least EVICT_FIRST_MIN_B_OVER_D times D: not at 128x32768x512 (B twice D), nor with FP32 D accumulated at
    # 64x32768x512 (D read and written: B twice D).
    assert not heuristics.get_fp8_gemm_config(128, 32768, 512, NUM_SMS, allow_split_k=True).evict_first_b
    assert heuristics.get_fp8_gemm_config(64, 32768, 512, NUM_SMS, allow_split_k=True).evict_first_b
    assert not heuristics.get_fp8_gemm_config(64, 32768, 512, NUM_SMS, out_dtype_bytes=4, with_accumulation=True,
                                              allow_split_k=True).evict_first_b
    # Not for the grouped kinds (no k given).
    assert not any(c.evict_first_b for c in heuristics.candidate_configs(64, 4096, NUM_SMS))
