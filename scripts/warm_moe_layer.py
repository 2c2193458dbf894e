"""Compiles (JIT) every kernel the moe_layer suite launches, without timing anything and in modest memory, so that a
later bench run of the suite starts warm: its GEMMs first, all at once (precompile, in parallel), then the other
kernels through the calls that launch them: the module's forward in both modes and the layer's backward with frozen
FP8 experts at the suite's sizes (zero weights: 11 GB), the weight-gradient branch's casts and gathers on the suite's
widths, and the gate and cast the suite calls itself.

Usage (GPU): PYTHONPATH=$PWD python scripts/warm_moe_layer.py
"""

import torch

import deep_kernels
from deep_kernels import grouped_gemm, k_grouped_gemm
from deep_kernels.benchmarks import moe_layer as suite
from deep_kernels.device import get_num_sms
from deep_kernels.gemm import CHANNEL_SCALED, kernel_spec
from deep_kernels.heuristics import grouped_fp8_gemm as grouped_heuristics
from deep_kernels.heuristics import k_grouped_fp8_gemm as k_grouped_heuristics
from deep_kernels.jit.precompile import precompile
from deep_kernels.moe.layout import contiguous_max_rows
from deep_kernels.validation import ceil_div
from deep_kernels.nn import MoE
from deep_kernels.testing.moe_layer import moe_layer_tokens


def gemm_specs(num_sms: int) -> list:
    """The specializations of the suite's GEMMs (the expensive compiles), as the grouped and k-grouped GEMMs' plans
    pick them: the contiguous forward and input-gradient GEMMs at T = TRAINING_TOKENS, the masked forward at the
    decode case, the weight gradients' k-grouped GEMMs."""
    hidden, intermediate, num_experts = suite.HIDDEN, suite.INTERMEDIATE, suite.NUM_EXPERTS
    top_k = suite.GATE["top_k"]
    num_rows = contiguous_max_rows(suite.TRAINING_TOKENS * top_k, num_experts)
    decode_tokens = min(num_tokens for num_tokens, mode, _ in suite.CASES if mode == "masked")
    expected_m = min(decode_tokens, ceil_div(decode_tokens * top_k, num_experts))
    problems = [(grouped_gemm.CONTIGUOUS, num_rows, n, k) for n, k in (
        (2 * intermediate, hidden), (hidden, intermediate), (intermediate, hidden), (hidden, 2 * intermediate))]
    problems += [(grouped_gemm.MASKED, expected_m, n, k) for n, k in ((2 * intermediate, hidden),
                                                                     (hidden, intermediate))]
    specs = []
    for gemm_type, m, n, k in problems:
        config = (grouped_gemm._tuned_config(gemm_type, m, n, k, num_experts, num_sms)
                  or grouped_heuristics.get_grouped_fp8_gemm_config(gemm_type, m, n, k, num_experts, num_sms))
        specs.append(kernel_spec(config, n, k, torch.bfloat16, False, gemm_type))
    for m, n in ((hidden, intermediate), (2 * intermediate, hidden)):
        config = k_grouped_heuristics.get_k_grouped_fp8_gemm_config(m, n, num_rows, num_experts, num_sms)
        specs.append(kernel_spec(config, n, k_grouped_gemm.KERNEL_SHAPE_K, torch.float32, False,
                                 k_grouped_heuristics.GEMM_TYPE, CHANNEL_SCALED))
    return specs


def main() -> None:
    hidden, intermediate, num_experts = suite.HIDDEN, suite.INTERMEDIATE, suite.NUM_EXPERTS
    precompile(gemm_specs(get_num_sms()), progress=False)
    deep_kernels.per_block_cast_to_fp8(torch.randn(256, 256, device="cuda").bfloat16())  # MoE.from_float
    module = MoE(hidden, intermediate, num_experts, **suite.GATE, device="cuda")
    for num_tokens, mode, _ in suite.CASES:
        x = moe_layer_tokens(num_tokens, hidden)
        module(x, mode)
        suite._active_experts(module, x)
    tokens = suite.TRAINING_TOKENS
    x = moe_layer_tokens(tokens, hidden).requires_grad_()
    module(x).backward(moe_layer_tokens(tokens, hidden, seed=4))
    del module

    num_rows = contiguous_max_rows(tokens * suite.GATE["top_k"], num_experts)
    logits = torch.randn(tokens, num_experts, device="cuda")
    bias = torch.zeros(num_experts, device="cuda")
    weights, _, layout = deep_kernels.topk_gate_with_layout(logits, suite.GATE["top_k"], "sigmoid", bias,
                                                            suite.GATE["num_groups"], suite.GATE["topk_groups"])
    deep_kernels.moe_expand(x.detach(), layout, zero_padding=True)
    projected = torch.randn(num_rows, 2 * intermediate, device="cuda").bfloat16()
    deep_kernels.swiglu_forward(projected, weights=weights, pos=layout.row_to_slot, check_pos=False,
                                out=torch.zeros(num_rows, intermediate, dtype=torch.bfloat16, device="cuda"))
    for width in (hidden, intermediate, 2 * intermediate):
        deep_kernels.per_channel_cast_transpose_to_fp8(torch.randn(256, width, device="cuda").bfloat16())
    torch.cuda.synchronize()
    print("moe_layer suite kernels compiled")


if __name__ == "__main__":
    main()
