"""Time candidate configs against the current picks, in turns in one process: the FP8 decode shapes short of their
targets (fp8_gemm_nt, with cuBLAS blockwise) and the BF16 masked grouped rows at 1-4 experts (with the cuBLAS loop).

Usage (on the GPU machine):
    python scripts/ab_decode_candidates.py --check          compile every config, check each against float64
    python scripts/ab_decode_candidates.py --time --out x   time them (kernels compiled by --check)
Every output is poisoned before its check; a config above calc_diff 2e-6 fails the run.
"""

import argparse
import json
import math
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

# FP8 dense: (m, n, k) -> labels (sweep_decode_fp8_gemm.label) timed against the model's pick: the previous pick
# first where the pick changed.
FP8_CANDIDATES = {
    (64, 7168, 16384): ("64x112/2pces8", "64x64/1pes10", "64x112/2pces9"),
    (32, 7168, 16384): ("64x112/2pces8",),
    (128, 4096, 7168): ("128x64/2pcs8",),
    (128, 32768, 512): (),
}
# BF16 masked rows timed (G, expected_m, n, k) -> tiles timed against the pick: the previous pick first where it
# changed, then the runners-up of the first run.
BF16_MASKED_CANDIDATES = {
    (1, 1024, 4096, 7168): ((128, 176), (128, 112)),
    (2, 512, 4096, 7168): ((128, 160),),
    (4, 256, 4096, 7168): ((128, 192), (128, 176)),
    (1, 1024, 7168, 2048): ((128, 128),),
    (2, 512, 7168, 2048): ((128, 192), (128, 176)),
    (4, 256, 7168, 2048): ((128, 224), (128, 192)),
}
BF16_MASKED_ROWS = tuple(BF16_MASKED_CANDIDATES)
MAX_DIFF = 2e-6
# Masked rows: timed on the suite's draw of masked_m and this many more.
OTHER_DRAWS = 4


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


def bf16_configs(g, expected_m, n, k, masked_m, hint, num_sms):
    """The pick, then BF16_MASKED_CANDIDATES' tiles (every stage that fits)."""
    pick = bf16_heuristics.get_grouped_bf16_gemm_config(bf16_gemm.MASKED, hint, n, k, g, num_sms)
    tiles = BF16_MASKED_CANDIDATES[(g, expected_m, n, k)]
    return list(dict.fromkeys([pick] + [bf16_heuristics.make_config(bm, bn) for bm, bn in tiles]))


class CleanL2Flusher(L2Flusher):
    """Evicts L2 by reading one byte of every 32-byte sector of the flush buffer (a strided bitwise_not into a buffer
    1/32 its size): L2 is left holding mostly clean lines, so a timed kernel's loads write back little. Against
    L2Flusher (which leaves L2 full of dirty lines) it shows what the write-back of others' lines costs a kernel."""

    def __init__(self, l2_bytes: int):
        super().__init__(l2_bytes)
        self.sectors = self.buffer.view(torch.int8).view(-1, 32)[:, 0]
        self.out = torch.empty_like(self.sectors)

    def __call__(self) -> None:
        torch.bitwise_not(self.sectors, out=self.out)


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
    bf16_work = {key: bf16_configs(*key, draws[key][0], draws[key][2], num_sms) for key in BF16_MASKED_ROWS}
    if args.check:
        specs = [gemm.kernel_spec(c, n, k, torch.bfloat16, False) for (_, n, k), cs in fp8_work.items() for c in cs]
        specs += [bf16_gemm.kernel_spec(c, n, k, torch.bfloat16, False, bf16_gemm.MASKED)
                  for (_, _, n, k), cs in bf16_work.items() for c in cs]
        precompile(list(dict.fromkeys(specs)), progress=False)
    l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size
    flusher = L2Flusher(l2_bytes) if args.time else None
    clean_flusher = CleanL2Flusher(l2_bytes) if args.time else None
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
            clean = time_kernels_us([calls[0], _cublas(a, b)], clean_flusher, reps=args.reps)
            rows.append({"kind": "fp8_clean_flush", "shape": [m, n, k], "config": label(configs[0]), "us": clean[0],
                         "cublas_us": clean[1]})
            print(f"fp8 {m}x{n}x{k} clean L2 flush: pick {clean[0]:.2f} us, cuBLAS {clean[1]:.2f} us", flush=True)
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
            # The suite's draw and OTHER_DRAWS more of the same row (masked_m only; the same a, b and hint).
            rng = random.Random(1)
            other = [masked_problem(g, expected_m, rng)[0] for _ in range(OTHER_DRAWS)]
            draw_tensors = [masked_dev] + [torch.tensor(x, dtype=torch.int32, device="cuda") for x in other]
            timed = [lambda c=c, d=d, mm=mm: bf16_gemm._launch_masked(a, b, d, mm, hint, c)
                     for mm in draw_tensors for c, d in zip(configs, outs)]
            d_peer = torch.empty((g, m_max, n), device="cuda", dtype=torch.bfloat16)
            peer = lambda: [torch.mm(a[i, :r], b[i].t(), out=d_peer[i, :r]) for i, r in enumerate(masked_m) if r]
            times = time_kernels_us(timed + [peer], flusher, reps=args.reps)
            per_draw = [times[j * len(configs):(j + 1) * len(configs)] for j in range(len(draw_tensors))]
            print(f"{name} draws {[masked_m] + other}")
            for i, config in enumerate(configs):
                us = [draw[i] for draw in per_draw]
                vs_pick = [draw[0] / draw[i] for draw in per_draw]
                geo = math.prod(vs_pick) ** (1 / len(vs_pick))
                rows.append({"kind": "bf16_masked", "shape": [g, expected_m, n, k], "config": label(config),
                             "pick": i == 0, "us": us, "vs_pick": vs_pick, "vs_pick_geomean": geo,
                             "vs_cublas": times[-1] / us[0]})
                print(f"{name} {'pick' if i == 0 else '    '} {label(config):>16} "
                      f"{' '.join(f'{t:7.2f}' for t in us)} us  vs pick {' '.join(f'{r:.3f}' for r in vs_pick)} "
                      f"(geomean {geo:.3f})  vs cuBLAS loop {times[-1] / us[0]:.3f}")
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
