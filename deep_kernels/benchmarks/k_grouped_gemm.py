"""Suite `k_grouped_gemm`: the k-grouped FP8 GEMM of MoE weight gradients (k_grouped_fp8_gemm_nt_contiguous,
accumulating into the FP32 gradients, c is d) for 4, 8 and 16 experts on DeepSeek-V3's expert shapes (out x in =
4096 x 7168 and 7168 x 2048) at 2048, 4096 and 8192 tokens per expert on average (uneven: each expert 0.7-1.3x the
average, rounded up to 128, the total G x the average), against (a) a loop of torch BF16 matmuls over the experts (dY_g^T X_g,
cuBLAS) and (b) this library's dense weight-gradient GEMM (fp8_gemm_nt, recipe (1, 1, 128)) on the same total
work (K = all the tokens), all timed in turns in the same process.

Inputs are cast as training casts them: per_channel_cast_transpose_to_fp8 of the token-major dY [T, out] and X
[T, in]. Each row first checks one call against the per-expert float64 reference (calc_diff over all of D).
Figures: flops 2 * out * in * T; bytes = both FP8 operands and their scales, every D read and written.

The k-grouped BF16 GEMM (k_grouped_bf16_gemm_tn_contiguous on the token-major bf16 dY and X as they are,
accumulating into the FP32 gradients) has rows of its own for the same experts' shapes at 4096 tokens per expert on
average, against the same loop of BF16 matmuls; bytes = both bf16 operands, every D read and written.
"""

import random

import torch

import deep_kernels
from deep_kernels.benchmarks.bf16_gemm import BF16_PEAK_TFLOPS
from deep_kernels.benchmarks.fp8_gemm import FP8_PEAK_TFLOPS
from deep_kernels.benchmarks.report import BenchContext
from deep_kernels.benchmarks.wgrad_gemm import config_text
from deep_kernels.k_grouped_bf16_gemm import _plan as bf16_plan
from deep_kernels.k_grouped_gemm import _plan
from deep_kernels.reference import k_grouped_gemm as reference
from deep_kernels.testing import calc_diff, random_activations
from deep_kernels.testing.bench import time_kernels_us

RECIPE = (1, 1, 128)
BF16_MEAN_TOKENS = (4096,)
GROUPS = (4, 8, 16)
MNS = ((4096, 7168), (7168, 2048))
MEAN_TOKENS = (2048, 4096, 8192)
PEER = "torch.mm bf16 (cuBLAS), one dY_g^T X_g per expert"
REPS = 10
ALIGNMENT = 128


