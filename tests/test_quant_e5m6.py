"""E5M6 per-token cast and cast-back: the reference's rounding and packing against independent formulations
(CPU), input validation (CPU), and the kernels bit-exact against the reference (GPU)."""

import math

import pytest
import torch

import deep_kernels
from deep_kernels.quant import E5M6_MAX
from deep_kernels.quant.e5m6 import MAX_GROUPS, row_divisor, rows_per_block
from deep_kernels.reference import quant as reference
from deep_kernels.testing import assert_bitwise_equal, poison_, poison_cached_memory, random_activations

from conftest import FULL, csrc_source, in_turns

VARIANTS = [(False, "mul"), (False, "div"), (True, "mul"), (True, "div")]


# ---- the reference (CPU) ----

def _brute_force_e5m6(values: torch.Tensor) -> torch.Tensor:
    """Codes by exhaustive search: the nearest of all finite non-negative e5m6 values (and 2^16 standing for
    inf, whose code 0x7C0 is even, as IEEE overflow rounds), ties to the even code; sign kept, NaN 0x7FF."""
    codes = torch.arange(0x7C1)
    grid = torch.where(codes == 0x7C0, 65536.0, reference.e5m6_to_float(codes).double())
    result = []
    for chunk in values.float().split(2048):
        distance = (chunk.double().abs().clamp(max=65536.0)[:, None] - grid[None, :]).abs()
        nearest = distance == distance.min(dim=1, keepdim=True).values
        even_nearest = nearest & (codes % 2 == 0)[None, :]
        pick = torch.where(even_nearest.any(dim=1), even_nearest.int().argmax(dim=1), nearest.int().argmax(dim=1))
        signed = codes[pick] | (chunk.view(torch.int32) < 0).long() * 0x800
        result.append(torch.where(torch.isnan(chunk), 0x7FF, signed))
    return torch.cat(result).int()


def _rounding_inputs() -> torch.Tensor:
    """Random FP32 over 50 binades, every grid point, every midpoint and their FP32 neighbours, specials."""
    generator = torch.Generator().manual_seed(0)
    n = 6000
    random = torch.randn(n, generator=generator) * torch.exp2(torch.randint(-32, 18, (n,), generator=generator).float())
    grid = reference.e5m6_to_float(torch.arange(0x7C0)).double()
    grid = torch.cat([grid, torch.tensor([65536.0], dtype=torch.float64)])
    midpoints = ((grid[1:] + grid[:-1]) / 2).float()
    specials = torch.tensor([0.0, math.inf, math.nan, 1e-45, 1e-40, 2.0 ** -14, 2.0 ** -20, 2.0 ** -21,
                             1.5 * 2.0 ** -21, 65024.0, 65279.99, 65280.0, 65536.0, 3e38])
    points = torch.cat([midpoints, grid.float(), specials])
    up, down = torch.full_like(points, math.inf), torch.zeros_like(points)
    points = torch.cat([points, torch.nextafter(points, up), torch.nextafter(points, down)])
    return torch.cat([random, points, -points])


def test_reference_rounding_matches_brute_force():
    values = _rounding_inputs()
    assert_bitwise_equal(reference.round_to_e5m6(values), _brute_force_e5m6(values), "codes")


