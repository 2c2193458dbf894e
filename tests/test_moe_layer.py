"""The MoE layer (deep_kernels.nn.MoE): its float reference against a per-token loop written from the layer's
definition, the shared inputs, the benchmark's peer, the module's validation, and its torch.compile graph (CPU); the
module's forward in both modes against the reference, compiled, in a CUDA graph, and run to run (GPU).

The GPU check is deep_kernels.testing.moe_layer.assert_layer_close against module_reference (its docstring derives
the bounds). What the bounds separate (measured on the CPU at the GPU tests' sizes): the FP8 casts of the
activations themselves (the reference without quantize) 8.9e-4 to 9.5e-4 on the whole output; routing weights 5%
off 1.2e-3; one expert's down-projection scales replaced by another's (the weights' 128 x 128 blocks have
power-of-two sizes over 2^-2 to 2^2, so a wrong block is 2x to 16x off) 1.7e-2 to 2.7e-2; one dropped slot 0.17 to
0.23 on its token but 3e-8 to 1.1e-5 on the whole output (2100 and 300 tokens).
"""

import math

import pytest
import torch

from deep_kernels.benchmarks.moe_layer import captured_forward, torch_bf16_moe, torch_cast_to_fp8, torch_fp8_moe
from deep_kernels.nn import MoE
from deep_kernels.reference.gemm import dequantize_b
from deep_kernels.reference.moe import topk_gate
from deep_kernels.reference.nn import kept_slots, moe_forward, router_logits
from deep_kernels.reference.quant import per_block_cast_to_fp8
from deep_kernels.reference.quant import per_token_cast_to_fp8 as reference_per_token_cast_to_fp8
from deep_kernels.testing import assert_bitwise_equal, calc_diff, poison_, poison_cached_memory
from deep_kernels.testing.moe_layer import (
    LAYER_BOUND, TOKEN_BOUND, assert_layer_close, dequantized_weights, fp8_exact_weights, module_reference,
    moe_layer_tokens, moe_layer_weights, reference_expert_kernels, token_diffs,
)

# The GPU tests' layer: small, with DeepSeek-V3's structure (groups, bias, sigmoid, scaling).
HIDDEN, INTERMEDIATE, NUM_EXPERTS = 512, 256, 16
GATE = dict(top_k=4, num_groups=4, topk_groups=2)
# The CPU tests' layer (the per-token loop is slow).
CPU_HIDDEN, CPU_INTERMEDIATE, CPU_EXPERTS, CPU_TOKENS = 256, 128, 8, 24
CPU_GATE = dict(top_k=3, num_groups=4, topk_groups=2)


# ---- the reference (CPU) ----

def _fp8_by_definition(values: torch.Tensor) -> torch.Tensor:
    """A float64 vector cast to e4m3 per 128 values from its FP32 values (amax clamped at 1e-4, scale
    amax / 448, code RNE(v * (448 / amax)), all FP32) and dequantized."""
    groups = values.float().view(-1, 128)
    amax = groups.abs().amax(dim=1, keepdim=True).clamp(min=1e-4)
    codes = (groups * (torch.full_like(amax, 448.0) / amax)).to(torch.float8_e4m3fn)
    return (codes.double() * (amax / torch.full_like(amax, 448.0)).double()).view(-1)


