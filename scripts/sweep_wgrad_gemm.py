"""Tuning harness for the weight-gradient FP8 GEMMs (recipe (1, 1, 128)): the dense fp8_gemm_nt and the k-grouped GEMM
with several tilings side by side, through the modules' own forced-config calls, accumulating into FP32 (c is d).

    python scripts/sweep_wgrad_gemm.py specs [TILINGS]           # how many kernels
    python scripts/sweep_wgrad_gemm.py precompile [TILINGS]      # build them into the kernel cache
    python scripts/sweep_wgrad_gemm.py check OUT.json [TILINGS]  # every config's calc_diff against float64, determinism
    python scripts/sweep_wgrad_gemm.py time OUT.json [TILINGS [SHAPES]]  # every config and torch's BF16 matmul timed in turns
    python scripts/sweep_wgrad_gemm.py run [TILINGS [SHAPES]]  # every config called three times (for a profiler)

TILINGS: a comma-separated subset of the tiling names below (default: all; "pick": none); the pick always runs. With
a leading "~", each shape runs only those of the pick's tile (other stages or clusters of it).
SHAPES: a comma-separated subset of the shapes, MxNxK (dense) or GxMxNxMEAN (k-grouped) (default: all).

Candidates are not product: the API runs the heuristics' pick; this compares the pick with the alternatives.
"""

import json
import random
import re
import sys

import torch

from deep_kernels import gemm, k_grouped_gemm
from deep_kernels.gemm import CHANNEL_SCALED
from deep_kernels.heuristics import fp8_gemm as heuristics
from deep_kernels.heuristics import k_grouped_fp8_gemm as k_heuristics

RECIPE = (1, 1, 128)
NUM_SMS = 132
# The weight-gradient suite's (out, in, tokens).
DENSE_SHAPES = tuple((m, n, k) for k in (16384, 4096) for m, n in ((2112, 7168), (24576, 1536), (7168, 2048),
                                                                    (4096, 7168)))
# (G, out, in, mean tokens): the k_grouped_gemm suite's FP8 rows.
K_GROUPED_SHAPES = tuple((g, m, n, mean) for m, n in ((4096, 7168), (7168, 2048)) for g in (4, 8, 16)
                         for mean in (2048, 4096, 8192))
# The shapes to run (main() narrows it from the command line): "x".join of a DENSE_SHAPES or K_GROUPED_SHAPES entry.
selected_shapes = None
# name -> (block_m, block_n, multicast, multicast_on_a, overlap_epilogue, ping_pong); "p": pipelined (wider than 128
# columns: the pipelined halves), "t": the math warpgroups take turns (ping-pong), "s": thread-major sfb; "/S": S stages
# (else as many as fit).
TILINGS = {
    "256x128+a": (256, 128, 2, True, False, False), "256x128+b": (256, 128, 2, False, False, False),
    "128x192o": (128, 192, 1, False, True, False), "128x128po": (128, 128, 1, False, True, False),
    "256x96+a": (256, 96, 2, True, False, False),
    "128x192ot": (128, 192, 1, False, True, True), "128x160ot": (128, 160, 1, False, True, True),
    "256x128t+a": (256, 128, 2, True, False, True), "256x128t+b": (256, 128, 2, False, False, True),
    "128x192po": (128, 192, 1, False, True, False), "128x160po": (128, 160, 1, False, True, False),
    "128x160p": (128, 160, 1, False, False, False), "128x192": (128, 192, 1, False, False, False),
    "128x192po+a": (128, 192, 2, True, True, False), "128x160o+b": (128, 160, 2, False, True, False),
    "128x128po+a": (128, 128, 2, True, True, False), "128x192po+b": (128, 192, 2, False, True, False),
    "128x192po/3": (128, 192, 1, False, True, False), "128x160o/3": (128, 160, 1, False, True, False),
    "128x128po/4": (128, 128, 1, False, True, False), "128x192o/3": (128, 192, 1, False, True, False),
    "128x128po+b": (128, 128, 2, False, True, False), "128x192o+b": (128, 192, 2, False, True, False),
    "128x192pos": (128, 192, 1, False, True, False), "128x128pos": (128, 128, 1, False, True, False),
    "128x160os": (128, 160, 1, False, True, False), "128x192os+b": (128, 192, 2, False, True, False),
    "256x128s+a": (256, 128, 2, True, False, False), "256x128s+b": (256, 128, 2, False, False, False),
}
# (The k-grouped kind's pipelined halves: at most 160 columns, and 128 x 160 has no epilogue overlap there.)
K_GROUPED_TILINGS = ("256x128+a", "256x128+b", "128x192o", "128x128po", "128x192ot", "256x128t+b", "128x160p",
                     "128x192", "128x192o/3", "128x192o+b", "128x192os+b", "256x128s+b")
