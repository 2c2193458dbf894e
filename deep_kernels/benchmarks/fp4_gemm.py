"""Suite `fp4_gemm`: the FP8 x MXFP4 GEMM on the DeepSeek-V3 projection shapes at decode sizes (M = 1, 16, 64,
128; the swapped kernel, weights as wgmma's register operand) and at M = 4096, on weights prepared once
(prepare_fp4_weights: `us`), timed in turns in the same run with
  - the same GEMM on the unprepared weights: `speedup_vs_unprepared`,
  - our FP8 GEMM on the same shape (e4m3 weights with 128 x 128 scales): `speedup_vs_fp8`, and
  - the user-side alternative with MXFP4 weights: our MXFP4 -> FP8 requantization (mxfp4_requant_to_fp8, 1 x 128
    weight scales) followed by cuBLAS's blockwise FP8 GEMM (torch._scaled_mm): `speedup` (the peer).
The weights are per_token_cast_to_mxfp4 of a random Gaussian matrix (deep_kernels.testing.gemm.gemm_weights), whose
128 x 128 blocks fold into e4m3 (the prefill path then runs the block-scaled FP8 GEMM). Bytes count B at 4.25 bits
a weight (the code and its share of the UE8M0 scale per 32).
NVFP4 rows (op `fp8_fp4_gemm_nt[nvfp4]`, decode sizes M = 1, 16, 64, 128): the same call with NVFP4 weights
(E4M3 scales per 16 and a global scale; B at 4.5 bits a weight), timed in turns with our FP8 GEMM on the same
shape (`speedup_vs_fp8`) and with the MXFP4 form of the call on the same shape (`speedup_vs_mxfp4`).
Masked grouped rows (op `m_grouped_fp8_fp4_gemm_nt_masked`, the decode MoE GEMM: G in 16, 64, 256 experts at
expected_m 16, 32, 64 valid rows each, N x K in 4096 x 7168 and 7168 x 2048; masked_m, M_max and the expected_m hint
as the grouped_gemm suite draws them, testing.grouped.masked_problem; each expert's weights per_token_cast_to_mxfp4
of its own random Gaussian matrix, as the dense rows', so tile-scaled): the call on grouped prepared weights,
timed in turns with our FP8 masked GEMM (m_grouped_fp8_gemm_nt_masked) on the same activations and the same
weights' values in e4m3 with 128 x 128 scales (`speedup_vs_fp8`). Bytes count the weights of the experts with valid
rows (4.25 bits a weight), their valid activation rows and outputs; calc_diff on the first two experts' rows."""

import random

import torch

import deep_kernels
from deep_kernels import fp4_gemm
from deep_kernels.benchmarks.report import BenchContext
from deep_kernels.device import get_num_sms
from deep_kernels.heuristics.fp8_fp4_gemm import code_stages
from deep_kernels.heuristics.fp8_fp4_swap_ab import SwapAbConfig, for_tile_scaled
from deep_kernels.heuristics.fp8_gemm import config_label
from deep_kernels.reference import fp4_gemm as reference
from deep_kernels.testing import calc_diff
from deep_kernels.testing.bench import time_kernels_us
from deep_kernels.testing.fp4_gemm import make_fp4_gemm_inputs, make_nvfp4_gemm_inputs, mxfp4_weights
from deep_kernels.testing.gemm import gemm_weights
from deep_kernels.testing.grouped import make_masked_inputs, masked_problem

MS = (1, 16, 64, 128, 4096)
NKS = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048))
FP8_PEAK_TFLOPS = 1979.0
PEER = "mxfp4_requant_to_fp8 + torch._scaled_mm blockwise (cuBLAS)"
CHECK_ROWS = 256


