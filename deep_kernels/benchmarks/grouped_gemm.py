"""Suite `grouped_gemm`: the MoE grouped FP8 GEMMs (contiguous and masked) on DeepSeek-V3 expert shapes,
against (a) a loop of cuBLAS blockwise-scaled FP8 GEMMs, one torch._scaled_mm per expert, and (b) this
library's dense fp8_gemm_nt on the same total rows (masked: the valid rows), both timed in the same run.

Every row first checks its result against the per-expert float64 reference: masked rows on every valid row,
contiguous rows (32768 rows each, whose full float64 products do not fit a 30 s run) on the first and last
CHECKED_ROWS rows of every expert and of the dense GEMM's output. Figures count the valid rows only: flops 2 * rows * N * K; bytes = valid A rows and their scales + every expert's B and scales + valid D.
"""

import random

import torch

import deep_kernels
from deep_kernels.benchmarks.fp8_gemm import FP8_PEAK_TFLOPS, _cublas
from deep_kernels.benchmarks.report import BenchContext
from deep_kernels.grouped_gemm import CONTIGUOUS, MASKED, _plan
from deep_kernels.reference import gemm as reference
from deep_kernels.testing import calc_diff, random_activations
from deep_kernels.testing.bench import time_kernels_us
from deep_kernels.testing.grouped import make_contiguous_inputs, make_masked_inputs, masked_problem
from deep_kernels.validation import ceil_div

# (G, M per group, N, K)
CONTIGUOUS_SHAPES = ((4, 8192, 4096, 7168), (4, 8192, 7168, 2048), (8, 4096, 4096, 7168), (8, 4096, 7168, 2048))
# (G, expected M) x (N, K)
MASKED_GROUPS = ((1, 1024), (2, 512), (4, 256), (16, 64), (32, 32))
MASKED_NKS = ((4096, 7168), (7168, 2048))
PEER = "torch._scaled_mm blockwise (cuBLAS), one call per expert"
# cuBLAS's blockwise path is given rows in multiples of this (the extra rows are the masked padding).
CUBLAS_ROW_MULTIPLE = 16
REPS = 20
# Rows checked at each end of a contiguous expert's segment (and of the dense GEMM of the contiguous rows' output).
CHECKED_ROWS = 128


def _column_major(scales: torch.Tensor) -> torch.Tensor:
    return scales.t().contiguous().t()


def _peer_loop(a_rows: list, sfa_rows: list, b, sfb):
    """(one cuBLAS call per expert, None) (a_rows[g] [M_g, K], sfa_rows[g] its FP32 scales; experts without rows
    skipped), or (None, the error) when cuBLAS rejects a shape."""
    calls = [_cublas(a, b[g], _column_major(sfa), sfb[g]) for g, (a, sfa) in enumerate(zip(a_rows, sfa_rows))
             if a.shape[0] > 0]
    loop = lambda: [call() for call in calls]
    try:
        loop()
    except RuntimeError as error:
        return None, error
    return loop, None


def _end_rows(first: int, rows: int) -> list:
    """The first and last CHECKED_ROWS rows of [first, first + rows) (all of them when fewer)."""
    if rows <= 2 * CHECKED_ROWS:
        return list(range(first, first + rows))
    return list(range(first, first + CHECKED_ROWS)) + list(range(first + rows - CHECKED_ROWS, first + rows))


def _rows_diff(d, a, sfa, b, sfb, rows: list) -> float:
    """calc_diff of d's `rows` against their float64 product with one expert's weights (b, sfb)."""
    index = torch.tensor(rows, device="cuda")
    a_rows = a.view(torch.uint8)[index].view(a.dtype)
    expected = reference.dequantize_a(a_rows, sfa[index]) @ reference.dequantize_b(b, sfb).T
    return calc_diff(d[index], expected)


def _dense_call(rows: int, n: int, k: int, b, sfb, checked_rows: list = None) -> tuple:
    """(fp8_gemm_nt on `rows` random rows with expert 0's weights, its calc_diff on checked_rows, default all)."""
    a = deep_kernels.per_token_cast_to_fp8(random_activations(rows, k))
    d = torch.empty((rows, n), device="cuda", dtype=torch.bfloat16)
    call = lambda: deep_kernels.fp8_gemm_nt(a, (b[0], sfb[0]), d)
    call()
    if checked_rows is not None:
        return call, _rows_diff(d, a[0], a[1], b[0], sfb[0], checked_rows)
    expected = reference.fp8_gemm_nt(a, (b[0], sfb[0]), torch.empty((rows, n), device="cuda", dtype=torch.float64))
    return call, calc_diff(d, expected)


def _time_with_peers(call, peer: tuple, dense: tuple, ctx: BenchContext) -> tuple:
    """(us, (peer_us, peer_error), (dense_us, dense_diff)): the kernel, the cuBLAS loop and the dense GEMM timed in
    turns (time_kernels_us), so that their ratios see the same clocks."""
    (peer_loop, peer_error), (dense, dense_diff) = peer, dense
    fns = [call, dense] + ([peer_loop] if peer_loop else [])
    times = time_kernels_us(fns, ctx.flusher, reps=REPS)
    return times[0], (times[2] if peer_loop else None, peer_error), (times[1], dense_diff)


