"""Suite `bf16_gemm`: the BF16 GEMMs (the GEMM engine's Bf16 kind) against torch's BF16 matmul (cuBLAS), timed in
turns in the same run: bf16_gemm_nt on the 18 DeepSeek-V3 projection shapes of the fp8_gemm suite, bf16_gemm_tn (both
operands MN-major, the weight gradient's layout) on their M = 4096 rows, and the grouped kinds (contiguous and
masked) on the grouped_gemm suite's expert shapes against a loop of torch matmuls, one per expert (masked: over each
expert's valid rows).

Every row first checks its result against the float64 reference. Grouped figures count the valid rows only.
"""

import random

import torch

import deep_kernels
from deep_kernels.benchmarks.fp8_gemm import MS, NKS
from deep_kernels.benchmarks.grouped_gemm import CONTIGUOUS_SHAPES, MASKED_GROUPS, MASKED_NKS
from deep_kernels.benchmarks.report import BenchContext
from deep_kernels.bf16_gemm import CONTIGUOUS, MASKED, _grouped_plan, _plan
from deep_kernels.device import get_num_sms
from deep_kernels.heuristics.fp8_gemm import config_label
from deep_kernels.reference import bf16_gemm as reference
from deep_kernels.testing import calc_diff, random_activations
from deep_kernels.testing.bench import time_kernels_us
from deep_kernels.testing.grouped import contiguous_layout, masked_problem

# H200 dense BF16 tensor-core rate (datasheet), the ceiling of roofline_fraction's compute term.
BF16_PEAK_TFLOPS = 989.0
DENSE_PEER = "torch.mm bf16 (cuBLAS)"
GROUPED_PEER = "torch.mm bf16 (cuBLAS), one call per expert"
GROUPED_REPS = 20


def _row(op: str, shape: dict, config: str, us: float, flops: int, num_bytes: int, ctx: BenchContext, peer: str,
         peer_us: float, check: str) -> dict:
    memory_fraction = num_bytes / ctx.copy_gbps / 1e3 / us
    return {
        "op": op, "shape": shape, "config": config, "us": round(us, 2), "tflops": round(flops / us / 1e6, 1),
        "gbps": round(num_bytes / us / 1e3, 1),
        "roofline_fraction": round(max(flops / BF16_PEAK_TFLOPS / 1e6 / us, memory_fraction), 3),
        "memory_roofline_fraction": round(memory_fraction, 3),
        "peer": peer, "peer_us": round(peer_us, 2), "speedup": round(peer_us / us, 3), "check": check,
    }


def dense_rows(ctx: BenchContext, shapes, layout: str = "nt") -> list:
    """bf16_gemm_nt (layout "nt") or bf16_gemm_tn (a [K, M] and b [K, N] row-major) against torch.mm of the same
    operands on (m, n, k) shapes."""
    rows = []
    for m, n, k in shapes:
        a, b = random_activations(m, k), torch.randn((n, k), device="cuda", dtype=torch.bfloat16)
        d, d_peer = (torch.empty((m, n), device="cuda", dtype=torch.bfloat16) for _ in range(2))
        if layout == "tn":
            a_t, b_t = a.t().contiguous(), b.t().contiguous()
            ours = lambda: deep_kernels.bf16_gemm_tn(a_t, b_t, d)
            peer = lambda: torch.mm(a_t.t(), b_t, out=d_peer)
        else:
            ours = lambda: deep_kernels.bf16_gemm_nt(a, b, d)
            peer = lambda: torch.mm(a, b.t(), out=d_peer)
        ours()
        peer()
        expected = reference.bf16_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64))
        check = f"calc_diff={calc_diff(d, expected):.1e}, cuBLAS {calc_diff(d_peer, expected):.1e}"
        del expected
        # NOTE: timed in turns, so that both see the same clocks (both run near the power limit).
        us, peer_us = time_kernels_us([ours, peer], ctx.flusher)
        mn_major = layout == "tn"
        _, config, grid, _ = _plan(m, n, k, torch.bfloat16, False, get_num_sms(), None, mn_major, mn_major)
        rows.append(_row(f"bf16_gemm_{layout}", {"m": m, "n": n, "k": k},
                         f"{config_label(config)}, {config.num_stages} stages, grid {grid[0]}", us, 2 * m * n * k,
                         2 * (m * k + n * k + m * n), ctx, DENSE_PEER, peer_us, check))
    return rows


