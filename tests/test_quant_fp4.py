"""FP4 e2m1 casts (MXFP4, NVFP4), cast-backs and the MXFP4 -> FP8 requantization: the reference's definition
(CPU), the kernels' e2m1 formulas emulated (CPU), input validation (CPU), and the kernels bit-exact against
the reference (GPU)."""

import math

import pytest
import torch

import deep_kernels
from deep_kernels.quant.common import ScaleLayout
from deep_kernels.quant.fp4 import DEFAULT_FP4_AMAX_CLAMP
from deep_kernels.reference.quant import fp4 as reference
from deep_kernels.reference.quant import pack_scales, per_token_cast_back, per_token_cast_to_fp8
from deep_kernels.testing import assert_bitwise_equal, empty_like_strided, poison_, random_activations

from conftest import FULL, csrc_source, in_turns

MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _fp32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def _probe_values() -> torch.Tensor:
    """Every e2m1 magnitude and midpoint, their FP32 neighbours, random values, specials, both signs."""
    points = torch.tensor(MAGNITUDES + (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 100.0), dtype=torch.float32)
    up = torch.nextafter(points, torch.full_like(points, math.inf))
    down = torch.nextafter(points, torch.full_like(points, -math.inf))
    generator = torch.Generator().manual_seed(0)
    uniform = torch.rand(20000, generator=generator) * 8
    specials = _fp32([math.inf, 1e-45, 1e-40, 2.0 ** -126, 3.0e38])
    values = torch.cat([points, up, down, uniform, specials]).abs()
    return torch.cat([values, -values])


def _brute_force_codes(values: torch.Tensor) -> torch.Tensor:
    """Nearest e2m1 magnitude in float64 (ties to the even code), saturating at 6, sign of the input."""
    codes = []
    for value in values.tolist():
        magnitude = min(abs(value), 6.0)
        distances = [abs(magnitude - m) for m in MAGNITUDES]
        best = min(distances)
        candidates = [code for code, d in enumerate(distances) if d == best]
        code = candidates[0] if len(candidates) == 1 else next(c for c in candidates if c % 2 == 0)
        codes.append(code + (8 if math.copysign(1.0, value) < 0 else 0))
    return torch.tensor(codes, dtype=torch.uint8)


# ---- the reference (CPU) ----

def test_reference_e2m1_rounding_matches_brute_force():
    values = _probe_values()
    assert torch.equal(reference.e2m1_codes(values, values), _brute_force_codes(values))
    nan = _fp32([math.nan, math.nan])
    signs = _fp32([1.0, -1.0])
    assert reference.e2m1_codes(nan, signs).tolist() == [0x7, 0xF]  # NaN -> 6 with the input's sign
    assert reference.e2m1_codes(_fp32([-0.0]), _fp32([-0.0])).tolist() == [0x8]


def test_kernel_e2m1_encoding_formula():
    # csrc/common/fp4.cuh's e2m1_magnitude at step 1, emulated in FP32 (the products exact, each FMA's addition
    # rounding once): 2^23 + the magnitude code is the least of RNE(2a), RNE(a) + 2 and RNE(a / 2) + 4 onto 2^23
    # (a = |v|), saturated at 2^23 + 7 (NaN too); pack_e2m1 adds each input's sign bit and packs element 2j into
    # the low nibble of byte j.
    source = csrc_source("common/fp4.cuh")
    for line in ("constexpr float kE2M1Magic = 8388608.0f;",
                 "fminf(fminf(fmaf(fabsf(x), 2.0f * step, kE2M1Magic), fmaf(fabsf(x), step, kE2M1Magic + 2.0f)),",
                 "fmaf(fabsf(x), 0.5f * step, kE2M1Magic + 4.0f));",
                 "return kSaturate ? fminf(code, kE2M1Magic + 7.0f) : code;",
                 "bytes[j] = __float_as_uint(e2m1_magnitude<kSaturate>(values[2 * j], step)) +"):
        assert line in source, line
    values = torch.cat([_probe_values(), _fp32([math.nan, -math.nan])])
    a = values.abs()
    magic = torch.full_like(values, 2.0 ** 23)
    code = torch.fmin(torch.minimum(torch.minimum(a * 2 + magic, a + (magic + 2)), a * 0.5 + (magic + 4)), magic + 7)
    codes = (code - magic).to(torch.int32) + (values.view(torch.int32) < 0).int() * 8
    assert torch.equal(codes.to(torch.uint8), reference.e2m1_codes(values, values))
    packed = codes[0::2] + codes[1::2] * 16
    assert torch.equal(packed.to(torch.uint8), reference.pack_e2m1(codes.to(torch.uint8).view(1, -1))
                       .view(torch.uint8).view(-1))


