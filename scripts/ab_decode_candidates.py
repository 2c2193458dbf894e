"""Time candidate configs against the current picks, in turns in one process: the FP8 decode shapes short of their
targets (fp8_gemm_nt, with cuBLAS blockwise) and the BF16 masked grouped rows at 1-4 experts (with the cuBLAS loop).

Usage (on the GPU machine):
    python scripts/ab_decode_candidates.py --check          compile every config, check each against float64
    python scripts/ab_decode_candidates.py --time --out x   time them (kernels compiled by --check)
Every output is poisoned before its check; a config above calc_diff 2e-6 fails the run.
"""

import argparse
import json
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from sweep_decode_fp8_gemm import label, parse_label  # noqa: E402

from deep_kernels import bf16_gemm, gemm  # noqa: E402
from deep_kernels.benchmarks.grouped_gemm import MASKED_GROUPS, MASKED_NKS  # noqa: E402
from deep_kernels.device import get_num_sms  # noqa: E402
from deep_kernels.heuristics import bf16_gemm as bf16_heuristics  # noqa: E402
from deep_kernels.heuristics import fp8_gemm as heuristics  # noqa: E402
from deep_kernels.jit.precompile import precompile  # noqa: E402
from deep_kernels.reference import bf16_gemm as bf16_reference  # noqa: E402
from deep_kernels.reference import gemm as reference  # noqa: E402
from deep_kernels.testing import calc_diff, random_activations  # noqa: E402
from deep_kernels.testing.bench import L2Flusher, time_kernels_us  # noqa: E402
from deep_kernels.testing.grouped import masked_problem  # noqa: E402

# FP8 dense: (m, n, k) -> labels (sweep_decode_fp8_gemm.label) timed against the model's pick.
FP8_CANDIDATES = {
    (64, 7168, 16384): ("64x64/1pes8",),
    (128, 4096, 7168): ("128x128/4pces5", "64x64/1pes13"),
    (128, 32768, 512): ("128x128/1pes5",),
}
# BF16 masked: (G, expected_m, n, k) -> (block_m, block_n) tiles (all stages that fit) timed against the pick.
BF16_MASKED_CANDIDATES = {
    (1, 1024, 4096, 7168): ((128, 160), (64, 224)),
    (2, 512, 4096, 7168): ((128, 144), (64, 192)),
    (4, 256, 4096, 7168): ((128, 160), (64, 192)),
    (1, 1024, 7168, 2048): ((64, 144), (64, 240)),
    (2, 512, 7168, 2048): ((64, 176), (128, 256)),
    (4, 256, 7168, 2048): ((64, 224), (128, 112)),
}
MAX_DIFF = 2e-6


def fp8_configs(m, n, k, num_sms):
    pick = heuristics.get_fp8_gemm_config(m, n, k, num_sms, allow_split_k=True)
    return list(dict.fromkeys([pick] + [parse_label(text) for text in FP8_CANDIDATES[(m, n, k)]]))


def masked_draws():
    """(G, expected_m, n, k) -> (masked_m, m_max, hint): the bf16_gemm suite's draws (its row order and seed)."""
    rng, draws = random.Random(0), {}
    for n, k in MASKED_NKS:
        for g, expected_m in MASKED_GROUPS:
            draws[(g, expected_m, n, k)] = masked_problem(g, expected_m, rng)
    return draws


def bf16_configs(g, expected_m, n, k, hint, num_sms):
    pick = bf16_heuristics.get_grouped_bf16_gemm_config(bf16_gemm.MASKED, hint, n, k, g, num_sms)
    tiles = BF16_MASKED_CANDIDATES[(g, expected_m, n, k)]
    return list(dict.fromkeys([pick] + [bf16_heuristics.make_config(bm, bn) for bm, bn in tiles]))


