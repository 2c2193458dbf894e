"""Command line: python -m deep_kernels {info, precompile, bench, test}."""

import argparse
import subprocess
import sys
from pathlib import Path

from deep_kernels import envs

FAMILIES = ("quant", "gemm", "grouped_gemm", "moe")
SUITES = ("quant", "fp8_gemm", "grouped_gemm", "routing", "moe_expand", "jit")


def _family_specs(names) -> list:
    import importlib

    specs = []
    for name in names:
        specs.extend(importlib.import_module(f"deep_kernels.{name}").precompile_specs())
    return specs


def cmd_info(_args) -> int:
    import torch

    from deep_kernels import device
    from deep_kernels.jit import cache, compiler

    if device.has_gpu():
        gpu = device.info(torch.cuda.current_device())
        print(f"GPU:            {gpu.name}, {gpu.num_sms} SMs, {gpu.smem_per_block_bytes} B smem/block, "
              f"{gpu.l2_bytes >> 20} MiB L2 (sm_{gpu.arch}); SMs used: {device.get_num_sms()}")
    else:
        print("GPU:            none found (compile-only: precompile works, kernels cannot run)")
    print(f"torch:          {torch.__version__} (CUDA {torch.version.cuda})")
    try:
        nvcc = compiler.nvcc_path()
        print(f"nvcc:           {nvcc} ({compiler.nvcc_version(nvcc)})")
    except RuntimeError as error:
        print(f"nvcc:           {error}")
    try:
        print(f"CUTLASS:        {compiler.cutlass_include()}")
    except RuntimeError as error:
        print(f"CUTLASS:        {error}")
    print(f"target arch:    sm_{device.target_arch()}")
    print(f"kernel cache:   {cache.cache_dir()} ({cache.cache_size_bytes() / 2**20:.1f} MiB)")
    print("environment:")
    for name, value, default, doc in envs.describe():
        print(f"  {name:<22} = {value!r:<12} (default {default!r}) {doc}")
    return 0


def cmd_precompile(args) -> int:
    from deep_kernels.jit.precompile import precompile

    specs = _family_specs(args.family or FAMILIES)
    entries = precompile(specs, jobs=args.jobs, arch=args.arch)
    print(f"{len(set(entries))} kernels ready in {entries[0].parent.parent if entries else '-'}")
    return 0


def cmd_bench(args) -> int:
    import importlib

    from deep_kernels import device
    from deep_kernels.benchmarks.report import BenchContext, print_table, write_suite

    if not device.has_gpu():
        print("bench needs a GPU: none found", file=sys.stderr)
        return 2
    ctx = BenchContext.create(args.commit)
    print(f"copy bandwidth: {ctx.copy_gbps:.0f} GB/s")
    results = []
    for suite in args.suite or SUITES:
        rows = importlib.import_module(f"deep_kernels.benchmarks.{suite}").run(ctx)
        print(f"wrote {write_suite(Path(args.out), suite, rows, ctx)}")
        results.append((suite, rows))
    for suite, rows in results:
        print_table(suite, rows)
    return 0


def cmd_test(args) -> int:
    tests = Path(__file__).resolve().parent.parent / "tests"
    if not tests.is_dir():
        print(f"tests/ not found next to the package ({tests}): run from a source checkout", file=sys.stderr)
        return 2
    return subprocess.call([sys.executable, "-m", "pytest", str(tests), *args.pytest_args])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deep_kernels", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="GPU, compiler, cache and DK_* settings").set_defaults(run=cmd_info)

    precompile = commands.add_parser("precompile", help="build kernels into the cache in parallel (no GPU needed)")
    precompile.add_argument("--family", action="append", choices=FAMILIES, help="kernel family (default: all)")
    precompile.add_argument("--arch", help="target such as 90a (default: DK_JIT_ARCH, the GPU's, else 90a)")
    precompile.add_argument("-j", "--jobs", type=int, help="parallel compiles (default: CPU count)")
    precompile.set_defaults(run=cmd_precompile)

    bench = commands.add_parser("bench", help="run benchmark suites on the GPU, write JSON and charts")
    bench.add_argument("--suite", action="append", choices=SUITES, help="suite (default: all)")
    bench.add_argument("--out", default="benchmarks/results", help="results root (default: benchmarks/results)")
    bench.add_argument("--commit", default="unknown", help="git sha of the measured tree, recorded in the JSON")
    bench.set_defaults(run=cmd_bench)

    test = commands.add_parser("test", help="run the test suite (GPU tests skip without a GPU); "
                                             "further arguments go to pytest")
    test.set_defaults(run=cmd_test)

    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "test":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.pytest_args = extra
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
