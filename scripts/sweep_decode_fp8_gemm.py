"""Time the decode-size (M <= 128) FP8 GEMM configs the model ranks close, in turns with its pick and cuBLAS.

Usage (on the GPU machine):
  python scripts/sweep_decode_fp8_gemm.py --check            compile every config, check each against float64
  python scripts/sweep_decode_fp8_gemm.py --time --out x.json time them (kernels already compiled by --check)
  --final: the model's pick against the previous pick (PREVIOUS_PICKS) only.
  --planned: the model's pick, its twin with evict-first B toggled, and the configs of PLANNED.
Per shape: the model's pick, its next TOP ranked configs, every unicast config whose jobs fill at least
FILL of the SMs in one wave, the pick with fewer stages, and each split config with its splits in a cluster.
Every output is poisoned before the check.
"""

import argparse
import json
from dataclasses import replace

import torch

from deep_kernels import gemm
from deep_kernels.device import get_num_sms
from deep_kernels.heuristics import fp8_gemm as heuristics
from deep_kernels.jit.precompile import precompile
from deep_kernels.reference import gemm as reference
from deep_kernels.testing import calc_diff
from deep_kernels.testing.bench import L2Flusher, time_kernels_us
from deep_kernels.testing.gemm import make_gemm_inputs

SHAPES = ((128, 2112, 7168), (64, 24576, 1536), (128, 24576, 1536), (128, 32768, 512), (64, 7168, 16384),
          (128, 7168, 16384), (64, 4096, 7168), (128, 4096, 7168), (64, 2112, 7168), (64, 32768, 512),
          (64, 7168, 2048), (128, 7168, 2048))
TOP = 8
FILL = 0.85
FEWER_STAGES = (4, 6, 8)
MAX_CLUSTER_SPLITS = 8  # the portable cluster size


def configs_for(m: int, n: int, k: int, num_sms: int, only_pick: bool = False, cluster: bool = True) -> list:
    ranked = [config for _, config in heuristics.ranked_configs(m, n, k, num_sms, allow_split_k=True)
              if config.block_m <= max(m, 64)]
    if only_pick:
        return ranked[:1]
    chosen = ranked[:TOP + 1]
    for config in ranked:
        jobs = heuristics.num_work_units(config, m, n, num_sms)
        if config.num_tma_multicast == 1 and FILL * num_sms <= jobs <= num_sms:
            chosen.append(config)
    pick = ranked[0]
    chosen += [heuristics.make_config(pick.block_m, pick.block_n, 1, False, 2, num_stages=s,
                                      num_splits=pick.num_splits, pipelined=pick.pipelined,
                                      overlap_epilogue=pick.overlap_epilogue)
               for s in FEWER_STAGES if s < pick.num_stages and pick.num_tma_multicast == 1]
    # Each split config also with its splits in a cluster, where every CTA gets one job.
    chosen += [replace(config, splits_in_cluster=True) for config in chosen
               if cluster and 1 < config.num_splits <= MAX_CLUSTER_SPLITS and not config.splits_in_cluster and
               heuristics.has_splits_in_cluster(replace(config, splits_in_cluster=True), m, n, num_sms)]
    return list(dict.fromkeys(chosen))


# The picks of the model before the decode changes (all stages that fit, workspace split-K, the epilogue overlap),
# labels as label() spells them.
PREVIOUS_PICKS = {
    (128, 2112, 7168): "128x64/4ps8", (64, 24576, 1536): "64x96/1ps10", (128, 24576, 1536): "128x192/1os4",
    (128, 32768, 512): "128x128/1pos5", (64, 7168, 16384): "64x112/2ps9", (128, 7168, 16384): "128x112/2ps6",
    (64, 4096, 7168): "64x96/3ps10", (128, 4096, 7168): "128x64/2ps8", (64, 2112, 7168): "64x64/4ps13",
    (64, 32768, 512): "64x128/1ps8", (64, 7168, 2048): "64x64/1ps13", (128, 7168, 2048): "128x64/1pos8",
}
def parse_label(text: str):
    """The config a label() spells."""
    multicast = next((side for side in ("+a", "+b") if side in text), None)
    text = text.replace(multicast, "") if multicast else text
    tile, rest = text.split("/")
    block_m, block_n = (int(v) for v in tile.split("x"))
    flags, stages = rest.split("s")
    digits = "".join(c for c in flags if c.isdigit())
    letters = flags[len(digits):]
    return heuristics.make_config(block_m, block_n, 2 if multicast else 1, multicast == "+a", 2, num_stages=int(stages),
                                  num_splits=int(digits),
                                  pipelined="p" in letters, overlap_epilogue="o" in letters,
                                  splits_in_cluster="c" in letters, evict_first_b="e" in letters)


