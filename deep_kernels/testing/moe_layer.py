"""Inputs of the MoE layer (deep_kernels.nn.MoE), shared by tests/test_moe_layer.py and the moe_layer benchmark,
and the table of reference kernels its CPU tests run the layer on.

Expert weights are FP8-exact: each 128 x 128 block of each expert is e4m3 values times its own power of two 2^e
(e in [-2, 2] around a base that keeps the projections near unit size), with one value of magnitude 448 * 2^e in
the block. per_block_cast_to_fp8 then finds amax = 448 * 2^e, the scale 2^e and the multiplier 2^-e, all exact,
and gives back the very codes: the bf16 weights are the module's dequantized weights. So the module, the float
reference and a BF16 peer compute with the same weights, and a wrong scale block (2x or more off) shows far above
any bound.
"""

import math

import torch

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
