"""Per-token-group and per-block FP8 casts and the cast-back: the reference's definition (CPU), input
validation (CPU), and the kernels bit-exact against the reference (GPU)."""

import functools
import math

import pytest
import torch

import deep_kernels
from deep_kernels.quant import BLOCK_SIZES, supported_group_sizes
from deep_kernels.reference import quant as reference
from deep_kernels.testing import (
    assert_bitwise_equal, empty_like_strided, poison_, poison_cached_memory, random_activations,
)

from conftest import FULL, csrc_source, in_turns

LAYOUTS = [(False, "mn_major"), (False, "row_major"), (True, "mn_major"), (True, "row_major"), (True, "packed_ue8m0")]


# ---- the reference (CPU) ----

def test_reference_known_values():
    x = torch.ones((2, 256), dtype=torch.bfloat16)
    x[1, 128:] = 0
    q, scales = reference.per_token_cast_to_fp8(x, 128, scale_layout="row_major")
    assert q.view(torch.uint8)[0].tolist() == [0x7E] * 256  # 1 * 448 / 1 = 448, e4m3's largest finite
    assert q.view(torch.uint8)[1, 128:].tolist() == [0] * 128
    fp32 = lambda v: torch.tensor(v, dtype=torch.float32)
    assert torch.equal(scales[0], torch.full((2,), 1 / 448, dtype=torch.float32))
    assert torch.equal(scales[1, 1], fp32(1e-4) / fp32(448.0))  # the clamped amax

    q, scales = reference.per_token_cast_to_fp8(x[:1], 128, ue8m0=True, scale_layout="packed_ue8m0")
    assert scales.tolist() == [[0x7777]]  # 2^-8 = ceil_pow2(1/448): exponent 119 = 0x77 twice, unused bytes 0
    assert q.view(torch.uint8)[0].tolist() == [0x78] * 256  # 1 * 2^8 = 256


def test_ceil_to_power_of_two_is_exact_at_boundaries():
    exact = torch.tensor([2.0 ** -20, 0.5, 1.0, 2.0 ** 20], dtype=torch.float32)
    above = torch.nextafter(exact, torch.full_like(exact, math.inf))
    assert torch.equal(reference.ceil_to_power_of_two(exact), exact)
    assert torch.equal(reference.ceil_to_power_of_two(above), exact * 2)
    special = torch.tensor([math.inf, math.nan], dtype=torch.float32)
    result = reference.ceil_to_power_of_two(special)
    assert result[0] == math.inf and math.isnan(result[1])


@pytest.mark.parametrize("format_max", [448.0, 65024.0])
def test_ue8m0_scale_in_integer_ops_is_the_divisions(format_max):
    # common/quant.cuh's GroupScaler with UE8M0 scales, mirrored: against ceil_to_power_of_two(amax / format_max)
    # and its reciprocal for every significand of the subnormals and of the exponents around where the quotient
    # turns subnormal, turns zero, at -1, 0, 1 and at the top of the range; inf and NaN.
    significands = torch.arange(1 << 23, dtype=torch.int64)
    borrow = _float_bits(format_max) - (128 << 23) + 1
    fmax = torch.tensor(format_max)
    branches = set()
    for biased_exponent in (0, 1, 9, 10, 16, 17, 127, 253, 254):
        bits = (biased_exponent << 23) | significands
        amax = _bits_float(bits)
        scale = reference.ceil_to_power_of_two(amax / fmax)
        scale_bits = (bits - borrow) & 0x7F800000
        normal = amax >= fmax * 2.0 ** -126
        nonzero = amax > fmax * 2.0 ** -126 * 2.0 ** -24
        mirrored = torch.where(normal, _bits_float(scale_bits), torch.where(nonzero, 2.0 ** -126, 0.0))
        multiplier = torch.where(normal, _bits_float(0x7F000000 - scale_bits),
                                 torch.where(nonzero, 2.0 ** 126, math.inf))
        assert torch.equal(mirrored, scale), biased_exponent
        assert torch.equal(multiplier, torch.ones_like(scale) / scale), biased_exponent
        branches |= {"zero"} if (~nonzero).any() else set()
        branches |= {"subnormal"} if (nonzero & ~normal).any() else set()
        branches |= {"normal"} if normal.any() else set()
    assert branches == {"zero", "subnormal", "normal"}
    special = torch.tensor([math.inf, math.nan])
    scale = reference.ceil_to_power_of_two(special / fmax)
    assert scale[0] == math.inf and (1 / scale[0]) == 0 and scale[1].isnan() and (1 / scale[1]).isnan()


def _float_bits(value) -> int:
    return torch.tensor([value], dtype=torch.float32).view(torch.int32).item()


def _bits_float(bits: torch.Tensor) -> torch.Tensor:
    return bits.to(torch.int32).view(torch.float32)


@pytest.mark.parametrize("ue8m0,layout", LAYOUTS)
def test_reference_round_trip_error_bound(ue8m0, layout):
    x = random_activations(33, 512, torch.float32, device="cpu", seed=1)
    q, scales = reference.per_token_cast_to_fp8(x, 128, ue8m0=ue8m0, scale_layout=layout)
    y = reference.per_token_cast_back(q, scales, 128, torch.float32)
    group_amax = x.abs().view(33, 4, 128).amax(dim=2, keepdim=True)
    # e4m3 keeps 3 mantissa bits: a relative step of 2^-4 of the value; subnormals 2^-9 of the scale.
    bound = torch.maximum(x.abs().view(33, 4, 128) * 2.0 ** -4, group_amax * 2.0 ** -9 * (2 if ue8m0 else 1))
    assert ((y - x).abs().view(33, 4, 128) <= bound).all()


