"""Autograd: the gate and SwiGLU (deep_kernels.nn.functional) and the MoE layer's backward
(deep_kernels.nn.moe_autograd.moe_layer).

CPU: each function's dataflow with its kernels replaced by their plain-torch references (same names, arguments and
rounding), against torch.autograd through a float64 formulation of the same function: what is left is the kernels'
formats (FP8 casts of the gradients, bf16 rounding), so the bounds below are the formats' error. GPU: the kernels
against the same float references, and bitwise run-to-run determinism of the gradients.

Bounds of the MoE layer: MOE_BOUNDS (their comment gives the measurements); a planted-bug test shows that each bound
rejects a wrong backward (the routing weight left out of the SwiGLU gradient, the gate's gradient lost, the
transposed weights' scale blocks left untransposed).
"""

import sys

import pytest
import torch
from functorch.compile import make_boxed_func

from deep_kernels.nn import functional, moe_autograd
from deep_kernels.reference import moe as reference_moe
from deep_kernels.reference import quant as reference_quant
from deep_kernels.reference.nn import moe as reference_nn_moe
from deep_kernels.reference.nn import moe_forward
from deep_kernels.testing import assert_bitwise_equal, calc_diff
from deep_kernels.testing.moe_layer import moe_layer_tokens, moe_layer_weights, training_kernels_on_references

HIDDEN, INTERMEDIATE, NUM_EXPERTS, TOKENS = 256, 128, 8, 40
GATE = dict(top_k=3, num_groups=4, topk_groups=2, scoring="sigmoid", renormalize=True, routed_scaling_factor=2.5)
GATE_WITHOUT_SCORING = dict(top_k=3, num_groups=4, topk_groups=2, routed_scaling_factor=2.5)  # the peers' arguments


# ---- the gate and SwiGLU (CPU, references) ----

@pytest.fixture
def pieces_on_references(monkeypatch):
    monkeypatch.setattr(functional, "_topk_gate_kernel", reference_moe.topk_gate)
    monkeypatch.setattr(functional, "topk_gate_backward", reference_moe.topk_gate_backward)
    monkeypatch.setattr(functional, "swiglu_forward", reference_quant.swiglu_forward)
    monkeypatch.setattr(functional, "swiglu_backward", reference_quant.swiglu_backward)


@pytest.mark.parametrize("scoring,renormalize", [("sigmoid", True), ("softmax", False), ("sqrtsoftplus", True)])
def test_gate_gradient_is_autograds(pieces_on_references, scoring, renormalize):
    torch.manual_seed(0)
    logits = torch.randn(9, 16, requires_grad=True)
    bias = torch.randn(16) * 0.1
    weights, indices = functional.topk_gate(logits, 4, scoring, bias, 4, 2, renormalize, 2.5)
    assert not indices.requires_grad and weights.requires_grad
    upstream = torch.randn_like(weights)
    (grad,) = torch.autograd.grad(weights, logits, upstream)
    # Autograd through the same selection in float64: the scores of the chosen experts, renormalized, scaled.
    exact_logits = logits.detach().double().requires_grad_()
    scores = {"sigmoid": torch.sigmoid, "softmax": lambda v: torch.softmax(v, dim=1),
              "sqrtsoftplus": lambda v: torch.sqrt(torch.nn.functional.softplus(v))}[scoring](exact_logits)
    chosen = scores.gather(1, indices.long())
    if renormalize:
        chosen = chosen / (chosen.sum(dim=1, keepdim=True) + 1e-20)
    (expected,) = torch.autograd.grad(chosen * 2.5, exact_logits, upstream.double())
    assert grad.dtype == logits.dtype and calc_diff(grad, expected) < 1e-12


