"""DeepGEMM's calling conventions beyond the NT calls, so that its callers switch by changing the module name.

The transposed forms of the FP8 GEMMs (fp8_gemm_nn / tn / tt, m_grouped_fp8_gemm_nn_contiguous) and of the grouped
BF16 GEMM (m_grouped_bf16_gemm_nn_contiguous) take the NT call's operands transposed, (t.mT, scales.mT). Hopper's FP8
wgmma (and the grouped BF16 kernel) read K-major operands only, so a transposed form takes the transposed view of a
K-major tensor and refuses a rows-major one before launch, naming the casts that write the K-major layout.
DeepGEMM's options compiled_dims and disable_ue8m0_cast (inference engines pass the latter on every call) are taken
and change nothing (tests/test_ops.py checks every GEMM takes them and checks their values). The recipe's per-operand
spelling (recipe_a, recipe_b: vLLM's FP8 x FP4 calls pass (1, 128) with (1, 32)) is the recipe it names, and the psum
layout (use_psum_layout=True: each expert's row end in place of m_indices, as vLLM's contiguous calls pass it) is the
m_indices of the same layout, either passed under DeepGEMM's keyword grouped_layout= as well (the k-grouped GEMMs take
its ks_cpu= and grouped_layout= for ks and ks_tensor).
transform_sf_into_required_layout returns FP32 scales in the layout the GEMMs read.

CPU: the refusals, and K-major views, recipe pairs and psum layouts passing every check up to the device's. GPU:
every form, and every call with the options, recipe pairs or psum layouts, bitwise equal to the plain NT call on the
same memory (outputs poisoned before each launch), and the NT call within the FP8 GEMM's bound of float64.
"""

import pytest
import torch

import deep_kernels
from deep_kernels.contiguous_layout import layout_argument
from deep_kernels.reference import bf16_gemm as reference_bf16
from deep_kernels.reference import fp4_gemm as reference_fp4
from deep_kernels.reference import gemm as reference
from deep_kernels.reference import k_grouped_gemm as reference_k_grouped
from deep_kernels.testing import assert_bitwise_equal, poison_, random_activations
from deep_kernels.testing.fp4_gemm import make_fp4_gemm_inputs, make_nvfp4_gemm_inputs, mxfp4_weights
from deep_kernels.testing.gemm import accumulator_like, assert_gemm_close, make_gemm_inputs
from deep_kernels.testing.grouped import (
    assert_masked_close, contiguous_layout, make_contiguous_inputs, make_masked_inputs, psum_ends,
)
from deep_kernels.testing.wgrad import make_k_grouped_bf16_inputs, make_k_grouped_inputs, make_wgrad_inputs
from deep_kernels.validation import deepgemm_recipe, tma_aligned_size


def _transposed(pair) -> tuple:
    """The transposed forms' operand for an NT operand pair: both views transposed (no copy)."""
    return pair[0].mT, pair[1].mT


def _product(a, b) -> torch.Tensor:
    """The float64 output a reference GEMM of the (tensor, scales) pairs a and b writes into."""
    return torch.empty((a[0].shape[0], b[0].shape[0]), device=a[0].device, dtype=torch.float64)


def _assert_masked_close(d: torch.Tensor, a, b, masked_m: torch.Tensor) -> None:
    """d against the float64 masked GEMM of a and b (testing.grouped.assert_masked_close)."""
    expected = reference.m_grouped_fp8_gemm_nt_masked(a, b, torch.full(d.shape, float("nan"), device=d.device,
                                                                       dtype=torch.float64), masked_m, 64)
    assert_masked_close(d, expected, masked_m)


def _rows_major(pair) -> tuple:
    """An NT operand's values as a rows-major [K, rows] tensor (the layout FP8 wgmma cannot read), scales as the
    transposed forms take them."""
    return pair[0].mT.contiguous(), pair[1].mT


def _form_operands(a, b) -> dict:
    """Each dense transposed form's (a, b) arguments for the NT operand pairs a and b: the transposed views."""
    return {"nn": (a, _transposed(b)), "tn": (_transposed(a), _transposed(b)), "tt": (_transposed(a), b)}


# ---- validation (CPU) ----

@pytest.mark.parametrize("form,operand", [("nn", "b"), ("tn", "a"), ("tn", "b"), ("tt", "a")])
def test_rows_major_operands_are_refused_naming_the_casts(form, operand):
    a, b = make_gemm_inputs(8, 256, 256, device="cpu")
    d = torch.empty(8, 256, dtype=torch.bfloat16)
    args = {"a": _transposed(a) if form[0] == "t" else a, "b": _transposed(b) if form[1] == "n" else b}
    args[operand] = _rows_major(a if operand == "a" else b)
    rows = "M" if operand == "a" else "N"
    cast = "per_channel_cast_transpose_to_fp8" if operand == "a" else "per_block_cast_to_fp8"
    with pytest.raises(ValueError, match=rf"{operand} \[K, {rows}\] is {rows}-major .* K-major .*{cast}"):
        getattr(deep_kernels, f"fp8_gemm_{form}")(args["a"], args["b"], d)


