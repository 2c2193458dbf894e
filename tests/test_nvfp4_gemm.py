"""FP8 x NVFP4 GEMM (fp8_fp4_gemm_nt with b = (codes, sfb, global_scale)): input validation, the heuristics and the
kernel's shared-memory carve-up (CPU), and the kernel against a float64 reference of the dequantized operands (GPU).

The check is deep_kernels.testing.gemm.assert_gemm_close (calc_diff below 1e-5 for bf16 D, 2e-7 for FP32 D, over
the whole matrix, every 128 x 128 tile and every row, outputs poisoned with NaN before each launch). The weights are
uniform random code bytes (every e2m1 code) with E4M3 group scales of every mantissa (a moderate range by default,
every positive finite value, subnormals and 448 included, in one test) and a global scale that is not a power of
two; the planted-bug tests run the real kernel with one wrong group scale, one row's nibbles swapped and a global
scale 1% off, and show that the same check rejects each result.
"""

import pytest
import torch

import deep_kernels
from deep_kernels import fp4_gemm, nvfp4_gemm
from deep_kernels.heuristics import fp8_nvfp4_swap_ab as heuristics
from deep_kernels.heuristics.fp8_gemm import SMEM_CAPACITY_BYTES
from deep_kernels.reference import fp4_gemm as reference
from deep_kernels.reference.quant.fp4 import nvfp4_cast_back
from deep_kernels.testing import assert_bitwise_equal, poison_
from deep_kernels.testing.fp4_gemm import ALL_E4M3_SCALES, make_nvfp4_gemm_inputs, nvfp4_weights
from deep_kernels.testing.gemm import accumulator_like, assert_gemm_close

DEEPSEEK_NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
# Forced configs the GPU tests run besides the heuristics' picks: (tokens a tile, math warpgroups, splits, CTAs an SM).
FORCED = [(16, 2, 3, 1), (32, 1, 1, 1), (64, 2, 2, 1), (128, 1, 4, 1), (16, 1, 2, 2), (32, 2, 2, 1)]


def _reference(a, b, c: torch.Tensor = None) -> torch.Tensor:
    m, n = a[0].shape[0], b[0].shape[0]
    return reference.fp8_fp4_gemm_nt(a, b, torch.empty((m, n), device=a[0].device, dtype=torch.float64), c=c)


def _run(a, b, config=None) -> torch.Tensor:
    m, n = a[0].shape[0], b[0].shape[0]
    return fp4_gemm.fp8_fp4_gemm_nt_with_config(config, a, b,
                                                poison_(torch.empty((m, n), device="cuda", dtype=torch.bfloat16)))


def forced_config(block_t: int, warpgroups: int, splits: int, ctas_per_sm: int = 1):
    return heuristics.make_config(block_t, warpgroups, num_splits=splits, ctas_per_sm=ctas_per_sm)


# ---- validation, heuristics, carve-up (CPU) ----

