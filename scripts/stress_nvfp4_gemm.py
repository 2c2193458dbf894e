"""Repeated-run stress of the swapped FP4 GEMMs (NVFP4, or MXFP4 with --kind mxfp4): each case runs one shape and
config many times into freshly poisoned outputs, compares every run bitwise with the first, checks the first against
the float64 reference, and summarises each mismatching run (differing elements, rows, column range, worst-row
calc_diff). Modes: `sync` (a synchronize after each launch), `burst` (launches back to back, outputs kept), `loaded`
(as burst while another stream runs BF16 matmuls). After each case the split-K tickets must be zero again. Exits with
status 1 if any case had a mismatching run or a ticket left.

    python scripts/stress_nvfp4_gemm.py --out DIR [--kind nvfp4|mxfp4] [--runs N] [--cases 64x7168x16384 ...]
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from deep_kernels import fp4_gemm, gemm, nvfp4_gemm
from deep_kernels.heuristics import fp8_fp4_swap_ab as mxfp4_heuristics
from deep_kernels.heuristics import fp8_nvfp4_swap_ab as nvfp4_heuristics
from deep_kernels.reference import fp4_gemm as reference
from deep_kernels.testing import poison_
from deep_kernels.testing.fp4_gemm import make_fp4_gemm_inputs, make_nvfp4_gemm_inputs
from deep_kernels.testing.gemm import gemm_errors

DEFAULT_CASES = ["64x7168x16384", "64x4096x7168", "64x32768x512", "1x7168x16384", "16x4096x7168", "64x2112x7168",
                 "128x7168x16384"]


def parse_case(text: str, kind: str):
    m, n, k = (int(x) for x in text.split("x"))
    heuristics = nvfp4_heuristics if kind == "nvfp4" else mxfp4_heuristics
    return m, n, k, heuristics.get_config(m, n, k, torch.cuda.get_device_properties(0).multi_processor_count)


def make_inputs(m, n, k, kind):
    return (make_nvfp4_gemm_inputs if kind == "nvfp4" else make_fp4_gemm_inputs)(m, n, k)


def mismatch_summary(out: torch.Tensor, first: torch.Tensor, expected: torch.Tensor) -> dict:
    differ = (out.view(torch.int16) != first.view(torch.int16))
    where = differ.nonzero()
    rows = sorted({int(r) for r in where[:, 0]})
    errors = gemm_errors(out, expected)
    return {"elements": int(differ.sum()), "rows": rows[:16], "num_rows": len(rows),
            "cols": [int(where[:, 1].min()), int(where[:, 1].max())],
            "col_groups_of_16": sorted({int(c) // 16 for c in where[:, 1]})[:16],
            "worst_row": errors["row"], "whole": errors["whole"]}


def run_case(kind, m, n, k, config, runs: int, mode: str, out_dir: Path, tag: str) -> dict:
    a, b = make_inputs(m, n, k, kind)
    expected = reference.fp8_fp4_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64))
    outs = [poison_(torch.empty((m, n), device="cuda", dtype=torch.bfloat16)) for _ in range(runs if mode != "sync" else 2)]
    side = torch.cuda.Stream() if mode == "loaded" else None
    if side is not None:
        x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        with torch.cuda.stream(side):
            for _ in range(max(runs // 3, 5)):
                x = (x @ x).clamp_(-1, 1)
    first = fp4_gemm.fp8_fp4_gemm_nt_with_config(config, a, b, outs[0]).clone()
    torch.cuda.synchronize()
    first_errors = gemm_errors(first, expected)
    mismatches = []
    start = time.time()
    for i in range(1, runs):
        d = outs[i] if mode != "sync" else poison_(outs[1])
        fp4_gemm.fp8_fp4_gemm_nt_with_config(config, a, b, d)
        if mode == "sync":
            torch.cuda.synchronize()
            if not torch.equal(d.view(torch.int16), first.view(torch.int16)):
                mismatches.append((i, mismatch_summary(d, first, expected)))
    torch.cuda.synchronize()
    if mode != "sync":
        for i in range(1, runs):
            if not torch.equal(outs[i].view(torch.int16), first.view(torch.int16)):
                mismatches.append((i, mismatch_summary(outs[i], first, expected)))
    tickets = [int(t) for w in gemm._split_workspaces.values() for t in w.tickets.nonzero().flatten()]
    return {"case": tag, "mode": mode, "config": str(config), "runs": runs, "seconds": round(time.time() - start, 2),
            "first_vs_reference": first_errors, "mismatching_runs": len(mismatches),
            "mismatches": [{"run": i, **s} for i, s in mismatches[:20]], "nonzero_tickets": tickets[:16]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--kind", default="nvfp4", choices=("nvfp4", "mxfp4"))
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--modes", default="sync,burst,loaded")
    parser.add_argument("--cases", nargs="*", default=DEFAULT_CASES)
    parser.add_argument("--precompile", action="store_true", help="compile the cases' kernels and exit")
    args = parser.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    cases = [(text, parse_case(text, args.kind)) for text in args.cases]
    if args.precompile:
        from deep_kernels.jit.precompile import precompile
        precompile([nvfp4_gemm.kernel_spec(config, torch.bfloat16, False) if args.kind == "nvfp4"
                    else fp4_gemm.swap_ab_kernel_spec(config, torch.bfloat16, False) for _, (*_, config) in cases],
                   progress=False)
        return
    results = []
    for text, (m, n, k, config) in cases:
        for mode in args.modes.split(","):
            result = run_case(args.kind, m, n, k, config, args.runs, mode, out_dir, f"{args.kind}_{text}_{mode}")
            print(json.dumps({key: result[key] for key in ("case", "config", "runs", "seconds", "mismatching_runs",
                                                           "nonzero_tickets")}), flush=True)
            print("  first vs reference:", result["first_vs_reference"], flush=True)
            for s in result["mismatches"][:3]:
                print("  ", json.dumps(s), flush=True)
            results.append(result)
    (out_dir / f"stress_{args.kind}.json").write_text(json.dumps(results, indent=1))
    failing = [r["case"] for r in results if r["mismatching_runs"] or r["nonzero_tickets"]]
    print(f"mismatching runs or tickets left in {len(failing)} of {len(results)} cases: {', '.join(failing) or 'none'}",
          flush=True)
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
