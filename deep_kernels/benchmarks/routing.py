"""Suite `routing`: top-k gating and the contiguous grouped-GEMM layout (DeepSeek-V3 router), each alone,
one after the other (two launches) and fused (one launch up to fused_max_tokens(k) tokens), and the gate
backward; against the same steps in plain torch (the reference), eager and under torch.compile."""

import torch

import deep_kernels
from deep_kernels.benchmarks.report import BenchContext, memory_bound_row, timed_peer
from deep_kernels.moe import contiguous_max_rows, fused_max_tokens
from deep_kernels.reference import moe as reference
from deep_kernels.testing import assert_bitwise_equal
from deep_kernels.testing.bench import time_kernel_us

TOKENS = (64, 128, 512, 4096, 16384)
BACKWARD_TOKENS = (4096, 16384)
NUM_EXPERTS, NUM_GROUPS, TOPK_GROUPS, TOP_K = 256, 8, 4, 8
GATE = dict(scoring="sigmoid", num_groups=NUM_GROUPS, topk_groups=TOPK_GROUPS, routed_scaling_factor=2.5)
LAYOUT_FIELDS = ("counts", "num_rows", "m_indices", "row_to_slot", "slot_to_row")
CONFIG = f"fp32 logits, sigmoid, {NUM_GROUPS} groups, top-{TOPK_GROUPS} groups, bias"


def _pipeline(module, logits, bias):
    weights, indices = module.topk_gate(logits, TOP_K, bias=bias, **GATE)
    return weights, indices, module.moe_layout(indices, NUM_EXPERTS)


def _fused(module, logits, bias):
    return module.topk_gate_with_layout(logits, TOP_K, bias=bias, **GATE)


def _backward(module, grad_weights, logits, indices):
    return module.topk_gate_backward(grad_weights, logits, indices, GATE["scoring"],
                                     routed_scaling_factor=GATE["routed_scaling_factor"])


def _check(outputs, expected) -> None:
    weights, indices, layout = outputs
    assert_bitwise_equal(weights, expected[0], "weights")
    assert_bitwise_equal(indices, expected[1], "indices")
    for name in LAYOUT_FIELDS:
        assert_bitwise_equal(getattr(layout, name), getattr(expected[2], name), name)


def launches(num_tokens: int) -> str:
    """What topk_gate_with_layout launches at num_tokens (the rows' config says it)."""
    if num_tokens <= fused_max_tokens(TOP_K):
        return "1 cooperative launch: gate + block counts, grid barrier, each block ranks + scatters its slots"
    return "2 launches: gate, then the layout (1 cooperative launch)"


def run(ctx: BenchContext) -> list:
    rows = []
    bias = torch.randn(NUM_EXPERTS, device="cuda") * 0.1
    for num_tokens in TOKENS:
        logits = torch.randn((num_tokens, NUM_EXPERTS), device="cuda")
        expected = _pipeline(reference, logits, bias)
        _check(_pipeline(deep_kernels, logits, bias), expected)
        _check(_fused(deep_kernels, logits, bias), expected)
        num_slots = num_tokens * TOP_K
        # logits and bias in; weights, indices out; indices read twice; slot_to_row, m_indices, row_to_slot out
        num_bytes = (num_tokens * NUM_EXPERTS + NUM_EXPERTS) * 4 + num_slots * 4 * 5 \
            + contiguous_max_rows(num_slots, NUM_EXPERTS) * 8
        shape = {"t": num_tokens, "e": NUM_EXPERTS, "k": TOP_K}

        us = time_kernel_us(lambda: deep_kernels.topk_gate(logits, TOP_K, bias=bias, **GATE), ctx.flusher)
        peer_name, peer_us = timed_peer(lambda: reference.topk_gate(logits, TOP_K, bias=bias, **GATE), ctx)
        # logits and bias in; weights and indices out
        gate_bytes = (num_tokens * NUM_EXPERTS + NUM_EXPERTS) * 4 + num_slots * 8
        rows.append(memory_bound_row("topk_gate", shape, f"{CONFIG}; 1 launch", us, gate_bytes, ctx, peer_name,
                                     peer_us, "bitwise equal"))

        indices = expected[1]
        us = time_kernel_us(lambda: deep_kernels.moe_layout(indices, NUM_EXPERTS), ctx.flusher)
        peer_name, peer_us = timed_peer(lambda: reference.moe_layout(indices, NUM_EXPERTS), ctx)
        # indices in; counts (negligible), slot_to_row, m_indices and row_to_slot out
        layout_bytes = num_slots * 8 + contiguous_max_rows(num_slots, NUM_EXPERTS) * 8
        rows.append(memory_bound_row("moe_layout", shape, "int32 indices; 1 cooperative launch: counts + -1 fill, "
                                     "grid barrier, ranks + scatter", us, layout_bytes, ctx, peer_name, peer_us,
                                     "bitwise equal"))

        us = time_kernel_us(lambda: _pipeline(deep_kernels, logits, bias), ctx.flusher)
        peer_us = time_kernel_us(lambda: _pipeline(reference, logits, bias), ctx.flusher, reps=20)
        rows.append(memory_bound_row(
            "topk_gate + moe_layout", shape, f"{CONFIG}; 2 launches: gate, then the layout (1 cooperative launch)", us,
            num_bytes, ctx, "torch reference (eager)", peer_us, "bitwise equal"))

        us = time_kernel_us(lambda: _fused(deep_kernels, logits, bias), ctx.flusher)
        peer_name, peer_us = timed_peer(lambda: _pipeline(reference, logits, bias), ctx)
        rows.append(memory_bound_row("topk_gate_with_layout", shape, f"{CONFIG}; {launches(num_tokens)}", us,
                                     num_bytes, ctx, peer_name, peer_us, "bitwise equal"))

    for num_tokens in BACKWARD_TOKENS:
        logits = torch.randn((num_tokens, NUM_EXPERTS), device="cuda")
        _, indices = deep_kernels.topk_gate(logits, TOP_K, bias=bias, **GATE)
        grad_weights = torch.randn((num_tokens, TOP_K), device="cuda")
        grad = _backward(deep_kernels, grad_weights, logits, indices)
        assert_bitwise_equal(grad, _backward(reference, grad_weights, logits, indices), "grad_logits")
        us = time_kernel_us(lambda: _backward(deep_kernels, grad_weights, logits, indices), ctx.flusher)
        peer_name, peer_us = timed_peer(lambda: _backward(reference, grad_weights, logits, indices), ctx)
        # grad_weights, indices and logits in; grad_logits out
        num_bytes = num_tokens * TOP_K * 8 + num_tokens * NUM_EXPERTS * 8
        rows.append(memory_bound_row(
            "topk_gate_backward", {"t": num_tokens, "e": NUM_EXPERTS, "k": TOP_K},
            "fp32 logits, sigmoid, renormalized, fp32 grad_logits; 1 launch", us, num_bytes, ctx, peer_name, peer_us,
            "bitwise equal"))
    return rows
