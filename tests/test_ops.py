"""The torch custom ops (deep_kernels.ops): torch.compile(fullgraph=True) traces every public function to its op with
no graph break; the ops' fake implementations give the eager functions' outputs (dtype, shape, strides: those of the
plain-torch references, computed on the CPU) and take symbolic sizes (new token counts reuse one dynamic graph);
the ops' implementations hand their arguments to the eager functions
(which then check everything but the device on CPU tensors); and on the GPU compiled code, and its CUDA-graph
replay, gives the eager bits."""

import dataclasses
import inspect
from typing import Callable, NamedTuple

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import deep_kernels
from deep_kernels.moe.layout import MoeLayout
from deep_kernels.reference import gemm as reference_gemm
from deep_kernels.reference import moe as reference_moe
from deep_kernels.reference import quant as reference_quant
from deep_kernels.testing import assert_bitwise_equal, empty_like_strided, poison_, random_activations
from deep_kernels.testing.fp4_gemm import make_fp4_gemm_inputs, make_nvfp4_gemm_inputs, mxfp4_weights
from deep_kernels.testing.gemm import make_gemm_inputs
from deep_kernels.testing.grouped import make_contiguous_inputs, make_masked_inputs, make_weights
from deep_kernels.testing.wgrad import make_k_grouped_bf16_inputs, make_k_grouped_inputs, make_wgrad_inputs

# Public functions without an op: they launch nothing of their own (torch ops, or host-side values) and trace as
# they are.
NEEDS_NO_OP = {"get_m_alignment_for_contiguous_layout", "get_mk_alignment_for_contiguous_layout",
               "get_k_alignment_for_contiguous_layout",
               "get_tma_aligned_size", "transform_sf_into_required_layout",
               "get_theoretical_mk_alignment_for_contiguous_layout", "set_mk_alignment_for_contiguous_layout",
               # DeepGEMM's other name of m_grouped_fp8_gemm_nt_masked, which traces to its op
               "fp8_m_grouped_gemm_nt_masked", "get_col_major_tma_aligned_tensor", "get_mn_major_tma_aligned_tensor",
               "get_num_sms",
               "nvfp4_global_scale", "prepare_fp4_weights", "set_num_sms", "tma_aligned_size",
               # transposed views handed to the NT call, which traces to its op
               "bf16_gemm_nn", "bf16_gemm_tn", "bf16_gemm_tt", "k_grouped_bf16_gemm_tn_contiguous",
               "m_grouped_bf16_gemm_nn_contiguous", "fp8_gemm_nn", "fp8_gemm_tn", "fp8_gemm_tt",
               "m_grouped_fp8_gemm_nn_contiguous"}
GEMMS = {"fp8_gemm_nt", "k_grouped_fp8_gemm_nt_contiguous", "k_grouped_fp8_gemm_tn_contiguous",
         "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked", "fp8_fp4_gemm_nt",
         "m_grouped_fp8_fp4_gemm_nt_contiguous", "m_grouped_fp8_fp4_gemm_nt_masked", "bf16_gemm_nt",
         "m_grouped_bf16_gemm_nt_contiguous", "m_grouped_bf16_gemm_nt_masked", "k_grouped_bf16_gemm_nt_contiguous"}


# ---- inputs (CPU) ----

def _x(m: int, k: int, dtype=torch.bfloat16, seed: int = 0) -> torch.Tensor:
    return random_activations(m, k, dtype, device="cpu", seed=seed)


def _routing(num_tokens: int = 5, num_experts: int = 16, k: int = 4, max_tokens: int = 3) -> tuple:
    """(logits, weights, indices, layout with the masked tensors) of DeepSeek-style grouped sigmoid routing."""
    logits = _x(num_tokens, num_experts, torch.float32, seed=3)
    weights, indices = reference_moe.topk_gate(logits, k, "sigmoid", num_groups=4, topk_groups=2)
    return logits, weights, indices, reference_moe.moe_layout(indices, num_experts, max_tokens)


def _swiglu_rows() -> tuple:
    """(args, kwargs) of swiglu_cast_to_fp8: x [N, 2H] (H = 256), a clamp, row weights gathered through pos (one row
    skipped)."""
    pos = torch.tensor([0, 3, -1, 5, 11, 2], dtype=torch.int32)
    return (_x(6, 512),), dict(clamp=7.0, weights=torch.rand(12), pos=pos)


def _fp8_expand(masked: bool, scale_layout: str) -> tuple:
    """(args, kwargs) of moe_expand of FP8 token rows with their scales."""
    q, scales = reference_quant.per_token_cast_to_fp8(_x(5, 256), ue8m0=scale_layout == "packed_ue8m0",
                                                      scale_layout=scale_layout)
    return (q, _routing()[3]), dict(scales=scales, masked=masked)


def _fp8_reduce() -> tuple:
    """(args, kwargs) of moe_reduce of FP8 rows in the masked layout, with their scales."""
    _, weights, _, layout = _routing()
    q, scales = reference_moe.moe_expand_cast_to_fp8(_x(5, 256), layout, masked=True)
    return (q, layout, weights), dict(scales=scales, masked=True, out_dtype=torch.float32)


def _bf16_reduce() -> tuple:
    _, weights, _, layout = _routing()
    return (reference_moe.moe_expand(_x(5, 256), layout), layout, weights), {}


def _accumulating_gemm() -> tuple:
    """(args, kwargs) of fp8_gemm_nt accumulating in place: c is d."""
    d = torch.rand(5, 64)
    return (*make_gemm_inputs(5, 64, 256, device="cpu"), d), dict(c=d)


def _contiguous_gemm(form: str) -> tuple:
    a, b, m_indices, offsets = make_contiguous_inputs([3, 0, 5], 32, 128, device="cpu")
    d = torch.empty(m_indices.numel(), 32, dtype=torch.bfloat16)
    return ((a, b, d, m_indices), {}) if form == "m_indices" else ((a, b, d), dict(offsets=offsets))


