"""`python -m deep_kernels tune`: time the model's best few FP8 GEMM configs per shape on this GPU and store the
fastest correct one (deep_kernels/tuning.py), which later calls of that shape then use. Suites: `fp8_gemm` (the
dense fp8_gemm_nt, bf16 D) and `grouped_gemm` (the contiguous and masked grouped GEMMs).

The model ranks every candidate; only its `count` best are compiled and timed (in turns, L2 flushed before
each run, so that clock drift under the power limit falls on all alike), which keeps a tune of the 18
DeepSeek-V3 dense shapes to about a minute on an H200. Each candidate's output is checked against float64
of the dequantized operands first (inputs with power-of-two block and row magnitudes, so a wrong scale shows): a
candidate whose calc_diff exceeds MAX_CALC_DIFF over the whole output, any 128 x 128 tile or any row, or that
leaves an element unwritten, is never stored.
"""

import random

import torch

from deep_kernels import gemm, grouped_gemm, tuning
from deep_kernels.device import get_num_sms, target_arch
from deep_kernels.heuristics import fp8_gemm as heuristics
from deep_kernels.heuristics import grouped_fp8_gemm as grouped_heuristics
from deep_kernels.jit.precompile import precompile
from deep_kernels.reference import gemm as reference
from deep_kernels.testing.bench import L2Flusher, time_kernels_us
from deep_kernels.testing.gemm import gemm_errors, make_gemm_inputs
from deep_kernels.testing.grouped import make_contiguous_inputs, make_masked_inputs, masked_problem

# The DeepSeek-V3 projections at decode and prefill sizes (the `fp8_gemm` benchmark's shapes).
DEFAULT_SHAPES = tuple((m, n, k) for n, k in ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384),
                                              (4096, 7168), (7168, 2048)) for m in (64, 128, 4096))
# (kind, G, rows per group (contiguous) or expected rows per group (masked), N, K): the `grouped_gemm`
# benchmark's shapes.
DEFAULT_GROUPED_SHAPES = (
    tuple(("contiguous", g, m, n, k) for g, m, n, k in ((4, 8192, 4096, 7168), (4, 8192, 7168, 2048),
                                                       (8, 4096, 4096, 7168), (8, 4096, 7168, 2048)))
    + tuple(("masked", g, e, n, k) for n, k in ((4096, 7168), (7168, 2048))
            for g, e in ((1, 1024), (2, 512), (4, 256), (16, 64), (32, 32))))
DEFAULT_COUNT = 6
# FP8 x FP8 with bf16 output measures about 1.4e-6 against float64 of the dequantized operands.
MAX_CALC_DIFF = 1e-5


def output_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """The worst calc_diff of a candidate's output [rows, N] against float64 over the whole output, its 128 x 128
    tiles and its rows (a wrong block hides in the whole output's sum), or NaN where it left an element unwritten
    (the output is NaN-filled before the call)."""
    if not torch.isfinite(actual).all():
        return float("nan")
    errors = gemm_errors(actual, expected)
    return max(errors["whole"], errors["tile"][0], errors["row"][0])


def tune_fp8_gemm(shapes, count: int = DEFAULT_COUNT, log=print) -> list:
    """Tunes each (m, n, k) with bf16 D; returns one row per shape: (shape, winner fields, us, model pick us)."""
    num_sms = get_num_sms()
    path = tuning.tuning_file(torch.cuda.get_device_name())
    identity = tuning.source_identity(heuristics.KERNEL_HEADER, target_arch())
    candidates = {}
    for m, n, k in shapes:
        gemm.check_k_n(k, n)
        ranked = heuristics.ranked_configs(m, n, k, num_sms, allow_split_k=True)
        candidates[(m, n, k)] = ranked[:count]
    precompile([gemm.kernel_spec(config, n, k, torch.bfloat16, False)
                for (m, n, k), ranked in candidates.items() for _, config in ranked])

    flusher = L2Flusher(torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size)
    rows = []
    for (m, n, k), ranked in candidates.items():
        a, b = make_gemm_inputs(m, n, k)
        d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        expected = reference.fp8_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64))
        calls, model_us = [], []
        for seconds, config in ranked:
            call = gemm.forced_config_call(config, a, b, d)
            d.fill_(float("nan"))
            call()
            diff = output_error(d, expected)
            if not diff <= MAX_CALC_DIFF:
                raise RuntimeError(f"tune: {m}x{n}x{k} with {config} gave calc_diff {diff:.2e} > {MAX_CALC_DIFF} "
                                   "(the worst of the whole output, its tiles and rows)")
            calls.append(call)
            model_us.append(seconds * 1e6)
        del expected
        times = time_kernels_us(calls, flusher, warmup=3, reps=15)
        best = min(range(len(times)), key=times.__getitem__)
        fields = heuristics.config_fields(ranked[best][1])
        tuning.record(path, gemm.TUNING_OP, identity, tuning.problem_key(m, n, k, 2, False, num_sms), fields, times[best],
                      model_us[best])
        rows.append(((m, n, k), fields, times[best], times[0]))
        log(f"{m:6d}x{n:6d}x{k:6d}  {heuristics.config_label(ranked[best][1])}  {times[best]:9.2f} us  (model's pick {times[0]:9.2f} us, "
            f"{times[0] / times[best]:.3f}x)")
    log(f"stored in {path}")
    return rows