# Tilings the dense shapes skip.
K_GROUPED_ONLY_TILINGS = ("128x192o/3", "128x192o+b", "128x192os+b")
# Whether only the selected tilings of the pick's tile run (main() sets it: TILINGS starting with "~").
same_tile_only = False
# The tilings to run (main() narrows it from the command line).
selected = set(TILINGS)


def _tiling(name: str):
    block_m, block_n, multicast, on_a, overlap, ping_pong = TILINGS[name]
    flags = re.match(r"\d+x\d+([a-z]*)", name)[1]
    pipelined = True if flags.startswith("p") else None
    stages = re.search(r"/(\d+)$", name)
    return heuristics.make_config(block_m, block_n, multicast, on_a, 4, num_stages=int(stages[1]) if stages else None,
                                  overlap_epilogue=overlap, operands=CHANNEL_SCALED, ping_pong=ping_pong,
                                  pipelined=False if ping_pong else pipelined, thread_major_sfb="s" in flags)


def _fits(name: str, m: int, n: int) -> bool:
    """Whether the tiling's cluster pairs the problem's tiles (an even count of N blocks with A multicast, of M blocks
    with B multicast)."""
    block_m, block_n, multicast, on_a, _, _ = TILINGS[name]
    return (multicast, on_a) in heuristics._multicast_options(m, n, block_m, block_n, NUM_SMS)


def _is_stage_variant_of(name: str, pick) -> bool:
    """Whether the tiling runs beside the pick: a tiling with a stage count only as a variant of a pick of the same
    tile (and cluster), and with same_tile_only every tiling only as a variant of a pick of the same tile."""
    config = _tiling(name)
    same_tile = (config.block_m, config.block_n, config.pipelined) == (pick.block_m, pick.block_n, pick.pipelined)
    if same_tile_only:
        return same_tile
    return "/" not in name or (same_tile and config.num_tma_multicast == pick.num_tma_multicast)


def dense_configs(m: int, n: int, k: int) -> dict:
    configs = {"pick": gemm._choose_config(m, n, k, NUM_SMS, 4, True, CHANNEL_SCALED)}
    configs.update((name, _tiling(name)) for name in TILINGS
                   if name in selected and name not in K_GROUPED_ONLY_TILINGS and _fits(name, m, n) and
                   _is_stage_variant_of(name, configs["pick"]))
    return configs


def k_grouped_ks(g: int, mean: int) -> list:
    from deep_kernels.benchmarks.k_grouped_gemm import expert_tokens

    return expert_tokens(g, mean, random.Random(g * mean))


def k_grouped_configs(g: int, m: int, n: int, mean: int) -> dict:
    total = sum(k_grouped_ks(g, mean))
    configs = {"pick": k_heuristics.get_k_grouped_fp8_gemm_config(m, n, total, g, NUM_SMS, True)}
    configs.update((name, _tiling(name)) for name in K_GROUPED_TILINGS
                   if name in selected and _is_stage_variant_of(name, configs["pick"]))
    return configs


def specs() -> list:
    out = []
    for m, n, k in filter(_shape_selected, DENSE_SHAPES):
        out += [gemm.kernel_spec(c, n, k, torch.float32, True, operands=CHANNEL_SCALED)
                for c in dense_configs(m, n, k).values()]
    for g, m, n, mean in filter(_shape_selected, K_GROUPED_SHAPES):
        out += [gemm.kernel_spec(c, n, 0, torch.float32, True, "k_grouped", CHANNEL_SCALED)
                for c in k_grouped_configs(g, m, n, mean).values()]
    return list(dict.fromkeys(out))


def _dense_calls(m: int, n: int, k: int) -> tuple:
    from deep_kernels.benchmarks.wgrad_gemm import wgrad_operands

    a, b, dy, x = wgrad_operands(k, m, n)
    calls = {}
    for name, config in dense_configs(m, n, k).items():
        d = torch.zeros((m, n), device="cuda")
        calls[name] = (gemm.forced_config_call(config, a, b, d, d, RECIPE), d, heuristics.config_label(config))
    peer_out = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
    return calls, (a, b), lambda: torch.mm(dy.T, x, out=peer_out)


