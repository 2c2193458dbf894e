"""The k_grouped_gemm suite's rows for some of its mean token counts, when the whole suite does not fit a time limit:
its kernels built first (the FP8 k-grouped picks, the dense weight-gradient picks at each total K, the BF16 k-grouped
picks), then the rows run and written as the suite's JSON, whose config_notes name the subset.

    python scripts/k_grouped_suite_subset.py precompile MEANS          # e.g. 2048,4096,8192
    python scripts/k_grouped_suite_subset.py run OUT_ROOT COMMIT MEANS [BF16_MEANS]  # the JSON rewritten after each row
"""

import random
import sys
from pathlib import Path

import torch

from deep_kernels import gemm, k_grouped_bf16_gemm
from deep_kernels.benchmarks import k_grouped_gemm as suite
from deep_kernels.gemm import CHANNEL_SCALED
from deep_kernels.heuristics import k_grouped_bf16_gemm as bf16_heuristics
from deep_kernels.heuristics import k_grouped_fp8_gemm as heuristics

NUM_SMS = 132


def shapes(means) -> list:
    return [(g, m, n, mean) for m, n in suite.MNS for g in suite.GROUPS for mean in means]


def specs(means, bf16_means) -> list:
    out = []
    for g, m, n, mean in shapes(means):
        total = sum(suite.expert_tokens(g, mean, random.Random(g * mean)))
        config = heuristics.get_k_grouped_fp8_gemm_config(m, n, total, g, NUM_SMS, True)
        out.append(gemm.kernel_spec(config, n, 0, torch.float32, True, "k_grouped", CHANNEL_SCALED))
        dense = gemm._choose_config(m, n, total, NUM_SMS, 4, True, CHANNEL_SCALED)
        out.append(gemm.kernel_spec(dense, n, total, torch.float32, True, operands=CHANNEL_SCALED))
    for g, m, n, mean in shapes(bf16_means):
        total = sum(suite.expert_tokens(g, mean, random.Random(g * mean)))
        config = bf16_heuristics.get_k_grouped_bf16_gemm_config(m, n, total, g, NUM_SMS, True, mn_major_b=True)
        out.append(k_grouped_bf16_gemm.kernel_spec(config, n, True, True, True))
    return list(dict.fromkeys(out))


def _means(text: str) -> tuple:
    return tuple(int(mean) for mean in text.split(",") if mean)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "precompile":
        from deep_kernels.jit.precompile import precompile

        means, bf16_means = _means(sys.argv[2]), _means(sys.argv[3] if len(sys.argv) > 3 else "")
        print(f"{len(specs(means, bf16_means))} kernels")
        precompile(specs(means, bf16_means), progress=False)
    elif mode == "run":
        import datetime
        import json

        from deep_kernels.benchmarks.report import BenchContext, gpu_folder, print_table, summarize
        from deep_kernels.benchmarks.report import _write_chart as write_chart

        out_root, commit, means = Path(sys.argv[2]), sys.argv[3], _means(sys.argv[4])
        bf16_means = _means(sys.argv[5]) if len(sys.argv) > 5 else ()
        ctx = BenchContext.create(commit)
        full = len(suite.MEAN_TOKENS) * len(suite.GROUPS) * len(suite.MNS) + len(shapes(suite.BF16_MEAN_TOKENS))
        rows = []
        folder = out_root / gpu_folder(ctx.gpu)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "k_grouped_gemm.json"
        # NOTE: rows by mean token count first; the JSON (not the chart) is written after every row, so that a run
        # stopped by a time limit leaves the rows it measured.
        ordered = sorted(shapes(means), key=lambda shape: means.index(shape[3]))
        for fp8_shapes, bf16_shapes in [([shape], []) for shape in ordered] + [
                ([], [shape]) for shape in shapes(bf16_means)]:
            rows += suite.rows(ctx, fp8_shapes, bf16_shapes)
            document = {
                "suite": "k_grouped_gemm", "gpu": ctx.gpu, "date": datetime.date.today().isoformat(),
                "torch": torch.__version__, "cuda": torch.version.cuda, "commit": ctx.commit,
                "copy_bandwidth_gbps": round(ctx.copy_gbps, 1), "rows": rows, "summary": summarize(rows),
            }
            if len(rows) < full:
                fp8 = [f"{r['shape']['g']} x {r['shape']['m']}x{r['shape']['n']} at {r['shape']['k'] // r['shape']['g']}"
                       for r in rows if r["op"].startswith("k_grouped_fp8")]
                bf16 = sum(r["op"].startswith("k_grouped_bf16") for r in rows)
                document["config_notes"] = (
                    f"Subset: {len(rows)} of the suite's {full} rows: the FP8 rows (experts x out x in at mean tokens per "
                    f"expert) {', '.join(fp8)}; {bf16} BF16 rows. The full suite does not fit the 30 s bench limit of "
                    "this run.")
            path.write_text(json.dumps(document, indent=2) + "\n")
            print(f"row {len(rows)}: {rows[-1]['shape']} {rows[-1]['speedup']}", flush=True)
        write_chart(folder / "k_grouped_gemm.png", "k_grouped_gemm", rows, ctx)
        print(f"wrote {path}")
        print_table("k_grouped_gemm", rows)
    else:
        raise SystemExit(__doc__)