def _requant_then_cublas(a, sfa, codes, scales, expected):
    """The user-side path: requantize the weights to e4m3 with 1 x 128 scales, then cuBLAS's blockwise GEMM with
    1 x 128 scales on both operands; (function, calc_diff). torch's layout rule for the weight scales of that
    recipe differs between versions, so the forms are tried in turn (the first whose product checks is kept)."""
    sfa_t = sfa.contiguous().t().contiguous().t()
    rows_checked = expected.shape[0]
    layouts = (lambda s: s, lambda s: s.t(), lambda s: s.contiguous(), lambda s: s.contiguous().t(),
               lambda s: s.t().contiguous())
    errors = []
    for layout in layouts:
        def run(layout=layout):
            q, sfq = deep_kernels.mxfp4_requant_to_fp8(codes, scales)
            return torch._scaled_mm(a, q.t(), scale_a=sfa_t, scale_b=layout(sfq), out_dtype=torch.bfloat16)
        try:
            diff = calc_diff(run()[:rows_checked], expected)
        except RuntimeError as error:
            errors.append(str(error).splitlines()[0])
            continue
        if diff < 1e-3:
            return run, diff
        errors.append(f"calc_diff {diff:.2g}")
    print(f"{PEER}: no weight-scale layout works: {errors}")
    return None, None


def rows(ctx: BenchContext, shapes) -> list:
    out = []
    for m, n, k in shapes:
        a, sfa = make_fp4_gemm_inputs(m, 16, k)[0]
        codes, scales = deep_kernels.per_token_cast_to_mxfp4(gemm_weights(n, k))
        prepared = deep_kernels.prepare_fp4_weights(codes, scales)
        d = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
        deep_kernels.fp8_fp4_gemm_nt((a, sfa), prepared, d)
        # NOTE: the check covers the first CHECK_ROWS rows (the float64 product of every row of the prefill shapes
        # would take most of the suite's time).
        rows_checked = min(m, CHECK_ROWS)
        expected = reference.fp8_fp4_gemm_nt((a[:rows_checked], sfa[:rows_checked]), (codes, scales),
                                             torch.empty((rows_checked, n), device="cuda", dtype=torch.float64))
        diff = calc_diff(d[:rows_checked], expected)
        d_unprepared = torch.empty_like(d)
        deep_kernels.fp8_fp4_gemm_nt((a, sfa), (codes, scales), d_unprepared)
        unprepared_diff = calc_diff(d_unprepared[:rows_checked], expected)
        ours = lambda: deep_kernels.fp8_fp4_gemm_nt((a, sfa), prepared, d)
        unprepared = lambda: deep_kernels.fp8_fp4_gemm_nt((a, sfa), (codes, scales), d_unprepared)
        b8, sfb8 = deep_kernels.per_block_cast_to_fp8(deep_kernels.mxfp4_cast_back(codes, scales))
        d8 = torch.empty_like(d)
        fp8 = lambda: deep_kernels.fp8_gemm_nt((a, sfa), (b8, sfb8), d8)
        peer, peer_diff = _requant_then_cublas(a, sfa, codes, scales, expected)
        fns = [ours, unprepared, fp8] + ([peer] if peer else [])
        times = time_kernels_us(fns, ctx.flusher)
        us, unprepared_us, fp8_us = times[:3]
        peer_us = times[3] if peer else None

        plan = fp4_gemm._dense_plan(m, n, k, torch.bfloat16, False, get_num_sms(), prepared=True)
        if plan is None:
            config_text = ("B expanded first from the prepared weights (" +
                           ("128 x 128 block scales), then fp8_gemm_nt" if prepared.folds_into_blocks else
                            "per-row scales), then fp8_gemm_nt recipe (1, 1, 128)"))
        elif isinstance(plan, SwapAbConfig):
            if prepared.tile_scaled:
                plan = for_tile_scaled(plan)
            config_text = (f"prepared weights, A and B swapped: {plan.block_w} weight rows x {plan.block_t} tokens, {plan.num_stages} "
                           f"stages, split-K {plan.num_splits}, {plan.ctas_per_sm} CTA(s) an SM" +
                           (", pipelined promotion" if plan.pipelined else "") +
                           (", splits in a cluster" if plan.splits_in_cluster else "") +
                           (", tile-scaled" if prepared.tile_scaled else ", row-scaled"))
        else:
            config_text = (f"{config_label(plan[1])}, {plan[1].num_stages} math stages, "
                           f"{code_stages(plan[1].block_m, plan[1].block_n, plan[1].num_stages, 2)} code stages")
        flops = 2 * m * n * k
        num_bytes = m * k + n * k * 4.25 / 8 + 2 * m * n + 4 * m * k // 128
        memory_us = num_bytes / ctx.copy_gbps / 1e3
        bound_us = max(flops / FP8_PEAK_TFLOPS / 1e6, memory_us)
        out.append({
            "op": "fp8_fp4_gemm_nt", "shape": {"m": m, "n": n, "k": k},
            "config": config_text,
            "us": round(us, 2), "tflops": round(flops / us / 1e6, 1), "gbps": round(num_bytes / us / 1e3, 1),
            "roofline_fraction": round(bound_us / us, 3), "memory_roofline_fraction": round(memory_us / us, 3),
            "peer": PEER, "peer_us": round(peer_us, 2) if peer_us else None,
            "speedup": round(peer_us / us, 3) if peer_us else None,
            "unprepared_us": round(unprepared_us, 2), "speedup_vs_unprepared": round(unprepared_us / us, 3),
            "fp8_us": round(fp8_us, 2), "speedup_vs_fp8": round(fp8_us / us, 3),
            "check": f"calc_diff={diff:.1e}, unprepared {unprepared_diff:.1e}" +
                     (f", peer {peer_diff:.1e}" if peer_diff is not None else ""),
        })
    return out


