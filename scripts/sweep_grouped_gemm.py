"""Time grouped FP8 GEMM configs against the heuristics' pick, per shape in turns in one process (GPU machine).

Usage: python scripts/sweep_grouped_gemm.py [--precompile-only | --cached-only]
        --shapes c4x8192x4096x7168 m16x64x7168x2048=128x128o,64x192 ... [--configs 128x192o 128x192o+b 256x128o+a ...]
Shapes (each optionally =its own configs, comma-separated, timed after --configs): c<G>x<rows per group>x<N>x<K> (contiguous, every group full) or m<G>x<expected_m>x<N>x<K> (masked, the
grouped_gemm benchmark's draw of masked_m). Configs: <BLOCK_M>x<BLOCK_N>[/<stages>][o][+a|+b] (o: the epilogue overlap); the pick
is always timed first. Every config's output is compared with the pick's (bitwise, else calc_diff) and the pick's
masked output with the float64 reference; contiguous picks are checked on their first and last 256 rows. --dense:
the contiguous shapes also time the dense GEMM of the same rows with each 256-row config (identical tiles).
--precompile-only compiles every kernel the run needs and exits (no GPU needed); --cached-only times only the configs
whose kernels are already in the kernel cache. --baseline DIR: also each config's kernel built from DIR/csrc (a copy of
the tree at the commit to compare with, whose kernels DIR's own --precompile-only run put into the same kernel cache:
set DK_JIT_CACHE_DIR for both), timed in the same turns, where that kernel is in the cache.
"""

import argparse
import random
import re
from pathlib import Path

import torch

from deep_kernels.device import get_num_sms
from deep_kernels.benchmarks.grouped_gemm import MASKED_GROUPS, MASKED_NKS
from deep_kernels import grouped_gemm
from deep_kernels.grouped_gemm import CONTIGUOUS, MASKED, forced_config_call
from deep_kernels.heuristics import fp8_gemm as heuristics
from deep_kernels.heuristics import grouped_fp8_gemm as grouped_heuristics
from deep_kernels import gemm
from deep_kernels.gemm import kernel_spec
from deep_kernels.device import target_arch
from deep_kernels.jit import cache, compiler, runtime
from deep_kernels.jit.precompile import precompile
from deep_kernels.reference import gemm as reference
from deep_kernels.testing import calc_diff
from deep_kernels.testing.bench import L2Flusher, time_kernels_us
from deep_kernels.testing.grouped import make_contiguous_inputs, make_masked_inputs, masked_problem

# --dense: time the dense GEMM alongside; --cached-only (set in main).
DENSE_ALONGSIDE = False
CACHED_ONLY = False
CONFIG_PATTERN = re.compile(r"^(\d+)x(\d+)(?:/(\d+))?(o?)(?:\+([ab]))?$")


def parse_config(text: str):
    match = CONFIG_PATTERN.match(text)
    if match is None:
        raise SystemExit(f"bad config {text!r}")
    block_m, block_n, stages, overlap, multicast = match.groups()
    return heuristics.make_config(int(block_m), int(block_n), 2 if multicast else 1, multicast == "a", 2,
                                  num_stages=int(stages) if stages else None, overlap_epilogue=overlap == "o")


def parse_shape(text: str) -> tuple:
    kind = {"c": CONTIGUOUS, "m": MASKED}[text[0]]
    g, m, n, k = (int(v) for v in text[1:].split("x"))
    return kind, g, m, n, k


def label(config) -> str:
    return f"{heuristics.config_label(config)}/s{config.num_stages}"