def test_kernel_rounding_formulation_matches_reference():
    # csrc/common/e5m6.cuh rounds by adding and subtracting 2^(e + 17) in FP32; the same steps in torch FP32
    # must give the reference's codes (which are computed on the bit pattern).
    source = csrc_source("common/e5m6.cuh")
    for line in ("const float magnitude = kSpecials ? fminf(fabsf(value), 65536.0f) : fabsf(value);",
                 "const float step = fmaxf(__fmul_rn(exponent_only, 131072.0f), 8.0f);",
                 "const float rounded = __fsub_rn(__fadd_rn(magnitude, step), step);",
                 "(__float_as_uint(__fmul_rn(rounded, 0x1p-112f)) >> 17) + (__float_as_uint(value) >> 31) * 0x800u;",
                 "return isnan(value) ? 0x7ffu : code;"):
        assert line in source, line
    values = torch.cat([_rounding_inputs(), torch.randint(-2**31, 2**31 - 1, (1 << 20,), dtype=torch.int32,
                                                          generator=torch.Generator().manual_seed(1)).view(torch.float32)])
    magnitude = torch.minimum(values.abs(), torch.tensor(65536.0))
    step = torch.maximum((magnitude.view(torch.int32) & 0x7F800000).view(torch.float32) * 2.0 ** 17, torch.tensor(8.0))
    rounded = (magnitude + step) - step
    codes = ((rounded * 2.0 ** -112).view(torch.int32) >> 17) + (values.view(torch.int32) < 0).int() * 0x800
    codes = torch.where(torch.isnan(values), 0x7FF, codes)
    assert_bitwise_equal(codes, reference.round_to_e5m6(values), "codes")


def test_codes_are_the_top_bits_of_a_half():
    codes = torch.arange(4096)
    values = reference.e5m6_to_float(codes)
    halves = (codes << 4).to(torch.int32).to(torch.uint16).view(torch.float16).float()
    assert torch.equal(values.nan_to_num(7.0), halves.nan_to_num(7.0))
    named = {0x000: 0.0, 0x001: 2.0 ** -20, 0x03F: 63 * 2.0 ** -20, 0x040: 2.0 ** -14, 0x3C0: 1.0, 0x3C1: 1 + 2 ** -6,
             0x7BF: E5M6_MAX, 0x7C0: math.inf, 0xFC0: -math.inf, 0xBC0: -1.0}
    for code, value in named.items():
        assert values[code].item() == value, hex(code)
    assert values[0x800].item() == 0.0 and math.copysign(1.0, values[0x800].item()) == -1.0
    assert torch.isnan(values[0x7C1:0x800]).all() and torch.isnan(values[0xFC1:]).all()
    assert reference.round_to_e5m6(values[~torch.isnan(values)]).tolist() == [
        c for c in range(4096) if not (0x7C0 < c < 0x800 or c > 0xFC0)]


def test_packing_bit_order():
    codes = torch.randint(0, 4096, (5, 64), generator=torch.Generator().manual_seed(2))
    packed = reference.pack_e5m6(codes)
    assert packed.shape == (5, 24) and packed.dtype == torch.int32
    # Code i of each 8 at bits [12i, 12i + 12) of a little-endian 96-bit group, word w its bits [32w, 32w + 32).
    bits = ((codes.view(5, 8, 8, 1) >> torch.arange(12)) & 1).reshape(5, 8, 96)
    words = (bits.view(5, 8, 3, 32).long() << torch.arange(32)).sum(dim=3)
    assert torch.equal(packed.view(5, 8, 3).long() & 0xFFFFFFFF, words)
    assert torch.equal(reference.unpack_e5m6(packed), codes.int())
    one = torch.tensor([[0xABC, 0x123, 0xFED, 0, 0, 0x9, 0, 0x800]])
    assert (reference.pack_e5m6(one).long() & 0xFFFFFFFF).tolist() == [[0xED123ABC, 0x9000000F, 0x80000000]]


def test_reference_cast_known_values():
    x = torch.zeros((5, 16), dtype=torch.float32)
    x[0] = 1.0                                   # all equal: every code is 65024's
    x[1, 3] = -0.0                               # an all-zero row: clamped amax, codes 0 (one -0)
    x[2, :2] = torch.tensor([2.0, -1.0])         # 65024 and -32512 = -(2 - 2^-6) * 2^14
    x[3, :3] = torch.tensor([math.inf, 1.0, -1.0])  # inf: scale inf, its code NaN, the others (signed) zero
    x[4, 5] = math.nan                           # NaN: scale and every code NaN
    packed, scales = reference.per_token_cast_to_e5m6(x)
    codes = reference.unpack_e5m6(packed)
    fp32 = lambda v: torch.tensor(v, dtype=torch.float32)
    assert codes[0].tolist() == [0x7BF] * 16 and scales[0] == fp32(1.0) / fp32(E5M6_MAX)
    assert codes[1].tolist() == [0, 0, 0, 0x800] + [0] * 12 and scales[1] == fp32(1e-4) / fp32(E5M6_MAX)
    assert codes[2, :3].tolist() == [0x7BF, 0x800 | (29 << 6) | 63, 0]
    assert codes[3, :4].tolist() == [0x7FF, 0, 0x800, 0] and scales[3] == math.inf
    assert codes[4].tolist() == [0x7FF] * 16 and math.isnan(scales[4])
    _, ue8m0_scales = reference.per_token_cast_to_e5m6(x[:1], ue8m0=True)
    assert ue8m0_scales.tolist() == [2.0 ** -15]  # ceil_pow2(1 / 65024)