@pytest.mark.parametrize("form", ["nn", "tn", "tt"])
@pytest.mark.parametrize("recipe", [None, (1, 1, 128)])
def test_k_major_views_pass_every_check_before_the_device(form, recipe):
    # On the CPU the last check is the device's: reaching it means the views were taken back to the NT layout with
    # matching shapes (a wrong transpose fails the K or scale shape checks first).
    if recipe is None:
        a, b = make_gemm_inputs(8, 256, 384, device="cpu")
    else:
        a, b = make_wgrad_inputs(8, 256, 384, device="cpu")
    d = torch.empty(8, 256)
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        getattr(deep_kernels, f"fp8_gemm_{form}")(*_form_operands(a, b)[form], d, c=d, recipe=recipe)


def test_transposed_forms_check_their_arguments():
    a, b = make_gemm_inputs(8, 256, 256, device="cpu")
    d = torch.empty(8, 256, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="b must be a \\(tensor, scales\\) pair"):
        deep_kernels.fp8_gemm_nn(a, b[0].T, d)
    with pytest.raises(TypeError, match="b must be torch.float8_e4m3fn"):
        deep_kernels.fp8_gemm_nn(a, (b[0].T.view(torch.uint8), b[1].T), d)
    with pytest.raises(ValueError, match="sfb must be 2-D"):
        deep_kernels.fp8_gemm_nn(a, (b[0].T, b[1].flatten()), d)
    with pytest.raises(ValueError, match="a must be at least 2-D"):
        deep_kernels.fp8_gemm_tt((a[0][0], a[1]), b, d)


def test_grouped_nn_forms_refuse_n_major_weights():
    a, b, m_indices, _ = make_contiguous_inputs([3, 0, 5], 32, 128, device="cpu")
    d = torch.empty(m_indices.numel(), 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"b \[K, N\] is N-major .*per_block_cast_to_fp8"):
        deep_kernels.m_grouped_fp8_gemm_nn_contiguous(a, _rows_major(b), d, m_indices)
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        deep_kernels.m_grouped_fp8_gemm_nn_contiguous(a, _transposed(b), d, m_indices)
    x, w = random_activations(256, 128, device="cpu", seed=0), random_activations(96, 128, device="cpu", seed=1)
    w = w.view(3, 32, 128)
    with pytest.raises(ValueError, match=r"b \[G, K, N\] is N-major .*w\.mT of K-major \[G, N, K\]"):
        deep_kernels.m_grouped_bf16_gemm_nn_contiguous(x, w.mT.contiguous(), d, m_indices)
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        deep_kernels.m_grouped_bf16_gemm_nn_contiguous(x, w.mT, d, m_indices)


def test_recipe_pairs_name_the_recipes():
    assert deepgemm_recipe(None, None, None) is None
    assert deepgemm_recipe((1, 1, 128), None, None) == (1, 1, 128)
    assert deepgemm_recipe(None, (1, 128), (128, 128)) == (1, 128, 128)
    assert deepgemm_recipe(None, [1, 128], (1, 128)) == (1, 1, 128)
    with pytest.raises(ValueError, match="pass either recipe or recipe_a with recipe_b, not both"):
        deepgemm_recipe((1, 128, 128), (1, 128), (128, 128))
    with pytest.raises(ValueError, match="recipe_a and recipe_b go together"):
        deepgemm_recipe(None, (1, 128), None)
    with pytest.raises(ValueError, match="must scale the same K blocks"):
        deepgemm_recipe(None, (1, 128), (128, 64))
    with pytest.raises(ValueError, match=r"recipe_b must be a pair \(rows, K\)"):
        deepgemm_recipe(None, (1, 128), (1, 128, 128))