def _wgrad_gemm() -> tuple:
    """(args, kwargs) of fp8_gemm_nt with the weight-gradient recipe, accumulating in place."""
    d = torch.rand(5, 64)
    return (*make_wgrad_inputs(5, 64, 256, device="cpu"), d), dict(c=d, recipe=(1, 1, 128))


def _k_grouped_gemm(layout: str) -> tuple:
    """(args, kwargs) of the k-grouped GEMM of three groups (one empty), with c (nt) or c is d (tn)."""
    ks = [128, 0, 256]
    a, b, ks_tensor = make_k_grouped_inputs(ks, 8, 32, device="cpu")
    d = torch.rand(3, 8, 32)
    if layout == "nt":
        return (a, b, d, ks, ks_tensor), dict(c=torch.rand(3, 8, 32))
    return ((a[0].T, a[1].T), (b[0].T, b[1].T), d, ks, ks_tensor), dict(c=d)


def _masked_gemm() -> tuple:
    a, b, masked_m = make_masked_inputs([2, 0, 3], 4, 32, 128, device="cpu")
    return (a, b, torch.empty(3, 4, 32, dtype=torch.bfloat16), masked_m, 2), {}


def _bf16_gemm(accumulate: bool) -> tuple:
    """(args, kwargs) of bf16_gemm_nt: bf16 d, or FP32 d accumulating in place (c is d)."""
    a, b = _x(5, 256), _x(64, 256, seed=1)
    if not accumulate:
        return (a, b, torch.empty(5, 64, dtype=torch.bfloat16)), {}
    d = torch.rand(5, 64)
    return (a, b, d), dict(c=d)


def _bf16_contiguous_gemm() -> tuple:
    m_indices = torch.full((256,), -1, dtype=torch.int32)
    m_indices[:3], m_indices[128:133] = 0, 2
    a, b = _x(256, 128), _x(96, 128, seed=1).view(3, 32, 128)
    return (a, b, torch.empty(256, 32, dtype=torch.bfloat16), m_indices), {}


def _bf16_masked_gemm() -> tuple:
    a, b = _x(12, 128).view(3, 4, 128), _x(96, 128, seed=1).view(3, 32, 128)
    return (a, b, torch.empty(3, 4, 32, dtype=torch.bfloat16), torch.tensor([2, 0, 3], dtype=torch.int32), 2), {}


def _bf16_k_grouped_gemm() -> tuple:
    """(args, kwargs) of the k-grouped BF16 GEMM of three groups (one empty): a M-major (a token-major tensor's
    transpose), b K-major, accumulating in place (c is d)."""
    ks = [64, 0, 128]
    a, b = _x(192, 8).t(), _x(32, 192, seed=1)
    d = torch.rand(3, 8, 32)
    return (a, b, d, ks, torch.tensor(ks, dtype=torch.int32)), dict(c=d)


def _fp4_contiguous_gemm() -> tuple:
    a, _, m_indices, _ = make_contiguous_inputs([3, 0, 5], 32, 128, device="cpu")
    return (a, mxfp4_weights(32, 128, device="cpu", num_groups=3), torch.empty(m_indices.numel(), 32,
                                                                               dtype=torch.bfloat16), m_indices), {}


def _fp4_masked_gemm() -> tuple:
    a, _, masked_m = make_masked_inputs([2, 0, 3], 4, 32, 128, device="cpu")
    return (a, mxfp4_weights(32, 128, device="cpu", num_groups=3), torch.empty(3, 4, 32, dtype=torch.bfloat16),
            masked_m, 2), {}


def _accumulating_nvfp4_gemm() -> tuple:
    """(args, kwargs) of the NVFP4 GEMM accumulating into d in place (c is d)."""
    d = torch.rand(5, 64)
    return (*make_nvfp4_gemm_inputs(5, 64, 256, device="cpu"), d), dict(c=d)


class Case(NamedTuple):
    id: str
    name: str  # the public function
    make: Callable  # () -> (args, kwargs) on the CPU
    with_out: bool = False  # also pass out=, shaped as the reference's outputs