NVFP4_MS = (1, 16, 64, 128)


def nvfp4_rows(ctx: BenchContext, shapes) -> list:
    from deep_kernels import nvfp4_gemm

    out = []
    for m, n, k in shapes:
        a, weights = make_nvfp4_gemm_inputs(m, n, k)
        d = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
        deep_kernels.fp8_fp4_gemm_nt(a, weights, d)
        expected = reference.fp8_fp4_gemm_nt(a, weights, torch.empty((m, n), device="cuda", dtype=torch.float64))
        diff = calc_diff(d, expected)
        ours = lambda: deep_kernels.fp8_fp4_gemm_nt(a, weights, d)
        b8, sfb8 = deep_kernels.per_block_cast_to_fp8(reference.dequantize_nvfp4(*weights).float())
        d8 = torch.empty_like(d)
        fp8 = lambda: deep_kernels.fp8_gemm_nt(a, (b8, sfb8), d8)
        mx_weights = mxfp4_weights(n, k)
        d4 = torch.empty_like(d)
        mxfp4 = lambda: deep_kernels.fp8_fp4_gemm_nt(a, mx_weights, d4)
        us, fp8_us, mxfp4_us = time_kernels_us([ours, fp8, mxfp4], ctx.flusher)
        config = nvfp4_gemm._config(m, n, k, torch.bfloat16)
        flops = 2 * m * n * k
        num_bytes = m * k + n * k * 4.5 / 8 + 2 * m * n + 4 * m * k // 128
        memory_us = num_bytes / ctx.copy_gbps / 1e3
        out.append({
            "op": "fp8_fp4_gemm_nt[nvfp4]", "shape": {"m": m, "n": n, "k": k},
            "config": (f"A and B swapped, f16 wgmma: {config.block_w} weight rows x {config.block_t} tokens, "
                       f"{config.num_stages} stages, split-K {config.num_splits}, {config.num_chains} chain(s)"),
            "us": round(us, 2), "tflops": round(flops / us / 1e6, 1), "gbps": round(num_bytes / us / 1e3, 1),
            "memory_roofline_fraction": round(memory_us / us, 3),
            "fp8_us": round(fp8_us, 2), "speedup_vs_fp8": round(fp8_us / us, 3),
            "mxfp4_us": round(mxfp4_us, 2), "speedup_vs_mxfp4": round(mxfp4_us / us, 3),
            "check": f"calc_diff={diff:.1e}",
        })
    return out


MASKED_NKS = ((4096, 7168), (7168, 2048))
MASKED_GROUPS = (16, 64, 256)
MASKED_EXPECTED_MS = (16, 32, 64)
MASKED_CHECK_GROUPS = 2


def _fp8_weights_of(codes, scales) -> tuple:
    """Our FP8 GEMM's weights with the MXFP4 weights' values: e4m3 [G, N, K] and FP32 128 x 128 scales, one expert
    at a time."""
    casts = [deep_kernels.per_block_cast_to_fp8(deep_kernels.mxfp4_cast_back(codes[g], scales[g]))
             for g in range(codes.shape[0])]
    return torch.stack([q for q, _ in casts]), torch.stack([sf for _, sf in casts])


def _expert_weights(n: int, k: int, num_groups: int) -> tuple:
    """(codes [G, N, K / 2], scales [G, N, K / 32]): per_token_cast_to_mxfp4 of each expert's gemm_weights."""
    casts = [deep_kernels.per_token_cast_to_mxfp4(gemm_weights(n, k, seed=1 + g)) for g in range(num_groups)]
    return torch.stack([codes for codes, _ in casts]), torch.stack([scales for _, scales in casts])


