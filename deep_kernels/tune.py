"""`python -m deep_kernels tune`: time the model's best few FP8 GEMM configs per shape on this GPU and store the
fastest correct one (deep_kernels/tuning.py), which later calls of that shape then use.

The model ranks every candidate; only its `count` best are compiled and timed (in turns, L2 flushed before
each run, so that clock drift under the power limit falls on all alike), which keeps a tune of the 18
DeepSeek-V3 dense shapes to about a minute on an H200. Each candidate's output is checked against float64
of the dequantized operands first (inputs with power-of-two block and row magnitudes, so a wrong scale shows); a candidate above MAX_CALC_DIFF is never stored.
"""

import torch

from deep_kernels import gemm, tuning
from deep_kernels.device import get_num_sms, target_arch
from deep_kernels.heuristics import fp8_gemm as heuristics
from deep_kernels.jit.precompile import precompile
from deep_kernels.reference import gemm as reference
from deep_kernels.testing import calc_diff
from deep_kernels.testing.bench import L2Flusher, time_kernels_us
from deep_kernels.testing.gemm import make_gemm_inputs

# The DeepSeek-V3 projections at decode and prefill sizes (the `fp8_gemm` benchmark's shapes).
DEFAULT_SHAPES = tuple((m, n, k) for n, k in ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384),
                                              (4096, 7168), (7168, 2048)) for m in (64, 128, 4096))
DEFAULT_COUNT = 6
# FP8 x FP8 with bf16 output measures about 1.4e-6 against float64 of the dequantized operands.
MAX_CALC_DIFF = 1e-5


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

    flusher = L2Flusher(torch.cuda.get_device_properties(0).L2_cache_size)
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
            diff = calc_diff(d, expected)
            if not diff <= MAX_CALC_DIFF:
                raise RuntimeError(f"tune: {m}x{n}x{k} with {config} gave calc_diff {diff:.2e} > {MAX_CALC_DIFF}")
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