CASES = [
    # FP8, E5M6 and FP4 casts
    Case("per_token", "per_token_cast_to_fp8", lambda: ((_x(5, 256),), {})),
    Case("per_token-fp32-row_major-div", "per_token_cast_to_fp8",
         lambda: ((_x(5, 256, torch.float32),), dict(group_size=64, scale_layout="row_major", scale_mode="div")), True),
    Case("per_token-packed_ue8m0", "per_token_cast_to_fp8",
         lambda: ((_x(6, 512),), dict(ue8m0=True, scale_layout="packed_ue8m0")), True),
    Case("per_token-one-group-per-row", "per_token_cast_to_fp8", lambda: ((_x(5, 384),), dict(group_size=None))),
    Case("per_block", "per_block_cast_to_fp8", lambda: ((_x(130, 256),), {})),
    Case("per_block-32-fp32", "per_block_cast_to_fp8", lambda: ((_x(40, 64, torch.float32),), dict(block_size=32)),
         True),
    Case("cast_back", "per_token_cast_back", lambda: (reference_quant.per_token_cast_to_fp8(_x(5, 256)), {})),
    Case("cast_back-row_major-fp32", "per_token_cast_back",
         lambda: (reference_quant.per_token_cast_to_fp8(_x(5, 256), scale_layout="row_major"),
                  dict(out_dtype=torch.float32)), True),
    Case("requant", "requant_per_block_to_per_token",
         lambda: (reference_quant.per_block_cast_to_fp8(_x(130, 256)), {}), True),
    Case("requant-packed_ue8m0", "requant_per_block_to_per_token",
         lambda: (reference_quant.per_block_cast_to_fp8(_x(130, 256)), dict(ue8m0=True, scale_layout="packed_ue8m0"))),
    Case("mxfp4", "per_token_cast_to_mxfp4", lambda: ((_x(5, 64),), {})),
    Case("mxfp4-packed_ue8m0", "per_token_cast_to_mxfp4", lambda: ((_x(5, 256),), dict(scale_layout="packed_ue8m0")),
         True),
    Case("nvfp4", "per_token_cast_to_nvfp4", lambda: ((_x(5, 64), torch.tensor([0.01])), {})),
    Case("nvfp4-swizzled", "per_token_cast_to_nvfp4",
         lambda: ((_x(5, 96), torch.tensor([0.01])), dict(scale_layout="swizzled")), True),
    Case("mxfp4_cast_back", "mxfp4_cast_back", lambda: (reference_quant.per_token_cast_to_mxfp4(_x(5, 64)), {})),
    Case("mxfp4_cast_back-fp32", "mxfp4_cast_back",
         lambda: (reference_quant.per_token_cast_to_mxfp4(_x(5, 64)), dict(out_dtype=torch.float32)), True),
    Case("nvfp4_cast_back-swizzled", "nvfp4_cast_back",
         lambda: ((*reference_quant.per_token_cast_to_nvfp4(_x(5, 96), torch.tensor([0.01]), "swizzled"),
                   torch.tensor([0.01])), dict(scale_layout="swizzled")), True),
    Case("mxfp4_requant", "mxfp4_requant_to_fp8",
         lambda: (reference_quant.per_token_cast_to_mxfp4(_x(5, 256), "packed_ue8m0"), {}), True),
    Case("e5m6", "per_token_cast_to_e5m6", lambda: ((_x(5, 64),), dict(ue8m0=True)), True),
    Case("e5m6_cast_back", "per_token_cast_back_e5m6",
         lambda: (reference_quant.per_token_cast_to_e5m6(_x(5, 64)), dict(out_dtype=torch.float32)), True),
    # SwiGLU, transposes
    Case("swiglu_cast", "swiglu_cast_to_fp8", _swiglu_rows),
    Case("swiglu_cast-packed_ue8m0", "swiglu_cast_to_fp8",
         lambda: ((_x(6, 512),), dict(ue8m0=True, scale_layout="packed_ue8m0")), True),
    Case("swiglu_cast_masked", "swiglu_cast_to_fp8_masked",
         lambda: ((_x(12, 512).view(3, 4, 512), torch.tensor([2, 0, 4], dtype=torch.int32)), dict(check_pos=False)),
         True),
    Case("swiglu_forward", "swiglu_forward", lambda: ((_x(6, 512),), dict(weights=torch.rand(6))), True),
    Case("swiglu_backward", "swiglu_backward", lambda: ((_x(6, 512), _x(6, 256, seed=1)), dict(clamp=7.0)), True),
    Case("per_channel_transpose", "per_channel_cast_transpose_to_fp8", lambda: ((_x(32, 256),), {})),
    Case("per_channel_transpose-packed_ue8m0", "per_channel_cast_transpose_to_fp8",
         lambda: ((_x(160, 64, torch.float32),), dict(ue8m0=True, scale_layout="packed_ue8m0")), True),
    Case("batched_transpose", "batched_transpose", lambda: ((_x(10, 24, torch.float32).view(2, 5, 24),), {})),
    Case("batched_transpose-e4m3", "batched_transpose",
         lambda: ((_x(10, 32).to(torch.float8_e4m3fn).view(2, 5, 32),), {}), True),
    # MoE routing
    Case("topk_gate", "topk_gate",
         lambda: ((_routing()[0], 4, "sigmoid"), dict(bias=torch.rand(16), num_groups=4, topk_groups=2,
                                                      routed_scaling_factor=2.5))),
    Case("topk_gate_backward", "topk_gate_backward",
         lambda: ((torch.rand(5, 4), _routing()[0], _routing()[2], "sigmoid"), {}), True),
    Case("map_global_to_local", "map_global_to_local_experts", lambda: ((_routing()[2].long(), 4, 1), {}), True),
    Case("moe_layout", "moe_layout", lambda: ((_routing()[2], 16), {})),
    Case("moe_layout-masked", "moe_layout", lambda: ((_routing()[2], 16), dict(max_tokens=3))),
    Case("gate_with_layout", "topk_gate_with_layout", lambda: ((_routing()[0], 4, "softmax"), {})),
    Case("gate_with_layout-masked", "topk_gate_with_layout",
         lambda: ((_routing()[0], 4, "sigmoid"), dict(num_groups=4, topk_groups=2, max_tokens=3)), True),
    Case("expand", "moe_expand", lambda: ((_x(5, 256), _routing()[3]), {})),
    Case("expand-masked", "moe_expand", lambda: ((_x(5, 256), _routing()[3]), dict(masked=True)), True),
    Case("expand-fp8-masked", "moe_expand", lambda: _fp8_expand(True, "mn_major")),
    Case("expand-fp8-packed", "moe_expand", lambda: _fp8_expand(False, "packed_ue8m0"), True),
    Case("expand_cast", "moe_expand_cast_to_fp8", lambda: ((_x(5, 256), _routing()[3]), {})),
    Case("expand_cast-masked-packed_ue8m0", "moe_expand_cast_to_fp8",
         lambda: ((_x(5, 256), _routing()[3]), dict(masked=True, ue8m0=True, scale_layout="packed_ue8m0")), True),
    Case("reduce", "moe_reduce", _bf16_reduce),
    Case("reduce-fp8-masked", "moe_reduce", _fp8_reduce, True),
    # GEMMs (d is written: the compiled call returns it)
    Case("gemm", "fp8_gemm_nt", lambda: ((*make_gemm_inputs(5, 64, 256, device="cpu"),
                                         torch.empty(5, 64, dtype=torch.bfloat16)), {})),
    Case("gemm-c", "fp8_gemm_nt", lambda: ((*make_gemm_inputs(5, 64, 256, device="cpu"), torch.empty(5, 64)),
                                           dict(c=torch.rand(5, 64)))),
    Case("gemm-c-is-d", "fp8_gemm_nt", _accumulating_gemm),
    Case("gemm-wgrad", "fp8_gemm_nt", _wgrad_gemm),
    Case("k_grouped-nt", "k_grouped_fp8_gemm_nt_contiguous", lambda: _k_grouped_gemm("nt")),
    Case("k_grouped-tn", "k_grouped_fp8_gemm_tn_contiguous", lambda: _k_grouped_gemm("tn")),
    Case("grouped_contiguous", "m_grouped_fp8_gemm_nt_contiguous", lambda: _contiguous_gemm("m_indices")),
    Case("grouped_contiguous-offsets", "m_grouped_fp8_gemm_nt_contiguous", lambda: _contiguous_gemm("offsets")),
    Case("grouped_masked", "m_grouped_fp8_gemm_nt_masked", _masked_gemm),
    Case("fp4_gemm", "fp8_fp4_gemm_nt", lambda: ((*make_fp4_gemm_inputs(5, 64, 256, device="cpu"),
                                                 torch.empty(5, 64, dtype=torch.bfloat16)), {})),
    Case("fp4_gemm-c", "fp8_fp4_gemm_nt", lambda: ((*make_fp4_gemm_inputs(5, 64, 256, device="cpu"),
                                                   torch.empty(5, 64)), dict(c=torch.rand(5, 64)))),
    Case("nvfp4_gemm", "fp8_fp4_gemm_nt", lambda: ((*make_nvfp4_gemm_inputs(5, 64, 256, device="cpu"),
                                                   torch.empty(5, 64, dtype=torch.bfloat16)), {})),
    Case("nvfp4_gemm-c-is-d", "fp8_fp4_gemm_nt", _accumulating_nvfp4_gemm),
    Case("fp4_grouped_contiguous", "m_grouped_fp8_fp4_gemm_nt_contiguous", _fp4_contiguous_gemm),
    Case("fp4_grouped_masked", "m_grouped_fp8_fp4_gemm_nt_masked", _fp4_masked_gemm),
    Case("bf16_gemm", "bf16_gemm_nt", lambda: _bf16_gemm(False)),
    Case("bf16_gemm-c-is-d", "bf16_gemm_nt", lambda: _bf16_gemm(True)),
    Case("bf16_grouped_contiguous", "m_grouped_bf16_gemm_nt_contiguous", _bf16_contiguous_gemm),
    Case("bf16_grouped_masked", "m_grouped_bf16_gemm_nt_masked", _bf16_masked_gemm),
    Case("bf16_k_grouped", "k_grouped_bf16_gemm_nt_contiguous", _bf16_k_grouped_gemm),
]


