"""Rows of the `quant` suite for SwiGLU fused with the per-token FP8 cast and its backward, against copy
bandwidth and the reference (torch.compile of it at 16384 rows, eager at the smaller shapes)."""

import torch

import deep_kernels
from deep_kernels.benchmarks.report import COMPILED_PEER_ROWS, BenchContext, checked_memory_row
from deep_kernels.reference import quant as reference
from deep_kernels.testing import random_activations

# (N rows, H): x is [N, 2H].
SHAPES = ((4096, 7168), (16384, 7168), (128, 2048), (4096, 2048), (16384, 2048))
GROUP_SIZE = 128
CLAMP = 7.0
# (label, options, whether rows carry a weight and a position, the op)
CASES = (
    ("fp32 mn_major", dict(), False, "swiglu_cast_to_fp8"),
    ("ue8m0 packed, clamp 7, weights[pos]", dict(clamp=CLAMP, ue8m0=True, scale_layout="packed_ue8m0"), True,
     "swiglu_cast_to_fp8"),
    ("clamp 7, weights[pos]", dict(clamp=CLAMP), True, "swiglu_backward"),
)


def _arguments(num_rows: int, hidden: int, options: dict, with_rows: bool, backward: bool,
               device: str = "cuda") -> tuple:
    """(args, kwargs) of a case: x (and dy); with rows, weights gathered through a permutation pos (no
    padding rows), unchecked so that no check kernels enter the timed calls."""
    x = random_activations(num_rows, 2 * hidden, torch.bfloat16, device=device)
    args = (x, random_activations(num_rows, hidden, torch.bfloat16, device=device)) if backward else (x,)
    kwargs = dict(options)
    if with_rows:
        pos = torch.randperm(num_rows, device=x.device).to(torch.int32)
        kwargs.update(weights=torch.rand((num_rows // 8, 8), device=x.device), pos=pos, check_pos=False)
    return args, kwargs


def _num_bytes(num_rows: int, hidden: int, with_rows: bool, backward: bool, options: dict) -> int:
    row_bytes = 8 if with_rows else 0  # a position and a weight per row
    if backward:  # x and dy in, dx and dweights out
        return num_rows * (hidden * 4 + hidden * 2 + hidden * 4 + 4 + row_bytes)
    scale_bytes = hidden // GROUP_SIZE * (1 if options.get("scale_layout") == "packed_ue8m0" else 4)
    return num_rows * (hidden * 4 + hidden + scale_bytes + row_bytes)


def rows(ctx: BenchContext) -> list:
    rows = []
    for num_rows, hidden in SHAPES:
        for label, options, with_rows, op in CASES:
            backward = op == "swiglu_backward"
            args, kwargs = _arguments(num_rows, hidden, options, with_rows, backward)
            rows.append(checked_memory_row(
                op, {"m": num_rows, "h": hidden}, f"bf16 x [m, 2h], {label}",
                lambda: getattr(deep_kernels, op)(*args, **kwargs), lambda: getattr(reference, op)(*args, **kwargs),
                _num_bytes(num_rows, hidden, with_rows, backward, options), ctx,
                compiled=num_rows == COMPILED_PEER_ROWS))
    return rows