def test_recipe_pairs_reach_the_kernels_checks():
    # On the CPU the last check is the device's: a pair that names the inputs' recipe reaches it, any other fails the
    # scale checks of the recipe it names, or is refused by name.
    a, b = make_gemm_inputs(8, 256, 384, device="cpu")
    d = torch.empty(8, 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        deep_kernels.fp8_gemm_nt(a, b, d, None, None, (1, 128), (128, 128))
    with pytest.raises(ValueError, match=r"sfb must have shape \[N, ceil\(K / 128\)\]"):  # per-channel: not these scales
        deep_kernels.fp8_gemm_nt(a, b, d, recipe_a=(1, 128), recipe_b=(1, 128))
    with pytest.raises(ValueError, match=r"recipe must be None, \(1, 128, 128\) or \(1, 1, 128\), got \(1, 64, 128\)"):
        deep_kernels.fp8_gemm_nn(a, _transposed(b), d, recipe_a=(1, 128), recipe_b=(64, 128))
    # Block sizes are ints: 1.5 is refused, not truncated to 1.
    with pytest.raises(ValueError, match=r"recipe must be None, \(1, 128, 128\) or \(1, 1, 128\), got \(1.5, 1, 128\)"):
        deep_kernels.fp8_gemm_nt(a, b, d, recipe=(1.5, 1, 128))
    with pytest.raises(ValueError, match="recipe_b must be a pair"):
        deep_kernels.fp8_gemm_nt(a, b, d, recipe_a=(1, 128), recipe_b=(1.5, 128))
    wgrad_a, wgrad_b = make_wgrad_inputs(8, 256, 384, device="cpu")
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        deep_kernels.fp8_gemm_tn(_transposed(wgrad_a), _transposed(wgrad_b), d, recipe_a=(1, 128), recipe_b=(1, 128))

    a, b, m_indices, _ = make_contiguous_inputs([3, 0, 5], 32, 128, device="cpu")
    d = torch.empty(m_indices.numel(), 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        deep_kernels.m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices, None, (1, 128), (128, 128))
    with pytest.raises(ValueError, match="the grouped FP8 GEMMs take 128 x 128 weight scales"):
        deep_kernels.m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices, recipe_a=(1, 128), recipe_b=(1, 128))
    a, b, masked_m = make_masked_inputs([2, 0, 3], 4, 32, 128, device="cpu")
    with pytest.raises(ValueError, match="the grouped FP8 GEMMs take 128 x 128 weight scales"):
        deep_kernels.m_grouped_fp8_gemm_nt_masked(a, b, torch.empty(3, 4, 32, dtype=torch.bfloat16), masked_m, 2,
                                                  recipe=(1, 1, 128))


def test_fp4_recipe_pairs_name_the_weights():
    d = torch.empty(8, 256, dtype=torch.bfloat16)
    mxfp4, nvfp4 = make_fp4_gemm_inputs(8, 256, 256, device="cpu"), make_nvfp4_gemm_inputs(8, 256, 256, device="cpu")
    for inputs, block_b in ((mxfp4, (1, 32)), (nvfp4, (1, 16))):
        with pytest.raises(ValueError, match="must be a CUDA tensor"):
            deep_kernels.fp8_fp4_gemm_nt(*inputs, d, None, None, (1, 128), block_b)
        for recipe in (dict(recipe=(1, 1, 128)), dict(recipe_a=(1, 128), recipe_b=(1, 48 - block_b[1])),
                       dict(recipe_a=(1, 128)), dict(recipe_a=(128, 128), recipe_b=block_b)):
            with pytest.raises(ValueError, match=rf"take recipe_a \(1, 128\) with recipe_b \(1, {block_b[1]}\)"):
                deep_kernels.fp8_fp4_gemm_nt(*inputs, d, **recipe)
    a, _, m_indices, _ = make_contiguous_inputs([3, 0, 5], 32, 128, device="cpu")
    b = mxfp4_weights(32, 128, device="cpu", num_groups=3)
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        deep_kernels.m_grouped_fp8_fp4_gemm_nt_contiguous(
            a, b, torch.empty(m_indices.numel(), 32, dtype=torch.bfloat16), m_indices, None, (1, 128), (1, 32))


def _contiguous_calls(sizes: list) -> tuple:
    """(each M-grouped contiguous GEMM on CPU inputs of expert sizes `sizes`, the layout passed as keywords; the
    layout's m_indices)."""
    a, b, m_indices, _ = make_contiguous_inputs(sizes, 32, 128, device="cpu")
    d = torch.empty(m_indices.numel(), 32, dtype=torch.bfloat16)
    x = random_activations(m_indices.numel(), 128, device="cpu", seed=0)
    w = random_activations(len(sizes) * 32, 128, device="cpu", seed=1).view(len(sizes), 32, 128)
    fp4 = mxfp4_weights(32, 128, device="cpu", num_groups=len(sizes))
    return {
        "fp8_nt": lambda **kw: deep_kernels.m_grouped_fp8_gemm_nt_contiguous(a, b, d, **kw),
        "fp8_nn": lambda **kw: deep_kernels.m_grouped_fp8_gemm_nn_contiguous(a, _transposed(b), d, **kw),
        "bf16_nt": lambda **kw: deep_kernels.m_grouped_bf16_gemm_nt_contiguous(x, w, d, **kw),
        "bf16_nn": lambda **kw: deep_kernels.m_grouped_bf16_gemm_nn_contiguous(x, w.mT, d, **kw),
        "fp8_fp4_nt": lambda **kw: deep_kernels.m_grouped_fp8_fp4_gemm_nt_contiguous(a, fp4, d, **kw),
    }, m_indices


def _psum_calls(sizes: list, ends) -> dict:
    """Each M-grouped contiguous GEMM called on CPU inputs of expert sizes `sizes` in the psum layout `ends`."""
    return {name: (lambda call=call, **kw: call(m_indices=ends, use_psum_layout=True, **kw))
            for name, call in _contiguous_calls(sizes)[0].items()}