# ---- helpers ----

def _moved(value, device: str, moved: dict):
    """value with every tensor (in tuples, lists, dicts and MoeLayouts) copied to device; a tensor met twice is
    copied once (c is d stays so)."""
    if isinstance(value, torch.Tensor):
        if id(value) not in moved:
            copy = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=device)
            moved[id(value)] = copy if device == "meta" else copy.copy_(value)
        return moved[id(value)]
    if isinstance(value, MoeLayout):
        return MoeLayout(**{name: _moved(t, device, moved) for name, t in _fields(value).items()})
    if isinstance(value, (tuple, list)):
        return type(value)(_moved(v, device, moved) for v in value)
    if isinstance(value, dict):
        return {key: _moved(v, device, moved) for key, v in value.items()}
    return value


def _fields(layout: MoeLayout) -> dict:
    return {field.name: getattr(layout, field.name) for field in dataclasses.fields(layout)}


def _tensors(result) -> list:
    """The tensors of a result (tuples and MoeLayouts flattened in order, None kept)."""
    if isinstance(result, MoeLayout):
        return list(_fields(result).values())
    if isinstance(result, (tuple, list)):
        return [t for value in result for t in _tensors(value)]
    return [result]


def _geometry(t) -> tuple:
    """dtype, shape and strides (of dimensions longer than 1, as the bitwise comparisons check them)."""
    if t is None:
        return None
    return t.dtype, tuple(t.shape), tuple(s for size, s in zip(t.shape, t.stride()) if size > 1)


class GraphRecorder:
    """A torch.compile backend: records each FX graph dynamo hands it, then runs it through AOTAutograd (which runs
    the ops' fake implementations) eagerly."""

    def __init__(self):
        self.graphs = []

    def __call__(self, graph_module, example_inputs):
        self.graphs.append(graph_module)
        return torch._dynamo.backends.debugging.aot_eager(graph_module, example_inputs)

    def deep_kernels_ops(self) -> list:
        """Every deep_kernels op the recorded graphs call, as "name.overload", in order."""
        return [str(node.target).removeprefix("deep_kernels.") for graph in self.graphs for node in graph.graph.nodes
                if node.op == "call_function" and str(node.target).startswith("deep_kernels.")]


def _compiled(fn, recorder: GraphRecorder):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend=recorder)


def _reference(name: str):
    for module in (reference_quant, reference_moe, reference_gemm):
        if hasattr(module, name):
            return getattr(module, name)
    raise AssertionError(f"no reference for {name}")


def _call_args(case: Case) -> tuple:
    """(args, kwargs, the reference's result) of a case on the CPU, kwargs with out= (empty tensors shaped as the
    reference's outputs) for a case with_out."""
    args, kwargs = case.make()
    expected = None if case.name in GEMMS else _reference(case.name)(*args, **kwargs)
    if case.with_out:
        kwargs = dict(kwargs, out=_empty_like_result(expected))
    return args, kwargs, expected


def _empty_like_result(result):
    """Uninitialised tensors in result's structure (tuples and MoeLayouts, None kept)."""
    if isinstance(result, MoeLayout):
        return MoeLayout(**{name: _empty_like_result(t) for name, t in _fields(result).items()})
    if isinstance(result, (tuple, list)):
        return tuple(_empty_like_result(value) for value in result)
    return None if result is None else empty_like_strided(result)


# ---- CPU ----

def test_every_public_function_has_an_op_or_launches_nothing():
    functions = {name for name in deep_kernels.__all__ if callable(getattr(deep_kernels, name))
                 and not isinstance(getattr(deep_kernels, name), type)}
    with_ops = {name for name in functions if hasattr(torch.ops.deep_kernels, name)}
    assert functions - with_ops == NEEDS_NO_OP
    assert {case.name for case in CASES} == with_ops, "every op has a case below"
    with_out = {name for name in with_ops if "out" in getattr(torch.ops.deep_kernels, name).overloads()}
    assert {case.name for case in CASES if case.with_out} == with_out, "every .out overload has a case below"


