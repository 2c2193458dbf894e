"""Every kernel's declaration (KernelDef) against its compiled binary, on the CPU: for each registered kernel,
compile its first precompiled specialization (or all of them with --all) and compare the cubin's parameter
count and sizes (cuobjdump -elf: EIATTR_KPARAM_INFO, what cuKernelGetParamInfo reports at load time), its C++
parameter types (the demangled symbol) and its launch bounds with the declaration.

Usage: python scripts/check_kernel_signatures.py [--all] [-j N]
"""

import argparse
import sys

from deep_kernels.jit import cache, registry
from deep_kernels.jit.precompile import precompile
from deep_kernels.jit.signature import SignatureError, check_cubin


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="every precompiled specialization, not one per kernel")
    parser.add_argument("-j", "--jobs", type=int, default=None)
    args = parser.parse_args()
    specs = registry.precompile_specs()
    if not args.all:
        specs = list({spec.entry: spec for spec in reversed(specs)}.values())[::-1]
    missing = sorted(d.name for d in registry.definitions() if d.entry not in {s.entry for s in specs})
    entries = precompile(specs, jobs=args.jobs, arch="90a")
    failures = len(missing)
    for name in missing:
        print(f"FAIL {name}: declared but never precompiled")
    for spec, entry in zip(specs, entries):
        try:
            found = check_cubin(spec, entry / cache.BINARY_NAME)
        except SignatureError as error:
            failures += 1
            print(f"FAIL {error}")
            continue
        print(f"ok   {spec.name:34s} {len(found.layout):2d} parameters, sizes {[s for _, s in found.layout]}, "
              f"{found.max_threads} threads")
    print(f"{len(specs) - failures + len(missing)} of {len(specs)} specializations match their declarations"
          + (f"; {len(missing)} kernels not precompiled" if missing else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