def plan(shapes, config_texts, num_sms):
    """[(shape, [pick, other configs])]."""
    planned = []
    for text in shapes:
        text, _, own_configs = text.partition("=")
        kind, g, m, n, k = parse_shape(text)
        hint_m = g * m if kind == CONTIGUOUS else int(1.2 * m)
        pick = grouped_heuristics.get_grouped_fp8_gemm_config(kind, hint_m, n, k, g, num_sms)
        configs = [pick]
        for config_text in list(config_texts) + [c for c in own_configs.split(",") if c]:
            config = parse_config(config_text)
            if kind == MASKED and config.num_tma_multicast == 2 and not config.multicast_on_a:
                continue
            if heuristics.config_label(config) != heuristics.config_label(pick) or \
                    config.num_stages != pick.num_stages:
                if all(label(config) != label(c) for c in configs):
                    configs.append(config)
        planned.append(((kind, g, m, n, k), configs))
    return planned


def is_cached(spec, identity) -> bool:
    return cache.read_entry(cache.entry_dir(spec.name, cache.cache_key(spec.render(), identity))) is not None


def baseline_call(kind: str, config, root: Path, a, sfa, b, sfb, d, layout, hint_m: int, m_rows: int):
    """The grouped GEMM with `config` run by the kernel built from root/csrc (found in the kernel cache), or None."""
    n, k = b.shape[1], b.shape[2]
    spec = kernel_spec(config, n, k, torch.bfloat16, False, kind)
    entry = cache.entry_dir(spec.name, cache.cache_key(spec.render(), compiler.compiler_identity(target_arch()),
                                                      root / "csrc"))
    binary = cache.read_entry(entry)
    if binary is None:
        return None
    _, _, grid = grouped_gemm.plan_of(kind, config, hint_m, n, k, get_num_sms())
    plan = (runtime.load_kernel(binary, spec, config.smem_bytes), config, grid)
    encode, names = ((grouped_gemm._encode_contiguous, grouped_gemm.CONTIGUOUS_INPUTS) if kind == CONTIGUOUS
                     else (grouped_gemm._encode_masked, grouped_gemm.MASKED_INPUTS))
    launches = {}
    return lambda: grouped_gemm.launch_grouped(launches, plan, encode, (a, sfa, b, sfb, layout), names, d, m_rows,
                                               b.shape[0])


def dense_spec(config, n: int, k: int):
    return kernel_spec(config, n, k, torch.bfloat16, False)


def dense_takes(config, n: int, k: int) -> bool:
    """Whether the contiguous sweep also times the dense GEMM with this config (the 256-row tiles: grouped against
    dense on identical tiles; --cached-only: if its kernel is in the cache)."""
    return DENSE_ALONGSIDE and config.block_m == 256 and (
        not CACHED_ONLY or is_cached(dense_spec(config, n, k), compiler.compiler_identity(target_arch())))


def benchmark_draws() -> dict:
    """{(G, expected_m, N, K): masked_problem(...)} as the grouped_gemm benchmark draws them (same order and seed)."""
    rng = random.Random(0)
    return {(g, expected_m, n, k): masked_problem(g, expected_m, rng) for n, k in MASKED_NKS
            for g, expected_m in MASKED_GROUPS}


