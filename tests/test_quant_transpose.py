"""The per-channel FP8 cast with transpose, the batched transpose and the per-row cast (group size K): the
references against independent formulations (CPU), input validation (CPU), compile coverage (CPU), and the
kernels bit-exact against the references (GPU)."""

import pytest
import torch

import deep_kernels
from deep_kernels import quant
from deep_kernels.reference import quant as reference
from deep_kernels.testing import assert_bitwise_equal, empty_like_strided, poison_, random_activations

from conftest import FULL, in_turns
from test_quant import check_cast_matches_reference

LAYOUTS = [(False, "mn_major"), (False, "row_major"), (True, "mn_major"), (True, "row_major"), (True, "packed_ue8m0")]


# ---- the references (CPU) ----

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("scale_mode", ["mul", "div"])
def test_reference_per_channel_against_column_formula(dtype, scale_mode):
    # Per column k and block g of 128 rows: amax over the block's rows (missing rows of the last block
    # ignored), then the per-token numerics; q comes out transposed.
    m, k = 200, 24
    x = random_activations(m, k, dtype, device="cpu", seed=5)
    q, scales = reference.per_channel_cast_transpose_to_fp8(x, scale_layout="row_major", scale_mode=scale_mode)
    assert q.shape == (k, m) and q.is_contiguous() and scales.shape == (k, 2)
    fp32 = x.float()
    for g, rows in enumerate((slice(0, 128), slice(128, m))):
        amax = fp32[rows].abs().amax(dim=0).clamp(min=quant.DEFAULT_AMAX_CLAMP)
        scale = amax / torch.full_like(amax, 448.0)
        scaled = fp32[rows] / scale if scale_mode == "div" else fp32[rows] * (torch.full_like(amax, 448.0) / amax)
        assert torch.equal(scales[:, g], scale)
        assert_bitwise_equal(q[:, rows].contiguous(), scaled.to(torch.float8_e4m3fn).T.contiguous(), f"block {g}")


@pytest.mark.parametrize("ue8m0,layout", LAYOUTS)
def test_reference_per_channel_is_per_token_of_transpose(ue8m0, layout):
    x = random_activations(256, 40, torch.bfloat16, device="cpu", seed=6)
    q, scales = reference.per_channel_cast_transpose_to_fp8(x, ue8m0=ue8m0, scale_layout=layout)
    q_t, scales_t = reference.per_token_cast_to_fp8(x.T.contiguous(), 128, ue8m0=ue8m0, scale_layout=layout)
    assert_bitwise_equal(q, q_t, "q")
    assert_bitwise_equal(scales, scales_t, "scales")


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.bfloat16, torch.float32])
def test_reference_batched_transpose_moves_bits(dtype):
    bits = torch.randint(0, 256, (3, 5, 7 * 4), dtype=torch.uint8)
    x = bits.view(dtype)
    y = reference.batched_transpose(x)
    assert y.shape == (3, x.shape[2], 5) and y.is_contiguous() and y.dtype == dtype
    x_bytes, y_bytes = x.view(torch.uint8), y.view(torch.uint8)  # the element's bytes as the last dimension
    size = dtype.itemsize
    for b in range(3):
        for m in range(5):
            for n in range(x.shape[2]):
                assert torch.equal(y_bytes[b, n, m * size:(m + 1) * size], x_bytes[b, m, n * size:(n + 1) * size])


@pytest.mark.parametrize("ue8m0,layout", LAYOUTS)
def test_reference_per_row_is_one_group_of_k(ue8m0, layout):
    x = random_activations(9, 96, torch.float32, device="cpu", seed=7)
    q, scales = reference.per_token_cast_to_fp8(x, None, ue8m0=ue8m0, scale_layout=layout)
    assert scales.shape == (9, 1)
    # The same rows padded to a 128-group with zeros (which never raise an amax) give the same codes.
    padded = torch.zeros((9, 128))
    padded[:, :96] = x
    q_padded, scales_padded = reference.per_token_cast_to_fp8(padded, 128, ue8m0=ue8m0, scale_layout=layout)
    assert_bitwise_equal(q, q_padded[:, :96].contiguous(), "q")
    assert_bitwise_equal(scales, scales_padded, "scales")