def _k_grouped_calls(g: int, m: int, n: int, mean: int) -> tuple:
    import deep_kernels
    from deep_kernels.testing import random_activations

    ks = k_grouped_ks(g, mean)
    total = sum(ks)
    dy, x = random_activations(total, m, seed=0), random_activations(total, n, seed=1)
    a, b = deep_kernels.per_channel_cast_transpose_to_fp8(dy), deep_kernels.per_channel_cast_transpose_to_fp8(x)
    ks_tensor = torch.tensor(ks, dtype=torch.int32, device="cuda")
    calls = {}
    for name, config in k_grouped_configs(g, m, n, mean).items():
        d = torch.zeros((g, m, n), device="cuda")
        calls[name] = (k_grouped_gemm.forced_config_call(config, a, b, d, ks, ks_tensor, d), d,
                       heuristics.config_label(config))
    peer_out = torch.empty((g, m, n), device="cuda", dtype=torch.bfloat16)
    starts = [sum(ks[:i]) for i in range(g)]
    segments = [(dy[s:s + k].T, x[s:s + k], peer_out[i]) for i, (s, k) in enumerate(zip(starts, ks))]
    return calls, (a, b, ks), lambda: [torch.mm(p, q, out=o) for p, q, o in segments]


def _shape_selected(shape: tuple) -> bool:
    return selected_shapes is None or "x".join(map(str, shape)) in selected_shapes


def _problems():
    for m, n, k in filter(_shape_selected, DENSE_SHAPES):
        yield {"m": m, "n": n, "k": k}, lambda m=m, n=n, k=k: _dense_calls(m, n, k), 2 * m * n * k
    for g, m, n, mean in filter(_shape_selected, K_GROUPED_SHAPES):
        yield ({"g": g, "m": m, "n": n, "mean_k": mean}, lambda g=g, m=m, n=n, mean=mean: _k_grouped_calls(g, m, n, mean),
               2 * m * n * g * mean)


def check(path: str) -> None:
    from deep_kernels.reference import gemm as reference
    from deep_kernels.reference import k_grouped_gemm as k_reference
    from deep_kernels.testing import calc_diff

    rows = []
    for shape, make, _ in _problems():
        calls, inputs, _ = make()
        if "g" in shape:
            a, b, ks = inputs
            expected = k_reference.k_grouped_fp8_gemm_nt_contiguous(
                a, b, torch.empty((shape["g"], shape["m"], shape["n"]), device="cuda", dtype=torch.float64), ks)
        else:
            a, b = inputs
            expected = reference.fp8_gemm_nt(a, b, torch.empty((shape["m"], shape["n"]), device="cuda",
                                                                 dtype=torch.float64), recipe=RECIPE)
        for name, (call, d, label) in calls.items():
            d.fill_(float("nan")).zero_()
            call()
            first = d.clone()
            d.zero_()
            call()
            rows.append({"shape": shape, "name": name, "label": label, "calc_diff": calc_diff(first, expected),
                         "deterministic": bool(torch.equal(first, d))})
            print(rows[-1], flush=True)
        del expected
    bad = [r for r in rows if not r["calc_diff"] <= 2e-6 or not r["deterministic"]]
    print("BAD:", bad)
    json.dump(rows, open(path, "w"), indent=1)


def time(path: str) -> None:
    from deep_kernels.benchmarks.report import BenchContext
    from deep_kernels.testing.bench import time_kernels_us

    ctx = BenchContext.create("sweep")
    rows = []
    for shape, make, flops in _problems():
        calls, _, peer = make()
        names = list(calls)
        times = time_kernels_us([calls[name][0] for name in names] + [peer], ctx.flusher, warmup=5, reps=15)
        peer_us = times[-1]
        for name, us in zip(names, times):
            rows.append({"shape": shape, "name": name, "label": calls[name][2], "us": round(us, 2),
                         "tflops": round(flops / us / 1e6, 1), "speedup_vs_bf16": round(peer_us / us, 3)})
            print(rows[-1], flush=True)
        print({"shape": shape, "peer_bf16_us": round(peer_us, 2), "peer_tflops": round(flops / peer_us / 1e6, 1)})
    json.dump(rows, open(path, "w"), indent=1)


def run() -> None:
    for _, make, _ in _problems():
        calls, _, _ = make()
        for name, (call, _, label) in calls.items():
            for _ in range(3):
                call()
            torch.cuda.synchronize()
            print(name, label, flush=True)


if __name__ == "__main__":
    mode = sys.argv[1]
    names = sys.argv[3 if mode in ("check", "time") else 2:]
    if names:
        same_tile_only = names[0].startswith("~")
        selected = set(names[0].lstrip("~").split(",")) - {"pick"}
        unknown = selected - set(TILINGS)
        if unknown:
            raise SystemExit(f"unknown tilings {sorted(unknown)}; known: {sorted(TILINGS)}")
    if len(names) > 1:
        selected_shapes = set(names[1].split(","))
    if mode == "specs":
        print(len(specs()))
    elif mode == "precompile":
        from deep_kernels.jit.precompile import precompile

        precompile(specs(), progress=False)
    elif mode == "check":
        check(sys.argv[2])
    elif mode == "time":
        time(sys.argv[2])
    elif mode == "run":
        run()
    else:
        raise SystemExit(__doc__)