def test_reference_layouts_agree():
    x = random_activations(9, 640, torch.bfloat16, device="cpu", seed=2)
    q_row, row_major = reference.per_token_cast_to_fp8(x, 128, ue8m0=True, scale_layout="row_major")
    for layout in ("mn_major", "packed_ue8m0"):
        q, scales = reference.per_token_cast_to_fp8(x, 128, ue8m0=True, scale_layout=layout)
        assert_bitwise_equal(q, q_row)
        assert torch.equal(reference.unpack_scales(scales, 9, 5), row_major)
    _, mn_major = reference.per_token_cast_to_fp8(x, 128, ue8m0=True)
    assert mn_major.stride() == (1, 12)  # 9 rows padded to 12: whole 16-byte TMA units


def test_reference_scale_modes():
    # amax 1.42...: x * fl(448 / amax) and x / fl(amax / 448) land on opposite sides of e4m3's midpoint
    # between 1 and 1.125, so the modes pick neighbouring codes (found by search; both FP32 exact here).
    x = torch.full((1, 128), 0.5, dtype=torch.float32)
    x[0, 0], x[0, 1] = 1.4203048944473267, 0.0033684687223285437
    q_mul, scales_mul = reference.per_token_cast_to_fp8(x, scale_layout="row_major")
    q_div, scales_div = reference.per_token_cast_to_fp8(x, scale_layout="row_major", scale_mode="div")
    assert torch.equal(scales_mul, scales_div)
    assert q_mul.view(torch.uint8)[0, :2].tolist() == [0x7E, 0x38]  # 448, 1.0
    assert q_div.view(torch.uint8)[0, :2].tolist() == [0x7E, 0x39]  # 448, 1.125
    # With power-of-two scales the modes agree bit for bit (the kernels serve both with one).
    y = random_activations(16, 1024, torch.float32, device="cpu", seed=3)
    for cast in (reference.per_token_cast_to_fp8, reference.per_block_cast_to_fp8):
        assert_bitwise_equal(cast(y, ue8m0=True)[0], cast(y, ue8m0=True, scale_mode="div")[0])


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("ue8m0,scale_mode", [(False, "mul"), (True, "mul"), (False, "div")])
def test_reference_per_block_is_per_token_over_flattened_blocks(block_size, ue8m0, scale_mode):
    # A block is a group of block_size^2 values; rows past M are zeros.
    m, k = 2 * block_size + 3, 3 * block_size
    x = random_activations(m, k, torch.bfloat16, device="cpu", seed=4)
    q, scales = reference.per_block_cast_to_fp8(x, block_size, ue8m0=ue8m0, scale_mode=scale_mode)
    assert q.shape == (m, k) and q.is_contiguous() and scales.shape == (3, 3) and scales.is_contiguous()
    padded = torch.zeros((3 * block_size, k), dtype=torch.bfloat16)
    padded[:m] = x
    flattened = padded.view(3, block_size, 3, block_size).transpose(1, 2).reshape(9, block_size ** 2)
    q_flat, scales_flat = reference.per_token_cast_to_fp8(flattened, block_size ** 2, ue8m0=ue8m0,
                                                          scale_layout="row_major", scale_mode=scale_mode)
    unflattened = q_flat.view(3, 3, block_size, block_size).transpose(1, 2).reshape(3 * block_size, k)
    assert_bitwise_equal(q, unflattened[:m].contiguous())
    assert torch.equal(scales, scales_flat.view(3, 3))


def test_reference_per_block_known_values():
    x = torch.full((1, 256), -2.0, dtype=torch.float32)  # one row of a 128-row block
    x[0, 128:] = 0
    q, scales = reference.per_block_cast_to_fp8(x)
    fp32 = lambda v: torch.tensor(v, dtype=torch.float32)
    assert torch.equal(scales, torch.stack([fp32(2.0) / fp32(448.0), fp32(1e-4) / fp32(448.0)]).view(1, 2))
    assert q.view(torch.uint8).tolist() == [[0xFE] * 128 + [0] * 128]  # -448, then zeros


# ---- validation (CPU tensors: every check that precedes the device check) ----