def _gemm_names() -> list:
    return sorted(name for name in deep_kernels.__all__ if "gemm_" in name and callable(getattr(deep_kernels, name)))


def test_every_gemm_takes_deepgemm_options():
    # DeepGEMM's names: compiled_dims on every GEMM; disable_ue8m0_cast and the recipe pair recipe_a / recipe_b
    # (positional after recipe, as DeepGEMM's) on those with FP8 operand scales (not the k-grouped ones, whose DeepGEMM
    # forms lack them); the psum layout options on the M-grouped contiguous ones (the hint on the NT forms only).
    for name in _gemm_names():
        parameters = inspect.signature(getattr(deep_kernels, name)).parameters
        assert parameters["compiled_dims"].default == "nk", name
        takes_ue8m0_option = "fp8" in name and not name.startswith("k_grouped")
        assert ("disable_ue8m0_cast" in parameters) == takes_ue8m0_option, name
        names = list(parameters)
        if takes_ue8m0_option:
            assert names.index("recipe_b") == names.index("recipe_a") + 1 == names.index("recipe") + 2, name
            assert parameters["recipe_a"].kind == inspect.Parameter.POSITIONAL_OR_KEYWORD, name
        else:
            assert "recipe_a" not in parameters and "recipe_b" not in parameters, name
        contiguous = name.startswith("m_grouped") and name.endswith("_contiguous")
        assert ("use_psum_layout" in parameters) == ("ensure_zero_padding" in parameters) == contiguous, name
        # DeepGEMM's current keyword for the layout argument (the k-grouped GEMMs': the device group sizes, with
        # ks_cpu for the host ones), beside our positional names.
        k_grouped = name.startswith("k_grouped")
        assert ("grouped_layout" in parameters) == (contiguous or k_grouped), name
        assert ("ks_cpu" in parameters) == k_grouped, name
        if contiguous or k_grouped:
            assert parameters["grouped_layout"].kind == inspect.Parameter.KEYWORD_ONLY, name
            positional = ("m_indices",) if contiguous else ("ks", "ks_tensor")
            assert names[3:3 + len(positional)] == list(positional), name
            assert all(parameters[p].default is None for p in positional), name
        assert ("expected_m_for_psum_layout" in parameters) == (contiguous and "_nt_" in name), name


@pytest.mark.parametrize("case", [case for case in CASES if case.name in GEMMS], ids=lambda case: case.id)
def test_deepgemm_options_are_checked_then_change_nothing(case):
    public = getattr(deep_kernels, case.name)
    args, kwargs = case.make()
    takes_ue8m0_option = "disable_ue8m0_cast" in inspect.signature(public).parameters
    options = dict(compiled_dims="mn", **({"disable_ue8m0_cast": True} if takes_ue8m0_option else {}))
    with pytest.raises(ValueError, match="must be a CUDA tensor"):  # every check before the device's passed
        public(*args, **kwargs, **options)
    with pytest.raises(ValueError, match="compiled_dims must be a string of the letters m, n and k, got 'nx'"):
        public(*args, **kwargs, compiled_dims="nx")
    if takes_ue8m0_option:
        with pytest.raises(TypeError, match="disable_ue8m0_cast must be a bool, got str"):
            public(*args, **kwargs, disable_ue8m0_cast="yes")


def test_compiled_call_with_deepgemm_options_is_the_op():
    args, kwargs = _accumulating_gemm()
    meta_args, meta_kwargs = _moved((args, kwargs), "meta", {})
    recorder = GraphRecorder()
    compiled = _compiled(lambda *args: deep_kernels.fp8_gemm_nt(*args, **meta_kwargs, compiled_dims="mn",
                                                                disable_ue8m0_cast=True), recorder)
    assert compiled(*meta_args) is meta_args[2]
    assert recorder.deep_kernels_ops() == ["fp8_gemm_nt.default"]


def test_compiled_psum_layout_call_is_the_contiguous_op():
    # DeepGEMM's psum layout becomes m_indices by torch ops before the op: the graph holds the one contiguous op.
    (a, b, d, _), _ = _contiguous_gemm("m_indices")
    ends = torch.tensor([3, 128, 133], dtype=torch.int32)  # sizes 3, 0 and 5
    meta_args = _moved((a, b, d, ends), "meta", {})
    recorder = GraphRecorder()
    compiled = _compiled(lambda *args: deep_kernels.m_grouped_fp8_gemm_nt_contiguous(*args, use_psum_layout=True),
                         recorder)
    assert compiled(*meta_args) is meta_args[2]
    assert recorder.deep_kernels_ops() == ["m_grouped_fp8_gemm_nt_contiguous.default"]


def _transposed_form_call(name: str) -> tuple:
    """(args, the NT op it traces to) of a transposed form on the CPU: the NT operands' transposed views."""
    if name == "m_grouped_bf16_gemm_nn_contiguous":
        a, b, d, m_indices = _bf16_contiguous_gemm()[0]
        return (a, b.mT, d, m_indices), "m_grouped_bf16_gemm_nt_contiguous.default"
    if name == "m_grouped_fp8_gemm_nn_contiguous":
        a, (b, sfb), d, m_indices = _contiguous_gemm("m_indices")[0]
        return (a, (b.mT, sfb.mT), d, m_indices), "m_grouped_fp8_gemm_nt_contiguous.default"
    (a, sfa), (b, sfb) = make_gemm_inputs(5, 64, 256, device="cpu")
    a_arg = (a.T, sfa.T) if name[-2] == "t" else (a, sfa)
    b_arg = (b.T, sfb.T) if name[-1] == "n" else (b, sfb)
    return (a_arg, b_arg, torch.empty(5, 64, dtype=torch.bfloat16)), "fp8_gemm_nt.default"


@pytest.mark.parametrize("name", ["fp8_gemm_nn", "fp8_gemm_tn", "fp8_gemm_tt", "m_grouped_fp8_gemm_nn_contiguous",
                                  "m_grouped_bf16_gemm_nn_contiguous"])