@pytest.mark.parametrize("ue8m0,scale_mode", VARIANTS)
def test_reference_round_trip_error_bound(ue8m0, scale_mode):
    x = random_activations(33, 1000, torch.float32, device="cpu", seed=3)
    packed, scales = reference.per_token_cast_to_e5m6(x, ue8m0=ue8m0, scale_mode=scale_mode)
    assert packed.shape == (33, 375) and scales.shape == (33,)
    y = reference.per_token_cast_back_e5m6(packed, scales, torch.float32)
    # Six mantissa bits: half a step is 2^-7 of the value; subnormal codes 2^-21 of the scale.
    bound = torch.maximum(x.abs() * 2.0 ** -7, scales[:, None] * 2.0 ** -21) * (1 + 2.0 ** -20)
    assert ((y - x).abs() <= bound).all()


def test_reference_scale_modes_agree_with_power_of_two_scales():
    x = random_activations(16, 1024, torch.float32, device="cpu", seed=4)
    mul, div = (reference.per_token_cast_to_e5m6(x, ue8m0=True, scale_mode=mode) for mode in ("mul", "div"))
    assert_bitwise_equal(mul[0], div[0], "packed")
    assert_bitwise_equal(mul[1], div[1], "scales")


# ---- validation (CPU tensors: every check that precedes the device check) ----

@pytest.mark.parametrize("x,kwargs,error,match", [
    (torch.ones(4, 256, dtype=torch.float16), {}, TypeError, "x must be"),
    (torch.ones(256, dtype=torch.bfloat16), {}, ValueError, "x must be 2-D"),
    (torch.ones(4, 100, dtype=torch.bfloat16), {}, ValueError, "multiple of 8"),
    (torch.ones(4, 8 * 14337, dtype=torch.bfloat16), {}, ValueError, "too long"),
    (torch.ones(1, 8 * 7169, dtype=torch.float32), {}, ValueError, "too long"),
    (torch.ones(256, 4, dtype=torch.bfloat16).t(), {}, ValueError, "contiguous last dimension"),
    (torch.ones(4, 260, dtype=torch.bfloat16)[:, :256], {}, ValueError, "16-byte aligned"),
    (torch.ones(4, 256, dtype=torch.bfloat16), {"scale_mode": "exact"}, ValueError, "scale_mode must be one of"),
    (torch.ones(4, 256, dtype=torch.bfloat16), {"amax_clamp": -1.0}, ValueError, "amax_clamp"),
    (torch.ones(4, 256, dtype=torch.bfloat16), {"ue8m0": 0}, TypeError, "ue8m0 must be a bool"),
    (torch.ones(4, 256, dtype=torch.bfloat16), {}, ValueError, "must be a CUDA tensor"),
    ("not a tensor", {}, TypeError, "torch.Tensor"),
])
def test_cast_rejects_bad_input(x, kwargs, error, match):
    with pytest.raises(error, match=match):
        deep_kernels.per_token_cast_to_e5m6(x, **kwargs)