@pytest.mark.parametrize("call", ["fp8_nt", "fp8_nn", "bf16_nt", "bf16_nn", "fp8_fp4_nt"])
def test_psum_layouts_reach_the_kernels_checks(call):
    sizes = [3, 0, 5]
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        _psum_calls(sizes, psum_ends(sizes, "cpu"))[call](ensure_zero_padding=False)
    with pytest.raises(ValueError, match=r"one row end per expert: shape \(3,\) for b .* got \(4,\)"):
        _psum_calls(sizes, torch.tensor([3, 128, 133, 133], dtype=torch.int32))[call]()
    with pytest.raises(TypeError, match="grouped_layout must be torch.int32"):
        _psum_calls(sizes, psum_ends(sizes, "cpu").long())[call]()
    with pytest.raises(TypeError, match="ensure_zero_padding must be a bool"):
        _psum_calls(sizes, psum_ends(sizes, "cpu"))[call](ensure_zero_padding=1)
    if call.endswith("_nt"):
        with pytest.raises(ValueError, match="must be a CUDA tensor"):
            _psum_calls(sizes, psum_ends(sizes, "cpu"))[call](expected_m_for_psum_layout=4)
        with pytest.raises(ValueError, match=r"expected_m_for_psum_layout must be .*\[1, "):
            _psum_calls(sizes, psum_ends(sizes, "cpu"))[call](expected_m_for_psum_layout=0)


@pytest.mark.parametrize("call", ["fp8_nt", "fp8_nn", "bf16_nt", "bf16_nn", "fp8_fp4_nt"])
def test_grouped_layout_is_deepgemms_keyword_for_the_layout(call):
    sizes = [3, 0, 5]
    calls, m_indices = _contiguous_calls(sizes)
    # Either name reaches the same checks (these CPU tensors stop at the device check, after the layout's).
    for layout in (dict(m_indices=m_indices), dict(grouped_layout=m_indices),
                   dict(grouped_layout=psum_ends(sizes, "cpu"), use_psum_layout=True)):
        with pytest.raises(ValueError, match="must be a CUDA tensor"):
            calls[call](**layout)
    with pytest.raises(ValueError, match=r"one row end per expert: shape \(3,\) for b .* got \(4,\)"):
        calls[call](grouped_layout=torch.tensor([3, 128, 133, 133], dtype=torch.int32), use_psum_layout=True)
    with pytest.raises(TypeError, match="as m_indices or as grouped_layout .* not both"):
        calls[call](m_indices=m_indices, grouped_layout=m_indices)
    with pytest.raises(TypeError, match=r"(exactly one of|missing the layout argument:) m_indices \(DeepGEMM's"):
        calls[call]()


@pytest.mark.parametrize("name", ["k_grouped_fp8_gemm_nt_contiguous", "k_grouped_fp8_gemm_tn_contiguous",
                                  "k_grouped_bf16_gemm_nt_contiguous", "k_grouped_bf16_gemm_tn_contiguous"])
def test_k_grouped_take_deepgemms_keywords_for_the_group_sizes(name):
    ks = [128, 0, 256]
    if "fp8" in name:
        a, b, ks_tensor = make_k_grouped_inputs(ks, 8, 32, device="cpu")
        if "_tn_" in name:
            a, b = (a[0].T, a[1].T), (b[0].T, b[1].T)
    else:
        a, b, ks_tensor = make_k_grouped_bf16_inputs(ks, 8, 32, device="cpu")
        if "_nt_" in name:
            a, b = a.T, b.T
    d = torch.empty(len(ks), 8, 32)
    gemm = getattr(deep_kernels, name)
    # Either spelling reaches the same checks (these CPU tensors stop at the device check, after the sizes').
    for sizes in (dict(ks=ks, ks_tensor=ks_tensor), dict(ks_cpu=ks, grouped_layout=ks_tensor),
                  dict(ks=ks, grouped_layout=ks_tensor)):
        with pytest.raises(ValueError, match="must be a CUDA tensor"):
            gemm(a, b, d, **sizes)
    with pytest.raises(ValueError, match="ks sums to 512"):
        gemm(a, b, d, ks_cpu=[128, 128, 256], grouped_layout=ks_tensor)
    with pytest.raises(TypeError, match="as ks or as ks_cpu .* not both"):
        gemm(a, b, d, ks, ks_cpu=ks, grouped_layout=ks_tensor)
    with pytest.raises(TypeError, match="as ks_tensor or as grouped_layout .* not both"):
        gemm(a, b, d, ks, ks_tensor, grouped_layout=ks_tensor)
    with pytest.raises(TypeError,
                       match=r"missing the device group sizes: ks_tensor \(DeepGEMM's keyword: grouped_layout\)"):
        gemm(a, b, d, ks_cpu=ks)