def _cublas(a, b):
    (a, sfa), (b, sfb) = a, b
    sfa_t = sfa.contiguous().t().contiguous().t()
    return lambda: torch._scaled_mm(a, b.t(), scale_a=sfa_t, scale_b=sfb.t(), out_dtype=torch.bfloat16)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--time", action="store_true")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    from deep_kernels.testing.gemm import make_gemm_inputs

    num_sms = get_num_sms()
    draws = masked_draws()
    fp8_work = {shape: fp8_configs(*shape, num_sms) for shape in FP8_CANDIDATES}
    bf16_work = {key: bf16_configs(*key, draws[key][2], num_sms) for key in BF16_MASKED_CANDIDATES}
    if args.check:
        specs = [gemm.kernel_spec(c, n, k, torch.bfloat16, False) for (_, n, k), cs in fp8_work.items() for c in cs]
        specs += [bf16_gemm.kernel_spec(c, n, k, torch.bfloat16, False, bf16_gemm.MASKED)
                  for (_, _, n, k), cs in bf16_work.items() for c in cs]
        precompile(list(dict.fromkeys(specs)), progress=False)
    flusher = L2Flusher(torch.cuda.get_device_properties(0).L2_cache_size) if args.time else None
    rows, wrong = [], []
    torch.manual_seed(0)
    for (m, n, k), configs in fp8_work.items():
        a, b = make_gemm_inputs(m, n, k)
        outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in configs]
        calls = [gemm.forced_config_call(c, a, b, d) for c, d in zip(configs, outs)]
        if args.check:
            expected = reference.fp8_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64))
            for config, call, d in zip(configs, calls, outs):
                d.fill_(float("nan"))
                call()
                diff = calc_diff(d, expected)
                print(f"fp8 {m}x{n}x{k} {label(config)} calc_diff {diff:.1e}")
                if not diff <= MAX_DIFF:
                    wrong.append((m, n, k, label(config), diff))
            del expected
        if args.time:
            times = time_kernels_us(calls + [_cublas(a, b)], flusher, reps=args.reps)
            for i, (config, us) in enumerate(zip(configs, times)):
                rows.append({"kind": "fp8", "shape": [m, n, k], "config": label(config), "pick": i == 0, "us": us,
                             "vs_pick": times[0] / us, "vs_cublas": times[-1] / us})
                print(f"fp8 {m}x{n}x{k} {'pick' if i == 0 else '    '} {label(config):>16} {us:8.2f} us "
                      f"vs pick {times[0] / us:.3f} vs cuBLAS {times[-1] / us:.3f}")
            print(f"fp8 {m}x{n}x{k} cuBLAS {times[-1]:.2f} us", flush=True)
    for (g, expected_m, n, k), configs in bf16_work.items():
        masked_m, m_max, hint = draws[(g, expected_m, n, k)]
        a = random_activations(g * m_max, k).view(g, m_max, k)
        b = torch.randn((g, n, k), device="cuda", dtype=torch.bfloat16)
        masked_dev = torch.tensor(masked_m, dtype=torch.int32, device="cuda")
        outs = [torch.empty((g, m_max, n), device="cuda", dtype=torch.bfloat16) for _ in configs]
        calls = [lambda c=c, d=d: bf16_gemm._launch_masked(a, b, d, masked_dev, hint, c) for c, d in zip(configs, outs)]
        name = f"bf16 masked {g}x{expected_m}x{n}x{k}"
        if args.check:
            expected = bf16_reference.m_grouped_bf16_gemm_nt_masked(
                a, b, torch.zeros((g, m_max, n), device="cuda", dtype=torch.float64), masked_dev, hint)
            valid = torch.arange(m_max, device="cuda")[None, :] < masked_dev[:, None]
            for config, call, d in zip(configs, calls, outs):
                d.fill_(float("nan"))
                call()
                diff = calc_diff(d[valid], expected[valid])
                untouched = bool(torch.isnan(d[~valid]).all())
                print(f"{name} {label(config)} calc_diff {diff:.1e} rows past masked_m untouched {untouched}")
                if not diff <= MAX_DIFF or not untouched:
                    wrong.append((name, label(config), diff, untouched))
            del expected
        if args.time:
            d_peer = torch.empty((g, m_max, n), device="cuda", dtype=torch.bfloat16)
            peer = lambda: [torch.mm(a[i, :r], b[i].t(), out=d_peer[i, :r]) for i, r in enumerate(masked_m) if r]
            times = time_kernels_us(calls + [peer], flusher, reps=args.reps)
            for i, (config, us) in enumerate(zip(configs, times)):
                rows.append({"kind": "bf16_masked", "shape": [g, expected_m, n, k], "config": label(config),
                             "pick": i == 0, "us": us, "vs_pick": times[0] / us, "vs_cublas": times[-1] / us})
                print(f"{name} {'pick' if i == 0 else '    '} {label(config):>16} {us:8.2f} us "
                      f"vs pick {times[0] / us:.3f} vs cuBLAS loop {times[-1] / us:.3f}")
            print(f"{name} cuBLAS loop {times[-1]:.2f} us", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    for row in wrong:
        print("WRONG:", row)
    if wrong:
        raise SystemExit(f"{len(wrong)} configs wrong")


if __name__ == "__main__":
    main()