@pytest.mark.parametrize("x,kwargs,error,match", [
    (torch.ones(4, 256, dtype=torch.float16), {}, TypeError, "x must be"),
    (torch.ones(4, 256, dtype=torch.int32), {}, TypeError, "x must be"),
    (torch.ones(256, dtype=torch.bfloat16), {}, ValueError, "x must be 2-D"),
    (torch.ones(4, 200, dtype=torch.bfloat16), {}, ValueError, "multiple of group_size"),
    (torch.ones(4, 256, dtype=torch.bfloat16), {"group_size": 100}, ValueError, "group_size must be one of"),
    (torch.ones(4, 512, dtype=torch.float32), {"group_size": 256}, ValueError, "group_size must be one of"),
    (torch.ones(4, 200, dtype=torch.bfloat16), {"group_size": None}, ValueError, "positive multiple of 16"),
    (torch.ones(256, 4, dtype=torch.bfloat16).t(), {}, ValueError, "contiguous last dimension"),
    (torch.ones(4, 260, dtype=torch.bfloat16)[:, :256], {}, ValueError, "16-byte aligned"),
    # (A meta tensor: the view of a 16 GiB allocation without one.)
    (torch.empty_strided((2, 256), (2**32, 1), device="meta", dtype=torch.bfloat16), {}, ValueError,
     r"x's row stride \(4294967296 elements\) must be below 2\^32"),
    (torch.ones(4, 256, dtype=torch.bfloat16), {"scale_layout": "col"}, ValueError, "scale_layout must be"),
    (torch.ones(4, 256, dtype=torch.bfloat16), {"scale_layout": "packed_ue8m0"}, ValueError, "needs ue8m0"),
    (torch.ones(4, 256, dtype=torch.bfloat16), {"amax_clamp": 0.0}, ValueError, "amax_clamp"),
    # format_max / amax of an all-zero group overflows FP32 below about 1.3e-36 (MIN_AMAX_CLAMP's note).
    (torch.ones(4, 256, dtype=torch.bfloat16), {"amax_clamp": 1e-37}, ValueError, "amax_clamp must be at least 1e-30"),
    # Finite in Python, inf as the kernels' FP32 parameter.
    (torch.ones(4, 256, dtype=torch.bfloat16), {"amax_clamp": 1e39}, ValueError,
     "amax_clamp must be a positive finite FP32 number"),
    (torch.ones(4, 256, dtype=torch.bfloat16), {"amax_clamp": True}, ValueError, "amax_clamp must be a positive"),
    (torch.ones(4, 256, dtype=torch.bfloat16), {"ue8m0": 1}, TypeError, "ue8m0 must be a bool, got int"),
    (torch.ones(4, 256, dtype=torch.bfloat16), {"ue8m0": None}, TypeError, "ue8m0 must be a bool, got NoneType"),
    (torch.ones(4, 256, dtype=torch.bfloat16), {}, ValueError, "must be a CUDA tensor"),
    (torch.ones(4, 256, dtype=torch.bfloat16), {"scale_mode": "exact"}, ValueError, "scale_mode must be one of"),
    ("not a tensor", {}, TypeError, "torch.Tensor"),
])
def test_cast_rejects_bad_input(x, kwargs, error, match):
    with pytest.raises(error, match=match):
        deep_kernels.per_token_cast_to_fp8(x, **kwargs)


@pytest.mark.parametrize("x,kwargs,error,match", [
    (torch.ones(4, 256, dtype=torch.float16), {}, TypeError, "x must be"),
    (torch.ones(256, dtype=torch.bfloat16), {}, ValueError, "x must be 2-D"),
    (torch.ones(4, 256, dtype=torch.bfloat16), {"block_size": 64}, ValueError, "block_size must be one of"),
    (torch.ones(4, 256, dtype=torch.bfloat16), {"block_size": 128.0}, ValueError, "block_size must be one of"),
    (torch.ones(4, 96, dtype=torch.bfloat16), {}, ValueError, "multiple of block_size = 128"),
    (torch.ones(4, 48, dtype=torch.float32), {"block_size": 32}, ValueError, "multiple of block_size = 32"),
    (torch.ones(256, 4, dtype=torch.bfloat16).t(), {}, ValueError, "contiguous last dimension"),
    (torch.ones(4, 260, dtype=torch.bfloat16)[:, :256], {}, ValueError, "16-byte aligned"),
    (torch.ones(4, 256, dtype=torch.bfloat16), {"scale_mode": "exact"}, ValueError, "scale_mode must be one of"),
    (torch.ones(4, 256, dtype=torch.bfloat16), {"amax_clamp": float("inf")}, ValueError, "amax_clamp"),
    (torch.ones(4, 256, dtype=torch.bfloat16), {"ue8m0": "yes"}, TypeError, "ue8m0 must be a bool"),
    (torch.ones(4, 256, dtype=torch.bfloat16), {}, ValueError, "must be a CUDA tensor"),
    ("not a tensor", {}, TypeError, "torch.Tensor"),
])
def test_block_cast_rejects_bad_input(x, kwargs, error, match):
    with pytest.raises(error, match=match):
        deep_kernels.per_block_cast_to_fp8(x, **kwargs)


def test_cast_back_rejects_bad_input():
    q = torch.zeros(4, 256, dtype=torch.float8_e4m3fn)
    good = torch.ones(4, 2)
    with pytest.raises(TypeError, match="q must be"):
        deep_kernels.per_token_cast_back(q.view(torch.uint8), good)
    with pytest.raises(TypeError, match="out_dtype"):
        deep_kernels.per_token_cast_back(q, good, out_dtype=torch.float16)
    with pytest.raises(ValueError, match="scales must have shape"):
        deep_kernels.per_token_cast_back(q, torch.ones(4, 3))
    with pytest.raises(TypeError, match="scales must be torch.float32 or torch.int32"):
        deep_kernels.per_token_cast_back(q, good.half())
    # Contiguous, but one byte past an aligned address: the kernel loads q 8 bytes at a time.
    misaligned = torch.zeros(4 * 256 + 16, dtype=torch.uint8)[1:4 * 256 + 1].view(torch.float8_e4m3fn).view(4, 256)
    with pytest.raises(ValueError, match="q must start at a 16-byte aligned address"):
        deep_kernels.per_token_cast_back(misaligned, good)
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        deep_kernels.per_token_cast_back(q, good)


# ---- kernels against the reference (GPU) ----

def _special_rows(x: torch.Tensor) -> torch.Tensor:
    """Rows of all-equal values, zeros, tiny and huge magnitudes, and mixed signs among random rows (in inputs of more
    rows than the specials take: a few rows stay random, or an input of one row would be one constant)."""
    x = x.clone()
    big = 1e30 if x.dtype == torch.float32 else 1e37
    specials = [1.5, 0.0, -3.0e-30 if x.dtype == torch.float32 else -1e-38, big, -big]
    if x.shape[0] > 7 * len(specials):
        for i, value in enumerate(specials):
            x[i * 7] = value
    return x


