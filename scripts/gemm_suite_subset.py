"""The fp8_gemm and bf16_gemm suites in parts, for a run with a time limit: the kernels built first, then the parts
run in order (parts()) and each suite's JSON rewritten after each of its parts, so that a run stopped by the limit
leaves the parts it measured (config_notes then name them).

    python scripts/gemm_suite_subset.py precompile fp8_gemm,bf16_gemm
    python scripts/gemm_suite_subset.py run fp8_gemm,bf16_gemm OUT_ROOT COMMIT     (or one of the two)
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


def parts() -> list:
    """(suite, description, function of the context returning rows) of both suites' parts, in the order they run:
    the rows the decode picks change first."""
    from deep_kernels.benchmarks import bf16_gemm, fp8_gemm

    def fp8_rows_at(ms):
        def run(ctx):
            fp8_gemm.MS = ms
            return fp8_gemm.run(ctx)
        return run

    return [
        ("bf16_gemm", "the 10 masked grouped rows", bf16_gemm.masked_rows),
        ("fp8_gemm", "the 12 rows at M = 64 and 128", fp8_rows_at(DECODE_MS)),
        ("bf16_gemm", "the 4 contiguous grouped rows", bf16_gemm.contiguous_rows),
        ("bf16_gemm", "the 18 NT rows", lambda ctx: bf16_gemm.dense_rows(ctx, bf16_gemm.DENSE_SHAPES)),
        ("bf16_gemm", "the 6 TN rows", lambda ctx: bf16_gemm.dense_rows(ctx, bf16_gemm.WEIGHT_GRADIENT_SHAPES, "tn")),
        ("fp8_gemm", "the 6 rows at M = 4096", fp8_rows_at(LARGE_MS)),
    ]


def main() -> None:
    suites = sys.argv[2].split(",") if len(sys.argv) > 2 else []
    if not suites or any(name not in ("fp8_gemm", "bf16_gemm") for name in suites):
        raise SystemExit(__doc__)
    mode = sys.argv[1]
    if mode == "precompile":
        from deep_kernels.jit.precompile import precompile

        specs = (fp8_specs() if "fp8_gemm" in suites else []) + (bf16_specs() if "bf16_gemm" in suites else [])
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
    chosen = [part for part in parts() if part[0] in suites]
    rows = {name: [] for name in suites}
    done = {name: [] for name in suites}
    for name, description, part in chosen:
        rows[name] += part(ctx)
        done[name].append(description)
        total = sum(part[0] == name for part in chosen)
        document = {
            "suite": name, "gpu": ctx.gpu, "date": datetime.date.today().isoformat(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "commit": ctx.commit,
            "copy_bandwidth_gbps": round(ctx.copy_gbps, 1), "rows": rows[name], "summary": summarize(rows[name]),
            "config_notes": (f"Subset: {'; '.join(done[name])} of the suite (run in parts within the 30 s bench limit "
                             "of this run; the other rows were not run at this commit)." if len(done[name]) < total
                             else "The whole suite, run in parts (rows ordered by part)."),
        }
        (folder / f"{name}.json").write_text(json.dumps(document, indent=2) + "\n")
        print(f"{name}: {description} written ({len(rows[name])} rows)", flush=True)
    for name in suites:
        _write_chart(folder / f"{name}.png", name, rows[name], ctx)
        print_table(name, rows[name])


if __name__ == "__main__":
    main()
