"""Suite `wgrad_gemm`: the weight-gradient FP8 GEMM, fp8_gemm_nt with recipe (1, 1, 128) (1 x 128 scales on both
operands) accumulating into an FP32 gradient (c is d), on the issue's out x in shapes at 4096 and 16384 tokens,
against torch's BF16 matmul of the same sizes (dY^T X in bf16, cuBLAS), timed in turns in the same process.
(torch._scaled_mm refuses 1 x 128 scales on both operands, so BF16 cuBLAS is the peer.)

Inputs are cast as training casts them: per_channel_cast_transpose_to_fp8 of the token-major output gradient
dY [T, out] and activations X [T, in]. Each row first checks one call against the float64 reference of the
dequantized operands (calc_diff). Figures: flops 2 * out * in * T; bytes = both FP8 operands and their scales, D
read and written.
"""

import torch

import deep_kernels
from deep_kernels.benchmarks.fp8_gemm import FP8_PEAK_TFLOPS
from deep_kernels.benchmarks.report import BenchContext
from deep_kernels.gemm import CHANNEL_SCALED, _plan
from deep_kernels.heuristics import fp8_gemm as heuristics
from deep_kernels.reference import gemm as reference
from deep_kernels.testing import calc_diff, random_activations
from deep_kernels.testing.bench import time_kernels_us

RECIPE = (1, 1, 128)
# (out, in) of the weight gradients, and the token counts.
MNS = ((2112, 7168), (24576, 1536), (7168, 2048), (4096, 7168))
TOKENS = (4096, 16384)
PEER = "torch.mm bf16 (cuBLAS), dY^T X"
REPS = 20


def wgrad_operands(tokens: int, m: int, n: int, seed: int = 0) -> tuple:
    """((dy_q [m, tokens], sfa), (x_q [n, tokens], sfb), dy [tokens, m] bf16, x [tokens, n] bf16)."""
    dy = random_activations(tokens, m, seed=seed)
    x = random_activations(tokens, n, seed=seed + 1)
    return (deep_kernels.per_channel_cast_transpose_to_fp8(dy), deep_kernels.per_channel_cast_transpose_to_fp8(x),
            dy, x)


def config_text(config, grid) -> str:
    return f"{heuristics.config_label(config)}, {config.num_stages} stages, grid {grid[0]}"


def shape_row(ctx: BenchContext, m: int, n: int, tokens: int) -> dict:
    a, b, dy, x = wgrad_operands(tokens, m, n)
    expected = reference.fp8_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64), recipe=RECIPE)
    d = torch.zeros((m, n), device="cuda")
    deep_kernels.fp8_gemm_nt(a, b, d, c=d, recipe=RECIPE)
    check = f"calc_diff={calc_diff(d, expected):.1e}"
    del expected
    ours = lambda: deep_kernels.fp8_gemm_nt(a, b, d, c=d, recipe=RECIPE)
    peer_out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
    peer = lambda: torch.mm(dy.T, x, out=peer_out)
    us, peer_us = time_kernels_us([ours, peer], ctx.flusher, reps=REPS)

    _, config, grid, _ = _plan(m, n, tokens, torch.float32, True, operands=CHANNEL_SCALED)
    flops = 2 * m * n * tokens
    num_bytes = (m + n) * tokens + 4 * (m + n) * (tokens // 128) + 2 * 4 * m * n
    return {
        "op": "fp8_gemm_nt", "shape": {"m": m, "n": n, "k": tokens}, "recipe": list(RECIPE),
        "config": config_text(config, grid), "us": round(us, 2), "tflops": round(flops / us / 1e6, 1),
        "gbps": round(num_bytes / us / 1e3, 1),
        "roofline_fraction": round(max(flops / FP8_PEAK_TFLOPS / 1e6, num_bytes / ctx.copy_gbps / 1e3) / us, 3),
        "peer": PEER, "peer_us": round(peer_us, 2), "peer_tflops": round(flops / peer_us / 1e6, 1),
        "speedup": round(peer_us / us, 3), "check": check,
    }


def rows(ctx: BenchContext, shapes) -> list:
    """One row per (out, in, tokens) of `shapes`."""
    return [shape_row(ctx, m, n, tokens) for m, n, tokens in shapes]


def run(ctx: BenchContext) -> list:
    return rows(ctx, [(m, n, tokens) for tokens in TOKENS for m, n in MNS])