def expert_tokens(num_groups: int, mean: int, rng: random.Random) -> list:
    """Tokens per expert: each mean x [0.7, 1.3] rounded up to a multiple of 128, then 128 taken from (or given to)
    experts in a random order, each staying in that range, until the total is G x mean (mean a multiple of 128)."""
    assert mean % ALIGNMENT == 0, mean
    low, high = -(-int(0.7 * mean) // ALIGNMENT) * ALIGNMENT, int(1.3 * mean) // ALIGNMENT * ALIGNMENT
    ks = [min(max(-(-int(mean * rng.uniform(0.7, 1.3)) // ALIGNMENT) * ALIGNMENT, low), high)
          for _ in range(num_groups)]
    order = rng.sample(range(num_groups), num_groups)
    step = 0
    while sum(ks) != num_groups * mean:
        g = order[step % num_groups]
        step += 1
        delta = -ALIGNMENT if sum(ks) > num_groups * mean else ALIGNMENT
        if low <= ks[g] + delta <= high:
            ks[g] += delta
    return ks


def shape_row(ctx: BenchContext, num_groups: int, m: int, n: int, mean: int) -> dict:
    ks = expert_tokens(num_groups, mean, random.Random(num_groups * mean))
    total = sum(ks)
    dy = random_activations(total, m, seed=0)
    x = random_activations(total, n, seed=1)
    a, b = deep_kernels.per_channel_cast_transpose_to_fp8(dy), deep_kernels.per_channel_cast_transpose_to_fp8(x)
    ks_tensor = torch.tensor(ks, dtype=torch.int32, device="cuda")
    d = torch.zeros((num_groups, m, n), device="cuda")
    deep_kernels.k_grouped_fp8_gemm_nt_contiguous(a, b, d, ks, ks_tensor, c=d)
    expected = reference.k_grouped_fp8_gemm_nt_contiguous(
        a, b, torch.empty((num_groups, m, n), device="cuda", dtype=torch.float64), ks)
    check = f"calc_diff={calc_diff(d, expected):.1e}"
    del expected
    ours = lambda: deep_kernels.k_grouped_fp8_gemm_nt_contiguous(a, b, d, ks, ks_tensor, c=d)

    peer_out = torch.empty((num_groups, m, n), device="cuda", dtype=torch.bfloat16)
    starts = [sum(ks[:g]) for g in range(num_groups)]
    segments = [(dy[s:s + k].T, x[s:s + k], peer_out[g]) for g, (s, k) in enumerate(zip(starts, ks))]
    peer = lambda: [torch.mm(dy_g, x_g, out=out) for dy_g, x_g, out in segments]
    dense_d = torch.zeros((m, n), device="cuda")
    dense = lambda: deep_kernels.fp8_gemm_nt(a, b, dense_d, c=dense_d, recipe=RECIPE)
    us, peer_us, dense_us = time_kernels_us([ours, peer, dense], ctx.flusher, reps=REPS)

    _, config, grid = _plan(m, n, total, num_groups, True)
    flops = 2 * m * n * total
    num_bytes = (m + n) * total + 4 * (m + n) * (total // 128) + 2 * 4 * num_groups * m * n
    return {
        "op": "k_grouped_fp8_gemm_nt_contiguous", "shape": {"g": num_groups, "m": m, "n": n, "k": total},
        "config": f"ks {ks}; {config_text(config, grid)}", "us": round(us, 2), "tflops": round(flops / us / 1e6, 1),
        "gbps": round(num_bytes / us / 1e3, 1),
        "roofline_fraction": round(max(flops / FP8_PEAK_TFLOPS / 1e6, num_bytes / ctx.copy_gbps / 1e3) / us, 3),
        "peer": PEER, "peer_us": round(peer_us, 2), "speedup": round(peer_us / us, 3),
        "dense_fp8_us": round(dense_us, 2), "speedup_vs_dense_fp8": round(dense_us / us, 3),
        "check": check,
    }


def bf16_shape_row(ctx: BenchContext, num_groups: int, m: int, n: int, mean: int) -> dict:
    ks = expert_tokens(num_groups, mean, random.Random(num_groups * mean))
    total = sum(ks)
    dy = random_activations(total, m, seed=0)
    x = random_activations(total, n, seed=1)
    ks_tensor = torch.tensor(ks, dtype=torch.int32, device="cuda")
    d = torch.zeros((num_groups, m, n), device="cuda")
    deep_kernels.k_grouped_bf16_gemm_tn_contiguous(dy, x, d, ks, ks_tensor, c=d)
    expected = reference.k_grouped_bf16_gemm_tn_contiguous(
        dy, x, torch.empty((num_groups, m, n), device="cuda", dtype=torch.float64), ks)
    check = f"calc_diff={calc_diff(d, expected):.1e}"
    del expected
    ours = lambda: deep_kernels.k_grouped_bf16_gemm_tn_contiguous(dy, x, d, ks, ks_tensor, c=d)

    peer_out = torch.empty((num_groups, m, n), device="cuda", dtype=torch.bfloat16)
    starts = [sum(ks[:g]) for g in range(num_groups)]
    segments = [(dy[s:s + k].T, x[s:s + k], peer_out[g]) for g, (s, k) in enumerate(zip(starts, ks))]
    peer = lambda: [torch.mm(dy_g, x_g, out=out) for dy_g, x_g, out in segments]
    us, peer_us = time_kernels_us([ours, peer], ctx.flusher, reps=REPS)

    _, config, grid = bf16_plan(m, n, total, num_groups, True, True, True)
    flops = 2 * m * n * total
    num_bytes = 2 * (m + n) * total + 2 * 4 * num_groups * m * n
    return {
        "op": "k_grouped_bf16_gemm_tn_contiguous", "shape": {"g": num_groups, "m": m, "n": n, "k": total},
        "config": f"ks {ks}; {config_text(config, grid)}", "us": round(us, 2), "tflops": round(flops / us / 1e6, 1),
        "gbps": round(num_bytes / us / 1e3, 1),
        "roofline_fraction": round(max(flops / BF16_PEAK_TFLOPS / 1e6, num_bytes / ctx.copy_gbps / 1e3) / us, 3),
        "peer": PEER, "peer_us": round(peer_us, 2), "speedup": round(peer_us / us, 3), "check": check,
    }


def rows(ctx: BenchContext, shapes, bf16_shapes=()) -> list:
    """One row per (G, out, in, mean tokens) of `shapes` (FP8) and of `bf16_shapes` (BF16)."""
    return [shape_row(ctx, *shape) for shape in shapes] + [bf16_shape_row(ctx, *shape) for shape in bf16_shapes]


def run(ctx: BenchContext) -> list:
    return rows(ctx, [(g, m, n, mean) for m, n in MNS for g in GROUPS for mean in MEAN_TOKENS],
                [(g, m, n, mean) for m, n in MNS for g in GROUPS for mean in BF16_MEAN_TOKENS])
