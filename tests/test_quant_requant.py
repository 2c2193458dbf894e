"""FP8 requantization from 128 x 128 block scales to 1 x 128 per-token groups: the reference's definition
and losslessness (CPU), input validation (CPU), and the kernel bit-exact against the reference (GPU)."""

import math

import pytest
import torch

import deep_kernels
from deep_kernels.reference import quant as reference
from deep_kernels.testing import assert_bitwise_equal, empty_like_strided, poison_, random_activations

from conftest import FULL, in_turns

LAYOUTS = [(False, "mn_major"), (False, "row_major"), (True, "mn_major"), (True, "row_major"), (True, "packed_ue8m0")]


# ---- the reference (CPU) ----

def test_reference_is_dequantize_then_per_token_cast():
    x = random_activations(300, 512, torch.bfloat16, device="cpu", seed=1)
    q, block_scales = reference.per_block_cast_to_fp8(x)
    dequantized = q.float().view(300, 4, 128) * block_scales.repeat_interleave(128, dim=0)[:300, :, None]
    assert torch.equal(reference.dequantize_per_block(q, block_scales), dequantized.view(300, 512))
    for ue8m0, layout in LAYOUTS:
        requantized = reference.requant_per_block_to_per_token(q, block_scales, ue8m0=ue8m0, scale_layout=layout)
        direct = reference.per_token_cast_to_fp8(dequantized.view(300, 512), 128, ue8m0=ue8m0, scale_layout=layout)
        assert_bitwise_equal(requantized[0], direct[0], "q")
        assert_bitwise_equal(requantized[1], direct[1], "scales")


@pytest.mark.parametrize("layout", ["mn_major", "row_major", "packed_ue8m0"])
def test_reference_is_lossless_with_power_of_two_scales(layout):
    x = random_activations(300, 1024, torch.float32, device="cpu", seed=2)
    x[7] = 0.0
    q, block_scales = reference.per_block_cast_to_fp8(x, ue8m0=True)
    q_token, scales = reference.requant_per_block_to_per_token(q, block_scales, ue8m0=True, scale_layout=layout)
    assert torch.equal(reference.per_token_cast_back(q_token, scales, 128, torch.float32),
                       reference.dequantize_per_block(q, block_scales))


def test_reference_without_power_of_two_scales_rounds_once_more():
    x = random_activations(300, 1024, torch.float32, device="cpu", seed=3)
    q, block_scales = reference.per_block_cast_to_fp8(x)
    dequantized = reference.dequantize_per_block(q, block_scales)
    q_token, scales = reference.requant_per_block_to_per_token(q, block_scales, scale_layout="row_major")
    y = reference.per_token_cast_back(q_token, scales, 128, torch.float32)
    assert not torch.equal(y, dequantized)
    # At most half an e4m3 step of the new scale: 2^-4 of the value, or 2^-10 of the scale's range (subnormals).
    bound = torch.maximum(dequantized.abs() * 2.0 ** -4, scales.repeat_interleave(128, dim=1) * 2.0 ** -10)
    assert ((y - dequantized).abs() <= bound * (1 + 2.0 ** -20)).all()


# ---- validation (CPU tensors: every check that precedes the device check) ----

def _pair(m=4, k=256):
    return torch.zeros(m, k, dtype=torch.float8_e4m3fn), torch.ones(math.ceil(m / 128), k // 128)


@pytest.mark.parametrize("q,scales,kwargs,error,match", [
    (_pair()[0].view(torch.uint8), _pair()[1], {}, TypeError, "q must be"),
    (torch.zeros(256, dtype=torch.float8_e4m3fn), _pair()[1], {}, ValueError, "q must be 2-D"),
    (torch.zeros(4, 200, dtype=torch.float8_e4m3fn), torch.ones(1, 1), {}, ValueError, "multiple of 128"),
    (torch.zeros(256, 4, dtype=torch.float8_e4m3fn).t(), _pair()[1], {}, ValueError, "q must be contiguous"),
    (torch.zeros(4 * 256 + 16, dtype=torch.uint8)[1:4 * 256 + 1].view(torch.float8_e4m3fn).view(4, 256), _pair()[1], {},
     ValueError, "q must start at a 16-byte aligned address"),
    (_pair()[0], _pair()[1].double(), {}, TypeError, "scales must be torch.float32"),
    (_pair()[0], torch.ones(1, 3), {}, ValueError, "scales must be a contiguous tensor of shape \\(1, 2\\)"),
    (_pair(129)[0], torch.ones(1, 2), {}, ValueError, "shape \\(2, 2\\)"),
    (_pair()[0], torch.ones(1, 4)[:, ::2], {}, ValueError, "scales must be a contiguous"),
    (*_pair(), {"scale_layout": "col"}, ValueError, "scale_layout must be"),
    (*_pair(), {"scale_layout": "packed_ue8m0"}, ValueError, "needs ue8m0"),
    (*_pair(), {"scale_mode": "exact"}, ValueError, "scale_mode must be one of"),
    (*_pair(), {"amax_clamp": 0.0}, ValueError, "amax_clamp"),
    (*_pair(), {}, ValueError, "q must be a CUDA tensor"),
    ("not a tensor", _pair()[1], {}, TypeError, "torch.Tensor"),
])
def test_requant_rejects_bad_input(q, scales, kwargs, error, match):
    with pytest.raises(error, match=match):
        deep_kernels.requant_per_block_to_per_token(q, scales, **kwargs)


# ---- the kernel against the reference (GPU) ----

def _block_quantized(m: int, k: int, dtype: torch.dtype, ue8m0: bool):
    """per_block_cast_to_fp8 of random rows with, among them, all-equal, zero, huge, tiny, inf and NaN rows."""
    x = random_activations(m, k, dtype)
    big = 1e30 if dtype == torch.float32 else 1e37
    if m > 35:  # distinct rows, random ones left over (a single row stays random)
        for i, value in enumerate([1.5, 0.0, -big, 1e-30, -0.0]):
            x[i * 7] = value
    if m > 300:
        x[257, 5] = math.inf   # an infinite block scale (block row 2, column 0)
        x[300, k - 1] = math.nan
    return reference.per_block_cast_to_fp8(x, ue8m0=ue8m0)


SHAPES = [(1, 128), (129, 1536), (4001, 7168)] + ([(8001, 4096), (300, 384)] if FULL else [])


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,block_ue8m0,ue8m0,layout,scale_mode", in_turns(
    [(i % 2 == 1, *variant, mode) for i, (variant, mode) in enumerate(
        (variant, mode) for variant in LAYOUTS for mode in ("mul", "div"))], SHAPES))