def test_rows_per_block_keep_outputs_aligned():
    for k in (8, 16, 24, 32, 1000, 7168, 8 * 4097):
        rows = rows_per_block(k)
        assert rows in (1, 2, 4) and rows * k % 32 == 0 and (rows == 1 or rows // 2 * k % 32 != 0)


def test_row_divisor_divides_every_group_index():
    # The cast-back's row of group g is (g * magic) >> shift: checked at every multiple of the divisor (and its
    # neighbours) up to 2^17 and near the largest group index, for small, power-of-two, odd and large divisors.
    for divisor in [*range(1, 300), 512, 896, 1000, 4095, 4097, 65535, 65536, 65537, 2**20 + 7, 2**30 + 3, 2**31 - 1]:
        magic, shift = row_divisor(divisor)
        assert 0 < magic < 2**32 and shift >= 31
        multiples = torch.arange(0, 2**17 // divisor + 2, dtype=torch.int64) * divisor
        top = torch.arange(MAX_GROUPS - 2**12, MAX_GROUPS, dtype=torch.int64)
        groups = torch.cat([multiples - 1, multiples, multiples + 1, top]).clamp(0, MAX_GROUPS - 1)
        assert torch.equal((groups * magic) >> shift, groups // divisor), divisor


@pytest.mark.parametrize("packed,scales,kwargs,error,match", [
    (torch.zeros(4, 12, dtype=torch.int64), torch.ones(4), {}, TypeError, "packed must be"),
    (torch.zeros(12, dtype=torch.int32), torch.ones(4), {}, ValueError, "packed must be 2-D"),
    (torch.zeros(4, 13, dtype=torch.int32), torch.ones(4), {}, ValueError, "multiple of 3"),
    (torch.zeros(12, 4, dtype=torch.int32).t(), torch.ones(4), {}, ValueError, "packed must be contiguous"),
    (torch.zeros(4, 12, dtype=torch.int32), torch.ones(4, dtype=torch.float64), {}, TypeError, "scales must be"),
    (torch.zeros(4, 12, dtype=torch.int32), torch.ones(4, 1), {}, ValueError, "scales must be a contiguous"),
    (torch.zeros(4, 12, dtype=torch.int32), torch.ones(4), {"out_dtype": torch.float16}, TypeError, "out_dtype"),
    (torch.zeros(4, 12, dtype=torch.int32), torch.ones(4), {}, ValueError, "packed must be a CUDA tensor"),
])
def test_cast_back_rejects_bad_input(packed, scales, kwargs, error, match):
    with pytest.raises(error, match=match):
        deep_kernels.per_token_cast_back_e5m6(packed, scales, **kwargs)


# ---- kernels against the reference (GPU) ----

def _special_rows(x: torch.Tensor) -> torch.Tensor:
    """Random rows with, among them: all-equal rows, an all-zero row, huge and tiny rows, rows holding
    subnormal FP32/bf16 values, -0, an infinity or a NaN."""
    x = x.clone()
    m, k = x.shape
    big, tiny = (1e30, 1e-30) if x.dtype == torch.float32 else (1e37, 1e-37)
    rows = {0: 1.5, 1: 0.0, 2: -big, 3: tiny, 4: -2.0 ** -20}
    if m > 7 * len(rows):  # distinct rows, random ones left over (a single row stays random)
        for i, value in rows.items():
            x[i * 7] = value
    if m > 40:
        x[11, : k // 2] = -0.0
        x[13, 1::2] = 1e-40 if x.dtype == torch.float32 else 1e-39  # subnormals among normal values
        x[17, 3] = math.inf
        x[19, k - 1] = -math.inf
        x[23, 0] = math.nan
        x[29, 1:] *= 2.0 ** -28                                   # scaled values below 2^-14: subnormal codes
    return x


# (7, 8): one group a row; 1000 and 24: the packed words end mid-vector and mid-tile (128 groups).
SHAPES = [(1, 128), (1, 1000), (4001, 128), (4001, 7168), (4001, 1000), (4001, 24), (7, 8)] + (
    [(1, 7168), (8001, 4096), (3, 8)] if FULL else [])
DTYPES = (torch.bfloat16, torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,dtype,ue8m0,scale_mode",
                         in_turns([(dtype, *variant) for variant in VARIANTS for dtype in DTYPES], SHAPES))
def test_cast_matches_reference(m, k, dtype, ue8m0, scale_mode):
    x = _special_rows(random_activations(m, k, dtype))
    kwargs = dict(ue8m0=ue8m0, scale_mode=scale_mode)
    packed_ref, scales_ref = reference.per_token_cast_to_e5m6(x, **kwargs)
    out = (poison_(torch.empty_like(packed_ref)), poison_(torch.empty_like(scales_ref)))
    packed, scales = deep_kernels.per_token_cast_to_e5m6(x, out=out, **kwargs)
    assert packed is out[0] and scales is out[1]
    assert_bitwise_equal(packed, packed_ref, "packed")
    assert_bitwise_equal(scales, scales_ref, "scales")
    again = deep_kernels.per_token_cast_to_e5m6(x, **kwargs)
    assert_bitwise_equal(again[0], packed_ref, "packed")
    assert_bitwise_equal(again[1], scales_ref, "scales")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,k", [(torch.bfloat16, 1000), (torch.float32, 7168)])
def test_cast_row_stride_and_clamp(dtype, k):
    x = random_activations(301, k + 64, dtype)[:, :k]  # row stride larger than K
    x[5] *= 1e-6
    for kwargs in (dict(), dict(amax_clamp=1e-2, ue8m0=True), dict(amax_clamp=1e-30, scale_mode="div")):
        poison_cached_memory()  # the outputs it allocates start poisoned
        packed, scales = deep_kernels.per_token_cast_to_e5m6(x, **kwargs)
        packed_ref, scales_ref = reference.per_token_cast_to_e5m6(x, **kwargs)
        assert_bitwise_equal(packed, packed_ref, "packed")
        assert_bitwise_equal(scales, scales_ref, "scales")


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,out_dtype", [(*shape, DTYPES[i % 2]) for i, shape in enumerate(SHAPES)])
def test_cast_back_matches_reference(m, k, out_dtype):
    # Every bit pattern is a valid packing: random words cover all 4096 codes (inf and NaN included), and
    # random scales include inf, NaN, zero and negative values.
    generator = torch.Generator(device="cuda").manual_seed(m * k)
    packed = torch.randint(-2**31, 2**31 - 1, (m, k * 3 // 8), dtype=torch.int32, device="cuda", generator=generator)
    scales = torch.randn(m, device="cuda", generator=generator) * 2.0 ** -10
    scales[::97] = math.inf
    scales[1::97] = math.nan
    scales[2::97] = 0.0
    out = poison_(torch.empty((m, k), dtype=out_dtype, device="cuda"))
    y = deep_kernels.per_token_cast_back_e5m6(packed, scales, out_dtype, out=out)
    assert y is out
    assert_bitwise_equal(y, reference.per_token_cast_back_e5m6(packed, scales, out_dtype), "y")
    x = _special_rows(random_activations(m, k, torch.bfloat16))
    packed, scales = deep_kernels.per_token_cast_to_e5m6(x)
    assert_bitwise_equal(deep_kernels.per_token_cast_back_e5m6(packed, scales, out_dtype),
                         reference.per_token_cast_back_e5m6(packed, scales, out_dtype), "y")


@pytest.mark.gpu
@pytest.mark.parametrize("ue8m0,scale_mode", VARIANTS)
def test_round_trip_has_no_rounding_bias(ue8m0, scale_mode):
    x = random_activations(4001, 1024, torch.float32)
    packed, scales = deep_kernels.per_token_cast_to_e5m6(x, ue8m0=ue8m0, scale_mode=scale_mode)
    y = deep_kernels.per_token_cast_back_e5m6(packed, scales, torch.float32)
    # The scaled values the kernel rounds, their rounded values, and the ties (where the FP32 neighbours
    # of a scaled value round apart), which round to even and are left out.
    amax = x.abs().amax(dim=1).clamp(min=1e-4)
    scale, multiplier = reference.scale_and_multiplier(amax, ue8m0, E5M6_MAX)
    assert torch.equal(scale, scales)
    scaled = x / scale[:, None] if scale_mode == "div" and not ue8m0 else x * multiplier[:, None]
    rounded = reference.e5m6_to_float(reference.unpack_e5m6(packed))
    ties = reference.round_to_e5m6(torch.nextafter(scaled, torch.zeros_like(scaled))) != reference.round_to_e5m6(
        torch.nextafter(scaled, scaled * 2))
    counted = (rounded != scaled) & ~ties & (y != x)
    n = int(counted.sum())
    assert n > x.numel() // 2
    for below in ((y < x), (y.abs() < x.abs())):
        share = float((below & counted).sum()) / n
        assert abs(share - 0.5) <= 10 / math.sqrt(n), share


@pytest.mark.gpu
def test_empty_input():
    for shape in ((0, 7168), (5, 0)):
        x = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
        packed, scales = deep_kernels.per_token_cast_to_e5m6(x)
        assert packed.shape == (shape[0], shape[1] * 3 // 8) and packed.dtype == torch.int32
        assert scales.shape == (shape[0],) and scales.dtype == torch.float32
        assert deep_kernels.per_token_cast_back_e5m6(packed, scales).shape == shape


@pytest.mark.gpu
def test_deterministic_and_graph_capturable():
    x = random_activations(1000, 7168, torch.bfloat16)
    packed, scales = deep_kernels.per_token_cast_to_e5m6(x)
    assert_bitwise_equal(deep_kernels.per_token_cast_to_e5m6(x)[0], packed, "packed")
    y = deep_kernels.per_token_cast_back_e5m6(packed, scales)
    out = (torch.empty_like(packed), torch.empty_like(scales))
    out_y = torch.empty_like(y)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        deep_kernels.per_token_cast_to_e5m6(x, out=out)
        deep_kernels.per_token_cast_back_e5m6(out[0], out[1], out=out_y)
    for _ in range(2):
        x.copy_(random_activations(1000, 7168, torch.bfloat16))  # new inputs, same buffers
        for t in (*out, out_y):
            poison_(t)
        graph.replay()
        torch.cuda.synchronize()
        packed_ref, scales_ref = reference.per_token_cast_to_e5m6(x)
        assert_bitwise_equal(out[0], packed_ref, "packed")
        assert_bitwise_equal(out[1], scales_ref, "scales")
        assert_bitwise_equal(out_y, reference.per_token_cast_back_e5m6(packed_ref, scales_ref), "y")


@pytest.mark.gpu
def test_bad_out_and_devices_are_rejected():
    x = random_activations(8, 256, torch.bfloat16)
    packed, scales = deep_kernels.per_token_cast_to_e5m6(x)
    with pytest.raises(ValueError, match="out\\[0\\] must be a contiguous tensor of shape"):
        deep_kernels.per_token_cast_to_e5m6(x, out=(packed[:4], scales))
    with pytest.raises(TypeError, match="out\\[1\\] must be torch.float32"):
        deep_kernels.per_token_cast_to_e5m6(x, out=(packed, scales.double()))
    shifted = torch.empty(8 * 96 + 1, dtype=torch.int32, device="cuda")[1:].view(8, 96)
    with pytest.raises(ValueError, match="out\\[0\\] must start at a 16-byte aligned address"):
        deep_kernels.per_token_cast_to_e5m6(x, out=(shifted, scales))
    with pytest.raises(TypeError, match="out\\[0\\] must be a torch.Tensor"):
        deep_kernels.per_token_cast_to_e5m6(x, out=(None, scales))
    with pytest.raises(TypeError, match="out must be a pair"):
        deep_kernels.per_token_cast_to_e5m6(x, out=(packed, scales, scales))
    with pytest.raises(ValueError, match="packed must start at a 16-byte aligned address"):
        deep_kernels.per_token_cast_back_e5m6(shifted, scales)
    with pytest.raises(ValueError, match="scales must be a CUDA tensor"):
        deep_kernels.per_token_cast_back_e5m6(packed, scales.cpu())