# ---- validation (CPU tensors: every check that precedes the device check) ----

@pytest.mark.parametrize("x,kwargs,error,match", [
    (torch.ones(32, 64, dtype=torch.float16), {}, TypeError, "x must be"),
    (torch.ones(64, dtype=torch.bfloat16), {}, ValueError, "x must be 2-D"),
    (torch.ones(40, 64, dtype=torch.bfloat16), {}, ValueError, "multiple of 16"),
    (torch.ones(32, 60, dtype=torch.bfloat16), {}, ValueError, "multiple of 8"),
    (torch.ones(32, 62, dtype=torch.float32), {}, ValueError, "multiple of 4"),
    (torch.ones(64, 32, dtype=torch.bfloat16).t(), {}, ValueError, "contiguous last dimension"),
    (torch.ones(32, 72, dtype=torch.bfloat16)[:, 4:68], {}, ValueError, "16-byte aligned"),
    (torch.ones(32, 64, dtype=torch.bfloat16), {"scale_layout": "col"}, ValueError, "scale_layout must be"),
    (torch.ones(32, 64, dtype=torch.bfloat16), {"scale_layout": "packed_ue8m0"}, ValueError, "needs ue8m0"),
    (torch.ones(32, 64, dtype=torch.bfloat16), {"amax_clamp": -1.0}, ValueError, "amax_clamp"),
    (torch.ones(32, 64, dtype=torch.bfloat16), {"scale_mode": "exact"}, ValueError, "scale_mode must be one of"),
    (torch.ones(32, 64, dtype=torch.bfloat16), {}, ValueError, "must be a CUDA tensor"),
    ("not a tensor", {}, TypeError, "torch.Tensor"),
])
def test_per_channel_rejects_bad_input(x, kwargs, error, match):
    with pytest.raises(error, match=match):
        deep_kernels.per_channel_cast_transpose_to_fp8(x, **kwargs)


@pytest.mark.parametrize("x,error,match", [
    (torch.ones(2, 3, 4, dtype=torch.float16), TypeError, "x must be"),
    (torch.ones(2, 3, 4, dtype=torch.int32), TypeError, "x must be"),
    (torch.ones(3, 4, dtype=torch.bfloat16), ValueError, "x must be 3-D"),
    (torch.ones(2, 4, 3, dtype=torch.bfloat16).transpose(1, 2), ValueError, "contiguous last dimension"),
    (torch.ones(1, 1, 1, dtype=torch.bfloat16).expand(70000, 1, 1), ValueError, "split it"),
    (torch.ones(2, 3, 4, dtype=torch.bfloat16), ValueError, "must be a CUDA tensor"),
    ("not a tensor", TypeError, "torch.Tensor"),
])
def test_batched_transpose_rejects_bad_input(x, error, match):
    with pytest.raises(error, match=match):
        deep_kernels.batched_transpose(x)


@pytest.mark.parametrize("k,dtype,match", [
    (40, torch.bfloat16, "positive multiple of 16 up to 32768"),
    (32768 + 16, torch.bfloat16, "positive multiple of 16 up to 32768"),
    (16384 + 16, torch.float32, "positive multiple of 16 up to 16384"),
])
def test_per_row_rejects_bad_k(k, dtype, match):
    with pytest.raises(ValueError, match=match):
        deep_kernels.per_token_cast_to_fp8(torch.ones(2, k, dtype=dtype), group_size=None)


def test_per_row_group_size_k_is_accepted_up_to_the_device_check():
    # group_size=None and group_size=K (not a per-token group size) pass validation; only the device fails.
    for k, group_size in ((7168, None), (7168, 7168), (128, None), (48, None)):
        with pytest.raises(ValueError, match="must be a CUDA tensor"):
            deep_kernels.per_token_cast_to_fp8(torch.ones(2, k, dtype=torch.bfloat16), group_size=group_size)
    assert quant.max_row_group_size(torch.bfloat16) == 32768 and quant.max_row_group_size(torch.float32) == 16384


