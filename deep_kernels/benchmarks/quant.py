"""Suite `quant`: the per-token, per-row and per-block FP8 casts, the cast-back, the per-channel cast with
transpose and the batched transpose (and the FP4 and SwiGLU modules' rows), against copy bandwidth and the
torch reference: torch.compile of it as the peer at the large shape, eager at the small one."""

import torch

import deep_kernels
from deep_kernels.benchmarks import quant_e5m6, quant_fp4, quant_swiglu
from deep_kernels.benchmarks.report import COMPILED_PEER_ROWS, BenchContext, checked_memory_row
from deep_kernels.reference import quant as reference
from deep_kernels.testing import random_activations

SHAPES = ((4096, 7168), (16384, 7168))
GROUP_SIZE = 128
VARIANTS = (("fp32 mn_major", GROUP_SIZE, False, "mn_major", "mul"),
            ("ue8m0 packed", GROUP_SIZE, True, "packed_ue8m0", "mul"),
            ("fp32 mn_major, divide", GROUP_SIZE, False, "mn_major", "div"),
            ("group K (per row), fp32 mn_major", None, False, "mn_major", "mul"))
BLOCK_VARIANTS = (("block 128, fp32", 128, False, "mul"), ("block 128, fp32, divide", 128, False, "div"),
                  ("block 32, ue8m0", 32, True, "mul"))
CHANNEL_VARIANTS = (("fp32 mn_major", False, "mn_major", "mul"), ("ue8m0 packed", True, "packed_ue8m0", "mul"))
# The batched transpose moves each large shape as batches of 2048 rows.
TRANSPOSE_ROWS = 2048
TRANSPOSE_TYPES = (("bf16", torch.bfloat16), ("e4m3", torch.float8_e4m3fn))


def run(ctx: BenchContext) -> list:
    return ([_checked_row(*case, ctx) for case in cases()] + quant_fp4.rows(ctx) + quant_swiglu.rows(ctx)
            + quant_e5m6.rows(ctx))


def cases(shapes=SHAPES, device: str = "cuda"):
    """(op, shape, config, args, kwargs, bytes moved) of every row, inputs built on `device` one at a time."""
    for m, k in shapes:
        x = random_activations(m, k, torch.bfloat16, device=device)
        for label, group_size, ue8m0, layout, scale_mode in VARIANTS:
            group = group_size or k
            kwargs = dict(group_size=group_size, ue8m0=ue8m0, scale_layout=layout, scale_mode=scale_mode)
            num_bytes = m * k * 3 + m * (k // group) * 4
            yield ("per_token_cast_to_fp8", {"m": m, "k": k, "group": group}, f"bf16 in, {label}", (x,), kwargs,
                   num_bytes)
            if group_size is not None:
                q, scales = reference.per_token_cast_to_fp8(x, **kwargs)
                yield ("per_token_cast_back", {"m": m, "k": k, "group": group}, f"bf16 out, {label}",
                       (q, scales, group), {}, num_bytes)
        for label, block_size, ue8m0, scale_mode in BLOCK_VARIANTS:
            kwargs = dict(block_size=block_size, ue8m0=ue8m0, scale_mode=scale_mode)
            num_bytes = m * k * 3 + -(-m // block_size) * (k // block_size) * 4
            yield ("per_block_cast_to_fp8", {"m": m, "k": k, "block": block_size}, f"bf16 in, {label}", (x,),
                   kwargs, num_bytes)
        for label, ue8m0, layout, scale_mode in CHANNEL_VARIANTS:
            kwargs = dict(ue8m0=ue8m0, scale_layout=layout, scale_mode=scale_mode)
            num_bytes = m * k * 3 + k * -(-m // 128) * 4
            yield ("per_channel_cast_transpose_to_fp8", {"m": m, "k": k, "block": 128}, f"bf16 in, q [K, M], {label}",
                   (x,), kwargs, num_bytes)
        batch_rows = min(m, TRANSPOSE_ROWS)
        for label, dtype in TRANSPOSE_TYPES:
            batched = x.to(dtype).view(m // batch_rows, batch_rows, k)
            yield ("batched_transpose", {"b": m // batch_rows, "m": batch_rows, "n": k}, label, (batched,), {},
                   2 * batched.numel() * batched.element_size())


def _checked_row(op: str, shape: dict, config: str, args: tuple, kwargs: dict, num_bytes: int,
                 ctx: BenchContext) -> dict:
    """The kernel `op` checked bit for bit against its reference, then timed with its peer."""
    return checked_memory_row(op, shape, config, lambda: getattr(deep_kernels, op)(*args, **kwargs),
                              lambda: getattr(reference, op)(*args, **kwargs), num_bytes, ctx,
                              compiled=shape.get("b", 1) * shape["m"] == COMPILED_PEER_ROWS)