def test_swiglu_gradients_are_autograds(pieces_on_references):
    torch.manual_seed(1)
    x = (torch.randn(6, 256) * 2).bfloat16().requires_grad_()
    slots = torch.rand(12, requires_grad=True)
    pos = torch.tensor([0, 3, -1, 5, 11, 2], dtype=torch.int32)
    y = functional.swiglu(x, slots, pos)
    assert y.dtype == torch.bfloat16 and torch.equal(y[2], torch.zeros_like(y[2]))
    upstream = torch.randn(6, 128).bfloat16()
    grad_x, grad_slots = torch.autograd.grad(y, (x, slots), upstream)
    exact_x, exact_slots = x.detach().double().requires_grad_(), slots.detach().double().requires_grad_()
    gate, up = exact_x.chunk(2, dim=1)
    row_weights = torch.where(pos >= 0, exact_slots[pos.long().clamp(min=0)], 0.0).unsqueeze(1)
    exact_y = torch.nn.functional.silu(gate) * up * row_weights
    expected_x, expected_slots = torch.autograd.grad(exact_y, (exact_x, exact_slots), upstream.double())
    assert grad_x.dtype == torch.bfloat16 and calc_diff(grad_x, expected_x) < 1e-5  # bf16 dx
    assert grad_slots.dtype == torch.float32 and calc_diff(grad_slots, expected_slots) < 1e-5
    assert torch.equal(grad_slots[[1, 4, 6, 7, 8, 9, 10]], torch.zeros(7))  # slots no row reads


def test_scatter_row_gradients_ignores_skipped_rows_reading_nothing():
    pos = torch.tensor([-1, 0, -1, 2], dtype=torch.int32)
    grad = functional.scatter_row_gradients(torch.tensor([5.0, 1.0, 6.0, 3.0]), pos, torch.zeros(2, 2))
    assert grad.tolist() == [[1.0, 0.0], [3.0, 0.0]]


# ---- the MoE layer (CPU, references) ----

@pytest.fixture
def layer_on_references(monkeypatch):
    training_kernels_on_references(monkeypatch)


def _layer(device: str, seed: int = 0) -> tuple:
    """(x, weights as leaves requiring gradients) of the tests' layer."""
    weights = moe_layer_weights(HIDDEN, INTERMEDIATE, NUM_EXPERTS, device, seed)
    x = moe_layer_tokens(TOKENS, HIDDEN, device, seed + 5).requires_grad_()
    for name in ("router_weight", "gate_up_weight", "down_weight"):
        weights[name].requires_grad_()
    return x, weights


DIFFERENTIABLE = ("x", "router_weight", "gate_up_weight", "down_weight")


def _grads(out: torch.Tensor, upstream: torch.Tensor, x, weights) -> dict:
    leaves = [x] + [weights[name] for name in DIFFERENTIABLE[1:]]
    return dict(zip(DIFFERENTIABLE, torch.autograd.grad(out, leaves, upstream)))


def _straight_through(round_trip):
    """A rounding of the reference made the identity for autograd: its value forward, gradient 1 backward."""
    return lambda values: values + (round_trip(values.detach()) - values).detach()


def _exact(x, weights, upstream, formats: bool = True) -> tuple:
    """(output, gradients) of the float64 reference layer by torch.autograd. formats: the forward in the kernels'
    activation formats (moe_forward's quantize=True), its FP8 casts and bf16 roundings straight through for the
    gradient, as the backward treats them; False: float64 throughout."""
    leaves = {"x": x.detach().double().requires_grad_()}
    leaves.update({name: weights[name].detach().double().requires_grad_() for name in DIFFERENTIABLE[1:]})
    with pytest.MonkeyPatch.context() as patch:
        for name in ("_fp8_round_trip", "_bf16_round_trip"):
            patch.setattr(reference_nn_moe, name, _straight_through(getattr(reference_nn_moe, name)))
        out = moe_forward(leaves["x"], leaves["router_weight"], weights["correction_bias"], leaves["gate_up_weight"],
                          leaves["down_weight"], **GATE, quantize=formats)
    grads = torch.autograd.grad(out, list(leaves.values()), upstream.double())
    return out, dict(zip(DIFFERENTIABLE, grads))


# calc_diff bounds of each gradient against float64 autograd through the reference in the kernels' formats
# (_exact): what is left is the backward's own FP8 casts (dout and dh, 1 x 128 for the input-gradient GEMMs; every
# weight-gradient operand 1 x 128 along the tokens) and bf16 roundings (the logits' gradient too, for the router
# GEMMs). Measured on the CPU with the references over seeds 0-3: x 3.6e-4 to 5.2e-4, router_weight 7e-6 to 1.2e-3
# (a sum over few tokens of the routing-weight gradients, dot products with cancellation), gate_up_weight 5.7e-4 to 8.9e-4, down_weight 3.3e-4 to 5.2e-4; the
# output 1.4e-6 (bf16). Against plain float64 (no formats) the forward's FP8 activations add about 1e-3 to each, and
# up to 1.3e-2 to the router's.
MOE_BOUNDS = {"x": 1.5e-3, "router_weight": 5e-3, "gate_up_weight": 2.5e-3, "down_weight": 1.5e-3}
OUTPUT_BOUND = 1e-5