def _grouped_problem(kind: str, g: int, m: int, n: int, k: int):
    """(gemm_type, the m the heuristics key on, inputs, d, group layout, expected_m hint, float64 reference with its
    valid-row mask). Masked rows follow the benchmark: masked_problem's sizes and hint."""
    if kind == "contiguous":
        a, b, m_indices, _ = make_contiguous_inputs([m] * g, n, k)
        d = torch.empty((g * m, n), device="cuda", dtype=torch.bfloat16)
        expected = reference.m_grouped_fp8_gemm_nt_contiguous(
            a, b, torch.empty((g * m, n), device="cuda", dtype=torch.float64), m_indices)
        return grouped_gemm.CONTIGUOUS, g * m, a, b, d, m_indices, None, expected, None
    masked_m, m_max, hint = masked_problem(g, m, random.Random(0))
    a, b, masked_m = make_masked_inputs(masked_m, m_max, n, k)
    d = torch.empty((g, m_max, n), device="cuda", dtype=torch.bfloat16)
    expected = reference.m_grouped_fp8_gemm_nt_masked(
        a, b, torch.zeros((g, m_max, n), device="cuda", dtype=torch.float64), masked_m, hint)
    valid = torch.arange(m_max, device="cuda")[None, :] < masked_m[:, None]
    return grouped_gemm.MASKED, hint, a, b, d, masked_m, hint, expected, valid


def tune_grouped_gemm(shapes, count: int = DEFAULT_COUNT, log=print) -> list:
    """Tunes each (kind, G, m, n, k) of DEFAULT_GROUPED_SHAPES' form; returns one row per shape: (shape, winner
    fields, us, model pick us)."""
    num_sms = get_num_sms()
    path = tuning.tuning_file(torch.cuda.get_device_name())
    identity = tuning.source_identity(heuristics.KERNEL_HEADER, target_arch())
    problems = [_grouped_problem(*shape) for shape in shapes]
    candidates = [grouped_heuristics.ranked_grouped_configs(gemm_type, key_m, shape[3], shape[4], shape[1], num_sms)[:count]
                  for shape, (gemm_type, key_m, *_) in zip(shapes, problems)]
    precompile([gemm.kernel_spec(config, shape[3], shape[4], torch.bfloat16, False, problem[0])
                for shape, problem, ranked in zip(shapes, problems, candidates) for _, config in ranked])

    flusher = L2Flusher(torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size)
    rows = []
    for shape, problem, ranked in zip(shapes, problems, candidates):
        kind, g, m, n, k = shape
        gemm_type, key_m, a, b, d, layout, hint, expected, valid = problem
        calls, model_us = [], []
        for seconds, config in ranked:
            call = grouped_gemm.forced_config_call(gemm_type, config, a, b, d, layout, hint)
            d.fill_(float("nan"))
            call()
            diff = output_error(d, expected) if valid is None else output_error(d[valid], expected[valid])
            if not diff <= MAX_CALC_DIFF:
                raise RuntimeError(f"tune: {kind} {g}x{m}x{n}x{k} with {config} gave calc_diff {diff:.2e} > "
                                   f"{MAX_CALC_DIFF} (the worst of the whole output, its tiles and rows)")
            calls.append(call)
            model_us.append(seconds * 1e6)
        times = time_kernels_us(calls, flusher, warmup=3, reps=15)
        best = min(range(len(times)), key=times.__getitem__)
        fields = heuristics.config_fields(ranked[best][1])
        tuning.record(path, grouped_gemm.TUNING_OPS[gemm_type], identity,
                      tuning.grouped_problem_key(g, key_m, n, k, num_sms), fields, times[best], model_us[best])
        rows.append((shape, fields, times[best], times[0]))
        log(f"{kind:10s} {g:3d}x{m:5d}x{n:5d}x{k:5d}  {heuristics.config_label(ranked[best][1])}  {times[best]:9.2f} us  "
            f"(model's pick {times[0]:9.2f} us, {times[0] / times[best]:.3f}x)")
    log(f"stored in {path}")
    return rows
