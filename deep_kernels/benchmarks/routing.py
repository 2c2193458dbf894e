"""Suite `routing`: top-k gating plus the contiguous grouped-GEMM layout (DeepSeek-V3 router), against
the same pipeline in plain torch (the reference)."""

import torch

import deep_kernels
from deep_kernels.benchmarks.report import BenchContext, memory_bound_row
from deep_kernels.moe import contiguous_max_rows
from deep_kernels.reference import moe as reference
from deep_kernels.testing import assert_bitwise_equal
from deep_kernels.testing.bench import time_kernel_us

TOKENS = (64, 128, 512, 4096, 16384)
NUM_EXPERTS, NUM_GROUPS, TOPK_GROUPS, TOP_K = 256, 8, 4, 8
GATE = dict(scoring="sigmoid", num_groups=NUM_GROUPS, topk_groups=TOPK_GROUPS, routed_scaling_factor=2.5)
LAYOUT_FIELDS = ("counts", "num_rows", "m_indices", "row_to_slot", "slot_to_row")


def _pipeline(module, logits, bias):
    weights, indices = module.topk_gate(logits, TOP_K, bias=bias, **GATE)
    return weights, indices, module.moe_layout(indices, NUM_EXPERTS)


def run(ctx: BenchContext) -> list:
    rows = []
    bias = torch.randn(NUM_EXPERTS, device="cuda") * 0.1
    for num_tokens in TOKENS:
        logits = torch.randn((num_tokens, NUM_EXPERTS), device="cuda")
        weights, indices, layout = _pipeline(deep_kernels, logits, bias)
        weights_ref, indices_ref, layout_ref = _pipeline(reference, logits, bias)
        assert_bitwise_equal(weights, weights_ref, "weights")
        assert_bitwise_equal(indices, indices_ref, "indices")
        for name in LAYOUT_FIELDS:
            assert_bitwise_equal(getattr(layout, name), getattr(layout_ref, name), name)
        us = time_kernel_us(lambda: _pipeline(deep_kernels, logits, bias), ctx.flusher)
        peer_us = time_kernel_us(lambda: _pipeline(reference, logits, bias), ctx.flusher, reps=20)
        num_slots = num_tokens * TOP_K
        # logits and bias in; weights, indices out; indices read twice; slot_to_row, m_indices, row_to_slot out
        num_bytes = (num_tokens * NUM_EXPERTS + NUM_EXPERTS) * 4 + num_slots * 4 * 5 \
            + contiguous_max_rows(num_slots, NUM_EXPERTS) * 8
        rows.append(memory_bound_row(
            "topk_gate + moe_layout", {"t": num_tokens, "e": NUM_EXPERTS, "k": TOP_K},
            f"fp32 logits, sigmoid, {NUM_GROUPS} groups, top-{TOPK_GROUPS} groups, bias", us, num_bytes, ctx,
            "torch reference (eager)", peer_us, "bitwise equal"))
    return rows