def masked_problems(nks=MASKED_NKS, groups=MASKED_GROUPS, expected_ms=MASKED_EXPECTED_MS) -> list:
    """(G, expected_m, N, K, masked_m, M_max, hint) of the masked rows, drawn as the grouped_gemm suite draws them."""
    rng = random.Random(0)
    return [(g, expected_m, n, k, *masked_problem(g, expected_m, rng))
            for n, k in nks for g in groups for expected_m in expected_ms]


def masked_rows(ctx: BenchContext, problems) -> list:
    from deep_kernels.heuristics import fp8_fp4_swap_ab as swap_ab

    out = []
    weights = {}
    for g, expected_m, n, k, masked_m, m_max, hint in problems:
        if (g, n, k) not in weights:
            weights.clear()
            torch.cuda.empty_cache()
            codes, scales = _expert_weights(n, k, g)
            weights[(g, n, k)] = (codes, scales, deep_kernels.prepare_fp4_weights(codes, scales),
                                  _fp8_weights_of(codes, scales))
        codes, scales, prepared, (b8, sfb8) = weights[(g, n, k)]
        a, _, masked = make_masked_inputs(masked_m, m_max, 16, k)
        d = torch.empty((g, m_max, n), device="cuda", dtype=torch.bfloat16)
        d8 = torch.empty_like(d)
        ours = lambda: deep_kernels.m_grouped_fp8_fp4_gemm_nt_masked(a, prepared, d, masked, hint)
        fp8 = lambda: deep_kernels.m_grouped_fp8_gemm_nt_masked(a, (b8, sfb8), d8, masked, hint)
        ours()
        fp8()
        checked = MASKED_CHECK_GROUPS
        expected = reference.m_grouped_fp8_fp4_gemm_nt_masked(
            (a[0][:checked], a[1][:checked]), (codes[:checked], scales[:checked]),
            torch.zeros((checked, m_max, n), device="cuda", dtype=torch.float64), masked[:checked], hint)
        valid = torch.arange(m_max, device="cuda")[None, :] < masked[:checked, None]
        diff = calc_diff(d[:checked][valid], expected[valid])
        fp8_diff = calc_diff(d8[:checked][valid], expected[valid])
        del expected
        us, fp8_us = time_kernels_us([ours, fp8], ctx.flusher)
        config = swap_ab.get_masked_config(hint, n, k, g, get_num_sms())
        if prepared.tile_scaled:
            config = swap_ab.for_tile_scaled(config)
        total = sum(masked_m)
        experts = sum(1 for rows_g in masked_m if rows_g)
        flops = 2 * total * n * k
        num_bytes = experts * n * k * 4.25 / 8 + total * (k + 4 * k // 128 + 2 * n)
        memory_us = num_bytes / ctx.copy_gbps / 1e3
        out.append({
            "op": "m_grouped_fp8_fp4_gemm_nt_masked",
            "shape": {"g": g, "m": m_max, "expected_m": expected_m, "n": n, "k": k, "expected_m_hint": hint},
            "config": (f"prepared weights, A and B swapped, persistent over (expert, token block, weight tile): "
                       f"{config.block_w} weight rows x {config.block_t} tokens, {config.num_stages} stages, "
                       f"{config.ctas_per_sm} CTA(s) an SM, {config.num_chains} chain(s)" +
                       (", tile-scaled" if prepared.tile_scaled else ", row-scaled")),
            "us": round(us, 2), "tflops": round(flops / us / 1e6, 1), "gbps": round(num_bytes / us / 1e3, 1),
            "memory_roofline_fraction": round(memory_us / us, 3),
            "fp8_us": round(fp8_us, 2), "speedup_vs_fp8": round(fp8_us / us, 3),
            "check": f"calc_diff={diff:.1e} (fp8 {fp8_diff:.1e}), first {checked} experts",
        })
    return out


def run(ctx: BenchContext) -> list:
    return (rows(ctx, [(m, n, k) for n, k in NKS for m in MS]) +
            nvfp4_rows(ctx, [(m, n, k) for n, k in NKS for m in NVFP4_MS]) +
            masked_rows(ctx, masked_problems()))
