"""Where the MoE layer's forward + backward time goes: one profiled training step of deep_kernels.nn.moe_layer at the
moe_layer suite's sizes (DeepSeek-V3, T tokens, contiguous layout, FP32 master weights), after warm-up, with L2
flushed before it. Prints every kernel of the step in launch order (its time and the running sum, forward and
backward apart), then the same per kernel name; with --peer, also the suite's plain-torch training peer per kernel
name (the two timed in the same process).

Usage (GPU): PYTHONPATH=$PWD python scripts/profile_moe_layer.py [--tokens 8192] [--peer]
"""

import argparse
import collections

import torch
from torch.profiler import ProfilerActivity, profile

from deep_kernels.benchmarks import moe_layer as suite
from deep_kernels.device import info
from deep_kernels.nn import MoE
from deep_kernels.testing.bench import L2Flusher
from deep_kernels.testing.moe_layer import moe_layer_tokens, moe_layer_weights


def profiled_kernels(fn, flusher: L2Flusher, warmup: int = 2) -> list:
    """(name, us) of the kernels of one run of fn (after warm-up runs), in start order."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    flusher()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        with torch.profiler.record_function("step"):
            fn()
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    return [(e.name, e.time_range.elapsed_us()) for e in kernels if not flusher.is_flush(e.name)]


def short(name: str, width: int = 110) -> str:
    return name if len(name) <= width else name[:width - 3] + "..."


def print_in_order(kernels: list, num_forward: int) -> None:
    """Every kernel with the running sum; a line after the first num_forward (the forward's)."""
    total = 0.0
    for i, (name, us) in enumerate(kernels):
        if i == num_forward:
            print(f"{'':10} {total:10.1f}  ---- backward ----")
        total += us
        print(f"{us:10.1f} {total:10.1f}  {short(name)}")


def print_by_name(title: str, kernels: list, top: int = 25) -> None:
    by_name = collections.defaultdict(lambda: [0.0, 0])
    for name, us in kernels:
        by_name[name][0] += us
        by_name[name][1] += 1
    total = sum(us for _, us in kernels)
    print(f"\n== {title}: {total:.1f} us in {len(kernels)} kernels; by name ==")
    for name, (us, count) in sorted(by_name.items(), key=lambda item: -item[1][0])[:top]:
        print(f"{us:10.1f} {100 * us / total:5.1f}% x{count:<5d} {short(name, 90)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=suite.TRAINING_TOKENS)
    parser.add_argument("--peer", action="store_true", help="also profile the plain-torch training peer")
    args = parser.parse_args()

    flusher = L2Flusher(info().l2_bytes)
    weights = moe_layer_weights(suite.HIDDEN, suite.INTERMEDIATE, suite.NUM_EXPERTS)
    module = MoE.from_float(**weights, **suite.GATE)
    master_weights = {name: weights.pop(name).float() for name in ("gate_up_weight", "down_weight")}
    x = moe_layer_tokens(args.tokens, suite.HIDDEN)
    grad_out = moe_layer_tokens(args.tokens, suite.HIDDEN, seed=4)

    forward = profiled_kernels(lambda: module(x), flusher)
    step = profiled_kernels(suite.training_step(x, module, master_weights, grad_out), flusher)
    print(f"== moe_layer forward + backward, T = {args.tokens}: forward {sum(us for _, us in forward):.1f} us "
          f"(MoE.forward's kernels), the step {sum(us for _, us in step):.1f} us ==")
    print_in_order(step, len(forward))
    print_by_name("moe_layer forward + backward", step)
    if args.peer:
        gate_up = (module.gate_up_weight, module.gate_up_scales)
        down = (module.down_weight, module.down_scales)
        peer = profiled_kernels(lambda: suite.torch_fp8_moe_training(
            x, module.router_weight, module.correction_bias, gate_up, down, grad_out, **suite.GATE), flusher, 1)
        print_by_name("plain-torch peer forward + backward", peer)


if __name__ == "__main__":
    main()
