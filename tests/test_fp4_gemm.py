"""FP8 x MXFP4 GEMMs: input validation and the heuristics' shared-memory carve-up (CPU), and the kernels against a
float64 reference of the dequantized operands (GPU).

The check is deep_kernels.testing.gemm.assert_gemm_close: calc_diff below 1e-5 for bf16 D (the bf16 rounding of D
alone gives up to 7.6e-6) and 2e-7 for FP32 D, over the whole matrix, every 128 x 128 tile and every row, with
outputs poisoned (NaN) before each launch so that every element is checked. The weights are uniform random e2m1
code bytes (every code, both zeros) with a power-of-two scale per 32-wide sub-block: per 128-deep block an
exponent in 2^-8 .. 2^8 and its sub-blocks shifted below it by 0 .. 3 (the exact expansion), 0 .. 14 (its limit)
or 0 .. 24 (rounded sub-blocks), so a wrong shift or column scale moves the result far past the bound; the
planted-bug tests run the real kernel with one wrong sub-block scale and with codes of one wrong nibble order,
and show that the same check rejects each result.
"""

import pytest
import torch

import deep_kernels
from deep_kernels import fp4_gemm
from deep_kernels.heuristics import fp8_fp4_gemm as heuristics
from deep_kernels.reference import fp4_gemm as reference
from deep_kernels.reference.quant.fp4 import pack_e2m1
from deep_kernels.testing import assert_bitwise_equal, poison_
from deep_kernels.testing.fp4_gemm import make_fp4_gemm_inputs, mxfp4_weights
from deep_kernels.testing.gemm import accumulator_like, assert_gemm_close
from deep_kernels.testing.grouped import make_contiguous_inputs, make_masked_inputs

DEEPSEEK_NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]


def _reference(a, b, c: torch.Tensor = None) -> torch.Tensor:
    m, n = a[0].shape[0], b[0].shape[0]
    return reference.fp8_fp4_gemm_nt(a, b, torch.empty((m, n), device=a[0].device, dtype=torch.float64), c=c)


def _run(a, b, config=None) -> torch.Tensor:
    m, n = a[0].shape[0], b[0].shape[0]
    return fp4_gemm.fp8_fp4_gemm_nt_with_config(config, a, b,
                                                poison_(torch.empty((m, n), device="cuda", dtype=torch.bfloat16)))


# ---- validation (CPU) ----