# Configs timed against the pick by --planned (labels as label() spells them): the close runners-up with evict-first B
# at the two 128-row shapes short of their targets (and 64 x 64 tiles in pairs multicasting B), unsplit 64 x 64 at the long-K 64-row shape, and the widest tiles
# at the short-K 64-row shape.
PLANNED = {
    (128, 4096, 7168): ("128x80/2pces7", "64x128/2pces8", "128x64/2pes8", "128x96/3pes7", "64x64/1pes13",
                        "64x64/1pe+bs13", "64x64/1p+bs13"),
    (128, 32768, 512): ("128x144/1es5", "128x160/1es5", "128x96/1poes7", "128x192/1es4", "128x128/1poes5",
                        "64x128/1pes4"),
    (64, 7168, 16384): ("64x64/1pes8",),
    (64, 24576, 1536): ("64x192/1es6", "128x192/1es4"),
}


def final_configs(m: int, n: int, k: int, num_sms: int) -> list:
    """The model's pick and, where PREVIOUS_PICKS has the shape, the previous pick."""
    pick = heuristics.ranked_configs(m, n, k, num_sms, allow_split_k=True)[0][1]
    previous = PREVIOUS_PICKS.get((m, n, k))
    return list(dict.fromkeys([pick] + ([parse_label(previous)] if previous else [])))


def planned_configs(m: int, n: int, k: int, num_sms: int) -> list:
    """The model's pick, its twin with evict-first B toggled, and PLANNED's configs."""
    pick = heuristics.ranked_configs(m, n, k, num_sms, allow_split_k=True)[0][1]
    configs = [pick]
    if pick.num_tma_multicast == 1:
        configs.append(replace(pick, evict_first_b=not pick.evict_first_b))
    configs += [parse_label(text) for text in PLANNED.get((m, n, k), ())]
    return list(dict.fromkeys(configs))


def label(config) -> str:
    return f"{heuristics.config_label(config)}s{config.num_stages}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--time", action="store_true")
    parser.add_argument("--shapes", type=int, default=len(SHAPES), help="the first this many of SHAPES")
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--only-pick", action="store_true", help="the model's pick alone (with cuBLAS)")
    parser.add_argument("--no-cluster", action="store_true", help="leave out the splits-in-a-cluster variants")
    parser.add_argument("--final", action="store_true", help="final_configs (the pick and the previous pick)")
    parser.add_argument("--planned", action="store_true", help="planned_configs (the pick, its evict-first twin, PLANNED)")
    parser.add_argument("--out", default="sweep_decode.json")
    args = parser.parse_args()
    num_sms = get_num_sms()
    shapes = SHAPES[:args.shapes]
    problems = {shape: (final_configs(*shape, num_sms) if args.final else
                        planned_configs(*shape, num_sms) if args.planned else
                        configs_for(*shape, num_sms, args.only_pick, not args.no_cluster)) for shape in shapes}
    print("configs:", sum(len(c) for c in problems.values()), flush=True)
    if args.check:
        precompile([gemm.kernel_spec(config, n, k, torch.bfloat16, False)
                    for (_, n, k), configs in problems.items() for config in configs], progress=False)
    flusher = L2Flusher(torch.cuda.get_device_properties(0).L2_cache_size) if args.time else None
    rows, wrong = [], []
    for (m, n, k), configs in problems.items():
        a, b = make_gemm_inputs(m, n, k)
        d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        calls = [gemm.forced_config_call(config, a, b, d) for config in configs]
        if args.check:
            expected = reference.fp8_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64))
            for config, call in zip(configs, calls):
                d.fill_(float("nan"))
                call()
                diff = calc_diff(d, expected)
                if not diff <= 2e-6:
                    wrong.append((m, n, k, label(config), diff))
            print(f"{m}x{n}x{k}: {len(configs)} configs checked", flush=True)
        if args.time:
            (qa, sfa), (qb, sfb) = a, b
            sfa_t = sfa.contiguous().t().contiguous().t()
            cublas = lambda: torch._scaled_mm(qa, qb.t(), scale_a=sfa_t, scale_b=sfb.t(), out_dtype=torch.bfloat16)
            times = time_kernels_us(calls + [cublas], flusher, reps=args.reps)
            peer_us = times[-1]
            pick_us = times[0]
            for config, us in zip(configs, times):
                rows.append({"m": m, "n": n, "k": k, "label": label(config), "us": round(us, 2),
                             "vs_cublas": round(peer_us / us, 3), "vs_pick": round(pick_us / us, 3),
                             "model_us": round(heuristics.estimate_seconds(config, m, n, k, num_sms) * 1e6, 2)})
            best = min(rows[-len(configs):], key=lambda r: r["us"])
            print(f"{m}x{n}x{k} cuBLAS {peer_us:.2f} | pick {label(configs[0])} {pick_us:.2f} ({peer_us / pick_us:.3f}) "
                  f"| best {best['label']} {best['us']:.2f} ({best['vs_cublas']:.3f})", flush=True)
            with open(args.out, "w") as f:
                json.dump(rows, f, indent=0)
    for w in wrong:
        print("WRONG", w)
    if wrong:
        raise SystemExit(f"{len(wrong)} configs above calc_diff 2e-6")


if __name__ == "__main__":
    main()
