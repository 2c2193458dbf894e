"""Time a grid of FP8 GEMM configs per shape on the GPU, to check and refit the heuristics' model.

Usage (on the GPU machine): python scripts/sweep_fp8_gemm.py --m 64 128 --out sweep.json
Every config's output is checked against float64 of the dequantized operands (calc_diff, poisoned output);
a config above --max-diff fails the run. Prints, per shape, the heuristics' pick and the fastest config measured,
with the model's estimates, and
with --both-k-loops each pipelinable config also with the plain (unpipelined) K loop, with --overlap-epilogue
each 128-row unsplit config also with the epilogue overlap (the next tile's first K block issued before a
tile's store), with --ping-pong each 128- and 256-row config also with the ping-pong schedule (the math warpgroups
take turns issuing; plain K loop; with --overlap-epilogue 256-row tiles too take the overlap then), with --own-tiles
each unsplit 64- and 128-row config also with the own-tile ping-pong (each math warpgroup owns the tile; 128-row own
tiles up to 128 columns).
"""

import argparse
import json

import torch

from deep_kernels import gemm
from deep_kernels.device import get_num_sms
from deep_kernels.heuristics import fp8_gemm as heuristics
from deep_kernels.jit.precompile import precompile
from deep_kernels.reference import gemm as reference
from deep_kernels.testing import calc_diff
from deep_kernels.testing.bench import L2Flusher, time_kernels_us
from deep_kernels.testing.gemm import make_gemm_inputs

NKS = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048))


# --multicast choices: (CTAs per cluster, multicast on A)
MULTICASTS = {"none": (1, False), "a": (2, True), "b": (2, False)}