def _config_text(config, grid) -> str:
    multicast = f"multicast {config.num_tma_multicast}"
    if config.num_tma_multicast > 1:
        multicast += " on A" if config.multicast_on_a else " on B"
    return f"block {config.block_m}x{config.block_n}, {config.num_stages} stages, {multicast}, grid {grid[0]}"


def _row(op: str, shape: dict, config: str, us: float, rows: int, n: int, k: int, num_groups: int,
         ctx: BenchContext, peer, dense, check: str) -> dict:
    (peer_us, peer_error), (dense_us, dense_diff) = peer, dense
    if peer_error is not None:
        print(f"cuBLAS blockwise failed for {op} {shape}: {peer_error}")
    flops = 2 * rows * n * k
    k_blocks = k // 128
    num_bytes = rows * (k + 2 * n + 4 * k_blocks) + num_groups * (n * k + 4 * ceil_div(n, 128) * k_blocks)
    memory_fraction = num_bytes / ctx.copy_gbps / 1e3 / us
    return {
        "op": op, "shape": shape, "config": config, "us": round(us, 2), "tflops": round(flops / us / 1e6, 1),
        "gbps": round(num_bytes / us / 1e3, 1),
        "roofline_fraction": round(max(flops / FP8_PEAK_TFLOPS / 1e6 / us, memory_fraction), 3),
        "memory_roofline_fraction": round(memory_fraction, 3),
        "peer": PEER, "peer_us": round(peer_us, 2) if peer_us else None,
        "speedup": round(peer_us / us, 3) if peer_us else None,
        "dense_fp8_gemm_nt_us": round(dense_us, 2), "ratio_to_dense": round(dense_us / us, 3),
        "check": f"{check}, dense calc_diff={dense_diff:.1e}",
    }


def _contiguous_rows(ctx: BenchContext) -> list:
    rows = []
    for g, m, n, k in CONTIGUOUS_SHAPES:
        (a, sfa), (b, sfb), m_indices, _ = make_contiguous_inputs([m] * g, n, k)
        d = torch.empty((g * m, n), device="cuda", dtype=torch.bfloat16)
        call = lambda: deep_kernels.m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, m_indices)
        d.fill_(float("nan"))
        call()
        check = "calc_diff={:.1e} on each expert's first and last {} rows".format(
            max(_rows_diff(d, a, sfa, b[i], sfb[i], _end_rows(i * m, m)) for i in range(g)), CHECKED_ROWS)
        peer = _peer_loop([a[i * m:(i + 1) * m] for i in range(g)], [sfa[i * m:(i + 1) * m] for i in range(g)],
                          b, sfb)
        dense = _dense_call(g * m, n, k, b, sfb, _end_rows(0, g * m))
        us, peer, dense = _time_with_peers(call, peer, dense, ctx)
        _, config, grid = _plan(CONTIGUOUS, g * m, n, k, g)
        rows.append(_row("m_grouped_fp8_gemm_nt_contiguous", {"g": g, "m": m, "n": n, "k": k},
                         _config_text(config, grid), us, g * m, n, k, g, ctx, peer, dense, check))
    return rows


def _masked_rows(ctx: BenchContext) -> list:
    rows = []
    rng = random.Random(0)
    for n, k in MASKED_NKS:
        for g, expected_m in MASKED_GROUPS:
            masked_m, m_max, hint = masked_problem(g, expected_m, rng)
            (a, sfa), (b, sfb), masked_m_device = make_masked_inputs(masked_m, m_max, n, k)
            d = torch.empty((g, m_max, n), device="cuda", dtype=torch.bfloat16)
            call = lambda: deep_kernels.m_grouped_fp8_gemm_nt_masked((a, sfa), (b, sfb), d, masked_m_device, hint)
            call()
            expected = reference.m_grouped_fp8_gemm_nt_masked(
                (a, sfa), (b, sfb), torch.zeros((g, m_max, n), device="cuda", dtype=torch.float64), masked_m_device,
                hint)
            valid = torch.arange(m_max, device="cuda")[None, :] < masked_m_device[:, None]
            check = f"calc_diff={calc_diff(d[valid], expected[valid]):.1e}"
            peer_rows = [ceil_div(rows_g, CUBLAS_ROW_MULTIPLE) * CUBLAS_ROW_MULTIPLE for rows_g in masked_m]
            peer = _peer_loop([a[i, :r] for i, r in enumerate(peer_rows)], [sfa[i, :r] for i, r in enumerate(peer_rows)],
                              b, sfb)
            total = sum(masked_m)
            us, peer, dense = _time_with_peers(call, peer, _dense_call(total, n, k, b, sfb), ctx)
            _, config, grid = _plan(MASKED, hint, n, k, g)
            rows.append(_row("m_grouped_fp8_gemm_nt_masked",
                             {"g": g, "m": m_max, "expected_m": expected_m, "n": n, "k": k, "expected_m_hint": hint},
                             _config_text(config, grid), us, total, n, k, g, ctx, peer, dense, check))
    return rows


def run(ctx: BenchContext) -> list:
    return _contiguous_rows(ctx) + _masked_rows(ctx)
