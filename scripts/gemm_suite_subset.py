"""The fp8_gemm or bf16_gemm suite in parts, for a run with a time limit: the kernels built first, then the parts run
in order and the suite's JSON rewritten after each one, so that a run stopped by the limit leaves the parts it
measured (config_notes then name them).

    python scripts/gemm_suite_subset.py precompile fp8_gemm|bf16_gemm
    python scripts/gemm_suite_subset.py run fp8_gemm|bf16_gemm OUT_ROOT COMMIT

fp8_gemm: the rows at M = 64 and 128 (the 12 decode shapes), then those at M = 4096. bf16_gemm: the grouped rows
(contiguous, then masked), then the dense NT rows, then the TN rows.
"""

import datetime
import json
import sys
from pathlib import Path

import torch

DECODE_MS = (64, 128)
LARGE_MS = (4096,)


def fp8_specs() -> list:
    from deep_kernels import gemm
    from deep_kernels.benchmarks import fp8_gemm as suite
    from deep_kernels.device import get_num_sms
    from deep_kernels.heuristics import fp8_gemm as heuristics

    num_sms = get_num_sms()
    specs = []
    for n, k in suite.NKS:
        for m in suite.MS:
            pick = heuristics.get_fp8_gemm_config(m, n, k, num_sms, allow_split_k=True)
            previous = heuristics.ranked_configs(m, n, k, num_sms, allow_split_k=True,
                                                 block_ms=suite.PREVIOUS_BLOCK_MS)[0][1]
            specs += [gemm.kernel_spec(config, n, k, torch.bfloat16, False) for config in (pick, previous)]
    return list(dict.fromkeys(specs))


def bf16_specs() -> list:
    from deep_kernels.benchmarks import bf16_gemm as suite
    from deep_kernels.device import get_num_sms

    return suite.kernel_specs(get_num_sms())


def parts(suite_name: str) -> list:
    """(description, function of the context returning rows) of the suite's parts, in order."""
    if suite_name == "fp8_gemm":
        from deep_kernels.benchmarks import fp8_gemm

        def rows_at(ms):
            def run(ctx):
                fp8_gemm.MS = ms
                return fp8_gemm.run(ctx)
            return run

        return [("the 12 rows at M = 64 and 128", rows_at(DECODE_MS)), ("the 6 rows at M = 4096", rows_at(LARGE_MS))]
    from deep_kernels.benchmarks import bf16_gemm

    return [("the 4 contiguous grouped rows", bf16_gemm.contiguous_rows),
            ("the 10 masked grouped rows", bf16_gemm.masked_rows),
            ("the 18 NT rows", lambda ctx: bf16_gemm.dense_rows(ctx, bf16_gemm.DENSE_SHAPES)),
            ("the 6 TN rows", lambda ctx: bf16_gemm.dense_rows(ctx, bf16_gemm.WEIGHT_GRADIENT_SHAPES, "tn"))]


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[2] not in ("fp8_gemm", "bf16_gemm"):
        raise SystemExit(__doc__)
    mode, suite_name = sys.argv[1], sys.argv[2]
    if mode == "precompile":
        from deep_kernels.jit.precompile import precompile

        specs = fp8_specs() if suite_name == "fp8_gemm" else bf16_specs()
        print(f"{len(specs)} kernels")
        precompile(specs, progress=False)
        return
    if mode != "run":
        raise SystemExit(__doc__)
    from deep_kernels.benchmarks.report import BenchContext, _write_chart, gpu_folder, print_table, summarize

    out_root, commit = Path(sys.argv[3]), sys.argv[4]
    ctx = BenchContext.create(commit)
    folder = out_root / gpu_folder(ctx.gpu)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{suite_name}.json"
    rows, done = [], []
    all_parts = parts(suite_name)
    for description, part in all_parts:
        rows += part(ctx)
        done.append(description)
        document = {
            "suite": suite_name, "gpu": ctx.gpu, "date": datetime.date.today().isoformat(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "commit": ctx.commit,
            "copy_bandwidth_gbps": round(ctx.copy_gbps, 1), "rows": rows, "summary": summarize(rows),
        }
        if len(done) < len(all_parts):
            document["config_notes"] = (f"Subset: {'; '.join(done)} of the suite (run in parts within the 30 s bench "
                                        "limit of this run; the other rows were not run at this commit).")
        else:
            document["config_notes"] = "The whole suite, run in parts (rows ordered by part)."
        path.write_text(json.dumps(document, indent=2) + "\n")
        print(f"{description}: {len(rows)} rows written", flush=True)
    _write_chart(folder / f"{suite_name}.png", suite_name, rows, ctx)
    print_table(suite_name, rows)


if __name__ == "__main__":
    main()