def _moe(x, weights):
    return moe_autograd.moe_layer(x, weights["router_weight"], weights["correction_bias"], weights["gate_up_weight"],
                                  weights["down_weight"], **GATE)


def _check_layer(out, grads, exact_out, exact_grads, x, weights) -> None:
    assert out.dtype == torch.bfloat16 and out.shape == x.shape
    assert calc_diff(out.detach(), exact_out.detach()) < OUTPUT_BOUND
    for name in DIFFERENTIABLE:
        leaf = x if name == "x" else weights[name]
        assert grads[name].dtype == leaf.dtype and grads[name].shape == leaf.shape, name
        assert grads[name].isfinite().all(), name
        diff = calc_diff(grads[name], exact_grads[name])
        assert diff < MOE_BOUNDS[name], f"{name}: calc_diff {diff:.2e}"


def _run_layer(device: str, seed: int) -> tuple:
    x, weights = _layer(device, seed)
    upstream = moe_layer_tokens(TOKENS, HIDDEN, device, seed + 9)
    out = _moe(x, weights)
    return (out, _grads(out, upstream, x, weights), *_exact(x, weights, upstream), x, weights)


@pytest.mark.parametrize("seed", [0, 1, 3])
def test_layer_gradients_on_the_references(layer_on_references, seed):
    _check_layer(*_run_layer("cpu", seed))


def test_module_is_differentiable_in_x(layer_on_references, monkeypatch):
    # MoE's forward with an x that requires a gradient: moe_layer on the module's FP8 buffers (no weight gradients).
    from deep_kernels.nn import MoE
    from deep_kernels.nn import moe as module_file

    monkeypatch.setattr(module_file, "per_block_cast_to_fp8", reference_quant.per_block_cast_to_fp8)
    monkeypatch.setattr(module_file, "check_cuda_device", lambda *args, **kwargs: None)
    x, weights = _layer("cpu", 2)
    module = MoE.from_float(**{name: w.detach() for name, w in weights.items()}, **GATE)
    upstream = moe_layer_tokens(TOKENS, HIDDEN, "cpu", 11)
    out = module(x)
    (grad_x,) = torch.autograd.grad(out, x, upstream)
    exact_out, exact_grads = _exact(x, weights, upstream)
    assert calc_diff(out.detach(), exact_out.detach()) < OUTPUT_BOUND
    assert calc_diff(grad_x, exact_grads["x"]) < MOE_BOUNDS["x"]


def _swiglu_backward_without_weights(x, dy, clamp=None, weights=None, pos=None, check_pos=True, out=None):
    return reference_quant.swiglu_backward(x, dy, clamp, None, pos, check_pos, out)


def _square_untransposed(scales):
    """A plant: the weights transposed but their (square) scale grid not; other grids transposed as they must be."""
    return scales if scales.shape[1] == scales.shape[2] else scales.transpose(1, 2).contiguous()


def _no_gate_gradient(grad_weights, logits, *args, **kwargs):
    return torch.zeros_like(logits, dtype=torch.float32)


@pytest.mark.parametrize("name,plant,caught", [
    ("swiglu_backward", _swiglu_backward_without_weights, ("x", "gate_up_weight")),  # dh without the routing weight
    ("topk_gate_backward", _no_gate_gradient, ("x", "router_weight")),  # the gate's gradient lost
    ("transposed_experts", lambda w: (w[0].transpose(1, 2).contiguous(), _square_untransposed(w[1])), ("x",)),
])
def test_the_bounds_reject_planted_bugs(layer_on_references, monkeypatch, name, plant, caught):
    if name == "transposed_experts":  # a square down-projection scale grid, so that the unswapped one fits
        monkeypatch.setattr(sys.modules[__name__], "INTERMEDIATE", HIDDEN)
    monkeypatch.setattr(moe_autograd, name, plant)
    out, grads, exact_out, exact_grads, x, weights = _run_layer("cpu", 0)
    for leaf in caught:
        diff = calc_diff(grads[leaf], exact_grads[leaf])
        assert diff > 3 * MOE_BOUNDS[leaf], f"{leaf}: calc_diff {diff:.2e}"


