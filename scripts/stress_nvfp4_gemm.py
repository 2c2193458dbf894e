"""Repeated-run stress of the swapped FP4 GEMMs (NVFP4, and MXFP4 with --mxfp4): each case runs one shape and config
many times into freshly poisoned outputs, compares every run bitwise with the first, checks the first against the
float64 reference, and summarises each mismatching run (differing elements, rows, column range, worst-row
calc_diff). Modes: `sync` (a synchronize after each launch), `burst` (launches back to back, outputs kept), `loaded`
(as burst while another stream runs BF16 matmuls). After each case the split-K tickets must be zero again.

    python scripts/stress_nvfp4_gemm.py --out DIR [--runs N] [--cases 64x7168x16384:64,2,2 ...] [--precompile]
"""

import argparse
import json
import time
from pathlib import Path

import torch

import deep_kernels
from deep_kernels import gemm
from deep_kernels.heuristics import fp8_nvfp4_swap_ab as heuristics
from deep_kernels.reference import fp4_gemm as reference
from deep_kernels.testing import poison_
from deep_kernels.testing.fp4_gemm import make_nvfp4_gemm_inputs
from deep_kernels.testing.gemm import gemm_errors

DEFAULT_CASES = ["64x7168x16384", "64x4096x7168", "64x32768x512", "1x7168x16384", "16x4096x7168", "64x2112x7168",
                 "128x7168x16384"]


def parse_case(text: str):
    shape, _, forced = text.partition(":")
    m, n, k = (int(x) for x in shape.split("x"))
    if forced:
        block_t, warpgroups, splits = (int(x) for x in forced.split(","))
        config = heuristics.make_config(block_t, warpgroups, num_splits=splits)
    else:
        config = heuristics.get_config(m, n, k, torch.cuda.get_device_properties(0).multi_processor_count)
    return m, n, k, config


def mismatch_summary(out: torch.Tensor, first: torch.Tensor, expected: torch.Tensor) -> dict:
    differ = (out.view(torch.int16) != first.view(torch.int16))
    where = differ.nonzero()
    rows = sorted({int(r) for r in where[:, 0]})
    errors = gemm_errors(out, expected)
    return {"elements": int(differ.sum()), "rows": rows[:16], "num_rows": len(rows),
            "cols": [int(where[:, 1].min()), int(where[:, 1].max())],
            "col_tiles_of_64": sorted({int(c) // 64 for c in where[:, 1]})[:16],
            "worst_row": errors["row"], "whole": errors["whole"]}


def run_case(m, n, k, config, runs: int, mode: str, out_dir: Path, tag: str) -> dict:
    a, b = make_nvfp4_gemm_inputs(m, n, k)
    expected = reference.fp8_fp4_gemm_nt(a, b, torch.empty((m, n), device="cuda", dtype=torch.float64))
    outs = [poison_(torch.empty((m, n), device="cuda", dtype=torch.bfloat16)) for _ in range(runs if mode != "sync" else 2)]
    side = torch.cuda.Stream() if mode == "loaded" else None
    if side is not None:
        x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        with torch.cuda.stream(side):
            for _ in range(max(runs // 3, 5)):
                x = (x @ x).clamp_(-1, 1)
    first = deep_kernels.fp8_fp4_gemm_nt(a, b, outs[0], config=config).clone()
    torch.cuda.synchronize()
    first_errors = gemm_errors(first, expected)
    mismatches = []
    start = time.time()
    for i in range(1, runs):
        d = outs[i] if mode != "sync" else poison_(outs[1])
        deep_kernels.fp8_fp4_gemm_nt(a, b, d, config=config)
        if mode == "sync":
            torch.cuda.synchronize()
            if not torch.equal(d.view(torch.int16), first.view(torch.int16)):
                mismatches.append((i, mismatch_summary(d, first, expected)))
                if len(mismatches) <= 3:
                    torch.save(d.cpu(), out_dir / f"{tag}_run{i}.pt")
    torch.cuda.synchronize()
    if mode != "sync":
        for i in range(1, runs):
            if not torch.equal(outs[i].view(torch.int16), first.view(torch.int16)):
                mismatches.append((i, mismatch_summary(outs[i], first, expected)))
                if len(mismatches) <= 3:
                    torch.save(outs[i].cpu(), out_dir / f"{tag}_run{i}.pt")
    tickets = [int(t) for w in gemm._split_workspaces.values() for t in w.tickets.nonzero().flatten()]
    return {"case": tag, "mode": mode, "config": str(config), "runs": runs, "seconds": round(time.time() - start, 2),
            "first_vs_reference": first_errors, "mismatching_runs": len(mismatches),
            "mismatches": [{"run": i, **s} for i, s in mismatches[:20]], "nonzero_tickets": tickets[:16]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--modes", default="sync,burst,loaded")
    parser.add_argument("--cases", nargs="*", default=DEFAULT_CASES)
    parser.add_argument("--precompile", action="store_true", help="compile the cases' kernels and exit")
    args = parser.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    cases = [parse_case(c) for c in args.cases]
    if args.precompile:
        from deep_kernels import nvfp4_gemm
        from deep_kernels.jit.precompile import precompile
        precompile([nvfp4_gemm.kernel_spec(c, torch.bfloat16, False) for *_, c in cases], progress=False)
        return
    results = []
    for text, (m, n, k, config) in zip(args.cases, cases):
        for mode in args.modes.split(","):
            result = run_case(m, n, k, config, args.runs, mode, out_dir, f"{text.replace(':', '_')}_{mode}")
            print(json.dumps({key: result[key] for key in ("case", "config", "runs", "seconds", "mismatching_runs",
                                                           "nonzero_tickets")}), flush=True)
            print("  first vs reference:", result["first_vs_reference"], flush=True)
            for s in result["mismatches"][:5]:
                print("  ", json.dumps(s), flush=True)
            results.append(result)
    (out_dir / "stress.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