def check_cast_matches_reference(op: str, x: torch.Tensor, **kwargs) -> None:
    """The cast `op` writes its reference's bytes into poisoned out= tensors and, twice, into ones it allocates
    (with the same shapes and strides)."""
    q_ref, scales_ref = getattr(reference, op)(x, **kwargs)
    out = (poison_(empty_like_strided(q_ref)), poison_(empty_like_strided(scales_ref)))
    q, scales = getattr(deep_kernels, op)(x, out=out, **kwargs)
    assert q is out[0] and scales is out[1]
    assert_bitwise_equal(q, q_ref, "q")
    assert_bitwise_equal(scales, scales_ref, "scales")
    for _ in range(2):
        q, scales = getattr(deep_kernels, op)(x, **kwargs)
        assert_bitwise_equal(q, q_ref, "q")
        assert_bitwise_equal(scales, scales_ref, "scales")


SHAPES = [(1, 128), (7, 7168), (64, 1536), (4001, 7168)] + ([(8001, 4096), (3, 512)] if FULL else [])
DTYPES = (torch.bfloat16, torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,dtype,ue8m0,layout", in_turns([(d, *v) for v in LAYOUTS for d in DTYPES], SHAPES))
def test_cast_matches_reference(m, k, dtype, ue8m0, layout):
    x = _special_rows(random_activations(m, k, dtype))
    check_cast_matches_reference("per_token_cast_to_fp8", x, group_size=128, ue8m0=ue8m0, scale_layout=layout)


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,group_size,dtype", [(33, 640, 128, torch.bfloat16), (4001, 896, 128, torch.float32),
                                                  (301, 224, 32, torch.float32), (5, 24, 8, torch.bfloat16)])
def test_cast_packed_partial_words(m, k, group_size, dtype):
    """Group counts that are no multiple of 4: the last CTAs of a row block cover padding groups, and the packed
    words' unused bytes must come out zero (out= is poisoned)."""
    assert group_size in supported_group_sizes(dtype)
    x = _special_rows(random_activations(m, k, dtype))
    check_cast_matches_reference("per_token_cast_to_fp8", x, group_size=group_size, ue8m0=True,
                                 scale_layout="packed_ue8m0")


def _divide_cases() -> list:
    variants = [(128, "mn_major"), (128, "row_major"), (32, "mn_major"), (256 if FULL else 64, "row_major")]
    return [case for case in in_turns([(d, *v) for v in variants for d in DTYPES], SHAPES)
            if case[3] in supported_group_sizes(case[2]) and case[1] % case[3] == 0]


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,dtype,group_size,layout", _divide_cases())
def test_cast_divide_mode_matches_reference(m, k, dtype, group_size, layout):
    x = _special_rows(random_activations(m, k, dtype))
    check_cast_matches_reference("per_token_cast_to_fp8", x, group_size=group_size, scale_layout=layout,
                                  scale_mode="div")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,group_size", [(torch.bfloat16, 32), (torch.float32, 64), (torch.bfloat16, 128)])
def test_cast_group_sizes_and_row_stride(dtype, group_size):
    assert group_size in supported_group_sizes(dtype)
    wide = random_activations(301, 1024 + 64, dtype)
    x = wide[:, :1024]  # row stride larger than K
    kwargs = dict(group_size=group_size, ue8m0=True, scale_layout="packed_ue8m0")
    poison_cached_memory()  # the outputs it allocates start poisoned
    q, scales = deep_kernels.per_token_cast_to_fp8(x, **kwargs)
    q_ref, scales_ref = reference.per_token_cast_to_fp8(x, **kwargs)
    assert_bitwise_equal(q, q_ref, "q")
    assert_bitwise_equal(scales, scales_ref, "scales")
    y = deep_kernels.per_token_cast_back(q, scales, group_size)
    assert_bitwise_equal(y, reference.per_token_cast_back(q_ref, scales_ref, group_size), "y")


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,out_dtype,ue8m0,layout",
                         in_turns([(d, *v) for v in LAYOUTS for d in DTYPES[::-1]], SHAPES))
def test_cast_back_matches_reference(m, k, out_dtype, ue8m0, layout):
    x = random_activations(m, k, torch.bfloat16)
    q, scales = reference.per_token_cast_to_fp8(x, 128, ue8m0=ue8m0, scale_layout=layout)
    out = poison_(torch.empty((m, k), dtype=out_dtype, device="cuda"))
    y = deep_kernels.per_token_cast_back(q, scales, 128, out_dtype, out=out)
    assert y is out
    assert_bitwise_equal(y, reference.per_token_cast_back(q, scales, 128, out_dtype), "y")


BLOCK_SHAPES = {
    128: [(1, 128), (7, 7168), (129, 1536), (4001, 7168)] + ([(16384, 4096), (300, 384)] if FULL else []),
    32: [(1, 32), (33, 160), (100, 1536), (4001, 7168)] + ([(8001, 4096), (65, 96)] if FULL else []),
}
BLOCK_VARIANTS = [(False, "mul"), (True, "mul"), (False, "div"), (True, "div")]


def _block_cases() -> list:
    """Each block size with each variant, the dtypes and the block size's shapes taking turns."""
    return [(block_size, *shapes[i % len(shapes)], DTYPES[(i + j) % 2], *variant)
            for j, (block_size, shapes) in enumerate(BLOCK_SHAPES.items()) for i, variant in enumerate(BLOCK_VARIANTS)]


@pytest.mark.gpu
@pytest.mark.parametrize("block_size,m,k,dtype,ue8m0,scale_mode", _block_cases())
def test_block_cast_matches_reference(block_size, m, k, dtype, ue8m0, scale_mode):
    x = _special_rows(random_activations(m, k, dtype))
    check_cast_matches_reference("per_block_cast_to_fp8", x, block_size=block_size, ue8m0=ue8m0,
                                  scale_mode=scale_mode)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,block_size", [(DTYPES[i % 2], size) for i, size in enumerate(BLOCK_SIZES)])