def _cpu_operands(m=8, n=256, k=256):
    a = (torch.zeros(m, k, dtype=torch.float8_e4m3fn), torch.ones(m, k // 128))
    b = (torch.zeros(n, k // 2, dtype=torch.uint8).view(torch.float4_e2m1fn_x2),
         torch.full((n, k // 32), 127, dtype=torch.uint8).view(torch.float8_e8m0fnu))
    return a, b, torch.empty(m, n, dtype=torch.bfloat16)


@pytest.mark.parametrize("mutate,error,match", [
    (lambda a, b, d: (a, (b[0].view(torch.uint8).view(torch.float8_e4m3fn), b[1]), d), TypeError, "b must be"),
    (lambda a, b, d: (a, (b[0][:, :64], b[1]), d), ValueError, "K / 2 = 128 bytes"),
    (lambda a, b, d: (a, (b[0], b[1][:, :4]), d), ValueError, r"sfb must be contiguous UE8M0 scales of shape \(256, 8\)"),
    (lambda a, b, d: (a, (b[0], b[1].view(torch.uint8).float()), d), TypeError, "sfb must be"),
    (lambda a, b, d: (a, (b[0], b[1].view(torch.uint8).view(torch.float8_e4m3fn)), d), TypeError, "sfb must be"),
    (lambda a, b, d: ((a[0][:, :192], a[1]), (b[0][:, :96], b[1][:, :6]), d), ValueError, "multiple of 128"),
    (lambda a, b, d: (a, (b[0][:200], b[1][:200]), d[:, :200]), ValueError, "multiple of 16"),
    (lambda a, b, d: (a, b, d.float()), TypeError, "pass c"),
    (lambda a, b, d: (a, b, d[:, :128]), ValueError, "d must be a contiguous"),
    (lambda a, b, d: ((a[0], a[1][:, :1]), b, d), ValueError, "sfa must have shape"),
    (lambda a, b, d: (a[0], b, d), TypeError, "pairs"),
    (lambda a, b, d: (a, b, d), ValueError, "must be a CUDA tensor"),
])
def test_rejects_bad_input(mutate, error, match):
    with pytest.raises(error, match=match):
        deep_kernels.fp8_fp4_gemm_nt(*mutate(*_cpu_operands()))


def test_grouped_rejects_bad_input():
    (a, sfa), (b, sfb), d = _cpu_operands(m=128)
    grouped_b = (b.unsqueeze(0).expand(2, -1, -1).contiguous(), sfb.unsqueeze(0).expand(2, -1, -1).contiguous())
    m_indices = torch.zeros(128, dtype=torch.int32)
    with pytest.raises(ValueError, match="shape \\(2, 256, 8\\)"):
        deep_kernels.m_grouped_fp8_fp4_gemm_nt_contiguous((a, sfa), (grouped_b[0], grouped_b[1][:, :, :4]), d,
                                                           m_indices)
    with pytest.raises(ValueError, match="M_total = 100 rows"):
        deep_kernels.m_grouped_fp8_fp4_gemm_nt_contiguous((a[:100], sfa[:100]), grouped_b, d[:100], m_indices[:100])
    masked_a = (a.view(torch.uint8).view(2, 64, 256).view(torch.float8_e4m3fn), sfa.view(2, 64, 2))
    masked_m = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="expected_m"):
        deep_kernels.m_grouped_fp8_fp4_gemm_nt_masked(masked_a, grouped_b, d.view(2, 64, 256), masked_m, 0)
    with pytest.raises(ValueError, match="b has 1"):
        deep_kernels.m_grouped_fp8_fp4_gemm_nt_masked(masked_a, (grouped_b[0][:1], grouped_b[1][:1]),
                                                      d.view(2, 64, 256), masked_m, 1)


def test_reference_dequantizes_codes_and_scales():
    # Codes 0..15 of one row (element 2i in the low nibble) with scales 2^0, 2^-1, 2^3, 2^-127 of its four
    # 32-groups.
    values = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                          dtype=torch.float64)
    codes = torch.arange(128, dtype=torch.uint8).remainder(16).view(1, 128)
    scales = torch.tensor([[127, 126, 130, 0]], dtype=torch.uint8)
    expected = values.repeat(8) * torch.tensor([1.0, 0.5, 8.0, 2.0 ** -127], dtype=torch.float64).repeat_interleave(32)
    actual = reference.dequantize_mxfp4(pack_e2m1(codes), scales.view(torch.float8_e8m0fnu))
    assert torch.equal(actual, expected.view(1, 128))


def test_weights_cover_every_code_and_the_asked_shifts():
    codes, scales = mxfp4_weights(256, 1024, device="cpu", max_shift=14)
    nibbles = torch.cat([codes.view(torch.uint8) & 0xF, codes.view(torch.uint8) >> 4])
    assert torch.bincount(nibbles.flatten().long(), minlength=16).min() > 0
    exponents = scales.view(torch.uint8).view(256, 8, 4).int()
    shifts = exponents.amax(dim=2, keepdim=True) - exponents
    assert shifts.max() == 14 and shifts.min() == 0


def test_smem_bytes_is_the_kernels_carve_up(tmp_path):
    # nvcc checks that the host's shared memory is the traits' kSmemBytes for the FP4 kind's picks.
    from deep_kernels.jit import compiler

    configs = {(c.block_m, c.block_n, c.num_stages): c for m, n, k in fp4_gemm.REPRESENTATIVE_MNK
               for c in [heuristics.get_config(m, n, k, 132)]}
    configs[(64, 48, 0)] = heuristics.make_config(64, 48, 2, num_stages=3, num_splits=3)
    checks = []
    fp32_config = heuristics.make_config(64, 128, 4, num_splits=2)
    for config, out, accumulate in [(c, "bfloat16", False) for c in configs.values()] + [(fp32_config, "float32", True)]:
        args = heuristics.template_args(config, 4096, 7168, out, accumulate)
        traits_args = ", ".join(args[:6] + args[8:])
        checks.append(f"static_assert(deep_kernels::sm90_fp8_gemm_detail::Sm90Fp8GemmTraits<{traits_args}>::kSmemBytes "
                      f"== {config.smem_bytes});")
    source = tmp_path / "smem_check.cu"
    source.write_text('#include "gemm/sm90_fp8_gemm_traits.cuh"\n' + "\n".join(checks) + "\n")
    command = compiler.compile_command(source, tmp_path / "smem_check.cubin", "90a")
    compiler.run_compile(command)
    first = next(iter(configs.values()))
    source.write_text(source.read_text().replace(f"== {first.smem_bytes});", f"== {first.smem_bytes + 1});", 1))
    with pytest.raises(RuntimeError, match="static assertion failed"):
        compiler.run_compile(command)


def test_heuristics_pick_legal_configs_and_price_fp4_weights(monkeypatch):
    for m, n, k in fp4_gemm.REPRESENTATIVE_MNK:
        config = heuristics.get_config(m, n, k, 132)
        assert config.num_tma_multicast == 1 and config.smem_bytes <= heuristics.SMEM_CAPACITY_BYTES
        assert config.num_stages >= heuristics.MIN_STAGES
    # Where the weight bytes are all the cost (expansion and code ring free), the FP4 estimate is near 4.25 / 8 of
    # the same config's FP8 estimate.
    from deep_kernels.heuristics import fp8_gemm
    monkeypatch.setattr(heuristics, "EXPAND_SECONDS_PER_CODE", {64: 0.0, 128: 0.0})
    monkeypatch.setattr(heuristics, "CODE_ROUND_TRIP_SECONDS", 0.0)
    config = heuristics.make_config(64, 64, 2, num_splits=1)
    fp4_s = heuristics.estimate_seconds(config, 1, 32768, 7168, 132)
    fp8_s = fp8_gemm.estimate_seconds(config, 1, 32768, 7168, 132)
    assert fp4_s < 0.7 * fp8_s
    with pytest.raises(ValueError, match="multiple of 128"):
        heuristics.get_config(1, 4096, 7200, 132)


# ---- kernels (GPU) ----

def _decode_and_prefill_shapes():
    shapes = [(m, n, k) for m in (1, 16, 64, 128) for n, k in DEEPSEEK_NK[::2]]
    shapes += [(m, n, k) for m, n, k in ((16, 2112, 7168), (64, 24576, 1536), (128, 7168, 16384))]
    return shapes + [(4096, 4096, 7168), (4096, 7168, 2048), (300, 1040, 384), (129, 176, 1024)]


def test_prefill_expands_before_and_decode_in_the_kernel():
    for n, k in DEEPSEEK_NK:
        assert not any(heuristics.expands_before(m, n, k, 132) for m in (1, 16, 64, 128))
        assert heuristics.expands_before(4096, n, k, 132)


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", _decode_and_prefill_shapes())
def test_dense_matches_reference(m, n, k):
    a, b = make_fp4_gemm_inputs(m, n, k)
    assert_gemm_close(_run(a, b), _reference(a, b))


@pytest.mark.gpu
@pytest.mark.parametrize("max_shift", [14, 24])
def test_sub_block_shifts_up_to_the_exact_limit_and_past_it(max_shift):
    a, b = make_fp4_gemm_inputs(64, 2048, 2048, max_shift=max_shift)
    assert_gemm_close(_run(a, b), _reference(a, b))


@pytest.mark.gpu
@pytest.mark.parametrize("block_m,block_n,splits", [(64, 128, 1), (64, 48, 3), (128, 96, 2), (128, 192, 1),
                                                    (64, 144, 2)])
def test_forced_tilings(block_m, block_n, splits):
    m, n, k = 300, 1040, 1024
    config = heuristics.make_config(block_m, block_n, 2, num_splits=splits,
                                    overlap_epilogue=block_m == 128 and splits == 1)
    a, b = make_fp4_gemm_inputs(m, n, k)
    assert_gemm_close(_run(a, b, config=config), _reference(a, b))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [96, 1024])  # the in-kernel expansion, and B expanded before the GEMM (prefill)
def test_accumulates_into_fp32_and_in_place(m):
    assert heuristics.expands_before(m, 2112, 1536, 132, 4, True) == (m == 1024)
    a, b = make_fp4_gemm_inputs(m, 2112, 1536)
    c = accumulator_like(_reference(a, b))
    expected = _reference(a, b, c)
    d = poison_(torch.empty(m, 2112, device="cuda"))
    assert_gemm_close(deep_kernels.fp8_fp4_gemm_nt(a, b, d, c=c), expected)
    d = c.clone()
    assert_gemm_close(deep_kernels.fp8_fp4_gemm_nt(a, b, d, c=d), expected)


@pytest.mark.gpu
def test_uint8_codes_and_scales_and_deterministic():
    a, b = make_fp4_gemm_inputs(64, 7168, 2048)
    first = _run(a, b)
    assert_gemm_close(first, _reference(a, b))
    assert_bitwise_equal(_run(a, (b[0].view(torch.uint8), b[1].view(torch.uint8))), first)
    assert_bitwise_equal(_run(a, b), first)


@pytest.mark.gpu
def test_check_rejects_a_wrong_sub_block_scale():
    a, b = make_fp4_gemm_inputs(64, 1024, 1024)
    expected = _reference(a, b)
    scales = b[1].view(torch.uint8).clone()
    scales[517, 13] += 1  # one 32-wide sub-block of one row twice too large
    with pytest.raises(AssertionError, match="calc_diff"):
        assert_gemm_close(_run(a, (b[0], scales.view(torch.float8_e8m0fnu))), expected)


@pytest.mark.gpu
def test_check_rejects_swapped_nibbles():
    a, b = make_fp4_gemm_inputs(64, 1024, 1024)
    expected = _reference(a, b)
    codes = b[0].view(torch.uint8).clone()
    codes[100] = (codes[100] >> 4) | (codes[100] << 4)  # elements 2i and 2i + 1 of one row exchanged
    with pytest.raises(AssertionError, match="calc_diff"):
        assert_gemm_close(_run(a, (codes, b[1])), expected)


@pytest.mark.gpu
def test_matches_the_cast_of_real_weights():
    from deep_kernels.testing.gemm import gemm_activations, cast_activations, gemm_weights
    w = gemm_weights(2112, 7168)
    b = deep_kernels.per_token_cast_to_mxfp4(w)
    a = cast_activations(gemm_activations(16, 7168))
    assert_gemm_close(_run(a, b), _reference(a, b))


@pytest.mark.gpu
def test_contiguous_matches_reference_and_keeps_padding_rows():
    sizes = [0, 200, 37, 128]
    a, _, m_indices, _ = make_contiguous_inputs(sizes, 1024, 2048)
    b = mxfp4_weights(1024, 2048, num_groups=len(sizes))
    d = poison_(torch.empty(m_indices.numel(), 1024, device="cuda", dtype=torch.bfloat16))
    deep_kernels.m_grouped_fp8_fp4_gemm_nt_contiguous(a, b, d, m_indices)
    expected = reference.m_grouped_fp8_fp4_gemm_nt_contiguous(a, b, torch.full_like(d, float("nan"), dtype=torch.float64),
                                                              m_indices)
    valid = m_indices >= 0
    assert_gemm_close(d[valid], expected[valid])
    assert torch.isnan(d[~valid]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("masked_m,m_max,expected_m", [([5, 0, 64, 33], 64, 32), ([1, 17, 3, 150, 0, 9], 160, 16)])
def test_masked_matches_reference_and_keeps_rows_past_masked_m(masked_m, m_max, expected_m):
    a, _, masked = make_masked_inputs(masked_m, m_max, 4096, 1024)
    b = mxfp4_weights(4096, 1024, num_groups=len(masked_m))
    d = poison_(torch.empty(len(masked_m), m_max, 4096, device="cuda", dtype=torch.bfloat16))
    deep_kernels.m_grouped_fp8_fp4_gemm_nt_masked(a, b, d, masked, expected_m)
    expected = reference.m_grouped_fp8_fp4_gemm_nt_masked(a, b, torch.full_like(d, float("nan"), dtype=torch.float64),
                                                          masked, expected_m)
    for g, rows in enumerate(masked_m):
        if rows:
            assert_gemm_close(d[g, :rows], expected[g, :rows])
        assert torch.isnan(d[g, rows:]).all()


# ---- the swapped kernel (weights as wgmma's register operand, decode sizes) ----

def test_swap_ab_smem_bytes_is_the_kernels_carve_up(tmp_path):
    from deep_kernels.heuristics import fp8_fp4_swap_ab as swap_ab
    from deep_kernels.jit import compiler

    configs = [swap_ab.make_config(t, w) for t in swap_ab.BLOCK_TS for w in (1, 2)]
    configs += [swap_ab.make_config(t, 1, ctas_per_sm=2) for t in (16, 32, 64)]
    configs += [swap_ab.make_config(16, 2, num_chains=1), swap_ab.make_config(32, 1, num_chains=2)]
    checks = [f"static_assert(deep_kernels::sm90_fp8_fp4_swap_ab_detail::Sm90Fp8Fp4SwapAbTraits<"
              f"{', '.join(swap_ab.template_args(c, 'bfloat16', False))}>::kSmemBytes == {c.smem_bytes});"
              for c in configs]
    source = tmp_path / "swap_ab_smem_check.cu"
    source.write_text('#include "kernels/sm90_fp8_fp4_gemm_swap_ab.cuh"\n' + "\n".join(checks) + "\n")
    command = compiler.compile_command(source, tmp_path / "swap_ab_smem_check.cubin", "90a")
    compiler.run_compile(command)
    source.write_text(source.read_text().replace(f"== {configs[0].smem_bytes});", f"== {configs[0].smem_bytes + 1});", 1))
    with pytest.raises(RuntimeError, match="static assertion failed"):
        compiler.run_compile(command)


def test_swap_ab_heuristics():
    from deep_kernels.heuristics import fp8_fp4_swap_ab as swap_ab
    for m in (1, 16, 64, 128):
        for n, k in DEEPSEEK_NK:
            config = swap_ab.get_config(m, n, k, 132)
            assert config.block_t >= m and 1 <= config.num_splits <= k // 128
            assert config.smem_bytes <= swap_ab.smem_capacity(config.ctas_per_sm)
    with pytest.raises(ValueError, match="1 to 128 tokens"):
        swap_ab.get_config(129, 4096, 7168, 132)
    (a, sfa), (b, sfb), d = _cpu_operands(m=17)
    with pytest.raises(ValueError, match="cannot take m = 17"):
        fp4_gemm._swap_ab_launch({}, swap_ab.make_config(16), a, sfa, b, sfb, d, 17, 256, 256, False)
    with pytest.raises(ValueError, match="num_splits must be in 1..K / 128 = 2"):
        fp4_gemm._swap_ab_launch({}, swap_ab.make_config(32, num_splits=3), a, sfa, b, sfb, d, 17, 256, 256, False)


def _swap_ab_config(block_t, warpgroups, splits, ctas_per_sm=1, chains=None):
    from deep_kernels.heuristics import fp8_fp4_swap_ab as swap_ab
    return swap_ab.make_config(block_t, warpgroups, num_splits=splits, ctas_per_sm=ctas_per_sm, num_chains=chains)


@pytest.mark.gpu
# (m, n, k, tokens a tile, math warpgroups, splits, CTAs an SM, accumulator chains: None for the most that fit)
@pytest.mark.parametrize("m,n,k,block_t,warpgroups,splits,ctas_per_sm,chains", [
    (1, 2112, 7168, 16, 2, 4, 1, None), (16, 2112, 7168, 16, 2, 1, 1, 1), (13, 1040, 1024, 16, 2, 3, 1, None),
    (64, 7168, 2048, 64, 2, 2, 1, None), (128, 4096, 7168, 128, 2, 3, 1, None), (100, 1040, 1024, 128, 1, 2, 1, None),
    (128, 24576, 1536, 128, 2, 1, 1, None), (32, 32768, 512, 32, 1, 1, 1, None), (20, 176, 512, 32, 1, 4, 1, 2),
    (64, 4096, 7168, 64, 2, 56, 1, 1), (5, 2112, 7168, 16, 1, 8, 2, None), (64, 7168, 2048, 64, 1, 2, 2, None),
    (30, 4096, 1024, 32, 1, 1, 2, None),
])
def test_swap_ab_matches_reference(m, n, k, block_t, warpgroups, splits, ctas_per_sm, chains):
    a, b = make_fp4_gemm_inputs(m, n, k)
    config = _swap_ab_config(block_t, warpgroups, splits, ctas_per_sm, chains)
    assert_gemm_close(_run(a, b, config=config), _reference(a, b))


@pytest.mark.gpu
@pytest.mark.parametrize("max_shift", [14, 24])
def test_swap_ab_sub_block_shifts(max_shift):
    a, b = make_fp4_gemm_inputs(64, 2048, 2048, max_shift=max_shift)
    assert_gemm_close(_run(a, b, config=_swap_ab_config(64, 2, 2)), _reference(a, b))


@pytest.mark.gpu
def test_swap_ab_accumulates_into_fp32_and_is_deterministic():
    a, b = make_fp4_gemm_inputs(64, 2112, 1536)
    config = _swap_ab_config(64, 2, 3)
    c = accumulator_like(_reference(a, b))
    expected = _reference(a, b, c)
    d = poison_(torch.empty(64, 2112, device="cuda"))
    assert_gemm_close(fp4_gemm.fp8_fp4_gemm_nt_with_config(config, a, b, d, c=c), expected)
    d = c.clone()
    assert_gemm_close(fp4_gemm.fp8_fp4_gemm_nt_with_config(config, a, b, d, c=d), expected)
    first = _run(a, b, config=config)
    assert_gemm_close(first, _reference(a, b))
    assert_bitwise_equal(_run(a, b, config=config), first)


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(64, 7168, 16384), (64, 4096, 7168), (16, 4096, 7168)])
def test_swap_ab_repeated_runs_are_bitwise_equal(m, n, k):
    from deep_kernels.heuristics import fp8_fp4_swap_ab as swap_ab
    a, b = make_fp4_gemm_inputs(m, n, k)
    config = swap_ab.get_config(m, n, k, deep_kernels.get_num_sms())
    first = _run(a, b, config=config)
    assert_gemm_close(first, _reference(a, b))
    # Back to back into poisoned outputs: a stage freed too early shows as a run that differs.
    outputs = [_run(a, b, config=config) for _ in range(200)]
    differing = [i for i, out in enumerate(outputs) if not torch.equal(out.view(torch.int16), first.view(torch.int16))]
    assert differing == []


@pytest.mark.gpu
def test_swap_ab_check_rejects_planted_bugs():
    a, b = make_fp4_gemm_inputs(64, 1024, 1024)
    expected = _reference(a, b)
    config = _swap_ab_config(64, 2, 2)
    scales = b[1].view(torch.uint8).clone()
    scales[517, 13] += 1
    with pytest.raises(AssertionError, match="calc_diff"):
        assert_gemm_close(_run(a, (b[0], scales.view(torch.float8_e8m0fnu)), config=config), expected)
    codes = b[0].view(torch.uint8).clone()
    codes[100] = (codes[100] >> 4) | (codes[100] << 4)
    with pytest.raises(AssertionError, match="calc_diff"):
        assert_gemm_close(_run(a, (codes, b[1]), config=config), expected)
