"""Time a grid of BF16 GEMM configs per shape on the GPU, in turns with torch's BF16 matmul, to check and refit the
BF16 heuristics (deep_kernels/heuristics/bf16_gemm.py).

Usage (on the GPU machine): python scripts/sweep_bf16_gemm.py --shapes 4096x7168x2048 128x4096x7168 --out sweep.json
Every config's output is checked against float64 (calc_diff, poisoned output); a config above --max-diff fails the
run. Prints, per shape, each config's time, the model's estimate, and the ratio to torch.mm.
"""

import argparse
import json

import torch

from deep_kernels import bf16_gemm
from deep_kernels.device import get_num_sms, info
from deep_kernels.heuristics import bf16_gemm as heuristics
from deep_kernels.heuristics.fp8_gemm import config_label
from deep_kernels.jit.precompile import precompile
from deep_kernels.reference import bf16_gemm as reference
from deep_kernels.testing import calc_diff, poison_, random_activations
from deep_kernels.testing.bench import L2Flusher, time_kernels_us

# (block_m, block_n, multicast, multicast on A)
TILES = ((128, 256, 1, False), (128, 240, 1, False), (128, 192, 1, False), (128, 128, 1, False),
         (256, 128, 1, False), (256, 128, 2, True), (256, 128, 2, False), (128, 256, 2, False), (128, 256, 2, True),
         (64, 256, 1, False), (64, 128, 1, False))


def configs_for(m: int, n: int, k: int, num_sms: int) -> list:
    configs = [heuristics.get_bf16_gemm_config(m, n, k, num_sms)]
    for block_m, block_n, multicast, on_a in TILES:
        if multicast > 1 and ((on_a and -(-n // block_n) % 2) or (not on_a and -(-m // block_m) % 2)):
            continue
        config = heuristics.make_config(block_m, block_n, multicast, on_a)
        if config not in configs:
            configs.append(config)
    return configs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", nargs="+", required=True, help="MxNxK")
    parser.add_argument("--max-diff", type=float, default=2e-6)
    parser.add_argument("--out")
    args = parser.parse_args()
    num_sms = get_num_sms()
    shapes = [tuple(int(v) for v in shape.split("x")) for shape in args.shapes]
    work = [(shape, config) for shape in shapes for config in configs_for(*shape, num_sms)]
    precompile([bf16_gemm.kernel_spec(config, n, k, torch.bfloat16, False) for (m, n, k), config in work],
               progress=False)
    flusher = L2Flusher(info().l2_bytes)
    results = []
    for m, n, k in shapes:
        a, b = random_activations(m, k), torch.randn((n, k), device="cuda", dtype=torch.bfloat16)
        expected = reference.bf16_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64))
        d_peer = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
        configs = configs_for(m, n, k, num_sms)
        calls = []
        for config in configs:
            d = poison_(torch.empty((m, n), device="cuda", dtype=torch.bfloat16))
            bf16_gemm._launch_dense(a, b, d, None, config)
            diff = calc_diff(d, expected)
            assert diff <= args.max_diff, f"{m}x{n}x{k} {config_label(config)}: calc_diff {diff:.2e}"
            calls.append(lambda d=d, config=config: bf16_gemm._launch_dense(a, b, d, None, config))
        times = time_kernels_us(calls + [lambda: torch.mm(a, b.t(), out=d_peer)], flusher)
        peer_us = times[-1]
        print(f"{m}x{n}x{k}: torch.mm {peer_us:.1f} us ({2 * m * n * k / peer_us / 1e6:.0f} TFLOPS)")
        for i, (config, us) in enumerate(zip(configs, times)):
            model_us = heuristics.estimate_seconds(config, m, n, k, num_sms) * 1e6
            print(f"  {'pick ' if i == 0 else '     '}{config_label(config):>14} {config.num_stages} stages: "
                  f"{us:8.1f} us  {2 * m * n * k / us / 1e6:6.0f} TFLOPS  x{peer_us / us:.3f}  model {model_us:.1f}")
            results.append({"m": m, "n": n, "k": k, "config": config_label(config), "stages": config.num_stages,
                            "pick": i == 0, "us": us, "peer_us": peer_us, "model_us": model_us})
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
