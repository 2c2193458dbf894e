"""Compiles (JIT) every kernel the moe_layer suite launches, without timing anything and in modest memory, so that a
later bench run of the suite starts warm: the module's forward in both modes and the layer's backward with frozen
FP8 experts at the suite's sizes (zero weights: 11 GB), the weight gradients' k-grouped GEMMs by their plans, and
the weight-gradient branch's casts and gathers on the suite's widths, and the gate and cast the suite calls itself.

Usage (GPU): PYTHONPATH=$PWD python scripts/warm_moe_layer.py
"""

import torch

import deep_kernels
from deep_kernels import k_grouped_gemm
from deep_kernels.benchmarks import moe_layer as suite
from deep_kernels.moe.layout import contiguous_max_rows
from deep_kernels.nn import MoE
from deep_kernels.testing.moe_layer import moe_layer_tokens


def main() -> None:
    hidden, intermediate, num_experts = suite.HIDDEN, suite.INTERMEDIATE, suite.NUM_EXPERTS
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
    for m, n in ((hidden, intermediate), (2 * intermediate, hidden)):
        k_grouped_gemm._plan(m, n, num_rows, num_experts, False)
    logits = torch.randn(tokens, num_experts, device="cuda")
    weights, _, layout = deep_kernels.topk_gate_with_layout(logits, suite.GATE["top_k"], "sigmoid", None,
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