def _cpu_operands(m=8, n=256, k=256):
    a = (torch.zeros(m, k, dtype=torch.float8_e4m3fn), torch.ones(m, k // 128))
    b = (torch.zeros(n, k // 2, dtype=torch.uint8).view(torch.float4_e2m1fn_x2),
         torch.full((n, k // 16), 0x38, dtype=torch.uint8).view(torch.float8_e4m3fn), torch.ones(1))
    return a, b, torch.empty(m, n, dtype=torch.bfloat16)


@pytest.mark.parametrize("mutate,error,match", [
    (lambda a, b, d: (a, (b[0].view(torch.uint8).view(torch.float8_e4m3fn), *b[1:]), d), TypeError, "b must be"),
    (lambda a, b, d: (a, (b[0][:, :64], *b[1:]), d), ValueError, "K / 2 = 128 bytes"),
    (lambda a, b, d: (a, (b[0], b[1][:, :8], b[2]), d), ValueError,
     r"sfb must be contiguous E4M3 scales of shape \(256, 16\)"),
    (lambda a, b, d: (a, (b[0], b[1].view(torch.uint8), b[2]), d), TypeError, "sfb must be torch.float8_e4m3fn"),
    (lambda a, b, d: (a, (b[0], b[1].view(torch.uint8)[:, :8].contiguous().view(torch.float8_e8m0fnu), b[2]), d),
     TypeError, "sfb must be torch.float8_e4m3fn"),
    (lambda a, b, d: (a, (*b[:2], b[2].double()), d), TypeError, "global_scale must be torch.float32"),
    (lambda a, b, d: (a, (*b[:2], torch.ones(2)), d), ValueError, "global_scale must hold one element"),
    (lambda a, b, d: ((a[0][:, :192], a[1]), (b[0][:, :96], b[1][:, :12], b[2]), d), ValueError, "multiple of 128"),
    (lambda a, b, d: (a, (b[0][:200], b[1][:200], b[2]), d[:, :200]), ValueError, "multiple of 16"),
    (lambda a, b, d: (a, b, d.float()), TypeError, "pass c"),
    (lambda a, b, d: (a, b, d[:, :128]), ValueError, "d must be a contiguous"),
    (lambda a, b, d: ((a[0], a[1][:, :1]), b, d), ValueError, "sfa must have shape"),
    (lambda a, b, d: (a[0], b, d), TypeError, "pair"),
    (lambda a, b, d: (a, b, d), ValueError, "global_scale must be a CUDA tensor"),
])
def test_rejects_bad_input(mutate, error, match):
    with pytest.raises(error, match=match):
        deep_kernels.fp8_fp4_gemm_nt(*mutate(*_cpu_operands()))


def test_grouped_gemms_reject_nvfp4_weights():
    (a, sfa), (b, sfb, global_scale), d = _cpu_operands(m=128)
    weights = (b.unsqueeze(0), sfb.unsqueeze(0), global_scale)
    with pytest.raises(ValueError, match="dense fp8_fp4_gemm_nt only"):
        deep_kernels.m_grouped_fp8_fp4_gemm_nt_contiguous((a, sfa), weights, d, torch.zeros(128, dtype=torch.int32))
    with pytest.raises(ValueError, match="dense fp8_fp4_gemm_nt only"):
        deep_kernels.m_grouped_fp8_fp4_gemm_nt_masked((a.unsqueeze(0), sfa.unsqueeze(0)), weights, d.unsqueeze(0),
                                                      torch.zeros(1, dtype=torch.int32), 1)


def test_reference_dequantizes_codes_scales_and_global_scale():
    codes, scales, global_scale = nvfp4_weights(32, 256, device="cpu", scale_bytes=ALL_E4M3_SCALES)
    weights = reference.dequantize_nvfp4(codes, scales, global_scale)
    # The cast-back reference rounds scale * global_scale to FP32 first: equal within FP32's rounding.
    back = nvfp4_cast_back(codes, scales, global_scale, out_dtype=torch.float32).double()
    torch.testing.assert_close(weights, back, rtol=2 ** -23, atol=0)
    first = codes.view(torch.uint8)[3, 5]
    e2m1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
    value = e2m1[int(first) & 7] * (-1 if int(first) & 8 else 1)
    scale = scales[3, 10 // 16].float().item() * global_scale.item()
    assert weights[3, 10].item() == pytest.approx(value * scale, rel=1e-7)


def test_smem_bytes_is_the_kernels_carve_up(tmp_path):
    from deep_kernels.jit import compiler

    configs = [heuristics.make_config(t, w) for t in heuristics.BLOCK_TS for w in (1, 2) if heuristics.fits_registers(t, w)]
    configs += [heuristics.make_config(16, 2, num_stages=3, num_chains=1), heuristics.make_config(16, 1, ctas_per_sm=2)]
    checks = [f"static_assert(deep_kernels::sm90_fp8_nvfp4_swap_ab_detail::Sm90Fp8Nvfp4SwapAbTraits<"
              f"{', '.join(heuristics.template_args(c, 'bfloat16', False))}>::kSmemBytes == {heuristics.smem_of(c)});"
              for c in configs]
    source = tmp_path / "nvfp4_smem_check.cu"
    source.write_text('#include "kernels/sm90_fp8_nvfp4_gemm_swap_ab.cuh"\n' + "\n".join(checks) + "\n")
    command = compiler.compile_command(source, tmp_path / "nvfp4_smem_check.cubin", "90a")
    compiler.run_compile(command)
    first = heuristics.smem_of(configs[0])
    source.write_text(source.read_text().replace(f"== {first});", f"== {first + 1});", 1))
    with pytest.raises(RuntimeError, match="static assertion failed"):
        compiler.run_compile(command)


def test_heuristics_pick_legal_configs():
    for m in (1, 16, 64, 128):
        for n, k in DEEPSEEK_NK:
            config = heuristics.get_config(m, n, k, 132)
            assert config.block_t >= m and 1 <= config.num_splits <= k // 128
            assert heuristics.smem_of(config) <= SMEM_CAPACITY_BYTES
            assert config.num_chains <= heuristics.max_chains(config.block_t)
            assert config.ctas_per_sm == (2 if config.block_t == 16 else 1)
    with pytest.raises(ValueError, match="1 to 128 tokens"):
        heuristics.get_config(129, 4096, 7168, 132)
    with pytest.raises(ValueError, match="accumulator chains"):
        heuristics.make_config(128, 1, num_chains=2)
    with pytest.raises(ValueError, match="no swapped NVFP4 kernel for 128 tokens and 2 math warpgroups"):
        heuristics.make_config(128, 2)
    with pytest.raises(ValueError, match="two need one math warpgroup and 16 tokens"):
        heuristics.make_config(32, 1, ctas_per_sm=2)
    (a, sfa), (b, sfb, global_scale), d = _cpu_operands(m=17)
    with pytest.raises(ValueError, match="cannot take m = 17"):
        nvfp4_gemm._prepared_launch({}, heuristics.make_config(16), a, sfa, b, sfb, global_scale, d, 17, 256, 256,
                                    False)
    with pytest.raises(ValueError, match="num_splits must be in 1..K / 128 = 2"):
        nvfp4_gemm._prepared_launch({}, heuristics.make_config(32, num_splits=3), a, sfa, b, sfb, global_scale, d,
                                    17, 256, 256, False)


# ---- the kernel (GPU) ----

@pytest.mark.gpu
@pytest.mark.parametrize("n,k", DEEPSEEK_NK)
@pytest.mark.parametrize("m", [1, 16, 64, 128])
def test_matches_reference_at_decode_sizes(m, n, k):
    a, b = make_nvfp4_gemm_inputs(m, n, k)
    assert_gemm_close(_run(a, b), _reference(a, b))


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,forced", [
    (13, 1040, 1024, FORCED[0]), (20, 176, 512, FORCED[1]), (64, 7168, 2048, FORCED[2]),
    (100, 4096, 7168, FORCED[3]), (128, 2112, 1536, FORCED[3]), (1, 2112, 7168, FORCED[4]),
    (16, 4096, 7168, FORCED[4]), (30, 7168, 16384, FORCED[5]),
])
def test_forced_configs(m, n, k, forced):
    a, b = make_nvfp4_gemm_inputs(m, n, k)
    assert_gemm_close(_run(a, b, config=forced_config(*forced)), _reference(a, b))


@pytest.mark.gpu
def test_every_e4m3_scale_is_exact():
    a, b = make_nvfp4_gemm_inputs(64, 2048, 2048, scale_bytes=ALL_E4M3_SCALES)
    assert_gemm_close(_run(a, b, config=forced_config(*FORCED[2])), _reference(a, b))


@pytest.mark.gpu
def test_more_than_128_rows_run_in_slices():
    a, b = make_nvfp4_gemm_inputs(300, 2112, 1536)
    assert_gemm_close(_run(a, b), _reference(a, b))


@pytest.mark.gpu
def test_matches_the_cast_of_real_weights():
    w = torch.randn(4096, 7168, device="cuda", dtype=torch.bfloat16)
    global_scale = deep_kernels.nvfp4_global_scale(w)
    codes, scales = deep_kernels.per_token_cast_to_nvfp4(w, global_scale)
    a, _ = make_nvfp4_gemm_inputs(16, 4096, 7168)
    b = (codes, scales, global_scale)
    assert_gemm_close(_run(a, b), _reference(a, b))
    assert_gemm_close(_run(a, (codes.view(torch.uint8), scales, global_scale)), _reference(a, b))


@pytest.mark.gpu
def test_accumulates_into_fp32_in_place_and_is_deterministic():
    a, b = make_nvfp4_gemm_inputs(64, 7168, 2048)
    config = forced_config(*FORCED[2])
    c = accumulator_like(_reference(a, b))
    expected = _reference(a, b, c)
    d = poison_(torch.empty(64, 7168, device="cuda"))
    assert_gemm_close(fp4_gemm.fp8_fp4_gemm_nt_with_config(config, a, b, d, c=c), expected)
    d = c.clone()
    assert_gemm_close(fp4_gemm.fp8_fp4_gemm_nt_with_config(config, a, b, d, c=d), expected)
    first = _run(a, b, config=config)
    assert_gemm_close(first, _reference(a, b))
    assert_bitwise_equal(_run(a, b, config=config), first)


def _differing_runs(outputs: list, first: torch.Tensor) -> list:
    """Indices of the outputs whose bytes differ from first's."""
    return [i for i, out in enumerate(outputs) if not torch.equal(out.view(torch.int16), first.view(torch.int16))]


# The split and two-warpgroup picks: (M, N, K) whose heuristics' config has more than one split or math warpgroup.
REPEATED_RUN_SHAPES = [(64, 7168, 16384), (64, 4096, 7168), (16, 4096, 7168), (128, 7168, 16384)]


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", REPEATED_RUN_SHAPES)
def test_repeated_runs_are_bitwise_equal(m, n, k):
    a, b = make_nvfp4_gemm_inputs(m, n, k)
    config = nvfp4_gemm._config(m, n, k, torch.bfloat16)
    assert config.num_splits > 1 or config.num_math_warpgroups > 1
    first = _run(a, b)
    assert_gemm_close(first, _reference(a, b))
    # Back to back, each into its own poisoned output, so that consecutive launches share the workspace and tickets.
    outputs = [_run(a, b) for _ in range(200)]
    assert _differing_runs(outputs, first) == []
    # The comparison sees one element's lowest bit flipped.
    planted = outputs[7].clone()
    planted.view(torch.int16)[m - 1, n - 1] ^= 1
    assert _differing_runs(outputs[:7] + [planted], first) == [7]


@pytest.mark.gpu
def test_global_scale_on_the_host_is_refused_before_launch():
    a, (codes, scales, global_scale) = make_nvfp4_gemm_inputs(16, 256, 256)
    d = poison_(torch.empty(16, 256, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="global_scale must be a CUDA tensor"):
        deep_kernels.fp8_fp4_gemm_nt(a, (codes, scales, global_scale.cpu()), d)
    assert torch.isnan(d).all()


@pytest.mark.gpu
def test_check_rejects_planted_bugs():
    a, (codes, scales, global_scale) = make_nvfp4_gemm_inputs(64, 7168, 2048)
    expected = _reference(a, (codes, scales, global_scale))
    config = forced_config(*FORCED[2])
    # One group's scale four times too large (its exponent two up): the largest group of row 517.
    wrong = scales.view(torch.uint8).clone()
    group = int(wrong[517].argmax())
    wrong[517, group] += 16
    with pytest.raises(AssertionError, match="calc_diff"):
        assert_gemm_close(_run(a, (codes, wrong.view(torch.float8_e4m3fn), global_scale), config=config), expected)
    swapped = codes.view(torch.uint8).clone()
    swapped[100] = (swapped[100] >> 4) | (swapped[100] << 4)
    with pytest.raises(AssertionError, match="calc_diff"):
        assert_gemm_close(_run(a, (swapped, scales, global_scale), config=config), expected)
    with pytest.raises(AssertionError, match="calc_diff"):
        assert_gemm_close(_run(a, (codes, scales, global_scale * 1.01), config=config), expected)