@pytest.mark.parametrize("seed", [0, 1])
def test_benchmark_peer_computes_the_same_gradients(monkeypatch, seed):
    # The moe_layer benchmark's plain-torch training peer (cuBLAS blockwise FP8 input gradients, bf16 weight
    # gradients), its _scaled_mm in float64, against the same float64 autograd as the layer, within the layer's
    # bounds (measured over seeds 0-3: x 3.4e-4 to 5.4e-4, router 8e-5 to 1.9e-3, gate_up 4.8e-4 to 7.4e-4, down 2.1e-4
    # to 3.4e-4; the output up to 5.4e-4, the peer routing on bf16 logits).
    from deep_kernels.benchmarks.moe_layer import torch_fp8_moe_training
    from test_moe_layer import _blockwise_scaled_mm

    monkeypatch.setattr(torch, "_scaled_mm", _blockwise_scaled_mm)
    x, weights = _layer("cpu", seed)
    upstream = moe_layer_tokens(TOKENS, HIDDEN, "cpu", seed + 9)
    monkeypatch.setattr(moe_autograd, "per_block_cast_to_fp8", reference_quant.per_block_cast_to_fp8)
    fp8 = {name: moe_autograd.quantize_experts(weights[name].detach()) for name in ("gate_up_weight", "down_weight")}
    out, *grads = torch_fp8_moe_training(x.detach(), weights["router_weight"].detach(), weights["correction_bias"],
                                         fp8["gate_up_weight"], fp8["down_weight"], upstream, **GATE_WITHOUT_SCORING)
    exact_out, exact_grads = _exact(x, weights, upstream)
    assert out.dtype == torch.bfloat16 and calc_diff(out, exact_out.detach()) < 1e-3
    for name, grad in zip(DIFFERENTIABLE, grads):
        leaf = x if name == "x" else weights[name]
        assert grad.shape == leaf.shape, name
        diff = calc_diff(grad, exact_grads[name])
        assert diff < MOE_BOUNDS[name], f"{name}: calc_diff {diff:.2e}"


# ---- GPU ----

@pytest.mark.gpu
def test_gate_and_swiglu_kernels_match_autograd_references():
    torch.manual_seed(2)
    logits = torch.randn(300, 256, device="cuda", requires_grad=True)
    weights, indices = functional.topk_gate(logits, 8, "sigmoid", None, 8, 4, True, 2.5)
    upstream = torch.randn_like(weights)
    (grad,) = torch.autograd.grad(weights, logits, upstream)
    expected = reference_moe.topk_gate_backward(upstream, logits.detach(), indices, "sigmoid", True, 2.5)
    assert_bitwise_equal(grad, expected, "gate gradient")  # bit-exact with the reference on the GPU
    x = (torch.randn(300, 512, device="cuda") * 2).bfloat16().requires_grad_()
    row_weights = torch.rand(300, device="cuda", requires_grad=True)
    dy = torch.randn(300, 256, device="cuda").bfloat16()
    grad_x, grad_w = torch.autograd.grad(functional.swiglu(x, row_weights), (x, row_weights), dy)
    expected_x, expected_w = reference_quant.swiglu_backward(x.detach(), dy, weights=row_weights.detach())
    assert_bitwise_equal(grad_x, expected_x, "swiglu dx")
    assert_bitwise_equal(grad_w, expected_w, "swiglu dweights")


@pytest.mark.gpu
def test_layer_gradients_match_the_float_reference_and_repeat_bitwise():
    out, grads, exact_out, exact_grads, x, weights = _run_layer("cuda", seed=3)
    _check_layer(out, grads, exact_out, exact_grads, x, weights)
    upstream = moe_layer_tokens(TOKENS, HIDDEN, "cuda", 12)
    again = _grads(_moe(x, weights), upstream, x, weights)
    first = _grads(_moe(x, weights), upstream, x, weights)
    for name in DIFFERENTIABLE:
        assert_bitwise_equal(again[name], first[name], f"{name}: second run")


# ---- torch.compile (CPU, meta tensors: the ops' fake implementations) ----

class _JointRecorder:
    """A torch.compile backend (AOTAutograd) that records the deep_kernels ops of the forward and backward graphs."""

    def __init__(self):
        self.forward, self.backward = [], []

    def _recorder(self, ops: list):
        def compile_graph(graph_module, example_inputs):
            for node in graph_module.graph.nodes:
                # A mutating op (.out) appears functionalized: auto_functionalized(op, ...).
                target = node.args[0] if "auto_functionalized" in str(node.target) else node.target
                if node.op == "call_function" and str(target).startswith("deep_kernels."):
                    ops.append(str(target).removeprefix("deep_kernels."))
            return make_boxed_func(graph_module.forward)
        return compile_graph

    def backend(self):
        from torch._dynamo.backends.common import aot_autograd

        return aot_autograd(fw_compiler=self._recorder(self.forward), bw_compiler=self._recorder(self.backward))