def test_layout_argument_takes_either_name():
    layout = torch.zeros(4, dtype=torch.int32)
    assert layout_argument(layout, None) is layout
    assert layout_argument(None, layout) is layout
    assert layout_argument(None, None, required=False) is None
    with pytest.raises(TypeError,
                       match=r"missing the layout argument: m_indices \(DeepGEMM's keyword: grouped_layout\)"):
        layout_argument(None, None)
    with pytest.raises(TypeError, match="not both"):
        layout_argument(layout, layout)


def test_psum_options_are_refused_without_the_psum_layout():
    a, b, m_indices, offsets = make_contiguous_inputs([3, 0, 5], 32, 128, device="cpu")
    d = torch.empty(m_indices.numel(), 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="expected_m_for_psum_layout is a hint for use_psum_layout=True only"):
        deep_kernels.m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices, expected_m_for_psum_layout=4)
    with pytest.raises(TypeError, match="use_psum_layout must be a bool"):
        deep_kernels.m_grouped_fp8_gemm_nt_contiguous(a, b, d, m_indices, use_psum_layout=1)
    with pytest.raises(TypeError, match=r"use_psum_layout=True takes the experts' row ends .* without offsets"):
        deep_kernels.m_grouped_fp8_gemm_nt_contiguous(a, b, d, offsets=offsets, use_psum_layout=True)


def test_transformed_scales_are_the_layouts_the_gemms_read():
    sfa = torch.rand(5, 3) + 0.5  # 1 x 128 scales of a [5, 384] activation, row-major as a cast may write them
    for recipe, is_sfa in (((1, 128, 128), True), ((1, 1, 128), False), ((1, 128), None)):
        out = deep_kernels.transform_sf_into_required_layout(sfa, 5, 384, recipe, is_sfa=is_sfa)
        assert out.stride() == (1, tma_aligned_size(5, 4)) and torch.equal(out, sfa)
        assert deep_kernels.transform_sf_into_required_layout(out, 5, 384, recipe, is_sfa=is_sfa) is out
    grouped = torch.rand(3, 130, 4) + 0.5  # [G, M, K / 128]
    out = deep_kernels.transform_sf_into_required_layout(grouped, 130, 512, (1, 128), num_groups=3)
    assert out.stride() == (132 * 4, 1, 132) and torch.equal(out, grouped)
    sfb = torch.rand(3, 2, 4) + 0.5  # 128 x 128 blocks of [3, 256, 512] weights: read as they are
    assert deep_kernels.transform_sf_into_required_layout(sfb, 256, 512, (1, 128, 128), 3, False,
                                                          disable_ue8m0_cast=True) is sfb
    assert deep_kernels.get_tma_aligned_size(5, 4) == 8 and deep_kernels.get_tma_aligned_size(130, 4) == 132
    assert deep_kernels.get_tma_aligned_size(17, 1) == 32 and deep_kernels.tma_aligned_size(3, 16) == 3


@pytest.mark.parametrize("n,element_size,wrong", [(-1, 4, "n"), (5.0, 4, "n"), (5, 0, "element_size"),
                                                   (5, 3, "element_size"), (5, 32, "element_size"),
                                                   (5, True, "element_size")])
def test_tma_aligned_size_checks_its_arguments(n, element_size, wrong):
    for public in (deep_kernels.get_tma_aligned_size, deep_kernels.tma_aligned_size):
        with pytest.raises(ValueError, match=f"^{wrong} must be"):
            public(n, element_size)


def test_transform_refuses_what_it_cannot_lay_out():
    sfa = torch.rand(5, 3)
    transform = deep_kernels.transform_sf_into_required_layout
    with pytest.raises(ValueError, match=r"a recipe \(M, N, K\) needs is_sfa"):
        transform(sfa, 5, 384, (1, 128, 128))
    with pytest.raises(ValueError, match=r"is_sfa goes with a recipe \(M, N, K\)"):
        transform(sfa, 5, 384, (1, 128), is_sfa=True)
    with pytest.raises(ValueError, match="recipe must be"):
        transform(sfa, 5, 384, 128)
    with pytest.raises(ValueError, match="read 1 x 128 and 128 x 128 scale blocks, got 1 x 32"):
        transform(torch.rand(5, 12), 5, 384, (1, 32))
    with pytest.raises(ValueError, match="packed UE8M0 int32 scales are DeepGEMM's Blackwell layout"):
        transform(torch.zeros(5, 1, dtype=torch.int32), 5, 384, (1, 128))
    with pytest.raises(TypeError, match="sf must be torch.float32"):
        transform(sfa.bfloat16(), 5, 384, (1, 128))
    with pytest.raises(ValueError, match=r"must have shape \(5, 4\), got \(5, 3\)"):
        transform(sfa, 5, 512, (1, 128))
    with pytest.raises(ValueError, match=r"num_groups = 2 must have shape \(2, 5, 3\)"):
        transform(sfa, 5, 384, (1, 128), num_groups=2)
    with pytest.raises(TypeError, match="disable_ue8m0_cast must be a bool"):
        transform(sfa, 5, 384, (1, 128), disable_ue8m0_cast=0)
    with pytest.raises(TypeError, match="psum_layout must be torch.int32"):
        transform(sfa, 5, 384, (1, 128), psum_layout=torch.zeros(2))