def run_shape(kind, g, m, n, k, configs, flusher, draws, baseline_root=None):
    if kind == CONTIGUOUS:
        (a, sfa), (b, sfb), m_indices, _ = make_contiguous_inputs([m] * g, n, k)
        d = torch.empty((g * m, n), device="cuda", dtype=torch.bfloat16)
        layout, hint, rows = m_indices, None, g * m
    else:
        masked_m, m_max, hint = draws.get((g, m, n, k)) or masked_problem(g, m, random.Random(0))
        (a, sfa), (b, sfb), layout = make_masked_inputs(masked_m, m_max, n, k)
        d = torch.empty((g, m_max, n), device="cuda", dtype=torch.bfloat16)
        rows = sum(masked_m)
    calls = [forced_config_call(kind, config, (a, sfa), (b, sfb), d, layout, hint) for config in configs]
    labels = [label(config) for config in configs]
    if baseline_root is not None:
        hint_m, m_rows = (g * m, g * m) if kind == CONTIGUOUS else (hint, d.shape[1])
        for config in configs:
            call = baseline_call(kind, config, baseline_root, a, sfa, b, sfb, d, layout, hint_m, m_rows)
            if call is not None:
                calls.append(call)
                labels.append("base " + label(config))
    outputs = []
    for call in calls:
        d.fill_(float("nan"))
        call()
        outputs.append(d.clone())
    if kind == MASKED:
        expected = reference.m_grouped_fp8_gemm_nt_masked((a, sfa), (b, sfb), torch.zeros(
            d.shape, device="cuda", dtype=torch.float64), layout, hint)
        valid = torch.arange(d.shape[1], device="cuda")[None, :] < layout[:, None]
        pick_diff = calc_diff(outputs[0][valid], expected[valid])
        for out in outputs:
            out[~valid] = 0
    else:
        pick_diff = 0.0
        for first, group in ((0, 0), (g * m - 256, g - 1)):
            rows_a = reference.dequantize_a(a[first:first + 256], sfa[first:first + 256])
            rows_d = rows_a @ reference.dequantize_b(b[group], sfb[group]).t()
            pick_diff = max(pick_diff, calc_diff(outputs[0][first:first + 256], rows_d))
    # Contiguous: the dense GEMM of the same rows (expert 0's weights) with each config that it takes, alongside.
    dense = [(config, gemm.forced_config_call(config, (a, sfa), (b[0], sfb[0]), d)) for config in configs
             if kind == CONTIGUOUS and dense_takes(config, n, k)]
    times = time_kernels_us(calls + [call for _, call in dense], flusher, reps=10, warmup=3)
    flops = 2 * rows * n * k
    print(f"{kind[10:]} G={g} m={m} N={n} K={k} pick check calc_diff={pick_diff:.1e}")
    for name, out, us in zip(labels, outputs, times):
        same = "bitwise" if torch.equal(out, outputs[0]) else f"calc_diff={calc_diff(out, outputs[0]):.1e}"
        print(f"  {name:27s} {us:9.2f} us {flops / us / 1e6:7.1f} TFLOPS  x{times[0] / us:.3f} of pick  {same}")
    for (config, _), us in zip(dense, times[len(calls):]):
        print(f"  dense {label(config):21s} {us:9.2f} us {flops / us / 1e6:7.1f} TFLOPS  x{times[0] / us:.3f} of pick")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", nargs="+", required=True)
    parser.add_argument("--configs", nargs="*", default=[])
    parser.add_argument("--precompile-only", action="store_true")
    parser.add_argument("--cached-only", action="store_true")
    parser.add_argument("--dense", action="store_true", help="contiguous: also the dense GEMM with the 256-row configs")
    parser.add_argument("--baseline", type=Path, default=None, help="a tree whose kernels to time alongside")
    parser.add_argument("--num-sms", type=int, default=None)
    args = parser.parse_args()
    global DENSE_ALONGSIDE, CACHED_ONLY
    DENSE_ALONGSIDE, CACHED_ONLY = args.dense, args.cached_only
    num_sms = args.num_sms or get_num_sms()
    planned = plan(args.shapes, args.configs, num_sms)
    specs = [kernel_spec(config, n, k, torch.bfloat16, False, kind) for (kind, _, _, n, k), configs in planned
             for config in configs]
    specs += [dense_spec(config, n, k) for (kind, _, _, n, k), configs in planned
              for config in configs if kind == CONTIGUOUS and dense_takes(config, n, k)]
    if args.precompile_only:
        precompile(specs)
        return
    if args.cached_only:
        identity = compiler.compiler_identity(target_arch())
        planned = [(shape, [config for config in configs
                            if is_cached(kernel_spec(config, shape[3], shape[4], torch.bfloat16, False, shape[0]),
                                         identity)])
                   for shape, configs in planned]
    flusher = L2Flusher(torch.cuda.get_device_properties(0).L2_cache_size)
    draws = benchmark_draws()
    for (kind, g, m, n, k), configs in planned:
        run_shape(kind, g, m, n, k, configs, flusher, draws, args.baseline)


if __name__ == "__main__":
    main()