def _compile_and_differentiate(fn, *inputs) -> _JointRecorder:
    recorder = _JointRecorder()
    torch._dynamo.reset()
    out = torch.compile(fn, fullgraph=True, backend=recorder.backend())(*inputs)
    out.backward(torch.ones_like(out))
    return recorder


def test_gate_compiles_forward_and_backward_to_the_ops():
    logits = torch.empty(9, 16, device="meta", requires_grad=True)
    recorder = _compile_and_differentiate(lambda v: functional.topk_gate(v, 4, "sigmoid", None, 4, 2)[0], logits)
    assert recorder.forward == ["topk_gate.default"] and recorder.backward == ["topk_gate_backward.default"]
    assert logits.grad.shape == logits.shape


def test_swiglu_compiles_forward_and_backward_to_the_ops():
    x = torch.empty(6, 256, dtype=torch.bfloat16, device="meta", requires_grad=True)
    weights = torch.empty(6, device="meta", requires_grad=True)
    recorder = _compile_and_differentiate(lambda v, w: functional.swiglu(v, w), x, weights)
    assert recorder.forward == ["swiglu_forward.default"]
    assert recorder.backward == ["swiglu_backward.out"]
    assert x.grad.shape == x.shape and weights.grad.shape == weights.shape


def _meta_layer() -> tuple:
    """(x, weights) of the tests' layer as meta tensors, the differentiable ones requiring gradients."""
    x, weights = _layer("cpu")
    meta = {name: torch.empty_like(w, device="meta").requires_grad_(w.requires_grad) for name, w in weights.items()}
    return torch.empty_like(x, device="meta").requires_grad_(), meta


def test_layer_compiles_forward_and_backward_to_the_ops():
    # No host value in either pass (the k-grouped GEMM's sizes stay on the device): one graph each, the kernels' ops
    # only, with the eager gradients' dtypes and shapes.
    x, weights = _meta_layer()
    recorder = _compile_and_differentiate(_moe, x, weights)
    assert recorder.forward == [
        "per_block_cast_to_fp8.default", "per_block_cast_to_fp8.default", "topk_gate_with_layout.default",
        "moe_expand_cast_to_fp8.default", "m_grouped_fp8_gemm_nt_contiguous.default", "swiglu_cast_to_fp8.default",
        "m_grouped_fp8_gemm_nt_contiguous.default", "moe_reduce.default"]
    assert recorder.backward.count("k_grouped_fp8_gemm_nt_contiguous.default") == 2
    assert recorder.backward.count("m_grouped_fp8_gemm_nt_contiguous.default") == 2
    assert "topk_gate_backward.default" in recorder.backward and "swiglu_backward.out" in recorder.backward
    for name in DIFFERENTIABLE:
        leaf = x if name == "x" else weights[name]
        assert leaf.grad is not None and leaf.grad.dtype == leaf.dtype and leaf.grad.shape == leaf.shape, name


def test_layer_without_expert_weights_raises():
    x, weights = _layer("cpu")
    for missing in ("gate_up_weight", "down_weight"):
        with pytest.raises(ValueError, match="moe_layer needs each expert projection as float weights, FP8 weights"):
            _moe(x, dict(weights, **{missing: None}))


@pytest.mark.gpu
def test_compiled_layer_matches_eager_bitwise():
    # torch.compile(fullgraph=True) with the default backend (inductor): the same output and gradients, bit for bit.
    x, weights = _layer("cuda", seed=1)
    upstream = moe_layer_tokens(TOKENS, HIDDEN, "cuda", 13)
    torch._dynamo.reset()
    compiled = torch.compile(_moe, fullgraph=True)
    out = compiled(x, weights)
    grads = _grads(out, upstream, x, weights)
    eager_out = _moe(x, weights)
    eager_grads = _grads(eager_out, upstream, x, weights)
    _check_layer(eager_out, eager_grads, *_exact(x, weights, upstream), x, weights)
    assert_bitwise_equal(out, eager_out, "compiled output")
    for name in DIFFERENTIABLE:
        assert_bitwise_equal(grads[name], eager_grads[name], f"compiled {name} gradient")
