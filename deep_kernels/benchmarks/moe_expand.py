"""Suite `moe_expand`: token expansion into the contiguous grouped-GEMM layout (bf16; fp8 with its scales;
fused with the per-token FP8 cast) and the weighted reduction back (bf16 out), DeepSeek-V3 routing, against
copy bandwidth and torch.compile of the reference."""

import torch

import deep_kernels
from deep_kernels.benchmarks.report import BenchContext, memory_bound_row, timed_peer
from deep_kernels.reference import moe as reference
from deep_kernels.testing import assert_bitwise_equal, random_activations
from deep_kernels.testing.bench import time_kernel_us

TOKENS = (64, 128, 512, 4096, 16384)
HIDDEN = 7168
NUM_EXPERTS, NUM_GROUPS, TOPK_GROUPS, TOP_K = 256, 8, 4, 8
GATE = dict(scoring="sigmoid", num_groups=NUM_GROUPS, topk_groups=TOPK_GROUPS, routed_scaling_factor=2.5)
SCALE_COLUMNS = HIDDEN // 128


def _expand_bytes(tokens_read: int, num_rows: int, element_bytes: int, scale_bytes: int = 0) -> int:
    """The least DRAM traffic, which the token-major kernels move: each routed token's row read once (and
    stored to its k slots' rows), every row up to num_rows written (padding rows as zeros)."""
    return (tokens_read + num_rows) * (HIDDEN * element_bytes + scale_bytes)


def routed_layout(num_tokens: int, bias: torch.Tensor) -> tuple:
    """(weights, layout, num_rows, kept_slots, tokens_read) of DeepSeek-V3 routing of random logits: the
    layout's rows up to num_rows, its slots kept, and the tokens with a kept slot (each read once)."""
    logits = torch.randn((num_tokens, NUM_EXPERTS), device="cuda")
    weights, indices = deep_kernels.topk_gate(logits, TOP_K, bias=bias, **GATE)
    layout = deep_kernels.moe_layout(indices, NUM_EXPERTS)
    num_rows, kept_slots = int(layout.num_rows.item()), int((layout.slot_to_row >= 0).sum().item())
    tokens_read = int((layout.slot_to_row >= 0).any(dim=1).sum().item())
    return weights, layout, num_rows, kept_slots, tokens_read


def run(ctx: BenchContext) -> list:
    rows = []
    bias = torch.randn(NUM_EXPERTS, device="cuda") * 0.1
    for num_tokens in TOKENS:
        weights, layout, num_rows, kept_slots, tokens_read = routed_layout(num_tokens, bias)
        shape = {"t": num_tokens, "h": HIDDEN, "e": NUM_EXPERTS, "k": TOP_K}
        x = random_activations(num_tokens, HIDDEN, torch.bfloat16)
        q, scales = deep_kernels.per_token_cast_to_fp8(x, 128)

        has_slot = layout.row_to_slot >= 0

        def checked_row(op, config, kernel, name, args, kwargs, num_bytes, written_rows=None):
            """written_rows picks the rows the kernel writes (it leaves the others, the reference writes zeros)."""
            out = kernel(*args, **kwargs)
            expected = getattr(reference, name)(*args, **kwargs)
            pairs = zip(out, expected) if isinstance(out, tuple) else ((out, expected),)
            for i, (actual, wanted) in enumerate(pairs):
                if written_rows is not None:
                    actual, wanted = actual[written_rows], wanted[written_rows]
                assert_bitwise_equal(actual, wanted, f"{op} output {i}")
            us = time_kernel_us(lambda: kernel(*args, **kwargs), ctx.flusher)
            peer, peer_us = timed_peer(lambda: getattr(reference, name)(*args, **kwargs), ctx, dynamic=True)
            return memory_bound_row(op, shape, config, us, num_bytes, ctx, peer, peer_us, "bitwise equal")

        rows.append(checked_row("moe_expand", "bf16, contiguous", deep_kernels.moe_expand, "moe_expand",
                                (x, layout), {}, _expand_bytes(tokens_read, num_rows, 2), slice(0, num_rows)))
        if num_tokens <= 512:  # decode: the contiguous layout is mostly padding rows
            rows.append(checked_row("moe_expand", "bf16, contiguous, zero_padding=False", deep_kernels.moe_expand,
                                    "moe_expand", (x, layout), {"zero_padding": False},
                                    _expand_bytes(tokens_read, kept_slots, 2), has_slot))
        rows.append(checked_row("moe_expand", "fp8 + fp32 mn_major scales, contiguous", deep_kernels.moe_expand,
                                "moe_expand", (q, layout, scales), {},
                                _expand_bytes(tokens_read, num_rows, 1, SCALE_COLUMNS * 4), slice(0, num_rows)))
        cast_bytes = tokens_read * HIDDEN * 2 + num_rows * (HIDDEN + SCALE_COLUMNS * 4)
        rows.append(checked_row("moe_expand_cast_to_fp8", "bf16 in, fp32 mn_major scales, contiguous",
                                deep_kernels.moe_expand_cast_to_fp8, "moe_expand_cast_to_fp8", (x, layout), {},
                                cast_bytes, slice(0, num_rows)))
        y = random_activations(layout.row_to_slot.shape[0], HIDDEN, torch.bfloat16)
        reduce_bytes = kept_slots * (HIDDEN * 2 + 8) + num_tokens * HIDDEN * 2
        rows.append(checked_row("moe_reduce", "bf16 in, bf16 out, contiguous", deep_kernels.moe_reduce, "moe_reduce",
                                (y, layout, weights), {}, reduce_bytes))
    return rows