# ---- kernels (GPU) ----

@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(100, 2112, 7168), (4096, 576, 1024), (64, 4096, 7168)])
def test_dense_forms_are_the_nt_call(m, n, k):
    a, b = make_gemm_inputs(m, n, k)
    expected = reference.fp8_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64))
    nt = deep_kernels.fp8_gemm_nt(a, b, poison_(torch.empty((m, n), device="cuda", dtype=torch.bfloat16)))
    assert_gemm_close(nt, expected)
    for form, operands in _form_operands(a, b).items():
        d = poison_(torch.empty((m, n), device="cuda", dtype=torch.bfloat16))
        assert getattr(deep_kernels, f"fp8_gemm_{form}")(*operands, d) is d
        assert_bitwise_equal(d, nt, f"fp8_gemm_{form}")


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(2112, 7168, 4096), (256, 384, 640)])
def test_weight_gradient_forms_accumulate_as_the_nt_call(m, n, k):
    # recipe (1, 1, 128): the TN form is the weight gradient's call on token-major dY and X.
    a, b = make_wgrad_inputs(m, n, k)
    c = accumulator_like(reference.fp8_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64),
                                               recipe=(1, 1, 128)))
    expected = reference.fp8_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64), c=c,
                                     recipe=(1, 1, 128))
    nt = deep_kernels.fp8_gemm_nt(a, b, poison_(torch.empty((m, n), device="cuda")), c=c, recipe=(1, 1, 128))
    assert_gemm_close(nt, expected)
    for form, operands in _form_operands(a, b).items():
        d = c.clone()  # c is d: accumulated in place
        getattr(deep_kernels, f"fp8_gemm_{form}")(*operands, d, c=d, recipe=(1, 1, 128))
        assert_bitwise_equal(d, nt, f"fp8_gemm_{form}")


@pytest.mark.gpu
def test_grouped_nn_forms_are_the_nt_calls():
    sizes = [300, 0, 77, 512]
    a, b, m_indices, offsets = make_contiguous_inputs(sizes, 576, 1024)
    m_total = m_indices.numel()
    nt = deep_kernels.m_grouped_fp8_gemm_nt_contiguous(
        a, b, poison_(torch.empty((m_total, 576), device="cuda", dtype=torch.bfloat16)), m_indices)
    expected = reference.m_grouped_fp8_gemm_nt_contiguous(
        a, b, poison_(torch.empty((m_total, 576), device="cuda", dtype=torch.float64)), m_indices)
    valid = m_indices >= 0
    assert_gemm_close(nt[valid], expected[valid])
    assert nt[~valid].isnan().all(), "padding rows left unwritten"
    for layout in ({"m_indices": m_indices}, {"offsets": offsets}):
        d = poison_(torch.empty((m_total, 576), device="cuda", dtype=torch.bfloat16))
        deep_kernels.m_grouped_fp8_gemm_nn_contiguous(a, _transposed(b), d, **layout)
        assert_bitwise_equal(d, nt, "m_grouped_fp8_gemm_nn_contiguous")

    m_indices, _ = contiguous_layout(sizes)
    x = random_activations(m_indices.numel(), 1024, seed=3)
    w = random_activations(len(sizes) * 576, 1024, seed=4).view(len(sizes), 576, 1024)
    nt = deep_kernels.m_grouped_bf16_gemm_nt_contiguous(
        x, w, poison_(torch.empty((m_total, 576), device="cuda", dtype=torch.bfloat16)), m_indices)
    expected = reference_bf16.m_grouped_bf16_gemm_nt_contiguous(
        x, w, torch.empty((m_total, 576), device="cuda", dtype=torch.float64), m_indices)
    assert_gemm_close(nt[valid], expected[valid])
    d = poison_(torch.empty((m_total, 576), device="cuda", dtype=torch.bfloat16))
    deep_kernels.m_grouped_bf16_gemm_nn_contiguous(x, w.mT, d, m_indices)
    assert_bitwise_equal(d, nt, "m_grouped_bf16_gemm_nn_contiguous")


