"""Command line: python -m deep_kernels {info, precompile, bench, tune, test}."""

import argparse
import os
import subprocess
import sys
from pathlib import Path

from deep_kernels import envs
from deep_kernels.jit import registry

# Kernel families register themselves (deep_kernels.jit.registry); benchmark suites are the modules of
# deep_kernels.benchmarks with a run(context).
FAMILIES = registry.families()


def _family_specs(names) -> list:
    return registry.precompile_specs(names)


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
    _print_tuned()
    return 0


def _print_tuned() -> None:
    """The measured winners of `tune` in the cache, per GPU; stale ones (another kernel source or compiler) marked."""
    from deep_kernels import gemm, grouped_gemm, tuning
    from deep_kernels.device import target_arch
    from deep_kernels.heuristics import fp8_gemm as heuristics
    from deep_kernels.jit import cache

    files = sorted((cache.cache_dir() / tuning.TUNED_DIR).glob("*.json"))
    if not files:
        print("tuned configs:  none (python -m deep_kernels tune)")
        return
    try:
        identity = tuning.source_identity(heuristics.KERNEL_HEADER, target_arch())
        identities = {op: identity for op in (gemm.TUNING_OP, *grouped_gemm.TUNING_OPS.values())}
    except RuntimeError:  # no nvcc: nothing is current
        identities = {}
    for path in files:
        print(f"tuned configs:  {path}")
        for op, key, entry, current in tuning.entries(path, identities):
            fields = ", ".join(f"{name}={value}" for name, value in entry["config"].items())
            print(f"  {op} {key}: {fields}; {entry['us']} us (model's pick {entry['model_us']} us), {entry['date']}"
                  f"{'' if current else ' [stale: kernel source or compiler changed]'}")


def cmd_precompile(args) -> int:
    from deep_kernels.jit.precompile import precompile

    specs = _family_specs(args.family or FAMILIES)
    entries = precompile(specs, jobs=args.jobs, arch=args.arch)
    print(f"{len(set(entries))} kernels ready in {entries[0].parent.parent if entries else '-'}")
    return 0


def cmd_bench(args) -> int:
    import importlib

    from deep_kernels import device
    from deep_kernels.benchmarks import suites
    from deep_kernels.benchmarks.report import BenchContext, print_table, write_suite

    unknown = sorted(set(args.suite or ()) - set(suites()))
    if unknown:
        print(f"unknown benchmark suites {unknown}: the suites are {', '.join(suites())}", file=sys.stderr)
        return 2
    if not device.has_gpu():
        print("bench needs a GPU: none found", file=sys.stderr)
        return 2
    ctx = BenchContext.create(args.commit)
    print(f"copy bandwidth: {ctx.copy_gbps:.0f} GB/s")
    results = []
    for suite in args.suite or suites():
        rows = importlib.import_module(f"deep_kernels.benchmarks.{suite}").run(ctx)
        if not rows:  # a suite this machine cannot run (it says why)
            continue
        print(f"wrote {write_suite(Path(args.out), suite, rows, ctx)}")
        results.append((suite, rows))
    for suite, rows in results:
        print_table(suite, rows)
    return 0


def _parse_tune_shapes(suite: str, shapes: list):
    """The --shapes of a suite as tune takes them, or None (with a message) when one is malformed."""
    parsed = []
    for shape in shapes:
        kind, _, dims = shape.lower().rpartition(":")
        values = dims.split("x")
        if suite == "fp8_gemm" and not kind and len(values) == 3 and all(v.isdigit() for v in values):
            parsed.append(tuple(map(int, values)))
        elif (suite == "grouped_gemm" and kind in ("contiguous", "masked") and len(values) == 4
              and all(v.isdigit() for v in values)):
            parsed.append((kind, *map(int, values)))
        else:
            form = "MxNxK, e.g. 4096x7168x2048" if suite == "fp8_gemm" else (
                "contiguous:GxMxNxK (M rows per group) or masked:GxExNxK (E expected rows per group), e.g. "
                "masked:16x64x4096x7168")
            print(f"{suite} shapes are {form}: got {shape!r}", file=sys.stderr)
            return None
    return parsed


def cmd_tune(args) -> int:
    from deep_kernels import device, tune

    shapes = _parse_tune_shapes(args.suite, args.shapes)
    if shapes is None:
        return 2
    if not device.has_gpu():
        print("tune needs a GPU: none found", file=sys.stderr)
        return 2
    if args.suite == "fp8_gemm":
        tune.tune_fp8_gemm(shapes or tune.DEFAULT_SHAPES, count=args.count)
    else:
        tune.tune_grouped_gemm(shapes or tune.DEFAULT_GROUPED_SHAPES, count=args.count)
    return 0


def cmd_test(args) -> int:
    tests = Path(__file__).resolve().parent.parent / "tests"
    if not tests.is_dir():
        print(f"tests/ not found next to the package ({tests}): run from a source checkout", file=sys.stderr)
        return 2
    # The full mode is the tests' DK_FULL_TEST (tests/conftest.py), set for the pytest process only.
    env = dict(os.environ, DK_FULL_TEST="1") if args.full else None
    return subprocess.call([sys.executable, "-m", "pytest", str(tests), *args.pytest_args], env=env)


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
    bench.add_argument("--suite", action="append", help="suite, a module of deep_kernels.benchmarks (default: all)")
    bench.add_argument("--out", default="benchmarks/results", help="results root (default: benchmarks/results)")
    bench.add_argument("--commit", default="unknown", help="git sha of the measured tree, recorded in the JSON")
    bench.set_defaults(run=cmd_bench)

    tune = commands.add_parser("tune", help="time the model's best configs per shape on this GPU and keep the fastest")
    tune.add_argument("--suite", choices=("fp8_gemm", "grouped_gemm"), default="fp8_gemm",
                      help="fp8_gemm (fp8_gemm_nt) or grouped_gemm (the contiguous and masked grouped GEMMs)")
    tune.add_argument("--shapes", nargs="*", default=[], help="fp8_gemm: MxNxK with bf16 D; grouped_gemm: "
                      "contiguous:GxMxNxK or masked:GxExNxK (default: the suite's benchmark shapes)")
    tune.add_argument("--count", type=int, default=6, help="candidates timed per shape, best modelled first")
    tune.set_defaults(run=cmd_tune)

    test = commands.add_parser("test", allow_abbrev=False,
                               help="run the test suite (GPU tests skip without a GPU); further arguments go to pytest")
    test.add_argument("--full", action="store_true",
                      help="the full mode (DK_FULL_TEST=1): also compile every kernel and check its SASS, and the "
                           "larger shapes and exhaustive sweeps (CI runs it after the default suite)")
    test.set_defaults(run=cmd_test)

    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "test":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.pytest_args = extra
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
