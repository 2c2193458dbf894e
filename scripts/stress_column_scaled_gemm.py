"""Repeated-run stress of the FP8 GEMM engine's column-scaled kinds (the weight-gradient recipe (1, 1, 128) of
fp8_gemm_nt, the k-grouped GEMM, and MXFP4 weights expanded in the kernel), whose promotion reads each stage's sfb
before the stage is freed: each case runs one long-K problem with the model's pick many times into fresh outputs,
compares every run bitwise with the first and checks the first against the float64 reference. Modes: `sync` (a
synchronize after each launch) and `burst` (8 launches back to back, each into its own D). Exits with status 1 if any
case had a mismatching run.

    python scripts/stress_column_scaled_gemm.py [--out DIR] [--runs N] [--cases ...] [--precompile]

Cases: wgrad:MxNxK (FP32 D accumulated in place), kgrouped:GxMxNxMEAN (likewise) or mxfp4:MxNxK (bf16 D; a size
whose fp8_fp4_gemm_nt runs the engine's in-kernel expansion).
"""

import argparse
import functools
import json
import random
import sys
import time
from pathlib import Path

import torch

import deep_kernels
from deep_kernels import fp4_gemm, gemm, k_grouped_gemm
from deep_kernels.heuristics import fp8_fp4_gemm as fp4_heuristics
from deep_kernels.heuristics import k_grouped_fp8_gemm as k_heuristics
from deep_kernels.reference import fp4_gemm as fp4_reference
from deep_kernels.reference import gemm as reference
from deep_kernels.reference import k_grouped_gemm as k_reference
from deep_kernels.testing import poison_
from deep_kernels.testing.fp4_gemm import make_fp4_gemm_inputs
from deep_kernels.testing.gemm import gemm_errors
from deep_kernels.testing.wgrad import group_sizes, make_k_grouped_inputs, make_wgrad_inputs

RECIPE = (1, 1, 128)
DEFAULT_CASES = ["wgrad:2112x7168x16384", "wgrad:4096x7168x16384", "wgrad:2048x2112x16384", "wgrad:1024x2048x16384",
                 "kgrouped:4x4096x7168x4096", "mxfp4:256x7168x16384"]
# Launches per burst (each into its own D).
BURST = 8


class Case:
    """One problem: its inputs, its pick and its float64 reference."""

    def __init__(self, text: str, num_sms: int):
        kind, shape = text.split(":")
        dims = [int(x) for x in shape.split("x")]
        self.text, self.kind, self.num_sms = text, kind, num_sms
        self.out_dtype = torch.bfloat16 if kind == "mxfp4" else torch.float32
        if kind == "mxfp4":
            m, n, k = dims
            self.a, self.b = make_fp4_gemm_inputs(m, n, k)
            self.shape = (m, n)
            self.dims = dims
            self.config = fp4_heuristics.get_config(m, n, k, num_sms, 2, False)
        elif kind == "wgrad":
            m, n, k = dims
            self.a, self.b = make_wgrad_inputs(m, n, k)
            self.shape = (m, n)
            self.config = gemm._choose_config(m, n, k, num_sms, 4, True, gemm.CHANNEL_SCALED)
        else:
            g, m, n, mean = dims
            self.ks = group_sizes(g, mean, random.Random(0))
            self.a, self.b, self.ks_tensor = make_k_grouped_inputs(self.ks, m, n)
            self.shape = (g, m, n)
            self.config = k_heuristics.get_k_grouped_fp8_gemm_config(m, n, sum(self.ks), g, num_sms, True)

    @functools.cached_property
    def expected(self) -> torch.Tensor:
        """The float64 reference."""
        d = torch.empty(self.shape, device="cuda", dtype=torch.float64)
        if self.kind == "mxfp4":
            return fp4_reference.fp8_fp4_gemm_nt(self.a, self.b, d)
        if self.kind == "wgrad":
            return reference.fp8_gemm_nt(self.a, self.b, d, recipe=RECIPE)
        return k_reference.k_grouped_fp8_gemm_nt_contiguous(self.a, self.b, d, self.ks)

    def clear(self, d: torch.Tensor) -> None:
        """D before a launch: poisoned (bf16 D), or zeros (FP32 D, which the call accumulates into)."""
        if self.out_dtype == torch.float32:
            d.zero_()
        else:
            poison_(d)

    def call(self, d: torch.Tensor):
        """A function that launches the pick into d, D = A B^T (FP32 D: c is d, zeroed by the caller)."""
        if self.kind == "mxfp4":
            m, n, k = self.dims
            key = (m, n, k, torch.bfloat16, False, self.num_sms, False)
            plan = fp4_gemm._dense_plan_of(self.config, m, n, k, torch.bfloat16, False, self.num_sms)

            def launch():
                fp4_gemm._plans[key] = plan
                return deep_kernels.fp8_fp4_gemm_nt(self.a, self.b, d)
            return launch
        if self.kind == "wgrad":
            return gemm.forced_config_call(self.config, self.a, self.b, d, c=d, recipe=RECIPE)
        return k_grouped_gemm.forced_config_call(self.config, self.a, self.b, d, self.ks, self.ks_tensor, c=d)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def summary(out: torch.Tensor, first: torch.Tensor, expected: torch.Tensor) -> dict:
    differ = bits(out) != bits(first)
    where = differ.nonzero()
    errors = gemm_errors(out.reshape(-1, out.shape[-1]), expected.reshape(-1, expected.shape[-1]))
    return {"elements": int(differ.sum()), "num_rows": len({tuple(r[:-1].tolist()) for r in where}),
            "first_index": where[0].tolist(), "worst_row": errors["row"], "whole": errors["whole"]}


