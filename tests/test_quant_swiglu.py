"""SwiGLU fused with the per-token FP8 cast, its bf16 forward and its backward: the reference against
float64 formulations (CPU), input validation (CPU), and the kernels bit-exact against the reference
evaluated on the GPU (GPU: CUDA's expf, which torch.exp calls there, may differ from the CPU's exp in
the last bit)."""

import math
import struct
from fractions import Fraction
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import deep_kernels
from deep_kernels import quant
from deep_kernels.quant import swiglu
from deep_kernels.reference import quant as reference
from deep_kernels.testing import assert_bitwise_equal, empty_like_strided, poison_, random_activations

from conftest import FULL, csrc_source

LAYOUTS = [(False, "mn_major", "mul"), (False, "row_major", "mul"), (True, "mn_major", "mul"),
           (True, "row_major", "mul"), (True, "packed_ue8m0", "mul"), (False, "mn_major", "div")]
CLAMP = 7.0  # a bf16 value: the forward clamps the loaded bf16 pairs
FLOAT_CLAMP = 7.1  # not one: the forward clamps each element in FP32


def _rows(num_rows: int, option: str, device: str, seed: int = 0):
    """(clamp, weights, pos) of a row option: "plain", "clamp", "float_clamp" (a clamp bf16 does not hold),
    "weights" (one per row), "pos" (positions into top-k weights [T, 4] with about a fifth of the rows at -1),
    "pos_only" (no weights)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    clamp = {"clamp": CLAMP, "pos": CLAMP, "float_clamp": FLOAT_CLAMP}.get(option)
    if option in ("plain", "clamp", "float_clamp"):
        return clamp, None, None
    if option == "weights":
        return clamp, torch.rand((num_rows,), generator=generator, device=device) + 0.5, None
    num_tokens = max(1, num_rows // 2)
    pos = torch.randint(0, num_tokens * 4, (num_rows,), generator=generator, device=device, dtype=torch.int32)
    pos[torch.rand((num_rows,), generator=generator, device=device) < 0.2] = -1
    weights = torch.rand((num_tokens, 4), generator=generator, device=device) + 0.5
    return clamp, (None if option == "pos_only" else weights), pos


def _swiglu64(x: torch.Tensor, clamp, weights, pos) -> torch.Tensor:
    """y in float64 from torch.nn.functional.silu and torch.clamp: the independent formulation."""
    hidden = x.shape[-1] // 2
    gate, up = x[..., :hidden].double(), x[..., hidden:].double()
    if clamp is not None:
        gate, up = gate.clamp(max=clamp), up.clamp(-clamp, clamp)
    y = F.silu(gate) * up
    if weights is not None:
        index = torch.arange(x.shape[0]) if pos is None else pos.long().clamp(min=0)
        y = y * weights.double().reshape(-1)[index].unsqueeze(1)
    return y


# ---- the reference (CPU) ----

@pytest.mark.parametrize("option", ["plain", "clamp", "weights", "pos", "pos_only"])
def test_reference_forward_matches_float64(option):
    x = random_activations(67, 2 * 384, torch.bfloat16, device="cpu", seed=1)
    clamp, weights, pos = _rows(67, option, "cpu")
    valid = torch.ones(67, dtype=torch.bool) if pos is None else pos >= 0
    expected = _swiglu64(x, clamp, weights, pos)[valid]
    if clamp is not None:
        assert (x[:, :384].float() > clamp).any() and (x[:, 384:].float().abs() > clamp).any()  # clamps bite
    # bf16 output: one rounding of 2^-9 relative over a few FP32 ulps.
    y = reference.swiglu_forward(x, clamp, weights, pos, out=torch.full((67, 384), float("nan"), dtype=torch.bfloat16))
    assert ((y[valid].double() - expected).abs() <= expected.abs() * 2.0 ** -8 + 1e-30).all()
    assert y[~valid].isnan().all()  # skipped rows keep out's values
    # FP8 output, dequantized: half an e4m3 step, 2^-4 of the value, or 2^-10 of the group's scale below its normals.
    q, scales = reference.swiglu_cast_to_fp8(x, clamp, weights, pos, ue8m0=True, scale_layout="row_major")
    dequantized = reference.per_token_cast_back(q, scales, 128, torch.float32)[valid].double().view(-1, 3, 128)
    expected = expected.view(-1, 3, 128)
    group_scale = scales[valid].double().view(-1, 3, 1)
    bound = torch.maximum(expected.abs() * 2.0 ** -4, group_scale * 2.0 ** -10) * (1 + 1e-6)
    assert ((dequantized - expected).abs() <= bound).all()


def test_reference_special_values():
    x = torch.ones((6, 256), dtype=torch.bfloat16)
    x[0, 0], x[1, 0], x[2, 0], x[3, 128], x[4, 0], x[5, 0] = -math.inf, math.inf, math.nan, math.inf, 1e38, -1e38
    y = reference.swiglu_forward(x).float()
    assert math.isnan(y[0, 0]) and y[1, 0] == math.inf and math.isnan(y[2, 0])  # -inf / inf is NaN
    assert y[3, 0] == math.inf and y[4, 0] == x[4, 0].float()  # silu(g) = g / (1 + 0) for a huge g
    assert y[5, 0] == 0 and math.copysign(1, y[5, 0]) == -1  # silu(-1e38) = -1e38 / inf = -0
    assert torch.equal(y[:, 1:128], torch.full((6, 127), F.silu(torch.tensor(1.0)).item()).bfloat16().float())
    clamped = reference.swiglu_forward(x, clamp=2.0).float()
    assert math.isnan(clamped[0, 0]) and math.isnan(clamped[2, 0])  # -inf and NaN stay
    silu2 = F.silu(torch.tensor(2.0)).item()
    assert clamped[1, 0] == torch.tensor(silu2).bfloat16().float()  # inf gate clamped to 2
    assert clamped[3, 0] == torch.tensor(2 * F.silu(torch.tensor(1.0)).item()).bfloat16().float()  # inf up -> 2
    q, scales = reference.swiglu_cast_to_fp8(x, scale_layout="row_major")
    assert math.isnan(scales[0, 0]) and (q[0].view(torch.uint8) & 0x7F == 0x7F).all()  # a NaN poisons its group
    assert scales[1, 0] == math.inf and q[1, 0].view(torch.uint8) & 0x7F == 0x7F  # inf: its own code NaN
    assert (q[1, 1:].view(torch.uint8) == 0).all()  # the group's finite codes 0


def test_reference_masked_is_plain_per_expert():
    num_experts, max_tokens = 4, 9
    x = random_activations(num_experts * max_tokens, 2 * 640, torch.bfloat16, device="cpu", seed=2)
    x = x.view(num_experts, max_tokens, -1)
    masked_m = torch.tensor([0, 9, 5, 12], dtype=torch.int32)  # 12 > T_max counts as T_max
    weights = torch.rand(num_experts, max_tokens)
    for ue8m0, layout, mode in LAYOUTS:
        kwargs = dict(ue8m0=ue8m0, scale_layout=layout, scale_mode=mode)
        q, scales = reference.swiglu_cast_to_fp8_masked(x, masked_m, CLAMP, weights, **kwargs)
        assert q.shape == (num_experts, max_tokens, 640)
        for expert, count in enumerate([0, 9, 5, 9]):
            q_plain, scales_plain = reference.swiglu_cast_to_fp8(x[expert], CLAMP, weights[expert], **kwargs)
            assert_bitwise_equal(q[expert, :count], q_plain[:count], "q")
            assert_bitwise_equal(reference.unpack_scales(scales[expert], max_tokens, 5)[:count],
                                 reference.unpack_scales(scales_plain, max_tokens, 5)[:count], "scales")
            # Each expert's scales are laid out as per_token_cast_to_fp8 lays out T_max rows.
            assert scales[expert].stride() == scales_plain.stride() or max_tokens == 1


@pytest.mark.parametrize("option", ["plain", "clamp", "weights", "pos"])
def test_reference_backward_matches_autograd(option):
    num_rows, hidden = 41, 384
    x = random_activations(num_rows, 2 * hidden, torch.bfloat16, device="cpu", seed=3)
    dy = random_activations(num_rows, hidden, torch.bfloat16, device="cpu", seed=4)
    clamp, weights, pos = _rows(num_rows, option, "cpu")
    valid = torch.ones(num_rows, dtype=torch.bool) if pos is None else pos >= 0
    x64 = x.double().requires_grad_()
    w64 = (torch.ones(num_rows, dtype=torch.float64) if weights is None else
           weights.double().reshape(-1)[torch.arange(num_rows) if pos is None else pos.long().clamp(min=0)])
    w64.requires_grad_()
    gate, up = x64[:, :hidden], x64[:, hidden:]
    if clamp is not None:
        # The kernels' clamp passes the gradient at |x| == c (bf16 inputs can equal the bf16 clamp) and stops
        # it beyond. torch.clamp's subgradient at the kink is a release's choice (2.13 passes it at both
        # ends, 2.14 stops it), so the clamp is spelled with torch.where, whose gradient follows the branch.
        gate = torch.where(gate > clamp, clamp, gate)
        up = torch.where(up > clamp, clamp, torch.where(up < -clamp, -clamp, up))
    (F.silu(gate) * up * w64.unsqueeze(1) * dy.double()).sum().backward()

    out = (poison_(torch.empty(num_rows, 2 * hidden, dtype=torch.bfloat16)), poison_(torch.empty(num_rows)))
    dx, dweights = reference.swiglu_backward(x, dy, clamp, weights, pos, out=out)
    assert dx is out[0] and dweights is out[1]
    expected = x64.grad[valid]
    # dx is the bf16 rounding (relative error at most 2^-8, bf16's unit roundoff: 2^-8.01 measured) of an FP32
    # value whose own error, measured at most 4.6e-7 of the row's largest gradient, peaks where
    # gc * (1 - sigmoid) + 1 cancels; the second term covers it 20 times over.
    bound = expected.abs() * 2.0 ** -8 + 1e-5 * expected.abs().amax(dim=1, keepdim=True)
    assert ((dx[valid].double() - expected).abs() <= bound).all()
    terms = (F.silu(gate) * up * dy.double()).detach()[valid]
    assert ((dweights[valid].double() - w64.grad[valid]).abs() <= 64 * 2.0 ** -24 * terms.abs().sum(dim=1)).all()
    if clamp is not None:
        gate_in, up_in = x[valid, :hidden].float(), x[valid, hidden:].float()
        assert (gate_in > clamp).any() and (dx[valid, :hidden][gate_in > clamp] == 0).all()
        assert (dx[valid, hidden:][up_in.abs() > clamp] == 0).all()
        # Inputs at the clamp itself, whose gradients the bound above checked (they pass, not 0).
        assert (gate_in == clamp).any() and (up_in.abs() == clamp).any()
    assert dx[~valid].isnan().all() and dweights[~valid].isnan().all()  # skipped rows keep the poison


def test_reference_backward_row_sum_order():
    from deep_kernels.reference.quant.swiglu import _row_sums

    # Lane 0 element 0 holds 2^24 (chunk 0) then 1 (chunk 1): its running sum rounds 2^24 + 1 to 2^24
    # (ties to even); its element 1 holds 1, lost again when the elements pair up; lane 1 adds 2 exactly.
    values = torch.zeros((1, 512))
    values[0, 0], values[0, 256], values[0, 1], values[0, 8] = 2.0 ** 24, 1.0, 1.0, 2.0
    assert _row_sums(values).item() == 2.0 ** 24 + 2
    assert values.double().sum().item() == 2.0 ** 24 + 4
    # 2H = 384: the last chunk's half of the lanes hold no columns.
    values = torch.arange(2 * 384, dtype=torch.float32).view(2, 384)
    assert torch.equal(_row_sums(values), values.double().sum(dim=1).float())  # small integers: exact


# ---- validation (CPU tensors: every check that precedes the device check) ----

_X = torch.ones(4, 512, dtype=torch.bfloat16)


@pytest.mark.parametrize("args,kwargs,error,match", [
    ((_X.half(),), {}, TypeError, "x must be torch.bfloat16"),
    ((_X.float(),), {}, TypeError, "x must be torch.bfloat16"),
    ((_X[0],), {}, ValueError, "x must be 2-D"),
    ((torch.ones(4, 384, dtype=torch.bfloat16),), {}, ValueError, "H a multiple of 128"),
    ((torch.ones(4, 257, dtype=torch.bfloat16),), {}, ValueError, "H a multiple of 128"),
    ((torch.ones(512, 4, dtype=torch.bfloat16).t(),), {}, ValueError, "contiguous last dimension"),
    ((torch.ones(4, 516, dtype=torch.bfloat16)[:, :512],), {}, ValueError, "16-byte aligned"),
    ((_X,), {"clamp": 0.0}, ValueError, "clamp must be None or a positive finite FP32 number"),
    ((_X,), {"clamp": math.inf}, ValueError, "clamp must be None or a positive finite FP32 number"),
    ((_X,), {"clamp": True}, ValueError, "clamp must be None or a positive finite FP32 number"),
    ((_X,), {"clamp": 1e39}, ValueError, "clamp must be None or a positive finite FP32 number"),  # inf in FP32
    ((_X,), {"check_pos": 1}, TypeError, "check_pos must be a bool"),
    ((_X,), {"weights": torch.ones(4, dtype=torch.float64)}, TypeError, "weights must be torch.float32"),
    ((_X,), {"weights": torch.ones(5)}, ValueError, "one weight per row"),
    ((_X,), {"weights": torch.ones(4, 2).t()}, ValueError, "weights must be contiguous"),
    ((_X,), {"pos": torch.zeros(4, dtype=torch.int64)}, TypeError, "pos must be torch.int32"),
    ((_X,), {"pos": torch.zeros(5, dtype=torch.int32)}, ValueError, "pos must be a contiguous tensor of shape"),
    ((_X,), {"weights": torch.ones(8), "pos": torch.tensor([0, 7, 8, -1], dtype=torch.int32)}, ValueError,
     r"pos must hold -1 \(a skipped row\) or positions in \[0, 8\), got 8 for row 2"),
    ((_X,), {"weights": torch.ones(8), "pos": torch.tensor([0, -2, 1, -1], dtype=torch.int32)}, ValueError,
     "got -2 for row 1"),
    ((_X,), {"pos": torch.tensor([0, -2, 1, -1], dtype=torch.int32)}, ValueError, "got -2 for row 1"),
    ((_X,), {"scale_layout": "col"}, ValueError, "scale_layout must be"),
    ((_X,), {"scale_layout": "packed_ue8m0"}, ValueError, "needs ue8m0"),
    ((_X,), {"amax_clamp": 0.0}, ValueError, "amax_clamp"),
    ((_X,), {"scale_mode": "exact"}, ValueError, "scale_mode must be one of"),
    ((_X,), {}, ValueError, "x must be a CUDA tensor"),
    ((_X,), {"weights": torch.ones(8), "pos": torch.tensor([0, 7, 8, -1], dtype=torch.int32), "check_pos": False},
     ValueError, "x must be a CUDA tensor"),
    (("not a tensor",), {}, TypeError, "x must be a torch.Tensor"),
])
def test_forward_rejects_bad_input(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        deep_kernels.swiglu_cast_to_fp8(*args, **kwargs)
    if not {"scale_layout", "amax_clamp", "scale_mode"} & kwargs.keys():
        with pytest.raises(error, match=match):
            deep_kernels.swiglu_forward(*args, **kwargs)


_XM = torch.ones(3, 5, 512, dtype=torch.bfloat16)
_M = torch.tensor([1, 5, 0], dtype=torch.int32)


@pytest.mark.parametrize("args,kwargs,error,match", [
    ((_X, _M), {}, ValueError, "x must be 3-D"),
    ((torch.ones(3, 5, 384, dtype=torch.bfloat16), _M), {}, ValueError, "H a multiple of 128"),
    ((torch.ones(3, 6, 512, dtype=torch.bfloat16)[:, :5], _M), {}, ValueError, "experts must follow one another"),
    ((torch.ones(3, 1, 516, dtype=torch.bfloat16)[..., :512], _M), {}, ValueError, "16-byte aligned"),
    ((_XM, _M.long()), {}, TypeError, "masked_m must be torch.int32"),
    ((_XM, _M[:2]), {}, ValueError, r"masked_m must be a contiguous tensor of shape \(3,\)"),
    ((_XM, _M), {"weights": torch.ones(14)}, ValueError, r"one weight per row \(15\)"),
    ((_XM, _M), {"pos": torch.zeros(15, dtype=torch.int32)}, ValueError, r"of shape \(3, 5\)"),
    ((_XM, _M), {"weights": torch.ones(2), "pos": torch.full((3, 5), 2, dtype=torch.int32)}, ValueError,
     r"positions in \[0, 2\), got 2 for row 0"),
    ((_XM, _M), {"scale_layout": "packed_ue8m0"}, ValueError, "needs ue8m0"),
    ((_XM, _M), {}, ValueError, "x must be a CUDA tensor"),
])
def test_masked_rejects_bad_input(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        deep_kernels.swiglu_cast_to_fp8_masked(*args, **kwargs)


@pytest.mark.parametrize("args,kwargs,error,match", [
    ((_X, torch.ones(4, 256)), {}, TypeError, "dy must be torch.bfloat16"),
    ((_X, torch.ones(4, 512, dtype=torch.bfloat16)), {}, ValueError, r"dy must have shape \(4, 256\)"),
    ((_X, torch.ones(256, 4, dtype=torch.bfloat16).t()), {}, ValueError, "dy must have a contiguous last"),
    ((_X.half(), torch.ones(4, 256, dtype=torch.bfloat16)), {}, TypeError, "x must be torch.bfloat16"),
    ((_X[:, :384], torch.ones(4, 192, dtype=torch.bfloat16)), {}, ValueError, "H a multiple of 128"),
    ((_X, torch.ones(4, 256, dtype=torch.bfloat16)), {"clamp": -1.0}, ValueError, "clamp must be"),
    ((_X, torch.ones(4, 256, dtype=torch.bfloat16)), {"weights": torch.ones(3)}, ValueError, "one weight per row"),
    ((_X, torch.ones(4, 256, dtype=torch.bfloat16)), {"pos": torch.full((4,), -3, dtype=torch.int32)}, ValueError,
     "got -3 for row 0"),
    ((_X, torch.ones(4, 256, dtype=torch.bfloat16)), {}, ValueError, "x must be a CUDA tensor"),
])
def test_backward_rejects_bad_input(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        deep_kernels.swiglu_backward(*args, **kwargs)


# ---- the kernels' fast division (CPU): every step evaluated exactly over its whole gate range ----

def _round_to_float32(x: Fraction, toward_zero: bool = False) -> Fraction:
    """x rounded to the nearest FP32 value, ties to even, or toward zero (subnormals included, no overflow)."""
    if x == 0:
        return x
    magnitude = abs(x)
    exponent = max(magnitude.numerator.bit_length() - magnitude.denominator.bit_length(), -126)
    if exponent > -126 and Fraction(2) ** exponent > magnitude:
        exponent -= 1  # now 2^exponent <= |x| < 2^(exponent + 1), or the subnormal scale
    step = Fraction(2) ** (exponent - 23)
    units, remainder = divmod(magnitude / step, 1)
    if not toward_zero and (remainder > Fraction(1, 2) or (remainder == Fraction(1, 2) and units % 2 == 1)):
        units += 1
    return (units if x > 0 else -units) * step


def _float32_neighbours(x: Fraction, ulps: int) -> list:
    """The positive FP32 values at most `ulps` steps from the one nearest to the positive x."""
    bits = struct.unpack("<I", struct.pack("<f", float(_round_to_float32(x))))[0]
    return [Fraction(struct.unpack("<f", struct.pack("<I", b))[0]) for b in range(bits - ulps, bits + ulps + 1)]


def _refined_reciprocal(d: Fraction, estimate: Fraction) -> Fraction:
    """refined_reciprocal of csrc/common/swiglu.cuh from an rcp.approx estimate: one Newton step in FMAs."""
    return _round_to_float32(estimate * _round_to_float32(1 - d * estimate) + estimate)


def _divide(a: Fraction, d: Fraction, r: Fraction) -> Fraction:
    """divide_by_scale(a, d, r) of csrc/common/quant.cuh, each FMA and product rounded once."""
    q = _round_to_float32(a * r)
    return _round_to_float32(q - r * _round_to_float32(d * q - a))


def _bf16_value(bits: int) -> Fraction:
    return Fraction(torch.tensor(bits - (bits >> 15 << 16), dtype=torch.int16).view(torch.bfloat16).item())


def test_fast_division_is_ieee_over_its_gate_range():
    # The kernels' fast range (GateRange::fast), and every bf16 gate in it (a sample without DK_FULL_TEST):
    # for each d = 1 + e with e any FP32 within 2 ulp of exp(-g) (CUDA's expf bound) and each rcp.approx
    # estimate within 2 ulp of 1 / d, the quotients g / d and 1 / d are the correctly rounded ones.
    source = csrc_source("common/swiglu.cuh")
    assert "smallest >= 0x1p-20f && largest <= 64.0f" in source
    magnitudes = torch.arange(0x3580, 0x4281, 1 if FULL else 7, dtype=torch.int32)  # [2^-20, 64]
    assert magnitudes[0] == 0x3580 and torch.tensor(0x3580, dtype=torch.int16).view(torch.bfloat16) == 2.0**-20
    checked = 0
    for bits in magnitudes.tolist() + [0x4280]:
        for gate in (bits, bits | 0x8000):
            g = _bf16_value(gate)
            for e in _float32_neighbours(Fraction(math.exp(-g)), 2):
                d = _round_to_float32(1 + e)
                for estimate in _float32_neighbours(1 / d, 2):
                    for a in (g, Fraction(1)):
                        assert _divide(a, d, _refined_reciprocal(d, estimate)) == _round_to_float32(a / d), \
                            (gate, d, estimate, a)
                        checked += 1
    assert checked > (30000 if FULL else 4000)


def test_forward_fast_silu_is_ieee_over_its_gate_range():
    # fast_silu's steps (no Newton step, on gate / 4 and d / 4) for every finite bf16 gate from 2^-20 in magnitude
    # (GatePairRange; a sample without DK_FULL_TEST): for each e = expf(-g) within 2 ulp of exp(-g) and each
    # rcp.approx estimate within 2 ulp of 4 / d, the quotient is the correctly rounded g / RN(1 + e). From 20 up e is
    # below 2^-28, so d = 1 whatever expf returns; below about -88.72 expf is inf and the steps give -0 (the
    # clamped d / 4 = FLT_MAX has the estimate 0: q0 = -0, and the correction adds 0 * (-g / 4)). -inf and NaN
    # gates, which the range lets through too, give NaN (q0 = -inf * 0, NaN * 0), as the division does; +inf (inf -
    # inf in the residual) is kept out unless a clamp bounds the gates. test_every_bf16_gate_matches_reference runs
    # every bf16 gate, these included, through the kernels.
    source = csrc_source("common/swiglu.cuh")
    assert "return __hbge2(smallest, __float2bfloat162_rn(0x1p-20f)) &&" in source
    assert "(kBounded || __hblt2(largest, __float2bfloat162_rn(__int_as_float(0x7f800000))))" in source
    assert "fminf(__fmaf_rn(expf(-gate), 0.25f, 0.25f), 0x1.fffffep127f)" in source
    largest = 0x7F7F  # bf16's largest finite magnitude
    band = [0x42AF, 0x42B0, 0x42B1]  # 87.5, 88 and 88.5: the largest finite d (from 2^126 up)
    checked = 0
    for bits in list(range(0x3580, largest, 1 if FULL else 11)) + band + [largest]:  # magnitudes from 2^-20
        for gate in (bits, bits | 0x8000):
            g = _bf16_value(gate)
            if -g > Fraction(8873, 100):
                continue
            exponentials = [Fraction(0)] if g >= 20 else _float32_neighbours(Fraction(math.exp(-g)), 2)
            for e in exponentials:
                quarter_d = _round_to_float32(e / 4 + Fraction(1, 4))
                assert quarter_d < 2**126
                for estimate in _float32_neighbours(1 / quarter_d, 2):
                    assert _divide(g / 4, quarter_d, estimate) == _round_to_float32(g / _round_to_float32(1 + e)), \
                        (gate, e, estimate)
                    checked += 1
    assert checked > (200000 if FULL else 20000)


def _reciprocals(divisor: Fraction) -> list:
    """ScaledSigmoidDenominator.r for a positive divisor: the exact RN(1 / divisor) for an all-ones significand,
    else the refined rcp.approx of each estimate within 2 ulp of 1 / divisor."""
    exponent = divisor.numerator.bit_length() - divisor.denominator.bit_length()
    if Fraction(2) ** exponent > divisor:
        exponent -= 1
    if divisor == Fraction(2) ** (exponent + 1) - Fraction(2) ** (exponent - 23):
        return [Fraction(2) ** -(exponent + 1) * (1 + Fraction(2) ** -23)]
    return [_refined_reciprocal(divisor, estimate) for estimate in _float32_neighbours(1 / divisor, 2)]


def _scaled_quotients(g: Fraction, d: Fraction, r: Fraction) -> tuple:
    """ScaledSigmoidDenominator(g).silu(g) and .sigmoid() of csrc/common/swiglu.cuh for a finite d and its r,
    each FMA and product rounded once."""
    scale = Fraction(2) ** 64
    huge, tiny = d >= scale, abs(g) < 1 / scale
    divisor = d / scale if huge else d
    q = _divide(g * scale if tiny else g, divisor, r)
    silu = _round_to_float32(q / scale) if huge or tiny else q
    q = _divide(Fraction(1), divisor, r)
    truncated = _round_to_float32(q / scale, toward_zero=True)
    residual = _round_to_float32(1 - truncated * scale * divisor)
    sigmoid = _round_to_float32(_round_to_float32(residual / scale) * r + truncated) if huge else q
    return silu, sigmoid


def test_scaled_division_is_ieee_for_every_bf16_gate():
    # ScaledSigmoidDenominator.silu and .sigmoid of csrc/common/swiglu.cuh for every finite nonzero bf16 gate
    # with a finite d (a sample without DK_FULL_TEST, which keeps every gate of the scaled ranges): for each
    # d = 1 + e with e any FP32 within 2 ulp of exp(-g) and each rcp.approx estimate within 2 ulp, the
    # quotients are the correctly rounded g / d and 1 / d; for the tiny gates (below 2^-64) e = 1, where
    # exp(-g) lies within 2^-64 of 1. Zeros (signs kept by the residual's order), infinities, NaN and an
    # infinite d are IEEE special cases: the GPU test of every bf16 gate checks them and the real expf.
    source = csrc_source("common/swiglu.cuh")
    assert "huge(d >= 0x1p64f)" in source and "fabsf(gate) < 0x1p-64f" in source
    scale = Fraction(2) ** 64
    checked = scaled = subnormal = 0
    for bits in range(1, 0x7f80):
        for gate in (bits, bits | 0x8000):
            g = _bf16_value(gate)
            tiny = abs(g) < 1 / scale
            if -g > Fraction(885, 10) or not (FULL or tiny or -g > 44 or bits % 23 == 0):
                continue  # from -89 on expf(-g) is inf
            e_center = Fraction(math.exp(-float(g)))
            for e in ([1] if tiny else _float32_neighbours(e_center, 2) if e_center > 2.0**-140 else [e_center]):
                d = _round_to_float32(1 + e)
                for r in _reciprocals(d / scale if d >= scale else d):
                    silu, sigmoid = _scaled_quotients(g, d, r)
                    assert (silu, sigmoid) == (_round_to_float32(g / d), _round_to_float32(1 / d)), (hex(gate), d, r)
                    checked += 1
                    scaled += d >= scale or tiny
                    subnormal += d > 2**126
    assert scaled > 10000 and subnormal >= 75 and checked > (500000 if FULL else 60000)


def test_kernels_are_precompiled():
    specs = {(spec.name, spec.template_args) for spec in quant.precompile_specs()}
    names = {name for name, _ in specs}
    assert {"smxx_swiglu_cast", "smxx_swiglu_backward"} <= names
    # Every variant the tests run, without a clamp, with a bf16 one and with another: 6 quantized layouts and
    # modes in both structures (FORWARD, FEW_ROWS_FORWARD), and the bf16 output.
    assert sum(name == "smxx_swiglu_cast" for name, _ in specs) == 3 * (2 * len(LAYOUTS) + 1)
    assert sum(name == "smxx_swiglu_backward" for name, _ in specs) == 2


def test_bf16_clamps_take_the_pair_kernels():
    # A clamp that bf16 holds exactly is applied to the loaded bf16 pairs (the same values as FP32 min and max).
    assert all(map(swiglu._is_bf16, (CLAMP, 100.0, 2.0**-100, 2.0**-133)))  # 2^-133: a bf16 subnormal
    assert not any(map(swiglu._is_bf16, (FLOAT_CLAMP, 0.3, 3e-30, 1e30, 1e39)))  # 1e39: beyond FP32
    assert all(swiglu._is_bf16(v) == (torch.tensor(v, dtype=torch.bfloat16).item() == v)
               for v in (CLAMP, FLOAT_CLAMP, 2.0**-133, 2.0**-140, 1e-45, 3.3895313892515355e38, 3.4e38))


def test_structures_and_their_geometry():
    assert swiglu.FORWARD == swiglu.ForwardConfig(rows_per_warp=1, passes=2, in_flight=2, range_check=True, min_blocks=0)
    assert swiglu.ForwardConfig(passes=4) == swiglu.ForwardConfig(passes=4, in_flight=4)
    # 4 rows a warp in each pass.
    assert swiglu.ForwardConfig(rows_per_warp=4, passes=4).block_rows == 4 * swiglu.NUM_WARPS * 4
    assert swiglu.ForwardConfig(passes=1).block_rows == swiglu.NUM_WARPS
    assert (swiglu.ForwardConfig(rows_per_warp=4).block_columns, swiglu.FORWARD.block_columns) == (128, 512)
    assert swiglu.BACKWARD == swiglu.BackwardConfig(chunks_ahead=1, min_blocks=4)
    # Decode-sized inputs (fewer of FORWARD's blocks than SMs) take FEW_ROWS_FORWARD: 4 warps, one row a thread.
    assert swiglu.FEW_ROWS_FORWARD.block_rows == 4 and swiglu.FEW_ROWS_FORWARD.block_columns == 512


@pytest.mark.parametrize("num_sms", [132, 78])
def test_forward_structure_by_grid_size(num_sms, monkeypatch):
    from deep_kernels import device

    monkeypatch.setattr(device, "_num_sms_override", num_sms)
    assert swiglu.forward_config(128, 2048) == swiglu.FEW_ROWS_FORWARD  # 4 x 8 blocks of FORWARD
    assert swiglu.forward_config(4096, 2048) == swiglu.FORWARD
    assert swiglu.forward_config(1, 7168) == swiglu.FEW_ROWS_FORWARD
    # The switch: FORWARD's grid (14 column blocks at H = 7168) reaches the SM count.
    row_blocks = -(-num_sms // 14)
    assert swiglu.forward_config(row_blocks * swiglu.FORWARD.block_rows, 7168) == swiglu.FORWARD
    assert swiglu.forward_config((row_blocks - 1) * swiglu.FORWARD.block_rows, 7168) == swiglu.FEW_ROWS_FORWARD


def test_benchmark_cases_build_on_cpu():
    from deep_kernels.benchmarks import quant_swiglu

    for label, options, with_rows, op in quant_swiglu.CASES:
        backward = op == "swiglu_backward"
        args, kwargs = quant_swiglu._arguments(64, 256, options, with_rows, backward, device="cpu")
        outputs = getattr(reference, op)(*args, **kwargs)
        assert all(t.shape[0] == 64 for t in outputs), label
        assert quant_swiglu._num_bytes(64, 256, with_rows, backward, options) > 64 * 256 * 5


def test_variant_harness_builds_on_cpu():
    # scripts/bench_swiglu_variants.py holds the candidate structures (neither precompiled nor tested on the GPU).
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "scripts" / "bench_swiglu_variants.py"
    module_spec = importlib.util.spec_from_file_location("bench_swiglu_variants", path)
    bench = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(bench)
    assert {op for *_, op in bench.CASES} == set(bench.VARIANTS)
    for label, options, with_rows, op in bench.CASES:
        for data in bench.INPUTS:
            args, kwargs = bench._arguments(64, 256, options, with_rows, op == "swiglu_backward", data, device="cpu")
            outputs = getattr(reference, op)(*args, **kwargs)
            assert outputs[0].shape[0] == 64 and args[0].dtype == torch.bfloat16, (label, data)
    # The first variant is the API's structure; every variant is a distinct kernel.
    assert next(iter(bench.FORWARD_VARIANTS.values())) == swiglu.FORWARD
    assert next(iter(bench.BACKWARD_VARIANTS.values())) == swiglu.BACKWARD
    assert len({swiglu._forward_spec(c, False, True) for c in bench.FORWARD_VARIANTS.values()}) == \
        len(bench.FORWARD_VARIANTS)
    assert bench.parse_structure("passes=4,range_check=0", swiglu.ForwardConfig) == \
        swiglu.ForwardConfig(passes=4, range_check=False)
    assert bench.parse_structure("chunks_ahead=2", swiglu.BackwardConfig) == swiglu.BackwardConfig(chunks_ahead=2)
    with pytest.raises(ValueError, match="expected"):
        bench.parse_structure("stages=2", swiglu.ForwardConfig)


# ---- kernels against the reference evaluated on the GPU ----

def _special_rows(x: torch.Tensor) -> torch.Tensor:
    """Rows with infinities, NaN, huge and tiny magnitudes in the gate or up half, among random rows."""
    x = x.clone()
    hidden = x.shape[1] // 2
    specials = [(0, math.inf), (0, -math.inf), (0, math.nan), (hidden, math.inf), (hidden, -math.inf),
                (hidden, math.nan), (0, 3e38), (0, -3e38), (hidden, 3e38), (0, 1e-39), (hidden, -1e-39)]
    for i, (half, value) in enumerate(specials[: x.shape[0]]):
        row = i * 7 % x.shape[0]
        x[row, half + 3 * (i + 1)] = value
    return x


def _copy_strided(t: torch.Tensor) -> torch.Tensor:
    return empty_like_strided(t).copy_(t)


def _check_against_reference(op: str, args: tuple, kwargs: dict, outputs: tuple) -> None:
    """The kernel `op` writes its reference's bytes into poisoned out= tensors shaped and strided like
    `outputs` (rows it skips keep the poison in both), the same on a second run (deterministic)."""
    single = len(outputs) == 1
    as_tuple = lambda result: (result,) if single else tuple(result)
    as_out = lambda tensors: tensors[0] if single else tensors
    poisoned = lambda: tuple(poison_(empty_like_strided(t)) for t in outputs)
    expected = as_tuple(getattr(reference, op)(*args, **kwargs, out=as_out(poisoned())))
    for run in range(2):
        kernel_out = poisoned()
        actual = as_tuple(getattr(deep_kernels, op)(*args, **kwargs, out=as_out(kernel_out)))
        for index, (a, out, e) in enumerate(zip(actual, kernel_out, expected)):
            assert a is out
            assert_bitwise_equal(a, e, f"{op} output {index} (run {run})")


SHAPES = [(1, 7168), (4001, 7168), (257, 384)] + ([(8001, 2048), (3, 128)] if FULL else [])
OPTIONS = ["plain", "clamp", "float_clamp", "weights", "pos", "pos_only"]


@pytest.mark.gpu
@pytest.mark.parametrize("num_rows,hidden", SHAPES)
@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("ue8m0,layout,scale_mode", LAYOUTS)
def test_cast_matches_reference(num_rows, hidden, option, ue8m0, layout, scale_mode):
    x = _special_rows(random_activations(num_rows, 2 * hidden, torch.bfloat16))
    clamp, weights, pos = _rows(num_rows, option, "cuda")
    kwargs = dict(ue8m0=ue8m0, scale_layout=layout, scale_mode=scale_mode)
    q, scales = deep_kernels.swiglu_cast_to_fp8(x, clamp, weights, pos, **kwargs)  # allocated outputs
    # Allocated outputs: the reference writes over a copy (rows skipped keep the same garbage in both).
    q_ref, scales_ref = reference.swiglu_cast_to_fp8(x, clamp, weights, pos, **kwargs,
                                                     out=(_copy_strided(q), _copy_strided(scales)))
    assert_bitwise_equal(q, q_ref, "q")
    assert_bitwise_equal(scales, scales_ref, "scales")
    _check_against_reference("swiglu_cast_to_fp8", (x, clamp, weights, pos), kwargs, (q, scales))


@pytest.mark.gpu
@pytest.mark.parametrize("num_rows,hidden", SHAPES)
@pytest.mark.parametrize("option", OPTIONS)
def test_bf16_forward_matches_reference(num_rows, hidden, option):
    x = _special_rows(random_activations(num_rows, 2 * hidden, torch.bfloat16))
    clamp, weights, pos = _rows(num_rows, option, "cuda")
    y = deep_kernels.swiglu_forward(x, clamp, weights, pos)
    assert y.shape == (num_rows, hidden) and y.dtype == torch.bfloat16 and y.is_contiguous()
    _check_against_reference("swiglu_forward", (x, clamp, weights, pos), {}, (y,))


@pytest.mark.gpu
@pytest.mark.parametrize("ue8m0,layout,scale_mode", LAYOUTS)
def test_cast_row_stride_and_moe_layout(ue8m0, layout, scale_mode):
    # Rows of the contiguous MoE layout: row_to_slot maps rows to top-k slots, -1 on padding rows.
    topk_idx = torch.randint(0, 8, (301, 4), device="cuda", dtype=torch.int32)
    moe = deep_kernels.moe_layout(topk_idx, 8)
    topk_weights = torch.rand((301, 4), device="cuda")
    num_rows = moe.row_to_slot.shape[0]
    x = random_activations(num_rows, 2 * 1024 + 64, torch.bfloat16)[:, :2048]  # row stride > 2H
    assert (moe.row_to_slot == -1).any()
    _check_against_reference("swiglu_cast_to_fp8", (x, None, topk_weights, moe.row_to_slot),
                   dict(ue8m0=ue8m0, scale_layout=layout, scale_mode=scale_mode),
                   deep_kernels.swiglu_cast_to_fp8(x, None, topk_weights, moe.row_to_slot, ue8m0=ue8m0,
                                                   scale_layout=layout, scale_mode=scale_mode))


@pytest.mark.gpu
def test_unchecked_positions_out_of_range_are_skipped():
    x = random_activations(64, 512, torch.bfloat16)
    weights = torch.rand(16, device="cuda")
    pos = torch.arange(64, device="cuda", dtype=torch.int32) - 24  # -24 .. 39: only 0 .. 15 in range
    with pytest.raises(ValueError, match=r"positions in \[0, 16\), got -24 for row 0"):
        deep_kernels.swiglu_cast_to_fp8(x, weights=weights, pos=pos)
    q, scales = deep_kernels.swiglu_cast_to_fp8(x, weights=weights, pos=pos.clamp(-1, 15))
    _check_against_reference("swiglu_cast_to_fp8", (x,), dict(weights=weights, pos=pos.clamp(-1, 15)), (q, scales))
    out = (poison_(torch.empty_like(q)), poison_(empty_like_strided(scales)))
    deep_kernels.swiglu_cast_to_fp8(x, weights=weights, pos=pos, check_pos=False, out=out)
    in_range = (pos >= 0) & (pos < 16)
    assert torch.equal(out[0].view(torch.uint8)[in_range], q.view(torch.uint8)[in_range])
    assert (out[0].view(torch.uint8)[~in_range] == 0xFF).all()
    assert_bitwise_equal(out[1][in_range], scales[in_range], "scales")
    assert out[1][~in_range].isnan().all()


def _masked_inputs(num_experts: int, max_tokens: int, hidden: int, with_weights: bool):
    x = _special_rows(random_activations(num_experts * max_tokens, 2 * hidden, torch.bfloat16))
    x = x.view(num_experts, max_tokens, 2 * hidden)
    if not with_weights:
        return x, None, None
    weights = torch.rand((num_experts * max_tokens // 2 + 1, 2), device="cuda")
    pos = torch.randint(0, weights.numel(), (num_experts, max_tokens), device="cuda", dtype=torch.int32)
    pos[:, 1::5] = -1
    return x, weights, pos


@pytest.mark.gpu
@pytest.mark.parametrize("ue8m0,layout,scale_mode", LAYOUTS)
@pytest.mark.parametrize("with_weights", [False, True])
@pytest.mark.parametrize("clamp", [None, CLAMP])
def test_masked_matches_reference(ue8m0, layout, scale_mode, with_weights, clamp):
    num_experts, max_tokens, hidden = 6, 301, 640
    x, weights, pos = _masked_inputs(num_experts, max_tokens, hidden, with_weights)
    masked_m = torch.tensor([0, 301, 17, 129, 1, 500], device="cuda", dtype=torch.int32)
    kwargs = dict(ue8m0=ue8m0, scale_layout=layout, scale_mode=scale_mode)
    q, scales = deep_kernels.swiglu_cast_to_fp8_masked(x, masked_m, clamp, weights, pos, **kwargs)
    assert q.shape == (num_experts, max_tokens, hidden) and q.is_contiguous()
    _check_against_reference("swiglu_cast_to_fp8_masked", (x, masked_m, clamp, weights, pos), kwargs, (q, scales))
    # Rows past masked_m are untouched: expert 0 entirely, expert 2 from row 17.
    out = (poison_(torch.empty_like(q)), poison_(empty_like_strided(scales)))
    deep_kernels.swiglu_cast_to_fp8_masked(x, masked_m, clamp, weights, pos, **kwargs, out=out)
    assert (out[0][0].view(torch.uint8) == 0xFF).all() and (out[0][2, 17:].view(torch.uint8) == 0xFF).all()


@pytest.mark.gpu
def test_masked_graph_replay_with_new_counts():
    num_experts, max_tokens, hidden = 4, 200, 1024
    x, weights, pos = _masked_inputs(num_experts, max_tokens, hidden, True)
    masked_m = torch.tensor([3, 200, 0, 77], device="cuda", dtype=torch.int32)
    kwargs = dict(clamp=CLAMP, weights=weights, pos=pos, ue8m0=True, scale_layout="packed_ue8m0")
    q, scales = deep_kernels.swiglu_cast_to_fp8_masked(x, masked_m, **kwargs)
    out = (empty_like_strided(q), empty_like_strided(scales))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        deep_kernels.swiglu_cast_to_fp8_masked(x, masked_m, **kwargs, check_pos=False, out=out)
    for counts in ([3, 200, 0, 77], [200, 0, 199, 1], [0, 0, 0, 0]):
        masked_m.copy_(torch.tensor(counts, dtype=torch.int32))
        x.copy_(random_activations(num_experts * max_tokens, 2 * hidden).view_as(x))
        expected = reference.swiglu_cast_to_fp8_masked(
            x, masked_m, **kwargs, out=(poison_(empty_like_strided(q)), poison_(empty_like_strided(scales))))
        poison_(out[0])
        poison_(out[1])
        graph.replay()
        torch.cuda.synchronize()
        assert_bitwise_equal(out[0], expected[0], "q")
        assert_bitwise_equal(out[1], expected[1], "scales")


BACKWARD_SHAPES = [(1, 7168), (4001, 7168), (257, 384), (33, 128)] + ([(8001, 2048)] if FULL else [])


@pytest.mark.gpu
@pytest.mark.parametrize("num_rows,hidden", BACKWARD_SHAPES)
@pytest.mark.parametrize("option", OPTIONS)
def test_backward_matches_reference(num_rows, hidden, option):
    x = _special_rows(random_activations(num_rows, 2 * hidden, torch.bfloat16))
    dy = random_activations(num_rows, hidden, torch.bfloat16)
    dy[num_rows // 2, 5] = math.inf
    clamp, weights, pos = _rows(num_rows, option, "cuda")
    dx, dweights = deep_kernels.swiglu_backward(x, dy, clamp, weights, pos)
    assert dx.shape == (num_rows, 2 * hidden) and dx.dtype == torch.bfloat16 and dx.is_contiguous()
    assert dweights.shape == (num_rows,) and dweights.dtype == torch.float32
    _check_against_reference("swiglu_backward", (x, dy, clamp, weights, pos), {}, (dx, dweights))


@pytest.mark.gpu
def test_backward_row_strides():
    x = random_activations(300, 2 * 1024 + 128, torch.bfloat16)[:, :2048]
    dy = random_activations(300, 1024 + 64, torch.bfloat16)[:, :1024]
    weights = torch.rand(300, device="cuda")
    dx, dweights = deep_kernels.swiglu_backward(x, dy, CLAMP, weights)
    _check_against_reference("swiglu_backward", (x, dy, CLAMP, weights, None), {}, (dx, dweights))


def _every_bf16_gate() -> torch.Tensor:
    """x [2^16, 2 * 128]: row r's gates all hold the bf16 of bit pattern r (every value once, NaN, inf,
    zeros and subnormals included); its ups are 1 in column 0 and random elsewhere."""
    gates = torch.arange(-(2**15), 2**15, dtype=torch.int32, device="cuda").to(torch.int16).view(torch.bfloat16)
    x = random_activations(2**16, 256, torch.bfloat16)
    x[:, :128] = gates.unsqueeze(1)
    x[:, 128] = 1
    return x


@pytest.mark.gpu
@pytest.mark.parametrize("clamp", [None, CLAMP])
def test_every_bf16_gate_matches_reference(clamp):
    # The kernels divide by 1 + expf(-g) without IEEE division's per-element check (common/swiglu.cuh):
    # every gate a bf16 tensor can hold, the clamp's too, must give the IEEE quotients. dy is one-hot in
    # column 0 so dweights is silu(g) itself in FP32, not only its bf16 rounding.
    x = _every_bf16_gate()
    dy = torch.zeros((x.shape[0], 128), dtype=torch.bfloat16, device="cuda")
    dy[:, 0] = 1
    dx, dweights = deep_kernels.swiglu_backward(x, dy, clamp)
    _check_against_reference("swiglu_backward", (x, dy, clamp), {}, (dx, dweights))
    gate = x[:, 0].float() if clamp is None else torch.minimum(x[:, 0].float(), torch.tensor(clamp, device="cuda"))
    silu = gate / (torch.exp(-gate) + 1)
    exposed = silu.isfinite() & dweights.isfinite()  # not where another column's 0 * inf is NaN
    assert exposed.sum() > 60000 and torch.equal(dweights[exposed], silu[exposed])  # the quotients themselves
    y = deep_kernels.swiglu_forward(x, clamp)
    _check_against_reference("swiglu_forward", (x, clamp), {}, (y,))
    _check_against_reference("swiglu_cast_to_fp8", (x, clamp), {}, deep_kernels.swiglu_cast_to_fp8(x, clamp))


@pytest.mark.gpu
@pytest.mark.parametrize("clamp", [3e-30, 0.3, 100.0, 1e30])
def test_unusual_clamps_match_reference(clamp):
    # A clamped gate takes silu(c) by IEEE division (common/swiglu.cuh), whatever c: below or above the fast
    # division's gate range, and 0.3, which is not a bf16 value.
    x = _special_rows(random_activations(333, 2 * 384, torch.bfloat16)) * 16
    dy = random_activations(333, 384, torch.bfloat16)
    _check_against_reference("swiglu_forward", (x, clamp), {}, (deep_kernels.swiglu_forward(x, clamp),))
    _check_against_reference("swiglu_cast_to_fp8", (x, clamp), {}, deep_kernels.swiglu_cast_to_fp8(x, clamp))
    _check_against_reference("swiglu_backward", (x, dy, clamp), {}, deep_kernels.swiglu_backward(x, dy, clamp))


@pytest.mark.gpu
def test_empty_inputs():
    x = torch.empty((0, 2 * 7168), dtype=torch.bfloat16, device="cuda")
    q, scales = deep_kernels.swiglu_cast_to_fp8(x)
    assert q.shape == (0, 7168) and q.dtype == torch.float8_e4m3fn and scales.shape == (0, 56)
    assert deep_kernels.swiglu_forward(x).shape == (0, 7168)
    dx, dweights = deep_kernels.swiglu_backward(x, torch.empty((0, 7168), dtype=torch.bfloat16, device="cuda"))
    assert dx.shape == (0, 2 * 7168) and dweights.shape == (0,)
    masked = torch.empty((3, 0, 256), dtype=torch.bfloat16, device="cuda")
    q, scales = deep_kernels.swiglu_cast_to_fp8_masked(masked, torch.zeros(3, dtype=torch.int32, device="cuda"))
    assert q.shape == (3, 0, 128) and scales.shape == (3, 0, 1)


@pytest.mark.gpu
def test_bad_out_and_devices_are_rejected():
    x = random_activations(8, 512, torch.bfloat16)
    q, scales = deep_kernels.swiglu_cast_to_fp8(x)
    with pytest.raises(ValueError, match="out\\[0\\] must be a contiguous tensor of shape"):
        deep_kernels.swiglu_cast_to_fp8(x, out=(q[:4], scales))
    with pytest.raises(ValueError, match="out\\[1\\] must have shape .* \\(row_major scales\\)"):
        deep_kernels.swiglu_cast_to_fp8(x, scale_layout="row_major", out=(q, scales))
    unaligned = torch.empty(8 * 256 + 8, dtype=torch.float8_e4m3fn, device="cuda")[8:].view(8, 256)
    with pytest.raises(ValueError, match="out\\[0\\] must start at a 16-byte aligned address"):
        deep_kernels.swiglu_cast_to_fp8(x, out=(unaligned, scales))
    with pytest.raises(ValueError, match="weights must be a CUDA tensor"):
        deep_kernels.swiglu_cast_to_fp8(x, weights=torch.ones(8))
    with pytest.raises(ValueError, match="masked_m must be a CUDA tensor"):
        deep_kernels.swiglu_cast_to_fp8_masked(x.view(2, 4, 512), torch.ones(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="out\\[1\\] must be a contiguous tensor of shape \\(8,\\)"):
        deep_kernels.swiglu_backward(x, x[:, :256], out=(torch.empty_like(x), torch.empty(9, device="cuda")))
