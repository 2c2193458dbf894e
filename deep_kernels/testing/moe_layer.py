"""Inputs of the MoE layer (deep_kernels.nn.MoE), shared by tests/test_moe_layer.py and the moe_layer benchmark,
the table of reference kernels its CPU tests run the layer on, and the check of a module's output against its
float64 reference.

Expert weights are FP8-exact: each 128 x 128 block of each expert is e4m3 values times its own power of two 2^e
(e in [-2, 2] around a base that keeps the projections near unit size), with one value of magnitude 448 * 2^e in
the block. per_block_cast_to_fp8 then finds amax = 448 * 2^e, the scale 2^e and the multiplier 2^-e, all exact,
and gives back the very codes: the bf16 weights are the module's dequantized weights. So the module, the float
reference and a BF16 peer compute with the same weights, and a wrong scale block (2x or more off) shows far above
any bound.
"""

import math

import torch

from deep_kernels.reference.gemm import dequantize_a, dequantize_b
from deep_kernels.reference.moe import moe_expand as reference_moe_expand
from deep_kernels.reference.nn import moe_forward
from deep_kernels.testing import calc_diff

BLOCK = 128
E4M3_MAX = 448.0
# Codes are normal values times this, rounded to e4m3: most of the format's range without saturating often.
CODE_SPREAD = 64.0