@pytest.mark.gpu
def test_deepgemm_options_change_nothing():
    a, b = make_gemm_inputs(100, 2112, 7168)
    plain = deep_kernels.fp8_gemm_nt(a, b, poison_(torch.empty((100, 2112), device="cuda", dtype=torch.bfloat16)))
    assert_gemm_close(plain, reference.fp8_gemm_nt(a, b, _product(a, b)))
    for options in (dict(disable_ue8m0_cast=True), dict(compiled_dims="mnk", disable_ue8m0_cast=False)):
        d = poison_(torch.empty((100, 2112), device="cuda", dtype=torch.bfloat16))
        assert_bitwise_equal(deep_kernels.fp8_gemm_nt(a, b, d, **options), plain, f"fp8_gemm_nt with {options}")
    a, b, masked_m = make_masked_inputs([40, 0, 97], 128, 576, 1024)
    plain = deep_kernels.m_grouped_fp8_gemm_nt_masked(
        a, b, poison_(torch.empty((3, 128, 576), device="cuda", dtype=torch.bfloat16)), masked_m, 64)
    _assert_masked_close(plain, a, b, masked_m)
    d = poison_(torch.empty((3, 128, 576), device="cuda", dtype=torch.bfloat16))
    deep_kernels.m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m, 64, compiled_dims="nk", disable_ue8m0_cast=True)
    assert_bitwise_equal(d, plain, "m_grouped_fp8_gemm_nt_masked with the options")


@pytest.mark.gpu
def test_recipe_pairs_are_the_recipes():
    def poisoned(m, n):
        return poison_(torch.empty((m, n), device="cuda", dtype=torch.bfloat16))

    for inputs, recipe, pair in ((make_gemm_inputs(100, 2112, 7168), None, ((1, 128), (128, 128))),
                                 (make_wgrad_inputs(256, 384, 640), (1, 1, 128), ((1, 128), (1, 128)))):
        m, n = inputs[0][0].shape[0], inputs[1][0].shape[0]
        plain = deep_kernels.fp8_gemm_nt(*inputs, poisoned(m, n), recipe=recipe)
        assert_gemm_close(plain, reference.fp8_gemm_nt(*inputs, _product(*inputs), recipe=recipe))
        d = deep_kernels.fp8_gemm_nt(*inputs, poisoned(m, n), None, None, *pair)
        assert_bitwise_equal(d, plain, f"fp8_gemm_nt with recipe_a, recipe_b = {pair}")
    for inputs, block_b in ((make_fp4_gemm_inputs(64, 576, 1024), (1, 32)),
                            (make_nvfp4_gemm_inputs(64, 576, 1024), (1, 16))):
        plain = deep_kernels.fp8_fp4_gemm_nt(*inputs, poisoned(64, 576))
        assert_gemm_close(plain, reference_fp4.fp8_fp4_gemm_nt(*inputs, _product(*inputs)))
        d = deep_kernels.fp8_fp4_gemm_nt(*inputs, poisoned(64, 576), recipe_a=(1, 128), recipe_b=block_b)
        assert_bitwise_equal(d, plain, f"fp8_fp4_gemm_nt with recipe_b = {block_b}")
    a, b, masked_m = make_masked_inputs([40, 0, 97], 128, 576, 1024)
    plain = deep_kernels.m_grouped_fp8_gemm_nt_masked(
        a, b, poison_(torch.empty((3, 128, 576), device="cuda", dtype=torch.bfloat16)), masked_m, 64)
    _assert_masked_close(plain, a, b, masked_m)
    d = poison_(torch.empty((3, 128, 576), device="cuda", dtype=torch.bfloat16))
    deep_kernels.m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m, 64, None, (1, 128), (128, 128))
    assert_bitwise_equal(d, plain, "m_grouped_fp8_gemm_nt_masked with recipe_a, recipe_b")


@pytest.mark.gpu
def test_psum_and_keyword_layout_calls_are_the_m_indices_calls():
    sizes = [300, 0, 77, 512]  # row ends 300, 512 (empty), 589 and 1152: three of them off the alignment
    a, b, m_indices, _ = make_contiguous_inputs(sizes, 576, 1024)
    ends, valid = psum_ends(sizes), m_indices >= 0
    x = random_activations(m_indices.numel(), 1024, seed=3)
    w = random_activations(len(sizes) * 576, 1024, seed=4).view(len(sizes), 576, 1024)
    fp4 = mxfp4_weights(576, 1024, num_groups=len(sizes))
    calls = {
        "m_grouped_fp8_gemm_nt_contiguous": (a, b, reference, {}),
        "m_grouped_fp8_gemm_nn_contiguous": (a, _transposed(b), reference, {}),
        "m_grouped_bf16_gemm_nt_contiguous": (x, w, reference_bf16, {}),
        "m_grouped_bf16_gemm_nn_contiguous": (x, w.mT, reference_bf16, {}),
        "m_grouped_fp8_fp4_gemm_nt_contiguous": (a, fp4, reference_fp4, dict(expected_m_for_psum_layout=256)),
    }
    for name, (lhs, rhs, references, hint) in calls.items():
        gemm = getattr(deep_kernels, name)
        plain = gemm(lhs, rhs, poison_(torch.empty((m_indices.numel(), 576), device="cuda", dtype=torch.bfloat16)),
                     m_indices)
        expected = getattr(references, name)(lhs, rhs, poison_(torch.empty(plain.shape, device="cuda",
                                                                           dtype=torch.float64)), m_indices)
        assert_gemm_close(plain[valid], expected[valid], name=name)
        assert plain[~valid].isnan().all(), f"{name}: padding rows written"
        d = poison_(torch.empty_like(plain))
        assert gemm(lhs, rhs, d, ends, use_psum_layout=True, **hint) is d
        assert_bitwise_equal(d, plain, f"{name} with the psum layout")
        # DeepGEMM's keyword for the layout argument, in either layout.
        for layout in (dict(grouped_layout=m_indices), dict(grouped_layout=ends, use_psum_layout=True)):
            d = poison_(torch.empty_like(plain))
            assert gemm(lhs, rhs, d, **layout) is d
            assert_bitwise_equal(d, plain, f"{name} with grouped_layout= ({sorted(layout)})")