def _per_token_loop(x, router_weight, correction_bias, gate_up_weight, down_weight, top_k, num_groups, topk_groups,
                    renormalize=True, routed_scaling_factor=2.5, max_tokens=None, quantize=False) -> torch.Tensor:
    """The layer token by token from its definition, in float64 (Python floats for the routing)."""
    num_tokens, hidden = x.shape
    num_experts, intermediate = gate_up_weight.shape[0], gate_up_weight.shape[1] // 2
    logits = (x.double() @ router_weight.double().T).tolist()
    bias = correction_bias.double().tolist()
    taken = [0] * num_experts
    out = torch.zeros((num_tokens, hidden), dtype=torch.float64)
    for t in range(num_tokens):
        scores = [1 / (1 + math.exp(-v)) for v in logits[t]]
        keys = [s + b for s, b in zip(scores, bias)]
        eligible = list(range(num_experts))
        if num_groups:
            size = num_experts // num_groups
            group_keys = [sum(sorted(keys[g * size:(g + 1) * size], reverse=True)[:2]) for g in range(num_groups)]
            best = sorted(range(num_groups), key=lambda g: (-group_keys[g], g))[:topk_groups]
            eligible = [e for e in eligible if e // size in best]
        chosen = sorted(eligible, key=lambda e: (-keys[e], e))[:top_k]
        weights = [scores[e] for e in chosen]
        if renormalize:
            total = sum(weights) + 1e-20
            weights = [w / total for w in weights]
        token = x[t].double()
        if quantize:
            token = _fp8_by_definition(token)
        for expert, weight in zip(chosen, weights):
            taken[expert] += 1
            if max_tokens is not None and taken[expert] > max_tokens:
                continue
            projected = gate_up_weight[expert].double() @ token
            if quantize:
                projected = projected.float().bfloat16().double()
            gate, up = projected[:intermediate], projected[intermediate:]
            y = gate / (1 + torch.exp(-gate)) * up * (weight * routed_scaling_factor)
            if quantize:
                y = _fp8_by_definition(y)
            expert_out = down_weight[expert].double() @ y
            if quantize:
                expert_out = expert_out.float().bfloat16().double()
            out[t] += expert_out
    return out


def _cpu_layer(seed: int = 0) -> tuple:
    weights = moe_layer_weights(CPU_HIDDEN, CPU_INTERMEDIATE, CPU_EXPERTS, "cpu", seed)
    return weights, moe_layer_tokens(CPU_TOKENS, CPU_HIDDEN, "cpu", seed + 3)


# (quantize, renormalize, max_tokens, num_groups): the plain layer, its kernel formats, no renormalization nor
# groups, and a capacity that drops slots (72 slots over 8 experts, 5 kept each at most).
LOOP_CASES = [(False, True, None, 4), (True, True, None, 4), (False, False, None, 0), (True, True, 5, 4)]


@pytest.mark.parametrize("quantize,renormalize,max_tokens,num_groups", LOOP_CASES)
def test_reference_matches_the_per_token_loop(quantize, renormalize, max_tokens, num_groups):
    weights, x = _cpu_layer(seed=num_groups + 2 * (max_tokens or 0))
    gate = dict(CPU_GATE, num_groups=num_groups, topk_groups=CPU_GATE["topk_groups"] if num_groups else 0)
    expected = _per_token_loop(x, **weights, **gate, renormalize=renormalize, max_tokens=max_tokens,
                               quantize=quantize)
    actual = moe_forward(x, **weights, **gate, renormalize=renormalize, max_tokens=max_tokens, quantize=quantize)
    assert actual.dtype == torch.float64 and actual.shape == x.shape
    # The reference's routing weights are FP32 (the gate's), the loop's float64: 1e-7 apart. Quantized, no FP8
    # code lands on the other side of a rounding point here (measured 0 beyond that).
    assert calc_diff(actual, expected) < 1e-12
    if max_tokens is not None:
        _, indices = topk_gate(router_logits(x, weights["router_weight"]), gate["top_k"], "sigmoid",
                               weights["correction_bias"], gate["num_groups"], gate["topk_groups"])
        assert not kept_slots(indices, CPU_EXPERTS, max_tokens).all(), "the capacity drops no slot: nothing tested"


def test_kept_slots_keeps_each_experts_first_slots():
    indices = torch.tensor([[0, 1], [1, 2], [0, 1], [1, 0]], dtype=torch.int32)
    assert kept_slots(indices, 3, 2).tolist() == [[True, True], [True, True], [True, False], [False, False]]
    assert kept_slots(indices, 3).all()


def test_quantized_reference_differs_from_float64_by_the_fp8_casts():
    # The bound's scale: the FP8 casts of the two GEMMs' activations move the output by 9.5e-4 here (two casts of
    # 3-bit mantissas), so a pipeline that skipped or doubled a cast cannot pass.
    weights = moe_layer_weights(HIDDEN, INTERMEDIATE, NUM_EXPERTS, "cpu")
    x = moe_layer_tokens(77, HIDDEN, "cpu")
    exact = moe_forward(x, **weights, **GATE)
    diff = calc_diff(moe_forward(x, **weights, **GATE, quantize=True), exact)
    assert 5 * LAYER_BOUND < diff < 2e-3
    # Routing weights 5% off: about 1.2e-3.
    assert calc_diff(moe_forward(x, **weights, **GATE, routed_scaling_factor=2.5 * 1.05), exact) > 10 * LAYER_BOUND


def test_fp8_exact_weights_quantize_losslessly():
    w = fp8_exact_weights(3, 256, 384, "cpu")
    assert w.dtype == torch.bfloat16 and w.shape == (3, 256, 384)
    for expert in range(3):
        q, scales = per_block_cast_to_fp8(w[expert])
        assert torch.equal(dequantize_b(q, scales), w[expert].double())
        assert torch.equal(scales, torch.exp2(scales.log2().round()))  # powers of two
        assert scales.max() / scales.min() >= 4  # blocks of different sizes


def test_peer_computes_the_same_layer():
    # The benchmark's BF16 peer, with the logits it routes on (bf16), against the float64 reference: bf16
    # activations cost about 1e-5.
    weights, x = _cpu_layer(seed=7)
    logits = torch.nn.functional.linear(x, weights["router_weight"]).float()
    expected = moe_forward(x, **weights, **CPU_GATE, logits=logits)
    assert calc_diff(torch_bf16_moe(x, **weights, **CPU_GATE, routed_scaling_factor=2.5), expected) < 1e-4


def _blockwise_scaled_mm(a, b, scale_a, scale_b, out_dtype):
    """torch._scaled_mm's blockwise recipe in float64 (a [M, K] with scales [M, K / 128], b [K, N] with scales
    [K / 128, N / 128]), rounded to out_dtype: the FP8 peer on the CPU."""
    a_values = a.double() * scale_a.double().repeat_interleave(128, dim=1)
    b_values = b.double() * scale_b.double().repeat_interleave(128, dim=0).repeat_interleave(128, dim=1)
    return (a_values @ b_values).to(out_dtype)


def test_fp8_peer_computes_the_same_layer(monkeypatch):
    # The benchmark's cuBLAS FP8 peer, its GEMMs in float64 (cuBLAS accumulates in FP32), on FP8-exact weights:
    # against the reference in the kernels' activation formats, what is left is the peer's bf16 SwiGLU and its
    # weights applied after the down-projection (3e-5 to 7e-5 over three seeds; 6.8e-5 at this one), against the FP8
    # casts' own 8e-4 to 1.2e-3.
    monkeypatch.setattr(torch, "_scaled_mm", _blockwise_scaled_mm)
    weights, x = _cpu_layer(seed=8)
    quantized = [[per_block_cast_to_fp8(w) for w in weights[name]] for name in ("gate_up_weight", "down_weight")]
    gate_up, down = ((torch.stack([q for q, _ in experts]), torch.stack([s for _, s in experts]))
                     for experts in quantized)
    logits = torch.nn.functional.linear(x, weights["router_weight"]).float()
    actual = torch_fp8_moe(x, weights["router_weight"], weights["correction_bias"], gate_up, down, **CPU_GATE,
                           routed_scaling_factor=2.5)
    quantized_reference = moe_forward(x, **weights, **CPU_GATE, logits=logits, quantize=True)
    assert actual.dtype == torch.bfloat16 and actual.shape == x.shape
    assert calc_diff(actual, quantized_reference) < 1e-4
    assert calc_diff(actual, moe_forward(x, **weights, **CPU_GATE, logits=logits)) > 3e-4  # the FP8 casts happen


def test_torch_cast_to_fp8_is_the_reference_cast():
    x = moe_layer_tokens(5, 256, "cpu", seed=2)
    codes, scales = torch_cast_to_fp8(x)
    expected_codes, expected_scales = reference_per_token_cast_to_fp8(x.float(), 128, scale_layout="row_major")
    assert torch.equal(codes.view(torch.uint8), expected_codes.view(torch.uint8))
    assert torch.equal(scales, expected_scales) and scales.stride() == (1, 5)


def test_benchmark_suite_is_registered():
    from deep_kernels.benchmarks import moe_layer, suites

    assert "moe_layer" in suites() and callable(moe_layer.run)


# ---- the module: construction and validation (CPU) ----

def test_defaults_are_deepseek_v3():
    module = MoE(device="meta")
    assert (module.hidden_size, module.intermediate_size, module.num_experts, module.top_k) == (7168, 2048, 256, 8)
    assert (module.num_groups, module.topk_groups, module.scoring) == (8, 4, "sigmoid")
    assert module.renormalize is True and module.routed_scaling_factor == 2.5 and module.mode == "contiguous"
    shapes = {name: (tuple(t.shape), t.dtype) for name, t in module.state_dict().items()}
    assert shapes == {
        "router_weight": ((256, 7168), torch.bfloat16), "correction_bias": ((256,), torch.float32),
        "gate_up_weight": ((256, 4096, 7168), torch.float8_e4m3fn), "gate_up_scales": ((256, 32, 56), torch.float32),
        "down_weight": ((256, 7168, 2048), torch.float8_e4m3fn), "down_scales": ((256, 56, 16), torch.float32)}


@pytest.mark.parametrize("config,error,match", [
    (dict(hidden_size=200), ValueError, "hidden_size must be a multiple of 128"),
    (dict(intermediate_size=0), ValueError, "intermediate_size must be an integer"),
    (dict(num_experts=513), ValueError, "num_experts"),
    (dict(top_k=17), ValueError, "top_k"),
    (dict(num_groups=3), ValueError, "num_groups \\(3\\) must divide"),
    (dict(topk_groups=9), ValueError, "topk_groups"),
    (dict(num_groups=0), ValueError, "topk_groups must be 0 without groups"),
    (dict(num_groups=32, topk_groups=1, top_k=9), ValueError, "top_k \\(9\\) must not exceed the 8 experts"),
    (dict(scoring="relu"), ValueError, "scoring"),
    (dict(renormalize=1), TypeError, "renormalize must be a bool"),
    (dict(routed_scaling_factor=float("nan")), ValueError, "routed_scaling_factor"),
    (dict(mode="dense"), ValueError, "mode must be one of"),
    (dict(max_tokens=0), ValueError, "max_tokens"),
])
def test_constructor_rejects_bad_config(config, error, match):
    with pytest.raises(error, match=match):
        MoE(**config, device="meta")


def _cpu_float_weights() -> dict:
    return dict(router_weight=torch.zeros(16, 512, dtype=torch.bfloat16), correction_bias=torch.zeros(16),
                gate_up_weight=torch.zeros(16, 512, 512, dtype=torch.bfloat16),
                down_weight=torch.zeros(16, 512, 256, dtype=torch.bfloat16))


@pytest.mark.parametrize("name,value,error,match", [
    ("gate_up_weight", torch.zeros(16, 512, 512, dtype=torch.float16), TypeError, "gate_up_weight must be"),
    ("gate_up_weight", torch.zeros(16, 511, 512), ValueError, "gate_up_weight must be \\[E, 2I, H\\]"),
    ("router_weight", torch.zeros(16, 512, 1), ValueError, "router_weight must be 2-D"),
    ("router_weight", torch.zeros(15, 512), ValueError, "router_weight must have shape \\(16, 512\\)"),
    ("correction_bias", torch.zeros(17), ValueError, "correction_bias must have shape \\(16,\\)"),
    ("down_weight", torch.zeros(16, 512, 384), ValueError, "down_weight must have shape \\(16, 512, 256\\)"),
    ("down_weight", torch.zeros(16, 512, 256, dtype=torch.float8_e4m3fn), TypeError, "down_weight must be"),
    ("router_weight", None, ValueError, "gate_up_weight must be a CUDA tensor"),  # valid, but on the CPU
])
def test_from_float_rejects_bad_weights_before_quantizing(name, value, error, match):
    weights = _cpu_float_weights()
    if value is not None:
        weights[name] = value
    with pytest.raises(error, match=match):
        MoE.from_float(**weights, **GATE)


def test_from_float_rejects_a_bad_config():
    with pytest.raises(ValueError, match=r"top_k must be an integer in \[1, 16\], got 17"):
        MoE.from_float(**_cpu_float_weights(), top_k=17, num_groups=4, topk_groups=2)


def _cpu_module(**config) -> MoE:
    return MoE(HIDDEN, INTERMEDIATE, NUM_EXPERTS, **GATE, **config, device="cpu")


@pytest.mark.parametrize("x,mode,error,match", [
    (torch.zeros(4, 512), None, TypeError, "x must be torch.bfloat16"),
    (torch.zeros(512, dtype=torch.bfloat16), None, ValueError, "x must be 2-D"),
    (torch.zeros(4, 384, dtype=torch.bfloat16), None, ValueError, "x must be \\[T, hidden_size\\]"),
    (torch.zeros(4, 1024, dtype=torch.bfloat16)[:, ::2], None, ValueError, "contiguous last dimension"),
    (torch.zeros(4, 512, dtype=torch.bfloat16), "prefill", ValueError, "mode must be one of"),
    (torch.zeros(4, 512, dtype=torch.bfloat16, requires_grad=True), "masked", ValueError,
     "backward pass takes the contiguous layout"),
    (torch.zeros(4, 512, dtype=torch.bfloat16), "masked", ValueError, "x must be a CUDA tensor"),
])
def test_forward_rejects_bad_input(x, mode, error, match):
    with pytest.raises(error, match=match):
        _cpu_module()(x, mode)


@pytest.fixture
def kernels_replaced_by_references(monkeypatch):
    """deep_kernels.nn.moe with every kernel call replaced by its plain-torch reference (same names and
    arguments), the device checks off and the router GEMM in float64: the module's own dataflow, on the CPU."""
    from deep_kernels.nn import moe as module
    from deep_kernels.reference import quant as quant_reference

    monkeypatch.setattr(module, "KERNELS", reference_expert_kernels())
    monkeypatch.setattr(module, "per_block_cast_to_fp8", quant_reference.per_block_cast_to_fp8)
    monkeypatch.setattr(module, "check_cuda_device", lambda *args, **kwargs: None)
    monkeypatch.setattr(MoE, "router_logits", lambda self, x: router_logits(x, self.router_weight))


# (mode, max_tokens): 40 tokens, 160 slots over 16 experts; a capacity of 6 drops slots.
@pytest.mark.parametrize("mode,max_tokens", [("contiguous", None), ("masked", None), ("masked", 6)])
def test_forward_dataflow_on_the_references(kernels_replaced_by_references, mode, max_tokens):
    # What the GPU tests check of the kernels, here of the wiring alone: which layout tensors feed which call,
    # the routing weight applied once, masked_m and the capacity, the shapes. The references compute each GEMM
    # in float64 and round it as the kernels do, so the output's bf16 rounding (at most 7.6e-6) is all that is left.
    weights = moe_layer_weights(HIDDEN, INTERMEDIATE, NUM_EXPERTS, "cpu", seed=4)
    module = MoE.from_float(**weights, **GATE, mode=mode, max_tokens=max_tokens)
    x = moe_layer_tokens(40, HIDDEN, "cpu", seed=5)
    out = module(x)
    expected = moe_forward(x, **weights, **GATE, max_tokens=max_tokens, quantize=True)
    assert out.dtype == torch.bfloat16 and out.shape == x.shape and out.isfinite().all()
    assert calc_diff(out, expected) < 1e-5
    assert token_diffs(out, expected).max() < 1e-5
    if max_tokens is not None:
        assert calc_diff(out, moe_forward(x, **weights, **GATE, quantize=True)) > 1e-3, "no slot was dropped"
    assert module(x[:0]).shape == (0, HIDDEN)


class _GraphCounter:
    """A torch.compile backend (AOTAutograd, eager: the ops' fake implementations run while it traces) that records
    the deep_kernels ops of each graph dynamo hands it."""

    def __init__(self):
        self.graphs = []

    def __call__(self, graph_module, example_inputs):
        self.graphs.append([str(node.target).removeprefix("deep_kernels.") for node in graph_module.graph.nodes
                            if node.op == "call_function" and str(node.target).startswith("deep_kernels.")])
        return torch._dynamo.backends.debugging.aot_eager(graph_module, example_inputs)


# (mode, max_tokens, the most graphs over COMPILED_TOKEN_COUNTS): the first count's graph, then dynamo's automatic
# dynamic one.
COMPILED_MODES = [("contiguous", None, 2), ("masked", None, 2), ("masked", 12, 2)]
COMPILED_TOKEN_COUNTS = (64, 40, 17, 300, 96, 5)


@pytest.mark.parametrize("mode,max_tokens,most_graphs", COMPILED_MODES)
def test_module_compiles_to_the_ops_for_every_token_count(mode, max_tokens, most_graphs):
    # torch.compile(module, fullgraph=True), as frameworks compile a model: one graph of the kernels' ops (x's address
    # and the devices are the ops' checks while tracing), reused across token counts. On meta tensors (the ops' fake
    # implementations).
    module = MoE(HIDDEN, INTERMEDIATE, NUM_EXPERTS, **GATE, mode=mode, max_tokens=max_tokens, device="meta")
    counter = _GraphCounter()
    torch._dynamo.reset()
    compiled = torch.compile(module, fullgraph=True, backend=counter)
    with torch.no_grad():
        for num_tokens in COMPILED_TOKEN_COUNTS:
            out = compiled(torch.empty(num_tokens, HIDDEN, dtype=torch.bfloat16, device="meta"))
            assert out.shape == (num_tokens, HIDDEN) and out.dtype == torch.bfloat16
    layout = "contiguous" if mode == "contiguous" else "masked"
    assert counter.graphs[0] == [
        "topk_gate_with_layout.default", "moe_expand_cast_to_fp8.default", f"m_grouped_fp8_gemm_nt_{layout}.default",
        "swiglu_cast_to_fp8.default" if mode == "contiguous" else "swiglu_cast_to_fp8_masked.default",
        f"m_grouped_fp8_gemm_nt_{layout}.default", "moe_reduce.default"]
    assert len(counter.graphs) <= most_graphs


@pytest.mark.parametrize("mode,max_tokens", [(mode, max_tokens) for mode, max_tokens, _ in COMPILED_MODES])
def test_module_exports_with_a_dynamic_token_count(mode, max_tokens):
    # torch.export with T dynamic over its whole range, as inference engines export a decode step: no guard on T, and
    # the exported program runs at token counts of every residue. On meta tensors. An intermediate size of 128 (the
    # DeepSeek-V3 experts' 2048 over 16 ranks) gives the activations one scale per row, whose tensor torch checks for
    # contiguity through the capacity's stride: the masked mode's default capacity must be its own 16-byte round-up.
    module = MoE(HIDDEN, 128, NUM_EXPERTS, **GATE, mode=mode, max_tokens=max_tokens, device="meta")
    tokens = torch.export.Dim("tokens", min=1, max=65536)
    with torch.no_grad():
        exported = torch.export.export(module, (torch.empty(40, HIDDEN, dtype=torch.bfloat16, device="meta"),),
                                       dynamic_shapes=({0: tokens},))
        for num_tokens in (5, 17, 64, 302):
            out = exported.module()(torch.empty(num_tokens, HIDDEN, dtype=torch.bfloat16, device="meta"))
            assert out.shape == (num_tokens, HIDDEN) and out.dtype == torch.bfloat16


def test_forward_rejects_buffers_cast_to_another_dtype():
    module = _cpu_module().to(torch.bfloat16)  # casts the FP8 weights and FP32 scales too
    with pytest.raises(TypeError, match="correction_bias must be torch.float32"):
        module(torch.zeros(4, 512, dtype=torch.bfloat16))


# ---- the module against the reference (GPU) ----

def _gpu_module(mode: str, max_tokens: int = None, seed: int = 0) -> tuple:
    """(module, its float weights)."""
    weights = moe_layer_weights(HIDDEN, INTERMEDIATE, NUM_EXPERTS, "cuda", seed)
    return MoE.from_float(**weights, **GATE, mode=mode, max_tokens=max_tokens), weights


# (mode, T, max_tokens): prefill, decode with room for every slot, and decode at a capacity that drops slots (256
# slots over 16 experts, 12 kept each at most).
FORWARD_CASES = [("contiguous", 2100, None), ("masked", 64, None), ("masked", 64, 12)]


@pytest.mark.gpu
@pytest.mark.parametrize("mode,num_tokens,max_tokens", FORWARD_CASES)
def test_forward_matches_reference(mode, num_tokens, max_tokens):
    module, weights = _gpu_module(mode, max_tokens)
    dequantized = dequantized_weights(module)
    for name in ("gate_up_weight", "down_weight"):  # FP8-exact weights: quantized losslessly, in the GEMMs' layout
        assert torch.equal(dequantized[name], weights[name].double()), name
    x = moe_layer_tokens(num_tokens, HIDDEN, "cuda", seed=num_tokens)
    poison_cached_memory()
    out = module(x)
    assert_layer_close(out, module_reference(module, x, mode))
    if max_tokens is not None:
        _, indices = topk_gate(module.router_logits(x), module.top_k, "sigmoid", module.correction_bias,
                               module.num_groups, module.topk_groups, True, module.routed_scaling_factor)
        assert not kept_slots(indices, NUM_EXPERTS, max_tokens).all(), "the capacity drops no slot: nothing tested"


@pytest.mark.gpu
def test_the_check_rejects_planted_bugs():
    module, _ = _gpu_module("contiguous")
    x = moe_layer_tokens(2100, HIDDEN, "cuda", seed=1)
    out = module(x)
    expected = module_reference(module, x, "contiguous")
    assert_layer_close(out, expected)
    # A wrong scale block: expert 3's down-projection scales replaced by expert 4's, handed to the real kernels.
    right_scales = module.down_scales[3].clone()
    assert not torch.equal(right_scales, module.down_scales[4])
    module.down_scales[3] = module.down_scales[4]
    wrong_scales_out = module(x)
    module.down_scales[3] = right_scales
    assert calc_diff(wrong_scales_out, expected) > 10 * LAYER_BOUND
    # The activations not quantized, and routing weights 5% off: each beyond the whole-output bound.
    assert calc_diff(out, module_reference(module, x, "contiguous", quantize=False)) > 5 * LAYER_BOUND
    scaled = module_reference(module, x, "contiguous", routed_scaling_factor=module.routed_scaling_factor * 1.05)
    assert calc_diff(out, scaled) > 5 * LAYER_BOUND
    # One slot dropped (the busiest expert's last): beyond the bound of its token (0.23 measured on the CPU), though
    # the whole output moves by 3e-8 only: the per-token check is what catches it.
    _, indices = topk_gate(module.router_logits(x), module.top_k, "sigmoid", module.correction_bias,
                           module.num_groups, module.topk_groups, True, module.routed_scaling_factor)
    capacity = int(torch.bincount(indices.flatten().long(), minlength=NUM_EXPERTS).max()) - 1
    dropped = module_reference(module, x, "contiguous", max_tokens=capacity)
    assert token_diffs(out, dropped).max() > 4 * TOKEN_BOUND


@pytest.mark.gpu
@pytest.mark.parametrize("mode,max_tokens,most_graphs", COMPILED_MODES)
def test_compiled_module_matches_eager_bitwise(mode, max_tokens, most_graphs):
    # torch.compile(module, fullgraph=True) with the default backend (inductor), over token counts that share its
    # dynamic graph: the eager output, bit for bit.
    module, _ = _gpu_module(mode, max_tokens, seed=6)
    torch._dynamo.reset()
    compiled = torch.compile(module, fullgraph=True)
    with torch.no_grad():
        for num_tokens in COMPILED_TOKEN_COUNTS:
            x = moe_layer_tokens(num_tokens, HIDDEN, "cuda", seed=40 + num_tokens)
            assert_bitwise_equal(compiled(x), module(x), f"{mode}, max_tokens {max_tokens}: {num_tokens} tokens")


@pytest.mark.gpu
def test_compiled_decode_in_cuda_graphs_matches_eager_bitwise():
    # torch.compile(mode="reduce-overhead"): inductor records the decode step into CUDA graphs (after its warm-up
    # runs) and replays them for new tokens of the same count.
    module, _ = _gpu_module("masked", seed=7)
    torch._dynamo.reset()
    compiled = torch.compile(module, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for step in range(4):
            x = moe_layer_tokens(64, HIDDEN, "cuda", seed=50 + step)
            assert_bitwise_equal(compiled(x).clone(), module(x), f"step {step}")


@pytest.mark.gpu
def test_masked_forward_replays_in_a_cuda_graph():
    module, _ = _gpu_module("masked", seed=2)
    static_x = moe_layer_tokens(64, HIDDEN, "cuda", seed=10)
    replay, static_out = captured_forward(module, static_x, "masked")
    outputs = []
    for seed in (11, 12):  # new tokens: new routing, new layouts inside the graph
        static_x.copy_(moe_layer_tokens(64, HIDDEN, "cuda", seed=seed))
        poison_(static_out)  # what the capture left there must not pass for the replay's output
        replay()
        eager = module(static_x)
        torch.cuda.synchronize()
        assert_bitwise_equal(static_out, eager, f"replay with tokens of seed {seed}")
        outputs.append(eager)
    assert not torch.equal(outputs[0], outputs[1])
    assert_layer_close(static_out, module_reference(module, static_x, "masked"))


@pytest.mark.gpu
def test_forward_is_deterministic_and_never_syncs():
    module, _ = _gpu_module("contiguous", seed=3)
    for mode, num_tokens in (("contiguous", 2100), ("masked", 64)):
        x = moe_layer_tokens(num_tokens, HIDDEN, "cuda", seed=20)
        first = module(x, mode)
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")  # a host synchronization raises
        try:
            second = module(x, mode)
        finally:
            torch.cuda.set_sync_debug_mode(previous)
        assert_bitwise_equal(second, first, f"{mode}: second run")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["contiguous", "masked"])
def test_a_tokens_output_does_not_depend_on_the_rest_of_the_batch(mode):
    # What the expert-parallel layer's bitwise equality with this one rests on: each rank computes its share of the
    # batch (the router GEMM, the grouped GEMMs' tiles and the kernels' launch shapes follow the token count).
    module, _ = _gpu_module(mode, seed=4)
    x = moe_layer_tokens(300, HIDDEN, "cuda", seed=21)
    whole = module(x, mode)
    for rows in (slice(0, 96), slice(96, 300), slice(17, 18)):
        assert_bitwise_equal(module(x[rows].contiguous(), mode), whole[rows], f"{mode}: tokens {rows}")