def test_compiled_transposed_form_is_its_nt_op(name):
    args, nt_op = _transposed_form_call(name)
    meta_args = _moved(args, "meta", {})
    recorder = GraphRecorder()
    result = _compiled(getattr(deep_kernels, name), recorder)(*meta_args)
    assert recorder.deep_kernels_ops() == [nt_op]
    assert result is meta_args[2], "the GEMM returns d"


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_compiled_call_is_the_op_with_the_eager_outputs(case):
    """torch.compile(fullgraph=True) of the public function on meta tensors: one graph calling the function's op
    (.out with out=), outputs shaped, typed and strided as the reference's on the CPU, out= and d returned as given."""
    args, kwargs, expected = _call_args(case)
    meta_args, meta_kwargs = _moved((args, kwargs), "meta", {})
    recorder = GraphRecorder()
    public = getattr(deep_kernels, case.name)
    result = _compiled(lambda *args: public(*args, **meta_kwargs), recorder)(*meta_args)

    overload = "out" if case.with_out else "default"
    assert recorder.deep_kernels_ops() == [f"{case.name}.{overload}"]
    if case.name in GEMMS:
        assert result is meta_args[2], "the GEMM returns d"
        return
    if case.with_out:
        assert all(r is o for r, o in zip(_tensors(result), _tensors(meta_kwargs["out"]))), "out= is returned"
        assert type(result) is type(expected)
    actual = [_geometry(t) for t in _tensors(result)]
    assert actual == [_geometry(t) for t in _tensors(expected)]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_op_hands_its_arguments_to_the_eager_function(case):
    """The compiled call on CPU tensors runs the op, whose implementation calls the eager function: every check
    passes but the device's (the eager functions check devices last)."""
    args, kwargs, _ = _call_args(case)
    public = getattr(deep_kernels, case.name)
    compiled = _compiled(lambda *args: public(*args, **kwargs), GraphRecorder())
    with pytest.raises(ValueError, match="must be a CUDA tensor, got a tensor on cpu"):
        compiled(*args)