def test_requant_matches_reference(m, k, block_ue8m0, ue8m0, layout, scale_mode):
    q, block_scales = _block_quantized(m, k, torch.bfloat16, block_ue8m0)
    kwargs = dict(ue8m0=ue8m0, scale_layout=layout, scale_mode=scale_mode)
    q_ref, scales_ref = reference.requant_per_block_to_per_token(q, block_scales, **kwargs)
    out = (poison_(empty_like_strided(q_ref)), poison_(empty_like_strided(scales_ref)))
    q_out, scales = deep_kernels.requant_per_block_to_per_token(q, block_scales, out=out, **kwargs)
    assert q_out is out[0] and scales is out[1]
    assert_bitwise_equal(q_out, q_ref, "q")
    assert_bitwise_equal(scales, scales_ref, "scales")
    again = deep_kernels.requant_per_block_to_per_token(q, block_scales, **kwargs)
    assert_bitwise_equal(again[0], q_ref, "q")
    assert_bitwise_equal(again[1], scales_ref, "scales")


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,layout", [(129, 1536, "packed_ue8m0"), (4001, 7168, "mn_major")])
def test_requant_is_lossless_with_power_of_two_scales(m, k, layout):
    x = random_activations(m, k, torch.bfloat16)
    q, block_scales = deep_kernels.per_block_cast_to_fp8(x, ue8m0=True)
    q_token, scales = deep_kernels.requant_per_block_to_per_token(q, block_scales, ue8m0=True, scale_layout=layout)
    assert_bitwise_equal(deep_kernels.per_token_cast_back(q_token, scales, 128, torch.float32),
                         reference.dequantize_per_block(q, block_scales), "dequantized")


@pytest.mark.gpu
def test_requant_empty_deterministic_and_graph_capturable():
    q = torch.empty((0, 7168), dtype=torch.float8_e4m3fn, device="cuda")
    q_token, scales = deep_kernels.requant_per_block_to_per_token(q, torch.empty((0, 56), device="cuda"))
    assert q_token.shape == (0, 7168) and scales.shape == (0, 56)
    q, block_scales = deep_kernels.per_block_cast_to_fp8(random_activations(1000, 4096, torch.bfloat16))
    first = deep_kernels.requant_per_block_to_per_token(q, block_scales, ue8m0=True)
    out = (empty_like_strided(first[0]), empty_like_strided(first[1]))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        deep_kernels.requant_per_block_to_per_token(q, block_scales, ue8m0=True, out=out)
    for _ in range(2):
        q_new, scales_new = deep_kernels.per_block_cast_to_fp8(random_activations(1000, 4096, torch.bfloat16))
        q.copy_(q_new)
        block_scales.copy_(scales_new)
        poison_(out[0])
        poison_(out[1])
        graph.replay()
        torch.cuda.synchronize()
        q_ref, scales_ref = reference.requant_per_block_to_per_token(q, block_scales, ue8m0=True)
        assert_bitwise_equal(out[0], q_ref, "q")
        assert_bitwise_equal(out[1], scales_ref, "scales")


@pytest.mark.gpu
def test_requant_rejects_bad_out_and_devices():
    q, block_scales = deep_kernels.per_block_cast_to_fp8(random_activations(8, 256, torch.bfloat16))
    q_token, scales = deep_kernels.requant_per_block_to_per_token(q, block_scales)
    with pytest.raises(ValueError, match="out\\[0\\] must be a contiguous tensor of shape"):
        deep_kernels.requant_per_block_to_per_token(q, block_scales, out=(q_token[:4], scales))
    with pytest.raises(ValueError, match="out\\[1\\] must have shape .* \\(row_major scales\\)"):
        deep_kernels.requant_per_block_to_per_token(q, block_scales, scale_layout="row_major", out=(q_token, scales))
    with pytest.raises(ValueError, match="scales must be a CUDA tensor"):
        deep_kernels.requant_per_block_to_per_token(q, block_scales.cpu())