def test_block_cast_row_stride(dtype, block_size):
    x = random_activations(301, 1024 + 64, dtype)[:, :1024]  # row stride larger than K
    check_cast_matches_reference("per_block_cast_to_fp8", x, block_size=block_size)


@pytest.mark.gpu
def test_empty_input():
    x = torch.empty((0, 7168), dtype=torch.bfloat16, device="cuda")
    q, scales = deep_kernels.per_token_cast_to_fp8(x)
    assert q.shape == (0, 7168) and q.dtype == torch.float8_e4m3fn and scales.shape == (0, 56)
    assert deep_kernels.per_token_cast_back(q, scales).shape == (0, 7168)
    q, scales = deep_kernels.per_block_cast_to_fp8(x)
    assert q.shape == (0, 7168) and q.dtype == torch.float8_e4m3fn and scales.shape == (0, 56)


@pytest.mark.gpu
def test_deterministic_and_graph_capturable():
    x = random_activations(1000, 4096, torch.bfloat16)
    first = deep_kernels.per_token_cast_to_fp8(x, ue8m0=True)
    out = (empty_like_strided(first[0]), empty_like_strided(first[1]))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        deep_kernels.per_token_cast_to_fp8(x, ue8m0=True, out=out)
    expected = reference.per_token_cast_to_fp8(x, ue8m0=True)
    assert_bitwise_equal(first[0], expected[0], "q")
    assert_bitwise_equal(first[1], expected[1], "scales")
    for replay in range(3):
        if replay == 2:  # new inputs, read on the device
            x.copy_(random_activations(1000, 4096, torch.bfloat16, seed=5))
            expected = reference.per_token_cast_to_fp8(x, ue8m0=True)
        poison_(out[0])
        poison_(out[1])
        graph.replay()
        torch.cuda.synchronize()
        assert_bitwise_equal(out[0], expected[0], "q")
        assert_bitwise_equal(out[1], expected[1], "scales")


@pytest.mark.gpu
def test_mismatched_devices_and_bad_out_are_rejected():
    x = random_activations(8, 256, torch.bfloat16)
    q, scales = deep_kernels.per_token_cast_to_fp8(x)
    with pytest.raises(ValueError, match="out\\[0\\] must be a contiguous tensor of shape"):
        deep_kernels.per_token_cast_to_fp8(x, out=(q[:4], scales))
    with pytest.raises(ValueError, match="out\\[1\\] must have shape .* \\(row_major scales\\)"):
        deep_kernels.per_token_cast_to_fp8(x, scale_layout="row_major", out=(q, scales))
    with pytest.raises(ValueError, match="scales must be a CUDA tensor"):
        deep_kernels.per_token_cast_back(q, scales.cpu())
    block_scales = torch.empty((1, 2), device="cuda")
    with pytest.raises(ValueError, match="out\\[1\\] must be a contiguous tensor of shape \\(1, 2\\)"):
        deep_kernels.per_block_cast_to_fp8(x, out=(q, block_scales.t()))
    with pytest.raises(TypeError, match="out\\[1\\] must be torch.float32"):
        deep_kernels.per_block_cast_to_fp8(x, out=(q, block_scales.double()))


# ---- Divide mode's division (CPU: the steps of csrc/common/quant.cuh, in exact arithmetic) ----

def _fma32(a, b, c):
    """RN_fp32(a * b + c) of float32 arrays, as the GPU's FMA: the exact value is s + err (a float64 product is
    exact, TwoSum is), and rounding s alone to fp32 is right unless s is an fp32 midpoint."""
    import numpy as np

    product, addend = a.astype(np.float64) * b.astype(np.float64), c.astype(np.float64)
    s = product + addend
    bb = s - product
    err = (product - (s - bb)) + (addend - bb)
    rounded = s.astype(np.float32)
    diff = s - rounded.astype(np.float64)
    neighbour = np.nextafter(rounded, np.where(diff > 0, np.inf, -np.inf).astype(np.float32))
    midpoint = (diff != 0) & (2 * diff == neighbour.astype(np.float64) - rounded.astype(np.float64))
    return np.where(midpoint & (err != 0) & (np.sign(err) == np.sign(diff)), neighbour, rounded)


def _divide_by_scale(x, scale):
    """csrc/common/quant.cuh's ScaleDivisor(scale).divide(x) (divide_by_scale), step for step."""
    import numpy as np

    with np.errstate(all="ignore"):
        magnitude = np.abs(scale)
        prescale = np.where((magnitude > 0) & (magnitude < np.float32(2.0 ** -92)), np.float32(2.0 ** 100),
                            np.where(magnitude >= np.float32(2.0 ** 100), np.float32(2.0 ** -100), np.float32(1)))
        scaled = (scale * prescale).astype(np.float32)
        divisor = np.where(np.isinf(scaled), np.float32(0),
                           np.where(scaled == 0, np.copysign(np.float32(1), -scaled), scaled)).astype(np.float32)
        reciprocal = (np.float32(1) / scaled).astype(np.float32)
        x = (x * prescale).astype(np.float32)
        quotient = (x * reciprocal).astype(np.float32)
        residual = _fma32(quotient, divisor, -x)
        return _fma32(-residual, reciprocal, quotient)


def _e4m3_codes(values):
    """The e4m3 bytes of FP32 values as the kernels' conversion gives them (RNE, saturating at +-448, every NaN
    0x7F, the GPU's FP32 NaN being positive)."""
    import numpy as np

    values = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))
    codes = values.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
    return torch.where(values.isnan(), 0x7F, codes)