def contiguous_rows(ctx: BenchContext, shapes=CONTIGUOUS_SHAPES) -> list:
    """m_grouped_bf16_gemm_nt_contiguous against a loop of torch.mm over (G, M per group, N, K) shapes."""
    rows = []
    for g, m, n, k in shapes:
        m_indices, _ = contiguous_layout([m] * g)
        a = random_activations(g * m, k)
        b = torch.randn((g, n, k), device="cuda", dtype=torch.bfloat16)
        d, d_peer = (torch.empty((g * m, n), device="cuda", dtype=torch.bfloat16) for _ in range(2))
        ours = lambda: deep_kernels.m_grouped_bf16_gemm_nt_contiguous(a, b, d, m_indices)
        peer = lambda: [torch.mm(a[i * m:(i + 1) * m], b[i].t(), out=d_peer[i * m:(i + 1) * m]) for i in range(g)]
        ours()
        expected = reference.m_grouped_bf16_gemm_nt_contiguous(
            a, b, torch.empty((g * m, n), device="cuda", dtype=torch.float64), m_indices)
        check = f"calc_diff={calc_diff(d, expected):.1e}"
        del expected
        us, peer_us = time_kernels_us([ours, peer], ctx.flusher, reps=GROUPED_REPS)
        _, config, grid = _grouped_plan(CONTIGUOUS, g * m, n, k, g)
        rows.append(_row("m_grouped_bf16_gemm_nt_contiguous", {"g": g, "m": m, "n": n, "k": k},
                         f"{config_label(config)}, {config.num_stages} stages, grid {grid[0]}", us, 2 * g * m * n * k,
                         2 * (g * m * (k + n) + g * n * k), ctx, GROUPED_PEER, peer_us, check))
    return rows


def masked_rows(ctx: BenchContext, nks=MASKED_NKS, groups=MASKED_GROUPS) -> list:
    """m_grouped_bf16_gemm_nt_masked against a loop of torch.mm over each expert's valid rows."""
    rows = []
    rng = random.Random(0)
    for n, k in nks:
        for g, expected_m in groups:
            masked_m, m_max, hint = masked_problem(g, expected_m, rng)
            a = random_activations(g * m_max, k).view(g, m_max, k)
            b = torch.randn((g, n, k), device="cuda", dtype=torch.bfloat16)
            masked_m_device = torch.tensor(masked_m, dtype=torch.int32, device="cuda")
            d, d_peer = (torch.empty((g, m_max, n), device="cuda", dtype=torch.bfloat16) for _ in range(2))
            ours = lambda: deep_kernels.m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m_device, hint)
            peer = lambda: [torch.mm(a[i, :r], b[i].t(), out=d_peer[i, :r]) for i, r in enumerate(masked_m) if r]
            ours()
            expected = reference.m_grouped_bf16_gemm_nt_masked(
                a, b, torch.zeros((g, m_max, n), device="cuda", dtype=torch.float64), masked_m_device, hint)
            valid = torch.arange(m_max, device="cuda")[None, :] < masked_m_device[:, None]
            check = f"calc_diff={calc_diff(d[valid], expected[valid]):.1e}"
            del expected
            us, peer_us = time_kernels_us([ours, peer], ctx.flusher, reps=GROUPED_REPS)
            _, config, grid = _grouped_plan(MASKED, hint, n, k, g)
            total = sum(masked_m)
            rows.append(_row("m_grouped_bf16_gemm_nt_masked",
                             {"g": g, "m": m_max, "expected_m": expected_m, "n": n, "k": k, "expected_m_hint": hint},
                             f"{config_label(config)}, {config.num_stages} stages, grid {grid[0]}", us,
                             2 * total * n * k, 2 * (total * (k + n) + g * n * k), ctx, GROUPED_PEER, peer_us, check))
    return rows


DENSE_SHAPES = tuple((m, n, k) for n, k in NKS for m in MS)
WEIGHT_GRADIENT_SHAPES = tuple((4096, n, k) for n, k in NKS)


def kernel_specs(num_sms: int) -> list:
    """The kernels the suite launches (the heuristics' picks of its rows), to compile in parallel up front."""
    from deep_kernels.bf16_gemm import kernel_spec
    from deep_kernels.heuristics import bf16_gemm as heuristics

    specs = [kernel_spec(heuristics.get_bf16_gemm_config(m, n, k, num_sms), n, k, torch.bfloat16, False)
             for m, n, k in DENSE_SHAPES]
    specs += [kernel_spec(heuristics.get_bf16_gemm_config(m, n, k, num_sms, mn_major_b=True), n, k, torch.bfloat16,
                          False, "normal", True, True) for m, n, k in WEIGHT_GRADIENT_SHAPES]
    specs += [kernel_spec(heuristics.get_grouped_bf16_gemm_config(CONTIGUOUS, g * m, n, k, g, num_sms), n, k,
                          torch.bfloat16, False, CONTIGUOUS) for g, m, n, k in CONTIGUOUS_SHAPES]
    hints = [(g, masked_problem(g, expected_m, random.Random(0))[2]) for g, expected_m in MASKED_GROUPS]
    specs += [kernel_spec(heuristics.get_grouped_bf16_gemm_config(MASKED, hint, n, k, g, num_sms), n, k, torch.bfloat16,
                          False, MASKED) for n, k in MASKED_NKS for g, hint in hints]
    return list(dict.fromkeys(specs))


def run(ctx: BenchContext) -> list:
    from deep_kernels.jit.precompile import precompile

    precompile(kernel_specs(get_num_sms()), progress=False)
    return (dense_rows(ctx, DENSE_SHAPES) + dense_rows(ctx, WEIGHT_GRADIENT_SHAPES, "tn") + contiguous_rows(ctx) +
            masked_rows(ctx))