def configs_for(m: int, n: int, k: int, block_ms, block_ns, splits, both_k_loops: bool, multicasts,
                overlap_epilogue: bool = False, ping_pong: bool = False, own_tiles: bool = False):
    for block_m in block_ms:
        if block_m > 64 and m <= 64:
            continue
        for block_n in block_ns:
            if heuristics.max_stages(block_m, block_n, 2) < heuristics.MIN_STAGES:
                continue
            k_loops = (True, False) if both_k_loops and heuristics.can_pipeline(block_m, block_n) else (None,)
            for num_splits in splits:
                if num_splits > -(-k // heuristics.BLOCK_K) or (block_m == 256 and (
                        num_splits > 1 or not heuristics.is_legal_tile(block_m, block_n))):
                    continue
                for multicast in multicasts:
                    num_tma_multicast, on_a = MULTICASTS[multicast]
                    if num_tma_multicast > 1 and (num_splits > 1 or (on_a and -(-n // block_n) % 2) or
                                                  (not on_a and -(-m // block_m) % 2)):
                        continue
                    overlaps = (False, True) if overlap_epilogue and block_m == 128 and num_splits == 1 else (False,)
                    for pipelined in k_loops:
                        for overlap in overlaps:
                            yield heuristics.make_config(block_m, block_n, num_tma_multicast, on_a, 2,
                                                         num_splits=num_splits, pipelined=pipelined,
                                                         overlap_epilogue=overlap)
                    if own_tiles and heuristics.can_own_tiles(block_m, block_n, num_splits) and \
                            heuristics.max_stages(block_m, block_n, 2, own_tiles=True) >= heuristics.MIN_STAGES:
                        yield heuristics.make_config(block_m, block_n, num_tma_multicast, on_a, 2, own_tiles=True)
                    if ping_pong and heuristics.can_ping_pong(block_m, False):
                        pp_overlaps = (False, True) if overlap_epilogue and heuristics.has_epilogue_overlap(
                            block_m, block_n, num_splits, ping_pong=True) else (False,)
                        for overlap in pp_overlaps:
                            yield heuristics.make_config(block_m, block_n, num_tma_multicast, on_a, 2,
                                                         num_splits=num_splits, pipelined=False,
                                                         overlap_epilogue=overlap, ping_pong=True)


def _row(m: int, n: int, k: int, config, us: float, num_sms: int, diff: float) -> dict:
    return {"calc_diff": diff, "m": m, "n": n, "k": k, "label": heuristics.config_label(config), "block_m": config.block_m, "block_n": config.block_n,
            "splits": config.num_splits, "pipelined": config.pipelined, "overlap": config.overlap_epilogue,
            "ping_pong": config.ping_pong, "own_tiles": config.own_tiles,
            "multicast": config.num_tma_multicast, "multicast_on_a": config.multicast_on_a, "us": round(us, 2),
            "tflops": round(2 * m * n * k / us / 1e6, 1),
            "model_us": round(heuristics.estimate_seconds(config, m, n, k, num_sms) * 1e6, 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--m", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--block-n", type=int, nargs="+", default=[32, 64, 96, 128, 192])
    parser.add_argument("--splits", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8])
    parser.add_argument("--block-m", type=int, nargs="+", default=list(heuristics.BLOCK_MS))
    parser.add_argument("--both-k-loops", action="store_true")
    parser.add_argument("--overlap-epilogue", action="store_true")
    parser.add_argument("--ping-pong", action="store_true")
    parser.add_argument("--own-tiles", action="store_true")
    parser.add_argument("--multicast", nargs="+", choices=sorted(MULTICASTS), default=["none"])
    parser.add_argument("--nk", nargs="+", default=[f"{n}x{k}" for n, k in NKS], help="N x K shapes, e.g. 32768x512")
    parser.add_argument("--out", default="sweep.json")
    parser.add_argument("--max-diff", type=float, default=1e-5, help="largest calc_diff a config may give")
    args = parser.parse_args()
    num_sms = get_num_sms()
    nks = [tuple(int(v) for v in nk.split("x")) for nk in args.nk]
    problems = [(m, n, k, config) for m in args.m for n, k in nks
                for config in configs_for(m, n, k, args.block_m, args.block_n, args.splits, args.both_k_loops,
                                          args.multicast, args.overlap_epilogue, args.ping_pong, args.own_tiles)]
    precompile([gemm.kernel_spec(config, n, k, torch.bfloat16, False) for _, n, k, config in problems])

    flusher = L2Flusher(torch.cuda.get_device_properties(0).L2_cache_size)
    rows = []
    for m, n, k in dict.fromkeys((m, n, k) for m, n, k, _ in problems):
        a, b = make_gemm_inputs(m, n, k)
        d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        configs = [config for pm, pn, pk, config in problems if (pm, pn, pk) == (m, n, k)]
        calls = [gemm.forced_config_call(config, a, b, d) for config in configs]
        expected = reference.fp8_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64))
        diffs = []
        for call in calls:
            d.fill_(float("nan"))
            call()
            diffs.append(calc_diff(d, expected))
        del expected
        # One shape's configs in turns, so that clock drift under the power limit falls on all alike.
        times = time_kernels_us(calls, flusher, reps=20)
        rows += [_row(m, n, k, config, us, num_sms, diff) for config, us, diff in zip(configs, times, diffs)]
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    wrong = [r for r in rows if not r["calc_diff"] <= args.max_diff]
    for r in wrong:
        print(f"WRONG: {r}")

    for m in args.m:
        for n, k in nks:
            shape_rows = [r for r in rows if (r["m"], r["n"], r["k"]) == (m, n, k)]
            pick = heuristics.get_fp8_gemm_config(m, n, k, num_sms, allow_split_k=True)
            pick_label = heuristics.config_label(pick)
            picked = [r for r in shape_rows if r["label"] == pick_label]
            best = min(shape_rows, key=lambda r: r["us"])
            picked_text = f"{picked[0]['us']:7.2f} us" if picked else "(not swept)"
            print(f"{m:5d}x{n:5d}x{k:5d} pick {pick_label} {picked_text} | best {best['label']} {best['us']:7.2f} us "
                  f"{best['tflops']} TFLOPS (model {best['model_us']:.2f})")
    if wrong:
        raise SystemExit(f"{len(wrong)} configs above calc_diff {args.max_diff}")


if __name__ == "__main__":
    main()