def _generator(device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def fp8_exact_weights(num_experts: int, n: int, k: int, device="cuda", seed: int = 1) -> torch.Tensor:
    """bf16 [E, n, k] (n, k multiples of 128) that per_block_cast_to_fp8 quantizes losslessly (the module
    docstring); values near 1 / sqrt(k) in size, so that a product with unit-size rows is near unit size.
    Built one expert at a time (a DeepSeek-V3 projection is 7.5G values)."""
    generator = _generator(device, seed)
    base = -round(math.log2(CODE_SPREAD * math.sqrt(k)))
    out = torch.empty((num_experts, n, k), dtype=torch.bfloat16, device=device)
    for expert in range(num_experts):
        codes = (torch.randn((n, k), generator=generator, device=device) * CODE_SPREAD).clamp(-E4M3_MAX, E4M3_MAX)
        codes = codes.to(torch.float8_e4m3fn).float()
        codes[::BLOCK, ::BLOCK] = E4M3_MAX  # each block's amax
        exponents = torch.randint(-2, 3, (n // BLOCK, k // BLOCK), generator=generator, device=device) + base
        scales = torch.exp2(exponents.float()).repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
        out[expert] = (codes * scales).bfloat16()
    return out


def moe_layer_weights(hidden: int, intermediate: int, num_experts: int, device="cuda", seed: int = 0) -> dict:
    """MoE.from_float's arguments: router_weight bf16 [E, H] (logits near unit size for unit-size tokens),
    correction_bias FP32 [E] (about a tenth of the scores' spread, so it changes some selections),
    gate_up_weight bf16 [E, 2I, H] and down_weight bf16 [E, H, I], both FP8-exact."""
    generator = _generator(device, seed)
    router = torch.randn((num_experts, hidden), generator=generator, device=device) / math.sqrt(hidden)
    bias = torch.randn((num_experts,), generator=generator, device=device) * 0.02
    return dict(router_weight=router.bfloat16(), correction_bias=bias,
                gate_up_weight=fp8_exact_weights(num_experts, 2 * intermediate, hidden, device, seed + 1),
                down_weight=fp8_exact_weights(num_experts, hidden, intermediate, device, seed + 2))


def moe_layer_tokens(num_tokens: int, hidden: int, device="cuda", seed: int = 3) -> torch.Tensor:
    """bf16 [T, H]: normal values times 2^e per token, e in [-2, 2] (activations' sizes vary by token)."""
    generator = _generator(device, seed)
    x = torch.randn((num_tokens, hidden), generator=generator, device=device)
    row = torch.randint(-2, 3, (num_tokens, 1), generator=generator, device=device)
    return (x * torch.exp2(row.float())).bfloat16()


def reference_expert_kernels():
    """nn.routed_experts.ExpertKernels of the plain-torch references (same names and arguments as the kernels):
    the layer's dataflow on the CPU."""
    from deep_kernels.nn.routed_experts import ExpertKernels
    from deep_kernels.reference import gemm, moe
    from deep_kernels.reference.quant import fp8, swiglu

    return ExpertKernels(moe.topk_gate, moe.topk_gate_with_layout, moe.moe_layout, moe.map_global_to_local_experts,
                         moe.moe_expand_cast_to_fp8, gemm.m_grouped_fp8_gemm_nt_contiguous,
                         gemm.m_grouped_fp8_gemm_nt_masked, swiglu.swiglu_cast_to_fp8, swiglu.swiglu_cast_to_fp8_masked,
                         moe.moe_reduce, fp8.per_token_cast_to_fp8, moe.moe_expand)


def training_kernels_on_references(patch) -> None:
    """nn.moe_autograd and nn.expert_parallel_autograd (the training layers) with every kernel replaced by its
    reference (float64 GEMMs rounded as the kernels round), the router GEMMs in float64, and moe_expand's contiguous
    rows from layout.num_rows on NaN (the kernel never writes them, so a backward that read them would show it);
    patch: a pytest.MonkeyPatch."""
    from deep_kernels.nn import expert_parallel_autograd, moe_autograd
    from deep_kernels.reference import gemm, moe, quant
    from deep_kernels.reference.nn import router_logits

    replaced = ((moe, ("topk_gate", "topk_gate_with_layout", "topk_gate_backward", "moe_layout",
                       "map_global_to_local_experts", "moe_expand_cast_to_fp8", "moe_reduce")),
                (gemm, ("m_grouped_fp8_gemm_nt_contiguous",)),
                (quant, ("per_block_cast_to_fp8", "per_token_cast_to_fp8", "swiglu_cast_to_fp8", "swiglu_backward",
                         "swiglu_forward", "batched_transpose", "per_channel_cast_transpose_to_fp8")))
    functions = {name: getattr(source, name) for source, names in replaced for name in names}
    functions.update(k_grouped_fp8_gemm_nt_contiguous=_k_grouped_reference, router_logits=router_logits,
                     router_gradient_gemm=lambda a, b: (a.double() @ b.double()).float(),
                     moe_expand=_expand_leaving_unused_rows)
    for module in (moe_autograd, expert_parallel_autograd):
        for name, function in functions.items():
            if hasattr(module, name):
                patch.setattr(module, name, function)


def _k_grouped_reference(a, b, d, ks, ks_tensor, c=None, recipe=(1, 1, 128)):
    """d[g] = a_g @ b_g^T over group g's columns, of the dequantized 1 x 128-scaled operands, in float64; the sizes
    on the device only (ks None, as the layers pass them), their sum at most the columns."""
    assert ks is None and sum(ks_tensor.tolist()) <= a[0].shape[1]
    a_values, b_values = dequantize_a(*a), dequantize_a(*b)
    start = 0
    for g, k in enumerate(ks_tensor.tolist()):
        d[g] = (a_values[:, start:start + k] @ b_values[:, start:start + k].T).to(d.dtype)
        start += k
    return d


def _expand_leaving_unused_rows(x, layout, *args, **kwargs):
    """The reference moe_expand with the contiguous rows from layout.num_rows on NaN."""
    rows = reference_moe_expand(x, layout, *args, **kwargs)
    rows[int(layout.num_rows[0]):] = float("nan")
    return rows

# Bounds of assert_layer_close, from a CPU emulation of the kernels' arithmetic at the GPU tests' sizes (FP32 GEMM
# accumulation with a relative error of up to 2^-12 per 128-deep block, which reproduces the FP8 GEMM's measured
# calc_diff of about 1e-8 in FP32; bf16 GEMM outputs; FP32 SwiGLU and reduce; a bf16 output). The whole output:
# 0.8e-5 to 1.8e-5 (2.6e-5 to 3.0e-5 at twice that accumulation error); the output's bf16 rounding alone is 1.4e-6.
# An accumulator difference that moves a bf16 value of the up-projection by one ulp moves its FP8 code about one
# time in sixteen, and each such code is 2^-4 to 2^-3 off: that is the rest. Every token's row: up to 3.5e-4 at 77
# tokens, 7.9e-4 at 2100 (the tail is the odd token where such codes gather). A token's row 10% off scores 4.5e-3:
# the token bound stays under that.
LAYER_BOUND = 1e-4
TOKEN_BOUND = 2e-3


def dequantized_weights(module) -> dict:
    """An nn.MoE's weights as float64: its FP8 experts dequantized, per expert."""
    def experts(q, scales):
        return torch.stack([dequantize_b(q[e], scales[e]) for e in range(q.shape[0])])
    return dict(router_weight=module.router_weight, correction_bias=module.correction_bias,
                gate_up_weight=experts(module.gate_up_weight, module.gate_up_scales),
                down_weight=experts(module.down_weight, module.down_scales))


def module_reference(module, x: torch.Tensor, mode: str, **overrides) -> torch.Tensor:
    """The float64 reference of module(x, mode=mode) in the kernels' activation formats (the same FP8 casts of x
    and of the SwiGLU output, bf16 GEMM outputs), on the module's own router logits (the router GEMM is torch's)
    and its dequantized weights, so that what differs is accumulation order and precision; overrides replace
    reference.nn.moe_forward's arguments."""
    arguments = dict(top_k=module.top_k, num_groups=module.num_groups, topk_groups=module.topk_groups,
                     scoring=module.scoring, renormalize=module.renormalize,
                     routed_scaling_factor=module.routed_scaling_factor, logits=module.router_logits(x),
                     max_tokens=module.max_tokens if mode == "masked" else None, quantize=True)
    arguments.update(overrides)
    return moe_forward(x, **dequantized_weights(module), **arguments)


def token_diffs(out: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """calc_diff of every row, in float64."""
    out, expected = out.double(), expected.double()
    total = (out * out + expected * expected).sum(dim=1)
    return torch.where(total > 0, (out - expected).square().sum(dim=1) / total, torch.zeros_like(total))


def assert_layer_close(out: torch.Tensor, expected: torch.Tensor) -> None:
    """A module's bf16 output against module_reference: finite, within LAYER_BOUND on the whole and TOKEN_BOUND
    on every token's row."""
    assert out.dtype == torch.bfloat16 and out.shape == expected.shape and out.is_contiguous()
    assert out.isfinite().all(), "a row the forward never wrote reached the output"
    diff = calc_diff(out, expected)
    assert diff < LAYER_BOUND, f"calc_diff {diff:.2e} of the whole output"
    diffs = token_diffs(out, expected)
    worst = int(diffs.argmax())
    assert diffs[worst] < TOKEN_BOUND, f"calc_diff {float(diffs[worst]):.2e} of token {worst}"