def test_kernel_e2m1_decoding_formula():
    # csrc/common/fp4.cuh e2m1_value: the magnitude bits at FP32 bits 22-24 read as e2m1 * 2^-126.
    codes = torch.arange(16, dtype=torch.int32)
    bits = ((codes & 7) << 22) | ((codes & 8) << 28)
    decoded = bits.view(torch.float32) * torch.full((16,), 2.0 ** 126)
    assert_bitwise_equal(decoded, reference.e2m1_to_float(codes.to(torch.uint8)))


def test_reference_mxfp4_known_values():
    x = torch.zeros((2, 64), dtype=torch.float32)
    x[0, :4] = _fp32([1.0, -0.7, 0.3, -0.0])  # amax 1: scale 2^ceil(log2(1 / 6)) = 2^-2, codes of x * 4
    x[1, 32:] = 3.0  # a second group of equal values: scale 2^-1, all 6
    codes, scales = reference.per_token_cast_to_mxfp4(x)
    assert codes.dtype == torch.float4_e2m1fn_x2 and codes.shape == (2, 32)
    assert scales.dtype == torch.float8_e8m0fnu and scales.view(torch.uint8).tolist() == [[125, 85], [85, 126]]
    # 4 -> code 6, -2.8 -> -3 (0xD), 1.2 -> 1 (2), -0 -> 0x8; element 2i in the low nibble
    assert codes.view(torch.uint8)[0, :2].tolist() == [0xD6, 0x82]
    assert codes.view(torch.uint8)[1, 16:].tolist() == [0x77] * 16
    # The all-zero groups: amax clamped to 1e-12, scale 2^ceil(log2(1e-12 / 6)) = 2^-42.
    packed_codes, packed = reference.per_token_cast_to_mxfp4(x, scale_layout="packed_ue8m0")
    assert_bitwise_equal(packed_codes.view(torch.uint8), codes.view(torch.uint8))
    assert packed.dtype == torch.int32 and packed.tolist() == [[125 | 85 << 8], [85 | 126 << 8]]
    y = reference.mxfp4_cast_back(codes, scales, torch.float32)
    assert y[0, :4].tolist() == [1.0, -0.75, 0.25, -0.0] and math.copysign(1, y[0, 3]) < 0
    assert torch.equal(reference.mxfp4_cast_back(packed_codes, packed, torch.float32), y)


def test_reference_nvfp4_known_values():
    x = torch.zeros((1, 32), dtype=torch.float32)
    x[0, :16] = 2.0
    x[0, 0] = 12.0
    x[0, 16:] = -1e-3
    g = reference.nvfp4_global_scale(x)
    assert g.shape == (1,) and g.dtype == torch.float32 and g[0] == _fp32(12.0) / _fp32(2688.0)
    codes, scales = reference.per_token_cast_to_nvfp4(x, g)
    block = scales.float()
    assert block[0, 0] == 448.0  # the tensor's largest block
    # 1e-3 / 6 / g = 0.03733 rounds to e4m3 0.0390625 (2^-5 * 1.25; the midpoint below is 0.03711)
    assert block[0, 1] == _fp32(0.0390625)
    assert codes.view(torch.uint8)[0, 0] == 0x27  # 12 -> 6 (7), 2 -> 1 (2)
    assert codes.view(torch.uint8)[0, 8:].tolist() == [0xFF] * 8  # -1e-3 / (block * g) = -5.73 -> -6
    y = reference.nvfp4_cast_back(codes, scales, g, out_dtype=torch.float32)
    assert y[0, 0] == _fp32(6.0) * (_fp32(448.0) * g[0])


def test_reference_nvfp4_scale_floor_and_saturation():
    x = torch.full((1, 32), 1.0, dtype=torch.float32)
    x[0, 16:] = 1e-30
    g = _fp32([1.0 / 2688])
    codes, scales = reference.per_token_cast_to_nvfp4(x, g, amax_clamp=1e-37)
    # 1e-30 / 6 / g is far below e4m3's range: the block scale floors at 2^-9 (byte 0x01), codes round to 0.
    assert scales.view(torch.uint8)[0].tolist() == [0x7E, 0x01]  # 1 / 6 / (1 / 2688) = 448
    assert codes.view(torch.uint8)[0].tolist() == [0x77] * 8 + [0] * 8
    tiny_g = _fp32([1e-30])
    codes, scales = reference.per_token_cast_to_nvfp4(x, tiny_g)
    assert scales.view(torch.uint8)[0, 0] == 0x7E  # 1 / 6 / 1e-30 saturates to 448
    assert codes.view(torch.uint8)[0, 0] == 0x77  # and the codes to 6