def test_division_model_is_the_kernels_code():
    # _divide_by_scale replays these lines of csrc/common/quant.cuh; the tests below hold for the kernels while
    # they are there.
    source = csrc_source("common/quant.cuh")
    for line in ("const float quotient = __fmul_rn(x, reciprocal);",
                 "const float residual = __fmaf_rn(quotient, divisor, -x);",
                 "return __fmaf_rn(-residual, reciprocal, quotient);",
                 "prescale = magnitude > 0.0f && magnitude < 0x1p-92f ? 0x1p100f : "
                 "(magnitude >= 0x1p100f ? 0x1p-100f : 1.0f);",
                 "divisor = isinf(scaled) ? 0.0f : (scaled == 0.0f ? copysignf(1.0f, -scaled) : scaled);",
                 "reciprocal = __frcp_rn(scaled);",
                 "return divide_by_scale(x * prescale, divisor, reciprocal);"):
        assert line in source, line


def _check_division(x, scale):
    """divide_by_scale's e4m3 codes are those of IEEE division, -0 and NaN included."""
    import numpy as np

    x, scale = np.broadcast_arrays(np.float32(x), np.float32(scale))
    with np.errstate(all="ignore"):
        exact = (x / scale).astype(np.float32)
    assert torch.equal(_e4m3_codes(_divide_by_scale(x, scale)), _e4m3_codes(exact))


def test_division_steps_match_ieee_division_near_every_e4m3_midpoint():
    import numpy as np

    rng = np.random.default_rng(0)
    # Divisor significands (the ends and random ones; scripts/brute_force_e4m3_division.c takes all 2^23 in the
    # same window) times every 5-bit boundary b in [1, 2) times x within 4 ulps of b * divisor, at random binades
    # of the divisor (2^-92 to 2^119) and of the quotient (2^-10, where 0 and 2^-9 meet, to 2^8; x finite).
    significands = np.concatenate([[0, 1, 2, 0x7FFFFF, 0x7FFFFE, 0x400000], rng.integers(0, 1 << 23, 4090)])
    divisor = (1 + significands / 2.0 ** 23).astype(np.float32)
    boundaries = np.arange(16, 32, dtype=np.float32) / 16
    centers = (boundaries[None, :].astype(np.float64) * divisor[:, None]).astype(np.float32)
    steps = np.arange(-4, 5, dtype=np.int32)
    x = (centers.view(np.int32)[:, :, None] + steps).view(np.float32)
    shape = x.shape
    divisor_exponent = rng.integers(-92, 120, shape[0]).astype(np.float64)
    quotient_exponent = np.minimum(rng.integers(-10, 9, shape), 125 - divisor_exponent[:, None, None])
    scale = np.ldexp(divisor.astype(np.float64), divisor_exponent.astype(int)).astype(np.float32)
    x_exponent = (divisor_exponent[:, None, None] + quotient_exponent).astype(int)
    x = np.ldexp(x.astype(np.float64), x_exponent).astype(np.float32)
    signs = np.where(rng.integers(0, 2, shape) == 1, np.float32(-1), np.float32(1))
    _check_division((x * signs).reshape(-1), np.broadcast_to(scale[:, None, None], shape).reshape(-1))


def test_division_steps_match_ieee_division_for_every_bf16_group_member():
    import numpy as np

    rng = np.random.default_rng(1)
    # Scales across and beyond the direct range (tiny ones take the kScaleUp step), with every bf16 value up to
    # 449 * scale (a group's members) of either sign, zeros included.
    exponents = np.concatenate([[-92, -93, 119, 0, -7, -100, -126, -127, -140, -149], rng.integers(-149, 120, 14)])
    significands = np.concatenate([[0, 0x7FFFFF, 1, 0x7FFFFE], rng.integers(0, 1 << 23, 12)])
    scales = np.ldexp(1 + significands[:, None] / 2.0 ** 23, exponents[None, :]).astype(np.float32).reshape(-1)
    scales = np.unique(scales[scales > 0])
    bf16 = (np.arange(1, 0x7F80, dtype=np.uint32) << 16).view(np.float32)
    for scale in scales:
        x = bf16[bf16 <= 449 * np.float64(scale)]
        _check_division(np.concatenate([x, -x, np.float32([0.0, -0.0])]), scale)


def test_division_steps_with_special_scales_and_values():
    import numpy as np

    # Zero, subnormal, tiny, huge, infinite and NaN scales (never negative), each with the values a group of that
    # scale can hold: |x| <= amax, amax up to where scale = RN(amax / 448) would grow (finite for a finite scale);
    # any with infinite and NaN scales.
    values = np.float32([0.0, -0.0, 1e-45, -1e-45, 1e-39, -3e-40, 1e-30, -2.5, 7.0, 3e38, -3e38, np.inf, -np.inf,
                         np.nan])
    for scale in np.float32([0.0, 1e-45, 3e-42, 1e-38, 2.0 ** -92, 1.0, 7e35, 2.0 ** 100, 3e38, np.inf, np.nan]):
        largest = np.inf if not np.isfinite(scale) else min(
            448 * (np.float64(scale) + 2.0 ** -150) * (1 + 2.0 ** -23), np.finfo(np.float32).max)
        x = values[(np.abs(values) <= largest) | np.isnan(scale)]
        _check_division(x, scale)
        with np.errstate(all="ignore"):
            exact = (x / scale).astype(np.float32)
        got = _divide_by_scale(x, np.full_like(x, scale))
        zero = exact == 0
        assert np.array_equal(np.signbit(got[zero]), np.signbit(exact[zero])), scale  # -0 stays -0
        if scale == 0 or not np.isfinite(scale):  # special scales: the IEEE quotient itself
            assert np.array_equal(np.isnan(got), np.isnan(exact)), scale
            finite = ~np.isnan(exact)
            assert np.array_equal(got.view(np.uint32)[finite], exact.view(np.uint32)[finite]), scale