def test_eager_calls_do_not_go_through_the_dispatcher():
    class OpLog(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    x = _x(5, 256)
    with OpLog() as log, pytest.raises(ValueError, match="x must be a CUDA tensor"):
        deep_kernels.per_token_cast_to_fp8(x)
    assert not [op for op in log.ops if op.startswith("deep_kernels.")]


def test_outputs_are_constants_to_autograd_as_in_eager_calls():
    x = torch.empty(5, 256, dtype=torch.bfloat16, device="meta", requires_grad=True)
    q, scales = _compiled(deep_kernels.per_token_cast_to_fp8, GraphRecorder())(x)
    assert not q.requires_grad and not scales.requires_grad


def _cast_gemm(x, b, sfb):
    d = torch.empty(x.shape[0], b.shape[0], dtype=torch.bfloat16, device=x.device)
    return deep_kernels.fp8_gemm_nt(deep_kernels.per_token_cast_to_fp8(x), (b, sfb), d)


def test_ops_run_during_a_compile_session_take_the_eager_path():
    """A backend may run the graph for real while compiling (as inductor's constant folding does), when
    torch.compiler.is_compiling() can still be true: the op's implementation must reach the eager function's checks,
    not call the op again."""
    def run_while_compiling(graph_module, example_inputs):
        graph_module(*example_inputs)
        return graph_module

    compiled = torch.compile(deep_kernels.per_token_cast_to_fp8, fullgraph=True, backend=run_while_compiling)
    torch._dynamo.reset()
    with pytest.raises((ValueError, torch._dynamo.exc.BackendCompilerFailed), match="x must be a CUDA tensor"):
        compiled(_x(5, 256))


def test_cast_then_gemm_compiles_to_one_graph_of_the_ops():
    """The issue's case: before the ops, dynamo failed on the eager body (a graph break at every call)."""
    (_, _), (b, sfb) = make_gemm_inputs(5, 64, 256, device="cpu")
    x, b, sfb = _moved((_x(5, 256), b, sfb), "meta", {})
    recorder = GraphRecorder()
    d = _compiled(_cast_gemm, recorder)(x, b, sfb)
    assert len(recorder.graphs) == 1
    assert recorder.deep_kernels_ops() == ["per_token_cast_to_fp8.default", "fp8_gemm_nt.default"]
    assert _geometry(d) == (torch.bfloat16, (5, 64), (64, 1))


def test_accumulating_in_place_passes_no_alias_of_d():
    """c is d reaches the op as the flag c_is_d: the tensors it reads never alias the d it writes."""
    (a, b), d = _moved((make_gemm_inputs(5, 64, 256, device="cpu"), torch.empty(5, 64)), "meta", {})
    recorder = GraphRecorder()
    assert _compiled(lambda a, b, d: deep_kernels.fp8_gemm_nt(a, b, d, d), recorder)(a, b, d) is d
    (call,) = [node for node in recorder.graphs[0].graph.nodes if "fp8_gemm_nt" in str(node.target)]
    assert call.args[5:7] == (None, True)


def test_cast_then_gemm_exports():
    """torch.export (non-strict by default: no dynamo) sees torch.compiler.is_compiling() too."""
    (_, _), (b, sfb) = make_gemm_inputs(5, 64, 256, device="cpu")

    class CastGemm(torch.nn.Module):
        def forward(self, x, b, sfb):
            return _cast_gemm(x, b, sfb)

    exported = torch.export.export(CastGemm(), _moved((_x(5, 256), b, sfb), "meta", {}))
    targets = [str(node.target) for node in exported.graph.nodes if node.op == "call_function"]
    assert "deep_kernels.per_token_cast_to_fp8.default" in targets
    assert any("deep_kernels.fp8_gemm_nt" in target for target in targets)


def _decode_moe_step(x, logits, bias, w_up, sfw_up, w_down, sfw_down, max_tokens: int):
    """One DeepSeek-style MoE decode step in the masked layout: routing, expand + cast, up-projection, SwiGLU + cast,
    down-projection, weighted reduce."""
    num_experts, intermediate = w_up.shape[0], w_up.shape[1] // 2
    weights, _, layout = deep_kernels.topk_gate_with_layout(
        logits, 4, "sigmoid", bias, num_groups=4, topk_groups=2, routed_scaling_factor=2.5, max_tokens=max_tokens)
    a = deep_kernels.moe_expand_cast_to_fp8(x, layout, masked=True)
    up = torch.zeros(num_experts, max_tokens, 2 * intermediate, dtype=torch.bfloat16, device=x.device)
    deep_kernels.m_grouped_fp8_gemm_nt_masked(a, (w_up, sfw_up), up, layout.masked_m, max_tokens)
    h = deep_kernels.swiglu_cast_to_fp8_masked(up, layout.masked_m, check_pos=False)
    down = torch.zeros(num_experts, max_tokens, x.shape[1], dtype=torch.bfloat16, device=x.device)
    deep_kernels.m_grouped_fp8_gemm_nt_masked(h, (w_down, sfw_down), down, layout.masked_m, max_tokens)
    return deep_kernels.moe_reduce(down, layout, weights, masked=True)


def _decode_moe_inputs(device: str, num_tokens: int = 5, hidden: int = 256, intermediate: int = 128,
                       num_experts: int = 16, max_tokens: int = 4) -> tuple:
    generator = torch.Generator(device=device).manual_seed(7)
    x = random_activations(num_tokens, hidden, device=device, seed=5)
    logits = torch.randn(num_tokens, num_experts, device=device, generator=generator)
    bias = torch.randn(num_experts, device=device, generator=generator) * 0.1
    return (x, logits, bias, *make_weights(num_experts, 2 * intermediate, hidden, device=device, seed=8),
            *make_weights(num_experts, hidden, intermediate, device=device, seed=9), max_tokens)


def test_decode_moe_step_compiles_to_one_graph_of_the_ops():
    *tensors, max_tokens = _decode_moe_inputs("cpu")
    recorder = GraphRecorder()
    out = _compiled(_decode_moe_step, recorder)(*_moved(tensors, "meta", {}), max_tokens)
    assert len(recorder.graphs) == 1
    assert recorder.deep_kernels_ops() == [
        "topk_gate_with_layout.default", "moe_expand_cast_to_fp8.default", "m_grouped_fp8_gemm_nt_masked.default",
        "swiglu_cast_to_fp8_masked.default", "m_grouped_fp8_gemm_nt_masked.default", "moe_reduce.default"]
    assert _geometry(out) == (torch.bfloat16, (5, 256), (256, 1))


def test_token_counts_share_one_dynamic_graph():
    """Serving engines call with a new token count at every step: after the first count's graph, dynamo's automatic
    dynamic shapes give one graph for every other count (the ops' fake implementations take symbolic sizes), so no
    count recompiles."""
    (_, _), (b, sfb) = make_gemm_inputs(5, 64, 256, device="cpu")
    b, sfb = _moved((b, sfb), "meta", {})
    recorder = GraphRecorder()
    cast_gemm = _compiled(_cast_gemm, recorder)
    for num_tokens in (5, 9, 13, 300):
        d = cast_gemm(_moved(_x(num_tokens, 256), "meta", {}), b, sfb)
        assert _geometry(d) == (torch.bfloat16, (num_tokens, 64), (64, 1))
    assert len(recorder.graphs) == 2
    recorder = GraphRecorder()
    decode_step = _compiled(_decode_moe_step, recorder)
    for num_tokens in (5, 9, 13):
        *tensors, max_tokens = _decode_moe_inputs("cpu", num_tokens=num_tokens)
        out = decode_step(*_moved(tensors, "meta", {}), max_tokens)
        assert _geometry(out) == (torch.bfloat16, (num_tokens, 256), (256, 1))
    assert len(recorder.graphs) == 2


@pytest.mark.parametrize("bf16", [False, True])
def test_k_grouped_group_sizes_reuse_one_dynamic_graph(bf16):
    """A training step's experts get new token counts every step: the host list ks is symbolic in the op (SymInt[]),
    so new counts of the same total reuse the dynamic graph instead of compiling one graph per ks."""
    sizes = [128, 256, 384, 512]
    if bf16:
        dy, x, ks_tensor = make_k_grouped_bf16_inputs(sizes, 64, 128, device="cpu")
        a, b, gemm = dy.T, x.T, deep_kernels.k_grouped_bf16_gemm_nt_contiguous
    else:
        a, b, ks_tensor = make_k_grouped_inputs(sizes, 64, 128, device="cpu")
        gemm = deep_kernels.k_grouped_fp8_gemm_nt_contiguous
    a, b, ks_tensor = _moved((a, b, ks_tensor), "meta", {})
    d = torch.empty(len(sizes), 64, 128, device="meta")
    recorder = GraphRecorder()
    compiled = _compiled(lambda a, b, d, ks, ks_tensor: gemm(a, b, d, ks, ks_tensor), recorder)
    for shift in range(4):  # distinct sizes in each list (equal ones would share a symbol, and a guard)
        assert compiled(a, b, d, sizes[shift:] + sizes[:shift], ks_tensor) is d
    assert len(recorder.graphs) == 2


def test_traced_calls_raise_the_eager_errors_of_a_bad_layout():
    """The layout is checked while tracing: torch.compile then runs the call eagerly, which raises the eager error;
    with fullgraph=True that error is the compile error's."""
    *_, layout = _routing()
    inputs = _moved((_x(5, 256), dataclasses.replace(layout, masked_slots=None, masked_m=None)), "meta", {})
    message = "masked=True needs a layout with the masked tensors"
    for fullgraph, error in ((False, ValueError), (True, (ValueError, torch._dynamo.exc.TorchDynamoException))):
        torch._dynamo.reset()
        compiled = torch.compile(lambda x, layout: deep_kernels.moe_expand(x, layout, masked=True),
                                 fullgraph=fullgraph, backend=GraphRecorder())
        with pytest.raises(error, match=message):
            compiled(*inputs)


# ---- GPU: compiled code and its CUDA-graph replay against eager calls ----

def _graph_replay(fn, static_inputs: list, new_inputs: list):
    """fn captured in a CUDA graph on static_inputs (after warm-up runs on a side stream, which also compile it and
    grow the split-K workspace), replayed with new_inputs copied into them; returns the replay's outputs (poisoned
    before the replay: the capture's own values do not pass for it)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn(*static_inputs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_outputs = fn(*static_inputs)
    for static, new in zip(static_inputs, new_inputs):
        if isinstance(static, torch.Tensor) and static is not new:
            static.copy_(new)
    for output in _tensors(static_outputs):
        poison_(output)
    graph.replay()
    torch.cuda.synchronize()
    return static_outputs


def _assert_outputs_equal(actual, expected, name: str) -> None:
    for i, (a, e) in enumerate(zip(_tensors(actual), _tensors(expected), strict=True)):
        assert_bitwise_equal(a, e, f"{name}[{i}]")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [5, 300])
def test_compiled_cast_gemm_matches_eager_and_replays_in_a_cuda_graph(m):
    """m = 5 is a decode size, where the heuristics split K (the split-K workspace grows in the warm-up runs, before
    the capture)."""
    (_, _), (b, sfb) = make_gemm_inputs(m, 1536, 7168)
    x, x_next = random_activations(m, 7168, seed=1), random_activations(m, 7168, seed=2)
    torch._dynamo.reset()
    compiled = torch.compile(_cast_gemm, fullgraph=True)
    _assert_outputs_equal(compiled(x, b, sfb), _cast_gemm(x, b, sfb), "compiled")
    replayed = _graph_replay(compiled, [x.clone(), b, sfb], [x_next, b, sfb])
    _assert_outputs_equal(replayed, _cast_gemm(x_next, b, sfb), "replayed")


def _cast_accumulate(x, b, sfb, c):
    """per_token_cast_to_fp8 into out= buffers, D = A B^T + C with c accumulated in place (c is d), the cast back
    into out=."""
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty_strided((x.shape[0], x.shape[1] // 128), (1, -(-x.shape[0] // 4) * 4), device=x.device)
    deep_kernels.per_token_cast_to_fp8(x, out=(q, scales))
    d = c.clone()
    deep_kernels.fp8_gemm_nt((q, scales), (b, sfb), d, d)
    x_back = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    return d, deep_kernels.per_token_cast_back(q, scales, out_dtype=torch.float32, out=x_back)


@pytest.mark.gpu
def test_compiled_out_variants_and_accumulation_match_eager():
    (_, _), (b, sfb) = make_gemm_inputs(64, 512, 1024)
    x, c = random_activations(64, 1024, seed=3), torch.randn(64, 512, device="cuda")
    torch._dynamo.reset()
    compiled = torch.compile(_cast_accumulate, fullgraph=True)
    _assert_outputs_equal(compiled(x, b, sfb, c), _cast_accumulate(x, b, sfb, c), "compiled")


@pytest.mark.gpu
def test_compiled_decode_moe_step_matches_eager_and_replays_in_a_cuda_graph():
    """64 tokens routed to 4 of 32 experts (4 groups, 2 kept), hidden 1024, expert intermediate 256; the replay runs
    new tokens and logits, so new expert counts (read on the device) through the captured graph."""
    x, logits, *parameters, max_tokens = _decode_moe_inputs("cuda", num_tokens=64, hidden=1024, intermediate=256,
                                                            num_experts=32, max_tokens=64)
    torch._dynamo.reset()
    compiled = torch.compile(_decode_moe_step, fullgraph=True)
    _assert_outputs_equal(compiled(x, logits, *parameters, max_tokens),
                          _decode_moe_step(x, logits, *parameters, max_tokens), "compiled")
    next_inputs = [random_activations(64, 1024, seed=11), torch.randn(64, 32, device="cuda"), *parameters, max_tokens]
    replayed = _graph_replay(compiled, [x.clone(), logits.clone(), *parameters, max_tokens], next_inputs)
    _assert_outputs_equal(replayed, _decode_moe_step(*next_inputs), "replayed")


def _prefill_moe_step(x, logits, w_up, sfw_up):
    """Routing, contiguous layout, expand + cast, grouped up-projection in both forms (m_indices, offsets), SwiGLU +
    cast with the gate weights gathered through row_to_slot."""
    weights, indices = deep_kernels.topk_gate(logits, 4, "softmax")
    layout = deep_kernels.moe_layout(indices, logits.shape[1])
    a = deep_kernels.moe_expand_cast_to_fp8(x, layout)
    up = torch.zeros(a[0].shape[0], w_up.shape[1], dtype=torch.bfloat16, device=x.device)
    deep_kernels.m_grouped_fp8_gemm_nt_contiguous(a, (w_up, sfw_up), up, layout.m_indices)
    up_from_offsets = torch.zeros_like(up)
    offsets = torch.nn.functional.pad(torch.cumsum(layout.counts, 0, dtype=torch.int32), (1, 0))
    deep_kernels.m_grouped_fp8_gemm_nt_contiguous(a, (w_up, sfw_up), up_from_offsets, offsets=offsets)
    q, scales = deep_kernels.swiglu_cast_to_fp8(up, weights=weights, pos=layout.row_to_slot, check_pos=False)
    # Rows of no slot are skipped (left unwritten): compare the rows of the routed slots.
    rows = layout.slot_to_row.view(-1).long()
    return weights, indices, up, up_from_offsets, q.view(torch.uint8)[rows], scales[rows].contiguous()


@pytest.mark.gpu
def test_compiled_prefill_moe_step_matches_eager():
    x, logits = random_activations(300, 512, seed=4), torch.randn(300, 16, device="cuda")
    w_up, sfw_up = make_weights(16, 512, 512, seed=6)
    torch._dynamo.reset()
    compiled = torch.compile(_prefill_moe_step, fullgraph=True)
    _assert_outputs_equal(compiled(x, logits, w_up, sfw_up), _prefill_moe_step(x, logits, w_up, sfw_up), "compiled")