def test_reference_nan_and_inf():
    x = torch.ones((3, 32), dtype=torch.float32)
    x[0, 1] = math.nan
    x[0, 2] = -2.0
    x[1, 3] = -math.inf
    x[2, 5] = math.inf
    codes, scales = reference.per_token_cast_to_mxfp4(x)
    nibbles = reference.unpack_e2m1(codes)
    assert scales.view(torch.uint8)[:, 0].tolist() == [0xFF, 0xFF, 0xFF]
    assert nibbles[0, 0] == 0x7 and nibbles[0, 2] == 0xF and nibbles[0, 1] == 0x7  # NaN group: +-6
    assert nibbles[1, 3] == 0xF and nibbles[1, 0] == 0x0 and nibbles[2, 5] == 0x7  # inf: +-6, finite +0
    assert reference.mxfp4_cast_back(codes, scales, torch.float32).isnan().all()
    g = _fp32([1.0])
    codes, scales = reference.per_token_cast_to_nvfp4(x, g)
    nibbles = reference.unpack_e2m1(codes)
    assert scales.view(torch.uint8)[:, 0].tolist() == [0x7F, 0x7E, 0x7E]  # NaN; inf saturates to 448
    assert nibbles[0, :3].tolist() == [0x7, 0x7, 0xF] and nibbles[1, 3] == 0xF and nibbles[1, 0] == 0x0
    y = reference.nvfp4_cast_back(codes, scales, g, out_dtype=torch.float32)
    assert y[0, :16].isnan().all() and not y[0, 16:].isnan().any()  # the NaN's block only
    assert y[1, 3] == -6.0 * 448.0 and not y[1:].isnan().any()


@pytest.mark.parametrize("fmt", ["mx", "nv"])
@pytest.mark.parametrize("scale_mode", ["mul", "div"])
def test_reference_rounding_is_unbiased(fmt, scale_mode):
    x = _cell_uniform(64, 4096, device="cpu", seed=5)
    _check_unbiased(x, _round_trip(reference, fmt, x, scale_mode))