@pytest.mark.gpu
def test_k_grouped_keyword_calls_are_the_positional_calls():
    ks = [256, 0, 384]  # an empty group: d[1] is zeros either way
    a, b, ks_tensor = make_k_grouped_inputs(ks, 256, 384)
    dy, x, _ = make_k_grouped_bf16_inputs(ks, 256, 384)
    # (FP8, BF16) float64 products of the groups
    expected = (
        reference_k_grouped.k_grouped_fp8_gemm_nt_contiguous(
            a, b, torch.empty(len(ks), 256, 384, device="cuda", dtype=torch.float64), ks),
        reference_k_grouped.k_grouped_bf16_gemm_tn_contiguous(
            dy, x, torch.empty(len(ks), 256, 384, device="cuda", dtype=torch.float64), ks))
    for gemm, lhs, rhs in ((deep_kernels.k_grouped_fp8_gemm_nt_contiguous, a, b),
                           (deep_kernels.k_grouped_fp8_gemm_tn_contiguous, (a[0].T, a[1].T), (b[0].T, b[1].T)),
                           (deep_kernels.k_grouped_bf16_gemm_tn_contiguous, dy, x)):
        plain = gemm(lhs, rhs, poison_(torch.empty(len(ks), 256, 384, device="cuda")), ks, ks_tensor)
        for g in range(len(ks)):
            assert_gemm_close(plain[g], expected[gemm is deep_kernels.k_grouped_bf16_gemm_tn_contiguous][g],
                              name=f"{gemm.__name__} d[{g}]")
        d = poison_(torch.empty_like(plain))
        assert gemm(lhs, rhs, d, ks_cpu=ks, grouped_layout=ks_tensor) is d
        assert_bitwise_equal(d, plain, f"{gemm.__name__} with ks_cpu= and grouped_layout=")


@pytest.mark.gpu
def test_transformed_scales_give_the_same_products():
    # Row-major FP32 sfa (a copy each call) and its transformed MN-major layout give the same bits.
    a, b = make_gemm_inputs(100, 2112, 7168)
    row_major_sfa = a[1].contiguous()
    plain = deep_kernels.fp8_gemm_nt((a[0], row_major_sfa), b, poison_(torch.empty((100, 2112), device="cuda",
                                                                                 dtype=torch.bfloat16)))
    assert_gemm_close(plain, reference.fp8_gemm_nt(a, b, _product(a, b)))
    sfa = deep_kernels.transform_sf_into_required_layout(row_major_sfa, 100, 7168, (1, 128, 128), is_sfa=True)
    sfb = deep_kernels.transform_sf_into_required_layout(b[1], 2112, 7168, (1, 128, 128), is_sfa=False)
    d = deep_kernels.fp8_gemm_nt((a[0], sfa), (b[0], sfb), poison_(torch.empty_like(plain)))
    assert_bitwise_equal(d, plain, "fp8_gemm_nt on transformed scales")
    a, b, m_indices, _ = make_contiguous_inputs([300, 0, 77], 576, 1024)
    plain = deep_kernels.m_grouped_fp8_gemm_nt_contiguous(
        (a[0], a[1].contiguous()), b, poison_(torch.empty((m_indices.numel(), 576), device="cuda",
                                                          dtype=torch.bfloat16)), m_indices)
    expected = reference.m_grouped_fp8_gemm_nt_contiguous(
        a, b, torch.empty((m_indices.numel(), 576), device="cuda", dtype=torch.float64), m_indices)
    valid = m_indices >= 0
    assert_gemm_close(plain[valid], expected[valid])
    sfa = deep_kernels.transform_sf_into_required_layout(a[1].contiguous(), m_indices.numel(), 1024, (1, 128))
    sfb = deep_kernels.transform_sf_into_required_layout(b[1], 576, 1024, (1, 128, 128), 3, False)
    d = deep_kernels.m_grouped_fp8_gemm_nt_contiguous((a[0], sfa), (b[0], sfb), poison_(torch.empty_like(plain)),
                                                      m_indices)
    assert_bitwise_equal(d, plain, "m_grouped_fp8_gemm_nt_contiguous on transformed scales")