def test_every_new_kernel_is_precompiled():
    names = {spec.name for spec in quant.precompile_specs()}
    assert {"smxx_per_channel_cast_transpose", "smxx_batched_transpose", "smxx_per_row_cast"} <= names


# ---- kernels against the references (GPU) ----

def _special_columns(x: torch.Tensor) -> torch.Tensor:
    """Columns (the channels) of all-equal values, zeros, -0, tiny and huge magnitudes, and non-finite
    values in a few 128-row blocks."""
    x = x.clone()
    big = 1e30 if x.dtype == torch.float32 else 1e37
    m, k = x.shape
    for j, value in enumerate([1.5, 0.0, -0.0, -1e-38, big, -big][:k]):
        x[:, j * 5 % k] = value
    if k > 3 and m > 3:
        x[m // 2, 3], x[1, k - 1], x[2, k - 1] = float("inf"), float("-inf"), float("nan")
    return x


CHANNEL_SHAPES = [(16, 8), (128, 64), (4000, 7176), (4096, 7168)] + ([(16384, 1536), (144, 4100)] if FULL else [])


CHANNEL_VARIANTS = [(False, "mn_major", "mul"), (False, "row_major", "mul"), (False, "mn_major", "div"),
                    (True, "mn_major", "mul"), (True, "packed_ue8m0", "mul")]
DTYPES = (torch.bfloat16, torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,dtype,ue8m0,layout,scale_mode",
                         in_turns([(d, *v) for v in CHANNEL_VARIANTS for d in DTYPES], CHANNEL_SHAPES))
def test_per_channel_matches_reference(m, k, dtype, ue8m0, layout, scale_mode):
    x = _special_columns(random_activations(m, k, dtype))
    kwargs = dict(ue8m0=ue8m0, scale_layout=layout, scale_mode=scale_mode)
    check_cast_matches_reference("per_channel_cast_transpose_to_fp8", x, **kwargs)
    if m % 128 == 0:  # the stated equality with the per-token cast of the transpose
        q, scales = deep_kernels.per_channel_cast_transpose_to_fp8(x, **kwargs)
        q_t, scales_t = reference.per_token_cast_to_fp8(x.T.contiguous(), 128, **kwargs)
        assert_bitwise_equal(q, q_t, "q")
        assert_bitwise_equal(scales, scales_t, "scales")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_per_channel_row_stride_and_graph(dtype):
    x = random_activations(272, 1024 + 64, dtype)[:, :1024]  # row stride larger than K
    check_cast_matches_reference("per_channel_cast_transpose_to_fp8", x)
    first = deep_kernels.per_channel_cast_transpose_to_fp8(x)
    out = (empty_like_strided(first[0]), empty_like_strided(first[1]))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        deep_kernels.per_channel_cast_transpose_to_fp8(x, out=out)
    for seed in range(2):
        x.copy_(random_activations(272, 1024, dtype, seed=seed))
        poison_(out[0])
        poison_(out[1])
        graph.replay()
        torch.cuda.synchronize()
        q_ref, scales_ref = reference.per_channel_cast_transpose_to_fp8(x)
        assert_bitwise_equal(out[0], q_ref, "q")
        assert_bitwise_equal(out[1], scales_ref, "scales")


def _random_bits(shape, dtype) -> torch.Tensor:
    """Every bit pattern is a valid input of a move (NaNs and infinities included)."""
    bits = torch.randint(0, 256, (*shape[:-1], shape[-1] * dtype.itemsize), dtype=torch.uint8, device="cuda")
    return bits.view(dtype)


TRANSPOSE_SHAPES = [(1, 1, 1), (3, 129, 257), (2, 33, 7), (8, 256, 7168), (1, 4001, 24)] + (
    [(8, 2048, 7168), (5, 1000, 1000)] if FULL else [])


@pytest.mark.gpu
@pytest.mark.parametrize("b,m,n,dtype", [(*shape, (torch.float8_e4m3fn, torch.bfloat16, torch.float32)[i % 3])
                                         for i, shape in enumerate(TRANSPOSE_SHAPES + TRANSPOSE_SHAPES[1:2])])
def test_batched_transpose_matches_reference(b, m, n, dtype):
    x = _random_bits((b, m, n), dtype)
    expected = reference.batched_transpose(x)
    out = poison_(torch.empty((b, n, m), dtype=dtype, device="cuda"))
    assert deep_kernels.batched_transpose(x, out=out) is out
    assert_bitwise_equal(out, expected, "y")
    assert_bitwise_equal(deep_kernels.batched_transpose(x), expected, "y")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.bfloat16, torch.float32])