def _cell_uniform(m: int, k: int, device="cuda", seed=None) -> torch.Tensor:
    """Values uniform in (-6, 6) * 2^r (r in [-8, 0] per row) with every 16th one 6 * 2^r: each group's scale is
    2^r exactly (MXFP4; NVFP4 with _UNIT_GLOBAL), so the scaled values fill e2m1's cells uniformly and
    unbiased rounding sends half of the inexact ones down."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    x = torch.rand((m, k), generator=generator, device=device) * 12 - 6
    x[:, ::16] = 6.0
    return x * torch.exp2(torch.randint(-8, 1, (m, 1), generator=generator, device=device).float())


_UNIT_GLOBAL = 2.0 ** -8  # block scale 2^(r + 8) <= 256, exact in e4m3


def _round_trip(module, fmt: str, x: torch.Tensor, scale_mode: str = "mul") -> torch.Tensor:
    if fmt == "mx":
        codes, scales = module.per_token_cast_to_mxfp4(x, scale_mode=scale_mode)
        return module.mxfp4_cast_back(codes, scales, torch.float32)
    g = torch.full((1,), _UNIT_GLOBAL, device=x.device)
    codes, scales = module.per_token_cast_to_nvfp4(x, g, scale_mode=scale_mode)
    return module.nvfp4_cast_back(codes, scales, g, out_dtype=torch.float32)


def _check_unbiased(x: torch.Tensor, y: torch.Tensor) -> None:
    """Among inexact values, the share rounded down is 0.5 +- 10 / sqrt(n)."""
    x, y = x.float().flatten(), y.float().flatten()
    inexact = y != x
    below = (y[inexact].abs() < x[inexact].abs()).double()
    n = below.numel()
    assert n > 0.9 * x.numel()
    assert abs(float(below.mean()) - 0.5) <= 10 / math.sqrt(n), float(below.mean())


def test_reference_round_trip_error_bound():
    x = random_activations(33, 512, torch.float32, device="cpu", seed=1)
    y = _round_trip(reference, "mx", x)
    group_amax = x.abs().view(33, 16, 32).amax(dim=2, keepdim=True)
    # One e2m1 step: a quarter of the magnitude above 2 (relative to the power-of-two scale), 0.25 scale below.
    scale = torch.exp2(torch.ceil(torch.log2(group_amax / 6)))
    bound = torch.maximum(x.abs().view(33, 16, 32) * 0.25, scale * 0.25)
    assert ((y - x).abs().view(33, 16, 32) <= bound).all()


def test_swizzle_layout_offsets():
    m, g = 130, 6
    scales = torch.arange(m * g, dtype=torch.int32).remainder(251).add(1).to(torch.uint8).view(m, g)
    swizzled = reference.swizzle_128x4(scales)
    assert swizzled.shape == (256, 8) and swizzled.is_contiguous()
    flat = swizzled.flatten()
    for row in range(256):
        for group in range(8):
            tile = (row // 128) * 2 + group // 4
            offset = tile * 512 + (row % 32) * 16 + (row % 128 // 32) * 4 + group % 4
            expected = int(scales[row, group]) if row < m and group < g else 0
            assert int(flat[offset]) == expected, (row, group)
    assert torch.equal(reference.unswizzle_128x4(swizzled, m, g), scales)


def _random_mxfp4(m: int, k: int, low: int, high: int, device="cuda", seed=None):
    """Random codes (every byte) and UE8M0 exponents in [low, high]."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    codes = torch.randint(0, 256, (m, k // 2), generator=generator, device=device, dtype=torch.int32)
    exponents = torch.randint(low, high + 1, (m, k // 32), generator=generator, device=device, dtype=torch.int32)
    return codes.to(torch.uint8).view(torch.float4_e2m1fn_x2), exponents.to(torch.uint8).view(torch.float8_e8m0fnu)


@pytest.mark.parametrize("layout", ["mn_major", "row_major", "packed_ue8m0"])
def test_reference_requant_is_exact_within_2_pow_14(layout):
    codes, scales = _random_mxfp4(9, 512, 120, 134, device="cpu", seed=0)  # scales within 2^14 of each other
    q, fp8_scales = reference.mxfp4_requant_to_fp8(codes, scales, scale_layout=layout)
    values = reference.mxfp4_cast_back(codes, scales, torch.float32)
    assert torch.equal(per_token_cast_back(q, fp8_scales, 128, torch.float32), values)
    # Wider spreads round the smallest groups' codes to e4m3's subnormal steps.
    codes, scales = _random_mxfp4(9, 512, 100, 140, device="cpu", seed=0)
    q, fp8_scales = reference.mxfp4_requant_to_fp8(codes, scales, scale_layout=layout)
    values = reference.mxfp4_cast_back(codes, scales, torch.float32)
    assert not torch.equal(per_token_cast_back(q, fp8_scales, 128, torch.float32), values)


def test_reference_requant_is_the_fp8_cast_of_the_cast_back():
    codes, scales = _random_mxfp4(5, 256, 0, 255, device="cpu", seed=0)  # every exponent, NaN (0xFF) included
    q, fp8_scales = reference.mxfp4_requant_to_fp8(codes, scales, scale_layout="row_major")
    values = reference.mxfp4_cast_back(codes, scales, torch.float32)
    q_ref, scales_ref = per_token_cast_to_fp8(values, 128, ue8m0=True, scale_layout="row_major")
    assert_bitwise_equal(q, q_ref, "q")
    assert_bitwise_equal(fp8_scales, scales_ref, "scales")


# ---- validation (CPU tensors: every check that precedes the device check) ----

BF16 = torch.bfloat16


@pytest.mark.parametrize("x,kwargs,error,match", [
    (torch.ones(4, 64, dtype=torch.float16), {}, TypeError, "x must be"),
    (torch.ones(64, dtype=BF16), {}, ValueError, "x must be 2-D"),
    (torch.ones(4, 48, dtype=BF16), {}, ValueError, "multiple of 32"),
    (torch.ones(64, 4, dtype=BF16).t(), {}, ValueError, "contiguous last dimension"),
    (torch.ones(4, 68, dtype=BF16)[:, :64], {}, ValueError, "16-byte aligned"),
    (torch.ones(4, 64, dtype=BF16), {"scale_layout": "swizzled"}, ValueError, "scale_layout must be one of"),
    (torch.ones(4, 64, dtype=BF16), {"scale_mode": "exact"}, ValueError, "scale_mode must be one of"),
    (torch.ones(4, 64, dtype=BF16), {"amax_clamp": 0.0}, ValueError, "amax_clamp"),
    (torch.ones(4, 64, dtype=BF16), {"amax_clamp": 1e-40}, ValueError, "at least 1e-37"),
    (torch.ones(4, 64, dtype=BF16), {}, ValueError, "must be a CUDA tensor"),
    ("not a tensor", {}, TypeError, "torch.Tensor"),
])
def test_mxfp4_cast_rejects_bad_input(x, kwargs, error, match):
    with pytest.raises(error, match=match):
        deep_kernels.per_token_cast_to_mxfp4(x, **kwargs)


GLOBAL = torch.ones(1)


@pytest.mark.parametrize("x,g,kwargs,error,match", [
    (torch.ones(4, 64, dtype=torch.int32), GLOBAL, {}, TypeError, "x must be"),
    (torch.ones(4, 40, dtype=BF16), GLOBAL, {}, ValueError, "multiple of 16"),
    (torch.ones(4, 64, dtype=BF16), GLOBAL, {"scale_layout": "packed_ue8m0"}, ValueError, "scale_layout must be"),
    (torch.ones(4, 64, dtype=BF16), GLOBAL, {"amax_clamp": math.inf}, ValueError, "amax_clamp"),
    (torch.ones(4, 64, dtype=BF16), GLOBAL.double(), {}, TypeError, "global_scale must be torch.float32"),
    (torch.ones(4, 64, dtype=BF16), torch.ones(2), {}, ValueError, "global_scale must hold one element"),
    (torch.ones(4, 64, dtype=BF16), 1.0, {}, TypeError, "global_scale must be a torch.Tensor"),
    (torch.ones(4, 64, dtype=BF16), GLOBAL, {}, ValueError, "x must be a CUDA tensor"),
])
def test_nvfp4_cast_rejects_bad_input(x, g, kwargs, error, match):
    with pytest.raises(error, match=match):
        deep_kernels.per_token_cast_to_nvfp4(x, g, **kwargs)


def test_cast_backs_and_requant_reject_bad_input():
    codes = torch.zeros(4, 64, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    mx_scales = torch.zeros(4, 4, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    nv_scales = torch.zeros(4, 8, dtype=torch.float8_e4m3fn)
    with pytest.raises(TypeError, match="codes must be"):
        deep_kernels.mxfp4_cast_back(codes.view(torch.int8), mx_scales)
    with pytest.raises(ValueError, match="codes must be contiguous"):
        deep_kernels.mxfp4_cast_back(torch.zeros(4, 128, dtype=torch.uint8)[:, ::2], mx_scales)
    with pytest.raises(ValueError, match="multiple of 32"):
        deep_kernels.mxfp4_cast_back(codes[:, :8].contiguous(), mx_scales)
    with pytest.raises(TypeError, match="scales must be"):
        deep_kernels.mxfp4_cast_back(codes, nv_scales)
    with pytest.raises(ValueError, match="scales must be a contiguous tensor of shape \\(4, 4\\)"):
        deep_kernels.mxfp4_cast_back(codes, mx_scales[:, :2])
    with pytest.raises(ValueError, match="scales must have shape"):
        deep_kernels.mxfp4_cast_back(codes, torch.zeros(4, 2, dtype=torch.int32))
    with pytest.raises(TypeError, match="out_dtype"):
        deep_kernels.mxfp4_cast_back(codes, mx_scales, out_dtype=torch.float16)
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        deep_kernels.mxfp4_cast_back(codes, mx_scales)
    with pytest.raises(ValueError, match="scale_layout must be one of"):
        deep_kernels.nvfp4_cast_back(codes, nv_scales, GLOBAL, scale_layout="packed_ue8m0")
    with pytest.raises(ValueError, match="scales must be a contiguous tensor of shape \\(128, 8\\)"):
        deep_kernels.nvfp4_cast_back(codes, nv_scales, GLOBAL, scale_layout="swizzled")
    with pytest.raises(ValueError, match="global_scale must hold one element"):
        deep_kernels.nvfp4_cast_back(codes, nv_scales, torch.ones(3))
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        deep_kernels.nvfp4_cast_back(codes, nv_scales, GLOBAL)
    with pytest.raises(ValueError, match="multiple of 128"):
        deep_kernels.mxfp4_requant_to_fp8(torch.zeros(4, 32, dtype=torch.uint8), mx_scales[:, :2].contiguous())
    wide_codes = torch.zeros(4, 128, dtype=torch.uint8)
    wide_scales = torch.zeros(4, 8, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    with pytest.raises(ValueError, match="scale_layout must be one of"):
        deep_kernels.mxfp4_requant_to_fp8(wide_codes, wide_scales, scale_layout="swizzled")
    with pytest.raises(ValueError, match="amax_clamp"):
        deep_kernels.mxfp4_requant_to_fp8(wide_codes, wide_scales, amax_clamp=-1.0)
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        deep_kernels.mxfp4_requant_to_fp8(wide_codes, wide_scales)
    with pytest.raises(ValueError, match="at least 1e-37"):
        deep_kernels.nvfp4_global_scale(torch.ones(4), amax_clamp=1e-38)


def _nv_block_bytes(amax, global_scale):
    """csrc/common/fp4.cuh's NVFP4 block byte, step for step (divide_by_scale and ScaleDivisor as replayed by
    tests/test_quant.py)."""
    import numpy as np
    from test_quant import _divide_by_scale, _e4m3_codes

    with np.errstate(all="ignore"):
        unit = np.where(np.isinf(amax), amax, _divide_by_scale(amax, np.full_like(amax, 6.0)))
        below_1024 = ~(unit >= np.float32(1024) * np.abs(global_scale))
        quotient = np.where(below_1024 | np.isinf(global_scale), _divide_by_scale(unit, global_scale),
                            np.copysign(np.float32(np.inf), global_scale)).astype(np.float32)
        block = np.where(np.isnan(quotient), quotient, np.maximum(quotient, np.float32(2.0 ** -9)))
    return _e4m3_codes(block)


def test_nvfp4_block_scale_steps_match_ieee_divisions():
    import numpy as np
    from test_quant import _e4m3_codes

    rng = np.random.default_rng(5)
    # amax from the smallest clamp to FLT_MAX (log-uniform, and next to e4m3 midpoints times 6 * g), inf and NaN,
    # over global scales small, ordinary, huge (either prescale), zero, infinite, NaN and negative.
    finite = np.exp2(rng.uniform(np.log2(1e-37), 128, 20000)).astype(np.float32)
    specials = np.float32([1e-37, 3e38, np.finfo(np.float32).max, 1.0, 6.0, np.inf, np.nan])
    for g in np.float32([1e-30, 1e-20, 2.0 ** -92, 1e-3, 1.0, 1e30, 3e30, 2.0 ** 100, 3e38, 1e-40, 0.0, -0.0,
                         np.inf, np.nan, -2.0]):
        codes = torch.arange(1, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).double().numpy()
        midpoints = (codes[:-1] + codes[1:]) / 2 * 6 * np.float64(g)
        near = (midpoints[rng.integers(0, midpoints.size, 4000)] * (1 + rng.integers(-8, 9, 4000) * 2.0 ** -24))
        with np.errstate(all="ignore"):
            near = near.astype(np.float32)
        amax = np.concatenate([finite, specials, near[np.isfinite(near) & (near >= 1e-37)]])
        with np.errstate(all="ignore"):
            exact = ((amax / np.float32(6)).astype(np.float32) / g).astype(np.float32)
            exact = np.where(np.isnan(exact), exact, np.maximum(exact, np.float32(2.0 ** -9)))
        assert torch.equal(_nv_block_bytes(amax, np.full_like(amax, g)), _e4m3_codes(exact)), g


def test_global_scale():
    x = random_activations(8, 64, torch.bfloat16, device="cpu", seed=7)
    x[3, 5] = -1000.0
    g = deep_kernels.nvfp4_global_scale(x)
    assert g.shape == (1,) and g.dtype == torch.float32 and g.tolist() == [(_fp32(1000.0) / _fp32(2688.0)).item()]
    empty = deep_kernels.nvfp4_global_scale(torch.empty(0, 64))
    assert empty.tolist() == [(_fp32(DEFAULT_FP4_AMAX_CLAMP) / _fp32(2688.0)).item()]
    x[0, 0] = math.nan
    assert deep_kernels.nvfp4_global_scale(x).isnan().all()


# ---- kernels against the reference (GPU) ----

def _special_rows(x: torch.Tensor) -> torch.Tensor:
    """Rows of all-equal values, zeros, huge and tiny magnitudes, subnormals, +-inf, NaN and -0 among random
    rows (each special in its own row, so the other rows stay finite)."""
    x = x.clone()
    big = 3e38
    subnormal = 1e-40 if x.dtype == torch.float32 else 1e-39
    m = x.shape[0]
    specials = [1.5, 0.0, -3.0e-30, big, -big, subnormal]
    if m > 7 * len(specials):  # distinct rows, random ones left over (a few rows stay random)
        for i, value in enumerate(specials):
            x[i * 7] = value
    if m > 50:
        x[41, 5] = math.inf
        x[43, 17] = -math.inf
        x[45, 3] = math.nan
        x[47, :] = -0.0
        x[49, ::3] = subnormal
    return x


def _check_fp4_cast(op: str, x: torch.Tensor, *args, **kwargs) -> None:
    """The cast `op` writes its reference's bytes into poisoned out= tensors and into ones it allocates."""
    codes_ref, scales_ref = getattr(reference, op)(x, *args, **kwargs)
    out = (poison_(empty_like_strided(codes_ref)), poison_(empty_like_strided(scales_ref)))
    codes, scales = getattr(deep_kernels, op)(x, *args, out=out, **kwargs)
    assert codes is out[0] and scales is out[1]
    assert_bitwise_equal(codes, codes_ref, "codes")
    assert_bitwise_equal(scales, scales_ref, "scales")
    again = getattr(deep_kernels, op)(x, *args, **kwargs)
    assert_bitwise_equal(again[0], codes_ref, "codes")
    assert_bitwise_equal(again[1], scales_ref, "scales")


MX_SHAPES = [(1, 32), (4001, 7168), (64, 1536), (33, 160), (7, 7168)] + ([(8001, 4096), (3, 96)] if FULL else [])
NV_SHAPES = [(1, 16), (4001, 7168), (129, 208), (33, 176), (7, 7168)] + ([(8001, 4096), (300, 48)] if FULL else [])
DTYPES = (torch.bfloat16, torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,dtype,layout",
                         in_turns([(d, layout) for layout in ("row_major", "packed_ue8m0") for d in DTYPES], MX_SHAPES))
def test_mxfp4_cast_matches_reference(m, k, dtype, layout):
    x = _special_rows(random_activations(m, k, dtype))
    _check_fp4_cast("per_token_cast_to_mxfp4", x, scale_layout=layout)


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,dtype,layout,scale_mode", in_turns(
    [(d, *v) for v in (("row_major", "mul"), ("swizzled", "mul"), ("row_major", "div")) for d in DTYPES], NV_SHAPES))
def test_nvfp4_cast_matches_reference(m, k, dtype, layout, scale_mode):
    x = random_activations(m, k, dtype)
    g = reference.nvfp4_global_scale(x)  # of the finite values, so specials below saturate
    _check_fp4_cast("per_token_cast_to_nvfp4", _special_rows(x), g, scale_layout=layout, scale_mode=scale_mode)


@pytest.mark.gpu
@pytest.mark.parametrize("g", [1e-30, 1.0, 1e30, 3e30, 0.0, math.inf])  # prescaled up, direct, scaled down, specials
def test_nvfp4_cast_extreme_global_scales(g):
    x = _special_rows(random_activations(300, 512, torch.float32))
    _check_fp4_cast("per_token_cast_to_nvfp4", x, torch.full((1,), g, device="cuda"), scale_layout="swizzled")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fp4_casts_row_stride(dtype):
    x = random_activations(301, 1024 + 64, dtype)[:, :1024]  # row stride larger than K
    _check_fp4_cast("per_token_cast_to_mxfp4", x, scale_layout="packed_ue8m0")
    _check_fp4_cast("per_token_cast_to_nvfp4", x, reference.nvfp4_global_scale(x), scale_layout="swizzled")


def _random_nvfp4(m: int, k: int):
    codes = torch.randint(0, 256, (m, k // 2), device="cuda", dtype=torch.int32).to(torch.uint8)
    scales = torch.randint(0, 0x7F, (m, k // 16), device="cuda", dtype=torch.int32).to(torch.uint8)  # NaN-free
    scales[0, 0] = 0x7F
    return codes.view(torch.float4_e2m1fn_x2), scales.view(torch.float8_e4m3fn)


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,out_dtype,packed", in_turns([(d, p) for p in (False, True) for d in DTYPES], MX_SHAPES))
def test_mxfp4_cast_back_matches_reference(m, k, out_dtype, packed):
    codes, scales = _random_mxfp4(m, k, 0, 255)  # every code and exponent, 0xFF (NaN) included
    if packed:
        scales = pack_scales(reference.e8m0_to_float(scales), ScaleLayout.packed_ue8m0)
    out = poison_(torch.empty((m, k), dtype=out_dtype, device="cuda"))
    y = deep_kernels.mxfp4_cast_back(codes, scales, out_dtype, out=out)
    assert y is out
    assert_bitwise_equal(y, reference.mxfp4_cast_back(codes, scales, out_dtype), "y")


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,out_dtype,layout",
                         in_turns([(d, layout) for layout in ("row_major", "swizzled") for d in DTYPES], NV_SHAPES))
def test_nvfp4_cast_back_matches_reference(m, k, out_dtype, layout):
    codes, scales = _random_nvfp4(m, k)
    if layout == "swizzled":
        scales = reference.swizzle_128x4(scales)
    g = torch.full((1,), 0.37, device="cuda")
    y = deep_kernels.nvfp4_cast_back(codes, scales, g, layout, out_dtype, out=poison_(torch.empty(
        (m, k), dtype=out_dtype, device="cuda")))
    assert_bitwise_equal(y, reference.nvfp4_cast_back(codes, scales, g, layout, out_dtype), "y")


REQUANT_SHAPES = [(1, 128), (7, 7168), (129, 1536), (4001, 7168)] + ([(8001, 4096)] if FULL else [])


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,packed_in,layout,low,high", in_turns(
    [(packed_in, layout, *((120, 134) if (i + packed_in) % 2 else (0, 255)))
     for i, layout in enumerate(("mn_major", "row_major", "packed_ue8m0")) for packed_in in (False, True)],
    REQUANT_SHAPES))
def test_requant_matches_reference(m, k, packed_in, layout, low, high):
    codes, scales = _random_mxfp4(m, k, low, high)
    if packed_in:
        scales = pack_scales(reference.e8m0_to_float(scales), ScaleLayout.packed_ue8m0)
    q_ref, scales_ref = reference.mxfp4_requant_to_fp8(codes, scales, scale_layout=layout)
    out = (poison_(empty_like_strided(q_ref)), poison_(empty_like_strided(scales_ref)))
    q, fp8_scales = deep_kernels.mxfp4_requant_to_fp8(codes, scales, scale_layout=layout, out=out)
    assert_bitwise_equal(q, q_ref, "q")
    assert_bitwise_equal(fp8_scales, scales_ref, "scales")
    if low == 120:  # within 2^14: exact
        values = reference.mxfp4_cast_back(codes, scales, torch.float32)
        assert torch.equal(per_token_cast_back(q, fp8_scales, 128, torch.float32), values)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["mx", "nv"])
def test_kernel_rounding_is_unbiased(fmt):
    x = _cell_uniform(512, 4096)
    _check_unbiased(x, _round_trip(deep_kernels, fmt, x))


@pytest.mark.gpu
def test_empty_input():
    x = torch.empty((0, 7168), dtype=torch.bfloat16, device="cuda")
    codes, scales = deep_kernels.per_token_cast_to_mxfp4(x)
    assert codes.shape == (0, 3584) and codes.dtype == torch.float4_e2m1fn_x2 and scales.shape == (0, 224)
    assert deep_kernels.mxfp4_cast_back(codes, scales).shape == (0, 7168)
    q, fp8_scales = deep_kernels.mxfp4_requant_to_fp8(codes, scales)
    assert q.shape == (0, 7168) and fp8_scales.shape == (0, 56)
    g = torch.ones(1, device="cuda")
    codes, scales = deep_kernels.per_token_cast_to_nvfp4(x, g, scale_layout="swizzled")
    assert scales.shape == (0, 448)
    assert deep_kernels.nvfp4_cast_back(codes, scales, g, "swizzled").shape == (0, 7168)


@pytest.mark.gpu
def test_deterministic_and_graph_capturable():
    x = random_activations(1000, 4096, torch.bfloat16)
    g = reference.nvfp4_global_scale(x)
    first = deep_kernels.per_token_cast_to_nvfp4(x, g, scale_layout="swizzled")
    expected = reference.per_token_cast_to_nvfp4(x, g, scale_layout="swizzled")
    assert_bitwise_equal(first[0], expected[0], "codes")
    assert_bitwise_equal(first[1], expected[1], "scales")
    out = (empty_like_strided(first[0]), empty_like_strided(first[1]))
    y = torch.empty((1000, 4096), dtype=torch.bfloat16, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        deep_kernels.per_token_cast_to_nvfp4(x, g, scale_layout="swizzled", out=out)
        deep_kernels.nvfp4_cast_back(out[0], out[1], g, "swizzled", out=y)
    for replay in range(3):
        if replay == 2:  # new inputs and a new global scale, read on the device
            x.copy_(random_activations(1000, 4096, torch.bfloat16))
            g.copy_(reference.nvfp4_global_scale(x))
            first = reference.per_token_cast_to_nvfp4(x, g, scale_layout="swizzled")
        poison_(out[0])
        poison_(out[1])
        poison_(y)
        graph.replay()
        torch.cuda.synchronize()
        assert_bitwise_equal(out[0], first[0], "codes")
        assert_bitwise_equal(out[1], first[1], "scales")
        assert_bitwise_equal(y, reference.nvfp4_cast_back(first[0], first[1], g, "swizzled"), "y")


@pytest.mark.gpu
def test_mismatched_devices_and_bad_out_are_rejected():
    x = random_activations(8, 256, torch.bfloat16)
    codes, scales = deep_kernels.per_token_cast_to_mxfp4(x)
    with pytest.raises(ValueError, match="out\\[0\\] must be a contiguous tensor of shape"):
        deep_kernels.per_token_cast_to_mxfp4(x, out=(codes[:4], scales))
    with pytest.raises(ValueError, match="out\\[1\\] must have shape"):
        deep_kernels.per_token_cast_to_mxfp4(x, scale_layout="packed_ue8m0", out=(codes, scales.view(torch.uint8)
                                                                                  .view(torch.int32)))
    with pytest.raises(ValueError, match="scales must be a CUDA tensor"):
        deep_kernels.mxfp4_cast_back(codes, scales.cpu())
    with pytest.raises(ValueError, match="global_scale must be a CUDA tensor"):
        deep_kernels.per_token_cast_to_nvfp4(x, torch.ones(1))


def test_benchmark_cases_build_on_cpu():
    from deep_kernels.benchmarks import quant_fp4

    rows = quant_fp4.cases(4, 64, device="cpu")
    assert [row[0] for row in rows] == ["per_token_cast_to_mxfp4", "mxfp4_cast_back", "per_token_cast_to_nvfp4",
                                        "nvfp4_cast_back"]
    for _, _, _, _, peer, num_bytes in rows:
        assert peer() is not None and num_bytes > 4 * 64 * 2
