"""Some rows of the fp8_gemm or bf16_gemm suite, when the whole suite does not fit a time limit: the kernels built
first, then the rows run and written as the suite's JSON (rewritten after each part, so that a run stopped by a time
limit leaves what it measured), whose config_notes name the subset.

    python scripts/gemm_suite_subset.py precompile fp8_decode|bf16_grouped
    python scripts/gemm_suite_subset.py run fp8_decode|bf16_grouped OUT_ROOT COMMIT

fp8_decode: the fp8_gemm suite's rows at M = 64 and 128 (the 12 decode shapes); bf16_grouped: the bf16_gemm suite's
grouped rows (contiguous and masked).
"""

import datetime
import json
import sys
from pathlib import Path

import torch

SUBSETS = {
    "fp8_decode": ("fp8_gemm", "the fp8_gemm suite's 12 rows at M = 64 and 128 (its M = 4096 rows not run)"),
    "bf16_grouped": ("bf16_gemm", "the bf16_gemm suite's grouped rows, contiguous and masked (its dense rows not run)"),
}
DECODE_MS = (64, 128)


def fp8_decode_specs() -> list:
    from deep_kernels import gemm
    from deep_kernels.benchmarks import fp8_gemm as suite
    from deep_kernels.device import get_num_sms
    from deep_kernels.heuristics import fp8_gemm as heuristics

    num_sms = get_num_sms()
    specs = []
    for n, k in suite.NKS:
        for m in DECODE_MS:
            pick = heuristics.get_fp8_gemm_config(m, n, k, num_sms, allow_split_k=True)
            previous = heuristics.ranked_configs(m, n, k, num_sms, allow_split_k=True,
                                                 block_ms=suite.PREVIOUS_BLOCK_MS)[0][1]
            specs += [gemm.kernel_spec(config, n, k, torch.bfloat16, False) for config in (pick, previous)]
    return list(dict.fromkeys(specs))


def bf16_grouped_specs() -> list:
    import random

    from deep_kernels.benchmarks import bf16_gemm as suite
    from deep_kernels.bf16_gemm import CONTIGUOUS, MASKED, kernel_spec
    from deep_kernels.device import get_num_sms
    from deep_kernels.heuristics import bf16_gemm as heuristics
    from deep_kernels.testing.grouped import masked_problem

    num_sms = get_num_sms()
    specs = [kernel_spec(heuristics.get_grouped_bf16_gemm_config(CONTIGUOUS, g * m, n, k, g, num_sms), n, k,
                         torch.bfloat16, False, CONTIGUOUS) for g, m, n, k in suite.CONTIGUOUS_SHAPES]
    hints = [(g, masked_problem(g, expected_m, random.Random(0))[2]) for g, expected_m in suite.MASKED_GROUPS]
    specs += [kernel_spec(heuristics.get_grouped_bf16_gemm_config(MASKED, hint, n, k, g, num_sms), n, k,
                          torch.bfloat16, False, MASKED) for n, k in suite.MASKED_NKS for g, hint in hints]
    return list(dict.fromkeys(specs))


def run_parts(subset: str):
    """(name, zero-argument function returning rows) of the subset's parts, in order."""
    if subset == "fp8_decode":
        from deep_kernels.benchmarks import fp8_gemm as suite

        suite.MS = DECODE_MS
        return [("decode", suite.run)]
    from deep_kernels.benchmarks import bf16_gemm as suite

    return [("contiguous", suite.contiguous_rows), ("masked", suite.masked_rows)]


def main() -> None:
    mode, subset = sys.argv[1], sys.argv[2]
    if subset not in SUBSETS:
        raise SystemExit(__doc__)
    if mode == "precompile":
        from deep_kernels.jit.precompile import precompile

        specs = fp8_decode_specs() if subset == "fp8_decode" else bf16_grouped_specs()
        print(f"{len(specs)} kernels")
        precompile(specs, progress=False)
        return
    if mode != "run":
        raise SystemExit(__doc__)
    from deep_kernels.benchmarks.report import BenchContext, _write_chart, gpu_folder, print_table, summarize

    out_root, commit = Path(sys.argv[3]), sys.argv[4]
    suite_name, description = SUBSETS[subset]
    ctx = BenchContext.create(commit)
    folder = out_root / gpu_folder(ctx.gpu)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{suite_name}.json"
    rows = []
    for name, part in run_parts(subset):
        rows += part(ctx)
        document = {
            "suite": suite_name, "gpu": ctx.gpu, "date": datetime.date.today().isoformat(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "commit": ctx.commit,
            "copy_bandwidth_gbps": round(ctx.copy_gbps, 1), "rows": rows, "summary": summarize(rows),
            "config_notes": f"Subset: {description}; the full suite does not fit the 30 s bench limit of this run.",
        }
        path.write_text(json.dumps(document, indent=2) + "\n")
        print(f"{name}: {len(rows)} rows written", flush=True)
    _write_chart(folder / f"{suite_name}.png", suite_name, rows, ctx)
    print_table(suite_name, rows)


if __name__ == "__main__":
    main()
