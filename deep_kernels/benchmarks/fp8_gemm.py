"""Suite `fp8_gemm`: the DeepSeek-V3 projection shapes against cuBLAS's blockwise-scaled FP8 GEMM
(torch._scaled_mm with 1x128 activation and 128x128 weight scales), timed in the same run, and against the
config the heuristics picked before 256-row tiles existed (`previous`: the same model over 64- and 128-row
tiles), so that no shape loses to it unseen."""

import torch

import deep_kernels
from deep_kernels.benchmarks.report import BenchContext, same_bytes_copy_us
from deep_kernels import gemm
from deep_kernels.device import get_num_sms
from deep_kernels.gemm import _plan
from deep_kernels.heuristics import fp8_gemm as heuristics
from deep_kernels.reference import gemm as reference
from deep_kernels.reference.quant import per_block_cast_to_fp8
from deep_kernels.testing import calc_diff, random_activations
from deep_kernels.testing.bench import time_kernels_us

MS = (64, 128, 4096)
NKS = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048))
# H200 dense FP8 tensor-core rate (datasheet), the ceiling of roofline_fraction's compute term.
FP8_PEAK_TFLOPS = 1979.0
# Rows up to this M are memory-bound: they also time a copy of the same bytes (the size's own copy floor).
DECODE_MAX_M = 128


PREVIOUS_BLOCK_MS = (64, 128)


def _cublas(a, b, sfa_column_major, sfb):
    return lambda: torch._scaled_mm(a, b.t(), scale_a=sfa_column_major, scale_b=sfb.t(), out_dtype=torch.bfloat16)


def run(ctx: BenchContext) -> list:
    rows = []
    for n, k in NKS:
        w = torch.randn((n, k), device="cuda", dtype=torch.bfloat16)
        b, sfb = per_block_cast_to_fp8(w)
        for m in MS:
            a, sfa = deep_kernels.per_token_cast_to_fp8(random_activations(m, k, torch.bfloat16))
            d = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
            deep_kernels.fp8_gemm_nt((a, sfa), (b, sfb), d)
            expected = reference.fp8_gemm_nt((a, sfa), (b, sfb), torch.empty((m, n), device="cuda", dtype=torch.float64))
            diff = calc_diff(d, expected)
            ours = lambda: deep_kernels.fp8_gemm_nt((a, sfa), (b, sfb), d)
            peer = _cublas(a, b, sfa.contiguous().t().contiguous().t(), sfb)
            try:
                peer_diff = calc_diff(peer(), expected)
            except RuntimeError as error:
                print(f"cuBLAS blockwise failed for {m}x{n}x{k}: {error}")
                peer, peer_diff = None, None
            previous_config = heuristics.ranked_configs(m, n, k, get_num_sms(), allow_split_k=True,
                                                        block_ms=PREVIOUS_BLOCK_MS)[0][1]
            d_previous = torch.empty_like(d)
            previous = gemm.forced_config_call(previous_config, (a, sfa), (b, sfb), d_previous)
            previous()
            previous_diff = calc_diff(d_previous, expected)
            # NOTE: timed in turns, so that the ratios see the same clocks (all run near the power limit).
            if peer:
                us, previous_us, peer_us = time_kernels_us([ours, previous, peer], ctx.flusher)
            else:
                (us, previous_us), peer_us = time_kernels_us([ours, previous], ctx.flusher), None

            _, config, grid, _ = _plan(m, n, k, torch.bfloat16, False)
            flops = 2 * m * n * k
            num_bytes = m * k + n * k + 2 * m * n + 4 * (m * k // 128 + sfb.numel())
            bound_us = max(flops / FP8_PEAK_TFLOPS / 1e6, num_bytes / ctx.copy_gbps / 1e3)
            rows.append({
                "op": "fp8_gemm_nt", "shape": {"m": m, "n": n, "k": k},
                "config": f"block {config.block_m}x{config.block_n}, {config.num_stages} stages, "
                          f"multicast {config.num_tma_multicast}{' on A' if config.multicast_on_a else ' on B' if config.num_tma_multicast > 1 else ''}, "
                          f"split-K {config.num_splits}, grid {grid[0]}",
                "us": round(us, 2), "tflops": round(flops / us / 1e6, 1), "gbps": round(num_bytes / us / 1e3, 1),
                "roofline_fraction": round(bound_us / us, 3),
                "memory_roofline_fraction": round(num_bytes / ctx.copy_gbps / 1e3 / us, 3),
                "same_bytes_copy_us": round(same_bytes_copy_us(num_bytes, ctx), 2) if m <= DECODE_MAX_M else None,
                "peer": "torch._scaled_mm blockwise (cuBLAS)",
                "peer_us": round(peer_us, 2) if peer_us else None,
                "speedup": round(peer_us / us, 3) if peer_us else None,
                "previous_config": heuristics.config_label(previous_config), "previous_us": round(previous_us, 2),
                "speedup_vs_previous": round(previous_us / us, 3),
                "check": f"calc_diff={diff:.1e}, previous {previous_diff:.1e}" +
                         (f", cuBLAS {peer_diff:.1e}" if peer_diff is not None else ""),
            })
    return rows