def run(case: Case, mode: str, runs: int) -> dict:
    # NOTE: FP32 D is C: each launch's D is zeroed first (D = 0 + A B^T); bf16 D is poisoned. `burst` launches BURST
    # calls back to back into their own outputs, then compares them.
    count = BURST if mode == "burst" else 1
    outs = [torch.empty(case.shape, device="cuda", dtype=case.out_dtype) for _ in range(count + 1)]
    calls = [case.call(d) for d in outs]
    case.clear(outs[0])
    calls[0]()
    torch.cuda.synchronize()
    first = outs[0].clone()
    first_errors = gemm_errors(first.reshape(-1, first.shape[-1]), case.expected.reshape(-1, case.expected.shape[-1]))
    mismatches = []
    start = time.time()
    for base in range(1, runs, count):
        indices = range(base, min(base + count, runs))
        for i in indices:
            case.clear(outs[1 + (i - base)])
            calls[1 + (i - base)]()
        torch.cuda.synchronize()
        for i in indices:
            out = outs[1 + (i - base)]
            if not torch.equal(bits(out), bits(first)):
                mismatches.append((i, summary(out, first, case.expected)))
    return {"case": case.text, "mode": mode, "config": str(case.config), "runs": runs,
            "seconds": round(time.time() - start, 2), "first_vs_reference": first_errors,
            "mismatching_runs": len(mismatches), "mismatches": [{"run": i, **s} for i, s in mismatches[:10]]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--modes", default="sync,burst")
    parser.add_argument("--cases", nargs="*", default=DEFAULT_CASES)
    parser.add_argument("--precompile", action="store_true", help="compile the cases' kernels and exit")
    args = parser.parse_args()
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    if args.precompile:
        from deep_kernels.jit.precompile import precompile
        specs = []
        for text in args.cases:
            case = Case(text, num_sms)
            if case.kind == "mxfp4":
                m, n, k = case.dims
                specs.append(fp4_gemm.kernel_spec(case.config, n, k, torch.bfloat16, False))
            elif case.kind == "wgrad":
                specs.append(gemm.kernel_spec(case.config, case.shape[1], case.a[0].shape[1], torch.float32, True,
                                              operands=gemm.CHANNEL_SCALED))
            else:
                specs.append(gemm.kernel_spec(case.config, case.shape[2], k_grouped_gemm.KERNEL_SHAPE_K, torch.float32,
                                              True, k_heuristics.GEMM_TYPE, gemm.CHANNEL_SCALED))
        precompile(specs, progress=False)
        return
    results = []
    for text in args.cases:
        case = Case(text, num_sms)
        for mode in args.modes.split(","):
            result = run(case, mode, args.runs)
            print(json.dumps({key: result[key] for key in ("case", "mode", "config", "runs", "seconds",
                                                           "mismatching_runs")}), flush=True)
            print("  first vs reference:", result["first_vs_reference"], flush=True)
            for s in result["mismatches"][:3]:
                print("  ", json.dumps(s), flush=True)
            results.append(result)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "stress_column_scaled.json").write_text(json.dumps(results, indent=1))
    failing = [f"{r['case']} {r['mode']}" for r in results if r["mismatching_runs"]]
    print(f"mismatching runs in {len(failing)} of {len(results)} cases: {', '.join(failing) or 'none'}", flush=True)
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