def test_batched_transpose_strided_and_misaligned(dtype):
    wide = _random_bits((4, 200, 320), dtype)
    for x in (wide[:, :150, :256], wide[::2, 3:, 16:], wide[:, :, 1:255], wide[1:, 1:, 1:]):
        out = poison_(torch.empty((x.shape[0], x.shape[2], x.shape[1]), dtype=dtype, device="cuda"))
        deep_kernels.batched_transpose(x, out=out)
        assert_bitwise_equal(out, reference.batched_transpose(x), "y")


@pytest.mark.gpu
def test_empty_inputs():
    y = deep_kernels.batched_transpose(torch.empty((0, 5, 7), dtype=torch.bfloat16, device="cuda"))
    assert y.shape == (0, 7, 5)
    assert deep_kernels.batched_transpose(torch.empty((2, 0, 7), device="cuda")).shape == (2, 7, 0)
    x = torch.empty((0, 64), dtype=torch.bfloat16, device="cuda")
    q, scales = deep_kernels.per_channel_cast_transpose_to_fp8(x)
    assert q.shape == (64, 0) and scales.shape == (64, 0)
    q, scales = deep_kernels.per_token_cast_to_fp8(torch.empty((0, 7168), dtype=torch.bfloat16, device="cuda"), None)
    assert q.shape == (0, 7168) and scales.shape == (0, 1)


ROW_SHAPES = [(1, 16), (7, 48), (4001, 7168), (64, 16384), (3, 1008)] + ([(8001, 4096), (2, 32768)] if FULL else [])


def _row_cases() -> list:
    """Each dtype with each variant, the shapes taking turns, and each shape once (none longer than the per-row
    cast takes for the dtype)."""
    variants = [(False, "mn_major", "mul"), (False, "row_major", "div"), (True, "packed_ue8m0", "mul")]
    cases = in_turns([(d, *v) for v in variants for d in DTYPES], ROW_SHAPES)
    cases += [(*shape, DTYPES[i % 2], *variants[i % 3]) for i, shape in enumerate(ROW_SHAPES[len(cases):])]
    return [case for case in cases if case[1] <= quant.max_row_group_size(case[2])]


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,dtype,ue8m0,layout,scale_mode", _row_cases())
def test_per_row_matches_reference(m, k, dtype, ue8m0, layout, scale_mode):
    x = random_activations(m, k, dtype)
    x[0, k // 2] = 0.0 if m == 1 else float("inf")
    kwargs = dict(ue8m0=ue8m0, scale_layout=layout, scale_mode=scale_mode)
    for group_size in (None, k):
        q_ref, scales_ref = reference.per_token_cast_to_fp8(x, group_size, **kwargs)
        assert scales_ref.shape == (m, 1)
        out = (poison_(empty_like_strided(q_ref)), poison_(empty_like_strided(scales_ref)))
        q, scales = deep_kernels.per_token_cast_to_fp8(x, group_size, out=out, **kwargs)
        assert_bitwise_equal(q, q_ref, "q")
        assert_bitwise_equal(scales, scales_ref, "scales")