# ---- edge values (CPU: what the module docstring promises; GPU: bit-exact with the reference) ----

def _edge_rows(x: torch.Tensor) -> torch.Tensor:
    """Rows of all-equal values, huge (near bf16's max), tiny and subnormal magnitudes, all -0, and rows with
    +inf, -inf, NaN, -0 and a subnormal among random values, spread over x's rows."""
    x = x.clone()
    m, k = x.shape
    rows = [i * (m // 11) for i in range(11)] if m >= 11 else list(range(m))
    generator = torch.Generator(device=x.device).manual_seed(11)
    uniform = lambda: torch.rand(k, generator=generator, device=x.device) * 2 - 1
    fills = [
        lambda r: torch.full_like(r, 1.5), lambda r: torch.full_like(r, -3e-3),
        lambda r: uniform() * 3.38e38, lambda r: uniform() * 1e-33, lambda r: uniform() * 1e-39,
        lambda r: torch.full_like(r, -0.0),
    ]
    marks = [(5, float("inf")), (k - 1, float("-inf")), (130 % k, float("nan")), (1, 1e-39)]
    for row, fill in zip(rows, fills):
        x[row] = fill(x[row].float()).to(x.dtype)
    for row, (column, value) in zip(rows[len(fills):], marks):
        x[row, column] = value
    if len(rows) == 11:
        x[rows[10], ::3] = -0.0
    return x


def test_reference_edge_values_follow_the_docstring():
    x = _edge_rows(random_activations(11, 256, torch.float32, device="cpu", seed=12))
    for scale_mode in ("mul", "div"):
        q, scales = reference.per_token_cast_to_fp8(x, scale_layout="row_major", scale_mode=scale_mode)
        codes, values = q.view(torch.uint8), q.float()
        assert (codes[0] == 0x7E).all() and (codes[1] == 0xFE).all()  # all equal: +-448
        assert torch.isfinite(scales[:5]).all() and torch.isfinite(values[:5]).all()
        assert (codes[5] == 0x80).all()  # all -0: -0 codes, the clamped amax's scale
        assert torch.equal(scales[5], torch.full((2,), 1e-4) / torch.full((2,), 448.0))
        # +inf at column 5 of row 6: scale inf, its code NaN, the group's finite codes zeros of their sign.
        assert scales[6, 0] == float("inf") and torch.isfinite(scales[6, 1])
        assert values[6, 5].isnan() and (values[6, :128].isnan().sum() == 1)
        finite = torch.arange(128) != 5
        assert (values[6, :128][finite] == 0).all()
        assert torch.equal(torch.signbit(values[6, :128][finite]), torch.signbit(x[6, :128][finite]))
        assert scales[7, 1] == float("inf") and values[7, 255].isnan()  # -inf: the same
        assert scales[8, 1].isnan() and values[8, 128:].isnan().all() and torch.isfinite(values[8, :128]).all()
        assert torch.equal(torch.signbit(values[10, ::3]), torch.ones(86, dtype=torch.bool))  # -0 stays -0
        # Huge and tiny rows use the whole e4m3 range: the group's amax lands on 448.
        assert (values[2].abs().view(2, 128).amax(dim=1) == 448).all()


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,dtype,amax_clamp",
                         [(4001, 1024, torch.bfloat16, 1e-30), (8001, 512, torch.float32, 1e-4)])
def test_edge_values_match_reference(m, k, dtype, amax_clamp):
    x = _edge_rows(random_activations(m, k, dtype))
    for ue8m0, layout, scale_mode in [(False, "mn_major", "mul"), (False, "row_major", "div"),
                                      (True, "packed_ue8m0", "mul")]:
        kwargs = dict(ue8m0=ue8m0, amax_clamp=amax_clamp, scale_mode=scale_mode)
        check_cast_matches_reference("per_token_cast_to_fp8", x, scale_layout=layout, **kwargs)
        q, scales = reference.per_token_cast_to_fp8(x, scale_layout=layout, **kwargs)
        for out_dtype in (torch.bfloat16, torch.float32):
            out = poison_(torch.empty((m, k), dtype=out_dtype, device="cuda"))
            deep_kernels.per_token_cast_back(q, scales, 128, out_dtype, out=out)
            assert_bitwise_equal(out, reference.per_token_cast_back(q, scales, 128, out_dtype), "y")
        for block_size in BLOCK_SIZES:
            check_cast_matches_reference("per_block_cast_to_fp8", x, block_size=block_size, **kwargs)
        check_cast_matches_reference("per_channel_cast_transpose_to_fp8", x[:m // 16 * 16].T.contiguous(),
                                     scale_layout=layout, **kwargs)


def _near_tie_rows(m: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows whose values divided by their group's scale land within a few ulps of e4m3 rounding midpoints,
    where a division off by one ulp would change the code; amax from 2^-13 (above the clamp) to 2^91, past
    the fast division's range."""
    generator = torch.Generator(device="cuda").manual_seed(13)
    codes = torch.arange(0, 0x7F, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn).float()
    midpoints = (codes[:-1] + codes[1:]) / 2  # from 2^-10 to 432
    amax = torch.exp2(torch.randint(-13, 90, (m, 1), generator=generator, device="cuda").float()) * (
        1 + torch.rand((m, 1), generator=generator, device="cuda"))
    amax = amax.to(dtype).float()
    scale = amax / torch.full_like(amax, 448.0)
    picks = midpoints[torch.randint(0, midpoints.numel(), (m, 127), generator=generator, device="cuda")]
    x = (picks.double() * scale.double()).float()
    for _ in range(2):  # a random step of up to two ulps either way
        step = torch.randint(-1, 2, x.shape, generator=generator, device="cuda")
        x = torch.where(step == 0, x, torch.nextafter(x, x * (1 + step.float())))
    x = torch.where(torch.rand(x.shape, generator=generator, device="cuda") < 0.5, -x, x)
    return torch.cat([amax, x], dim=1).to(dtype)  # each row one 128-group, its amax first


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_divide_mode_near_ties_match_reference(dtype):
    x = _near_tie_rows(4096, dtype)
    check = functools.partial(check_cast_matches_reference, scale_mode="div")
    check("per_token_cast_to_fp8", x, scale_layout="row_major")
    check("per_token_cast_to_fp8", x.reshape(-1, 1024), scale_layout="row_major")
    check("per_block_cast_to_fp8", x.reshape(-1, 1024))
    check("per_channel_cast_transpose_to_fp8", x.T.contiguous(), scale_layout="row_major")


def _share_below(dequantized: torch.Tensor, x: torch.Tensor) -> None:
    """Rounding is unbiased: among values that do not round-trip exactly, as many come back smaller as
    larger, signed and in magnitude, within 10 / sqrt(n)."""
    dequantized, x = dequantized.float().reshape(-1), x.float().reshape(-1)
    for a, b in ((dequantized, x), (dequantized.abs(), x.abs())):
        differ = a != b
        n = int(differ.sum())
        assert n > 10_000
        share = float((a[differ] < b[differ]).sum()) / n
        assert abs(share - 0.5) <= 10 / math.sqrt(n), share


def _cell_uniform(m: int, k: int) -> torch.Tensor:
    """fp32 values spread uniformly inside the cells between adjacent e4m3 codes (random signs), times 2^-5,
    with +-448 * 2^-5 at every 128th row and column: every group's, block's and column block's scale is
    then exactly 2^-5, a dequantized value is its code times 2^-5, and unbiased rounding sends as many
    non-exact values below as above. (Inputs with a sloping density inside a cell, like normal values or
    values uniform across e4m3's uneven cells, are biased by themselves.)"""
    codes = torch.arange(0, 0x7F, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn).float()
    lower, upper = codes[:-1], codes[1:]
    cell = torch.randint(0, lower.numel(), (m, k), device="cuda")
    x = lower[cell] + torch.rand((m, k), device="cuda") * (upper[cell] - lower[cell])
    x[:, ::128] = 448.0
    x[::128, :] = 448.0
    sign = torch.where(torch.rand((m, k), device="cuda") < 0.5, -1.0, 1.0)
    return x * sign * 2.0**-5


@pytest.mark.gpu
@pytest.mark.parametrize("scale_mode", ["mul", "div"])
def test_rounding_is_unbiased(scale_mode):
    m, k = 4001, 2048
    x = _cell_uniform(m, k)
    q, scales = deep_kernels.per_token_cast_to_fp8(x, scale_mode=scale_mode)
    _share_below(deep_kernels.per_token_cast_back(q, scales, 128, torch.float32), x)
    q, scales = deep_kernels.per_token_cast_to_fp8(x, None, scale_layout="row_major", scale_mode=scale_mode)
    _share_below(q.float() * scales, x)
    q, scales = deep_kernels.per_block_cast_to_fp8(x, scale_mode=scale_mode)
    _share_below(q.float() * scales.repeat_interleave(128, 0)[:m].repeat_interleave(128, 1), x)
    q, scales = deep_kernels.per_channel_cast_transpose_to_fp8(x[:4000], scale_layout="row_major",
                                                               scale_mode=scale_mode)
    _share_below(q.float() * scales.repeat_interleave(128, 1)[:, :4000], x[:4000].T)


def test_benchmark_cases_build_on_cpu():
    # The quant suite's rows at a small shape: every op exists and its reference runs on the arguments built.
    from deep_kernels.benchmarks import quant as suite

    ops = set()
    for op, shape, config, args, kwargs, num_bytes in suite.cases(((256, 512),), device="cpu"):
        getattr(reference, op)(*args, **kwargs)
        assert callable(getattr(deep_kernels, op)) and num_bytes > 0 and shape and config
        ops.add(op)
    assert ops == {"per_token_cast_to_fp8", "per_token_cast_back", "per_block_cast_to_fp8",
                   "per_channel_cast_transpose_to_fp8", "batched_transpose"}


@pytest.mark.parametrize("m,num_groups", [(1, 1), (5, 56), (4001, 7), (64, 4)])
def test_kernel_scale_stride_is_the_row_or_column_step(m, num_groups):
    # What the casts pass their kernels: the step between rows (row-major) or group columns (MN-major, packed
    # words), for flat scales and for the masked layout's per-expert blocks.
    from deep_kernels.quant.common import ScaleLayout, empty_scales, kernel_scale_stride
    from deep_kernels.quant.swiglu import empty_masked_scales
    from deep_kernels.validation import tma_aligned_size

    like = torch.empty(0)
    expected = {ScaleLayout.row_major: num_groups, ScaleLayout.mn_major: tma_aligned_size(m, 4),
                ScaleLayout.packed_ue8m0: tma_aligned_size(m, 4)}
    for layout, stride in expected.items():
        assert kernel_scale_stride(empty_scales(m, num_groups, layout, like), layout) == stride
        assert kernel_scale_stride(empty_masked_scales(3, m, num_groups, layout, like), layout) == stride
